//! Block-sparse GEMM kernels: a plan `sparse_gemm` / `sparse_dual_gemm` becomes an instantiation of
//! `GemmBsrWgmma` (`gemm_bsr_wgmma.cuh`: sm_90a, f16 / bf16), `GemmBsrMma` (other f16 / bf16) or
//! `GemmBsrSimt` (f32) from `gemm_bsr.cuh`.
//!
//! The block pattern is compiled into the source as `__device__ const int` arrays, so the kernel
//! ABI is unchanged (buffers and symbolic dims only). The packed weight buffers are
//! `[kept, rows, cols]` as the IR defines them.
//!
//! # `GemmBsrMma` / `GemmBsrSimt`
//! The kept-block lists are compressed sparse rows (`row_ptr`, `col_idx`). One CTA computes a
//! `BM x BN` tile inside one block row of the weight; `BN` is the block's row count rounded up to
//! 16 (at most 128, 64 for dual GEMMs), so a block row of more rows than that is split over
//! several CTAs.
//!
//! # `GemmBsrWgmma` (Hopper)
//! Taken for [`Arch::Sm90a`], f16 / bf16, A stored `[M, K]` (no constant row stride that is not a
//! multiple of 8), a block height that is a wgmma N ([`WGMMA_N`]), a block width that is a
//! multiple of 16 and fewer than 32768 block columns. One CTA computes 128 rows of the output and
//! a GROUP of `G` consecutive block rows (`G * BR <= 256` columns, 128 for dual GEMMs, `G <= 16`),
//! one accumulator array per block row. Its k loop walks the group's steps: the union of the kept
//! block columns of its rows, each with the mask of the rows that keep it ([`GroupSteps`]). A
//! step's A slice is loaded once for all of them. See the template's comment for the shared
//! layout (swizzled K-major atoms of 64, 32 or 16 elements) and the pipeline; the tests below
//! check its address math against the PTX ISA's canonical layouts on the CPU.

use crate::cpp::{self, Symbols};
use crate::gemm::{a_layout, check_output_columns, epilogue_code, Config};
use crate::view::matrix_view;
use crate::{dim_params, signature, Arch, CodegenError, Ctx, CudaKernel, Grid, Launch};
use mlpc_ir::{BlockPattern, DType, Extent, MatLayout, SparseGemm};
use std::fmt::Write;

fn round_up(v: u32, to: u32) -> u32 {
    v.div_ceil(to) * to
}

/// The tile configuration of a BSR kernel, in the dense kernel's terms (`MmaConfig`/`SimtConfig`).
fn choose(dtype: DType, dual: bool, block: [u32; 2]) -> Config {
    let [br, bc] = block;
    let cap = if dual { 64 } else { 128 };
    let bn = round_up(br, 16).clamp(16, cap);
    let mut c = match dtype {
        DType::F16 | DType::Bf16 => {
            // Warps: 4 along M below 64 columns (32 x BN each), 2 x 4 at 128 (like the dense
            // kernel); BK = the block's columns rounded to the mma k, at most 32.
            let (bm, x, y) = match bn {
                16 | 32 => (128, 4, 1),
                64 => (128, 4, 2),
                _ => (128, 2, 4),
            };
            Config {
                bm,
                bn,
                bk: round_up(bc, 16).min(32),
                x,
                y,
                stages: 3,
                min_blocks: 0,
                mma: true,
            }
        }
        DType::F32 => {
            // Threads hold TM x TN outputs: TM 8 (4 for dual), TN 4 below 64 columns, else 8.
            let tm = if dual { 4 } else { 8 };
            let bm = if dual { 64 } else { 128 };
            let tn = if bn >= 64 { 8 } else { 4 };
            let bk = if bn == 128 { 8 } else { 16 };
            Config {
                bm,
                bn,
                bk: round_up(bc, 4).min(bk),
                x: tm,
                y: tn,
                stages: 2,
                min_blocks: 0,
                mma: false,
            }
        }
    };
    // CTAs per SM the registers are budgeted for: 512 threads per SM on tensor cores (at most
    // 128 registers each, as the dense kernel), 256 on the FFMA path (whose 64 accumulators and
    // slice registers need more).
    let per_sm = if c.mma { 512 } else { 256 };
    c.min_blocks = (per_sm / c.threads()).max(1);
    c
}

/// `name[len] = {v, v, ...};`, 16 values per line.
fn int_array(name: &str, values: &[u32]) -> String {
    let mut s = format!("__device__ const int {name}[{}] = {{", values.len());
    for (i, v) in values.iter().enumerate() {
        if i % 16 == 0 {
            s.push_str("\n    ");
        } else {
            s.push(' ');
        }
        let _ = write!(s, "{v},");
    }
    s.push_str("\n};\n");
    s
}

/// The block heights the grouped Hopper kernel has a wgmma for (`bsr_wgmma::Mma<T, N>`).
pub(crate) const WGMMA_N: [u32; 10] = [8, 16, 24, 32, 48, 64, 96, 128, 192, 256];
/// The dynamic shared memory a block may use on sm_90 (227 KiB).
const SMEM_LIMIT: u32 = 227 * 1024;
/// At most this many stages: more buys nothing once the loads of a few slices cover the latency.
const MAX_STAGES: u32 = 8;

/// A `GemmBsrWgmma` configuration (`mlpc::BsrWgmmaConfig<BM, G, BK, STAGES>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WgmmaBsr {
    pub bm: u32,
    /// Block rows per CTA.
    pub g: u32,
    /// The k depth of one slice (a divisor of the block width).
    pub bk: u32,
    pub stages: u32,
}

impl WgmmaBsr {
    /// One consumer warpgroup (128 threads) per 64 rows.
    pub fn threads(&self) -> u32 {
        self.bm / 64 * 128
    }

    /// Mirrors `GemmBsrWgmma::kStageBytes`: the A slice and the G block slots (twice for dual).
    fn stage_bytes(bm: u32, g: u32, br: u32, bk: u32, dual: bool) -> u32 {
        let nb = if dual { 2 } else { 1 };
        (bm + nb * g * br) * bk * 2
    }

    /// Mirrors `GemmBsrWgmma::kSmemBytes`: the ring plus 1024 bytes of alignment slack.
    pub fn smem_bytes(&self, br: u32, dual: bool) -> u32 {
        self.stages * Self::stage_bytes(self.bm, self.g, br, self.bk, dual) + 1024
    }

    pub fn template(&self) -> String {
        format!(
            "mlpc::BsrWgmmaConfig<{}, {}, {}, {}>",
            self.bm, self.g, self.bk, self.stages
        )
    }
}

/// The grouped Hopper kernel's configuration for a block-sparse GEMM, or `None` when it keeps
/// `GemmBsrMma` / `GemmBsrSimt`. `la` is A's physical layout and `lda` its row stride.
pub(crate) fn select_wgmma(
    arch: Arch,
    dtype: DType,
    dual: bool,
    (la, lda): (MatLayout, &Extent),
    p: &BlockPattern,
) -> Option<WgmmaBsr> {
    let [br, bc] = p.block;
    if arch != Arch::Sm90a || !matches!(dtype, DType::F16 | DType::Bf16) || la != MatLayout::N {
        return None;
    }
    if lda.as_constant().is_some_and(|c| c % 8 != 0) {
        return None;
    }
    // The step's block column shares an int with the 16-bit row mask.
    if !WGMMA_N.contains(&br) || bc % 16 != 0 || p.block_cols() >= 1 << 15 {
        return None;
    }
    // Accumulators: G * BR / 2 f32 registers per thread and product, at most 128 in all.
    let cols = if dual { 128 } else { 256 };
    if br > cols {
        return None;
    }
    let rows = u32::try_from(p.block_rows()).unwrap_or(u32::MAX);
    let g = (cols / br).min(16).min(rows).max(1);
    let bk = [64, 48, 32, 16].into_iter().find(|d| bc % d == 0)?;
    let bm = 128;
    let stages = ((SMEM_LIMIT - 1024) / WgmmaBsr::stage_bytes(bm, g, br, bk, dual)).min(MAX_STAGES);
    (stages >= 3).then_some(WgmmaBsr { bm, g, bk, stages })
}

/// The k loop of every group of `g` consecutive block rows, as `GemmBsrWgmma` reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GroupSteps {
    /// `groups + 1` offsets: group j's steps are `grp_ptr[j] .. grp_ptr[j + 1]`.
    pub grp_ptr: Vec<u32>,
    /// Per step: `(block column << 16) | mask`, bit i of the mask set when block row `j * g + i`
    /// keeps the column. Columns increase within a group.
    pub step_info: Vec<u32>,
    /// Per step: the offset in `step_blk` of its first kept block.
    pub step_first: Vec<u32>,
    /// The packed index (position in `pattern.kept`) of each kept block, step by step, in
    /// increasing row within a step.
    pub step_blk: Vec<u32>,
}

impl GroupSteps {
    /// The steps of `pattern` cut into groups of `g` (1..=16) block rows; block columns must be
    /// below 32768.
    pub fn new(pattern: &BlockPattern, g: u32) -> GroupSteps {
        let rows = pattern.block_rows() as usize;
        let g = g as usize;
        let groups = rows.div_ceil(g);
        let row_ptr = pattern.row_ptr();
        let mut s = GroupSteps {
            grp_ptr: vec![0],
            step_info: Vec::new(),
            step_first: Vec::new(),
            step_blk: Vec::new(),
        };
        for j in 0..groups {
            // (column, row in the group, packed index) of every kept block of the group, in
            // column order then row order.
            let mut kept: Vec<(u32, u32, u32)> = Vec::new();
            for i in 0..g.min(rows - j * g) {
                let r = j * g + i;
                for at in row_ptr[r]..row_ptr[r + 1] {
                    kept.push((pattern.kept[at as usize].1, i as u32, at));
                }
            }
            kept.sort_unstable();
            for chunk in kept.chunk_by(|x, y| x.0 == y.0) {
                let mask = chunk.iter().fold(0u32, |m, &(_, i, _)| m | (1 << i));
                s.step_info.push((chunk[0].0 << 16) | mask);
                s.step_first.push(s.step_blk.len() as u32);
                s.step_blk.extend(chunk.iter().map(|&(_, _, at)| at));
            }
            s.grp_ptr.push(s.step_info.len() as u32);
        }
        s
    }
}

pub fn generate(ctx: &Ctx<'_>, sg: &SparseGemm) -> Result<CudaKernel, CodegenError> {
    let kname = ctx.name();
    let g = &sg.gemm;
    let p = &sg.pattern;
    let dtype = ctx.out.ty.dtype;
    let dual = g.dual.is_some();
    let nmat = g.matrix_operands();

    let layout_err = |b: &mlpc_ir::Buffer, reason: String| CodegenError::Layout {
        kernel: kname.clone(),
        buffer: b.name.clone(),
        ty: b.ty.to_string(),
        reason,
    };
    let shape_err = |what: String, expected: String, actual: String| CodegenError::Shape {
        kernel: kname.clone(),
        what,
        expected,
        actual,
    };
    p.check()
        .map_err(|m| shape_err("the block pattern".into(), "valid".into(), m))?;
    if g.b != MatLayout::T {
        return Err(layout_err(
            ctx.args[1],
            "a sparse GEMM reads its weight as [N, K] (layout t)".into(),
        ));
    }
    let view = |b: &mlpc_ir::Buffer| matrix_view(&b.ty).map_err(|r| layout_err(b, r));

    // Logical A [M, K], C [M, N]; the packed weights [kept, rows, cols].
    let a = {
        let v = view(ctx.args[0])?;
        match g.a {
            MatLayout::N => v,
            MatLayout::T => v.transposed(),
        }
    };
    let c = view(ctx.out)?;
    let (m, k, n) = (&c.rows, &a.cols, &c.cols);
    let (pn, pk) = (Extent::constant(p.out), Extent::constant(p.inp));
    if n != &pn {
        return Err(shape_err(
            "the output's column count".into(),
            pn.to_string(),
            n.to_string(),
        ));
    }
    if k != &pk || &a.rows != m {
        return Err(shape_err(
            format!("A `{}` as [M, K]", ctx.args[0].name),
            format!("[{m}, {pk}]"),
            format!("[{}, {k}]", a.rows),
        ));
    }
    let packed: Vec<mlpc_ir::Dim> = p
        .packed_shape()
        .into_iter()
        .map(mlpc_ir::Dim::Fixed)
        .collect();
    for &buf in &ctx.args[1..nmat] {
        if buf.ty.shape[..] != packed[..] || !buf.ty.is_contiguous() {
            return Err(shape_err(
                format!("packed weight `{}`", buf.name),
                format!("row-major {packed:?}"),
                buf.ty.to_string(),
            ));
        }
    }
    check_output_columns(ctx, &c)?;
    let (la, lda) = a_layout(ctx, &a)?;

    let mut syms = Symbols::default();
    let epi = epilogue_code(ctx, g, m, n, &mut syms)?;
    let mut arg_names: Vec<String> = vec!["a".into(), "b".into()];
    if dual {
        arg_names.push("b_up".into());
    }
    arg_names.extend(epi.arg_names);
    arg_names.push("out".into());

    let [br, bc] = p.block;
    let elem = cpp::elem_type(dtype);
    let hopper = select_wgmma(ctx.opts.arch, dtype, dual, (la, &lda), p);
    let cfg = choose(dtype, dual, p.block);
    // Kept blocks are read as the `[N, K]` weight, B layout `t`.
    let (threads, smem, min_blocks, bm) = match hopper {
        Some(h) => (h.threads(), h.smem_bytes(br, dual), 1, h.bm),
        None => (
            cfg.threads(),
            cfg.smem_bytes(la, MatLayout::T, dual),
            cfg.min_blocks,
            cfg.bm,
        ),
    };
    let nsub = br.div_ceil(cfg.bn);
    // Grid columns: one per group of block rows (wgmma), or per BN share of a block row.
    let col_tiles = match hopper {
        Some(h) => p.block_rows().div_ceil(u64::from(h.g)),
        None => p.block_rows() * u64::from(nsub),
    };
    let entry = match hopper {
        Some(h) => format!(
            "mlpc_bsr_{}_{}_nt_b{br}x{bc}_wgmma_{}x{}x{}",
            epi.name_parts.join("_"),
            dtype.name(),
            h.bm,
            h.g * br,
            h.bk
        ),
        None => format!(
            "mlpc_bsr_{}_{}_{}t_b{br}x{bc}_{}x{}x{}",
            epi.name_parts.join("_"),
            dtype.name(),
            la.letter(),
            cfg.bm,
            cfg.bn,
            cfg.bk
        ),
    };

    let params_ty = if hopper.is_some() {
        "BsrWgmmaParams"
    } else {
        "BsrParams"
    };
    let mut body = vec![
        format!("    mlpc::{params_ty}<{elem}, {}> p;", epi.n_slots),
        "    p.a = a;".to_string(),
        "    p.b = b;".to_string(),
        format!("    p.b_up = {};", if dual { "b_up" } else { "nullptr" }),
        "    p.c = out;".to_string(),
        format!("    p.m = {};", syms.expr(m)),
        format!("    p.n = {};", syms.expr(n)),
        format!("    p.k = {};", syms.expr(k)),
        format!("    p.lda = {};", syms.expr(&lda)),
        format!("    p.ldb = {bc};"),
        format!("    p.ldb_up = {};", if dual { bc } else { 0 }),
        format!("    p.ldc = {};", syms.expr(&c.row_stride)),
    ];
    let lists: &[&str] = if hopper.is_some() {
        &["grp_ptr", "step_info", "step_first", "step_blk"]
    } else {
        &["row_ptr", "col_idx"]
    };
    body.extend(lists.iter().map(|l| format!("    p.{l} = {l};")));
    body.extend(epi.lines);
    body.push("    Kernel::run(p);".to_string());

    let symbols = syms.into_sorted();
    let summary = format!(
        "out[m, n] = {} with B block-sparse: {br}x{bc} blocks of [{}, {}], {} of {} kept",
        epi.summary,
        p.out,
        p.inp,
        p.kept.len(),
        p.total_blocks()
    );
    let mut src = ctx.header(&summary, &arg_names);
    let include = if hopper.is_some() {
        "gemm_bsr_wgmma.cuh"
    } else {
        "gemm_bsr.cuh"
    };
    src.push_str(&format!("#include \"{include}\"\n\n"));
    src.push_str("namespace {\n");
    match hopper {
        Some(h) => {
            let steps = GroupSteps::new(p, h.g);
            src.push_str(&format!(
                "// Group j (block rows {g}j .. {g}j + {g}) runs steps grp_ptr[j] .. grp_ptr[j + 1]. Step s is\n\
                 // block column step_info[s] >> 16 for the rows in the mask step_info[s] & 0xffff;\n\
                 // their packed blocks are step_blk[step_first[s] ..], in increasing row.\n",
                g = h.g
            ));
            src.push_str(&int_array("grp_ptr", &steps.grp_ptr));
            src.push_str(&int_array("step_info", &steps.step_info));
            src.push_str(&int_array("step_first", &steps.step_first));
            src.push_str(&int_array("step_blk", &steps.step_blk));
            src.push_str(&format!("using Config = {};\n", h.template()));
            src.push_str(&format!("using Epilogue = {};\n", epi.ty));
            src.push_str(&format!(
                "using Kernel = mlpc::GemmBsrWgmma<{elem}, {br}, {bc}, Config, Epilogue>;\n"
            ));
        }
        None => {
            let template = if cfg.mma { "GemmBsrMma" } else { "GemmBsrSimt" };
            let col_idx: Vec<u32> = p.kept.iter().map(|&(_, c)| c).collect();
            src.push_str("// Kept blocks of block row r: col_idx[row_ptr[r] .. row_ptr[r + 1]].\n");
            src.push_str(&int_array("row_ptr", &p.row_ptr()));
            src.push_str(&int_array("col_idx", &col_idx));
            src.push_str(&format!("using Config = {};\n", cfg.template()));
            src.push_str(&format!("using Epilogue = {};\n", epi.ty));
            src.push_str(&format!(
                "using Kernel = mlpc::{template}<{elem}, {}, {br}, {bc}, Config, Epilogue>;\n",
                cpp::layout(la)
            ));
        }
    }
    src.push_str(&format!(
        "static_assert(Kernel::kThreads == {threads}, \"block size of the launch description\");\n"
    ));
    src.push_str(&format!(
        "static_assert(Kernel::kSmemBytes == {smem}, \"shared memory of the launch description\");\n"
    ));
    src.push_str(&match hopper {
        Some(h) => format!(
            "static_assert(Kernel::kGroup == {}, \"block rows per CTA of the launch description\");\n",
            h.g
        ),
        None => format!(
            "static_assert(Kernel::kNSub == {nsub}, \"column tiles per block row of the launch description\");\n"
        ),
    });
    src.push_str("}  // namespace\n\n");
    src.push_str(&format!(
        "extern \"C\" __global__ void __launch_bounds__({threads}, {min_blocks}) {entry}(\n{}) {{\n",
        signature(elem, &arg_names, ctx.args.len(), &symbols)
    ));
    src.push_str(&body.join("\n"));
    src.push_str("\n}\n");

    let mut params = ctx.buffer_params();
    params.extend(dim_params(&symbols));
    Ok(CudaKernel {
        name: kname.clone(),
        entry,
        source: src,
        launch: Launch {
            block: [threads, 1, 1],
            smem_bytes: smem,
            // One CTA per BM rows and per group of block rows (wgmma) or BN-column share of a
            // block row.
            grid: Grid::Tiles {
                m: m.clone(),
                n: Extent::constant(col_tiles),
                tile_m: bm,
                tile_n: 1,
            },
        },
        params,
        small_m: None,
    })
}
