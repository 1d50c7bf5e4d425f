//! Block-sparse GEMM kernels: a plan `sparse_gemm` / `sparse_dual_gemm` becomes an instantiation of
//! `GemmBsrMma` (f16, bf16) or `GemmBsrSimt` (f32) from `gemm_bsr.cuh`.
//!
//! The block pattern is compiled into the source: the kept-block lists become two
//! `__device__ const int` arrays (`row_ptr`, `col_idx`, compressed sparse rows), so the kernel ABI is
//! unchanged (buffers and symbolic dims only). The packed weight buffers are `[kept, rows, cols]`
//! as the IR defines them. One CTA computes a `BM x BN` tile inside one block row of the weight;
//! `BN` is the block's row count rounded up to 16 (at most 128, 64 for dual GEMMs), so a block row
//! of more rows than that is split over several CTAs.

use crate::cpp::{self, Symbols};
use crate::gemm::{a_layout, check_output_columns, epilogue_code, Config};
use crate::view::matrix_view;
use crate::{dim_params, signature, CodegenError, Ctx, CudaKernel, Grid, Launch};
use mlpc_ir::{DType, Extent, MatLayout, SparseGemm};
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
    let cfg = choose(dtype, dual, p.block);
    let threads = cfg.threads();
    // Kept blocks are read as the `[N, K]` weight, B layout `t`.
    let smem = cfg.smem_bytes(la, MatLayout::T, dual);
    let nsub = br.div_ceil(cfg.bn);
    let col_tiles = p.block_rows() * u64::from(nsub);
    let elem = cpp::elem_type(dtype);
    let entry = format!(
        "mlpc_bsr_{}_{}_{}t_b{br}x{bc}_{}x{}x{}",
        epi.name_parts.join("_"),
        dtype.name(),
        la.letter(),
        cfg.bm,
        cfg.bn,
        cfg.bk
    );

    let mut body = vec![
        format!("    mlpc::BsrParams<{elem}, {}> p;", epi.n_slots),
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
        "    p.row_ptr = row_ptr;".to_string(),
        "    p.col_idx = col_idx;".to_string(),
    ];
    body.extend(epi.lines);
    body.push("    Kernel::run(p);".to_string());

    let symbols = syms.into_sorted();
    let template = if cfg.mma { "GemmBsrMma" } else { "GemmBsrSimt" };
    let col_idx: Vec<u32> = p.kept.iter().map(|&(_, c)| c).collect();
    let summary = format!(
        "out[m, n] = {} with B block-sparse: {br}x{bc} blocks of [{}, {}], {} of {} kept",
        epi.summary,
        p.out,
        p.inp,
        p.kept.len(),
        p.total_blocks()
    );
    let mut src = ctx.header(&summary, &arg_names);
    src.push_str("#include \"gemm_bsr.cuh\"\n\n");
    src.push_str("namespace {\n");
    src.push_str("// Kept blocks of block row r: col_idx[row_ptr[r] .. row_ptr[r + 1]].\n");
    src.push_str(&int_array("row_ptr", &p.row_ptr()));
    src.push_str(&int_array("col_idx", &col_idx));
    src.push_str(&format!("using Config = {};\n", cfg.template()));
    src.push_str(&format!("using Epilogue = {};\n", epi.ty));
    src.push_str(&format!(
        "using Kernel = mlpc::{template}<{elem}, {}, {br}, {bc}, Config, Epilogue>;\n",
        cpp::layout(la)
    ));
    src.push_str(&format!(
        "static_assert(Kernel::kThreads == {threads}, \"block size of the launch description\");\n"
    ));
    src.push_str(&format!(
        "static_assert(Kernel::kSmemBytes == {smem}, \"shared memory of the launch description\");\n"
    ));
    src.push_str(&format!(
        "static_assert(Kernel::kNSub == {nsub}, \"column tiles per block row of the launch description\");\n"
    ));
    src.push_str("}  // namespace\n\n");
    src.push_str(&format!(
        "extern \"C\" __global__ void __launch_bounds__({threads}, {}) {entry}(\n{}) {{\n",
        cfg.min_blocks,
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
            // One CTA per BM rows and per BN-column share of each block row.
            grid: Grid::Tiles {
                m: m.clone(),
                n: Extent::constant(col_tiles),
                tile_m: cfg.bm,
                tile_n: 1,
            },
        },
        params,
        small_m: None,
    })
}
