//! GEMM kernels: a plan `gemm` / `dual_gemm` (or an unfused `matmul`) becomes an instantiation of
//! `GemmMma` (f16, bf16) or `GemmSimt` (f32).
//!
//! The operand layouts given to the template come from the buffers' strides, not only from the
//! node's `MatLayout`: the node says which logical matrix an operand is, the strides say where its
//! elements are. A matrix operand must have one contiguous dimension; the other becomes the row
//! stride (`lda`, `ldb`), a literal when fixed and an expression of symbol arguments otherwise.

use crate::cpp::{self, Symbols};
use crate::view::{is_one, matrix_view, MatrixView};
use crate::wgmma::Family;
use crate::{dim_params, signature, Arch, CodegenError, Ctx, CudaKernel, Grid, Launch, Param};
use crate::{ShortGrid, TileChoice, TileKey};
use mlpc_ir::{BufferKind, DType, Epilogue, Extent, Gemm, MatLayout};
use smallvec::SmallVec;

/// An unfused `matmul`: `A @ B` with both operands as stored.
pub fn plain_matmul() -> Gemm {
    Gemm {
        a: MatLayout::N,
        b: MatLayout::N,
        dual: None,
        epilogue: SmallVec::new(),
    }
}

/// A tile configuration and the template that runs it (the block-sparse kernel uses it too).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Config {
    pub(crate) bm: u32,
    pub(crate) bn: u32,
    pub(crate) bk: u32,
    /// `MmaConfig`: warps along M and N, stages. `SimtConfig`: the thread block TM x TN.
    pub(crate) x: u32,
    pub(crate) y: u32,
    pub(crate) stages: u32,
    /// CTAs per SM the registers are budgeted for (`__launch_bounds__`' second argument).
    pub(crate) min_blocks: u32,
    pub(crate) mma: bool,
}

impl Config {
    fn choose(dtype: DType, dual: bool) -> Config {
        match (dtype, dual) {
            // 8 warps as 2 x 4, 64 x 32 per warp: 64 accumulators per thread. Three stages and two
            // CTAs per SM (at most 128 registers, no spills) keep enough loads in flight: on an
            // H200 this ran 1.5x faster than two stages at one CTA per SM; four stages or
            // BK = 64 gained nothing more.
            (DType::F16 | DType::Bf16, false) => Config {
                bm: 128,
                bn: 128,
                bk: 32,
                x: 2,
                y: 4,
                stages: 3,
                min_blocks: 2,
                mma: true,
            },
            // Two accumulators: 8 warps as 4 x 2, 32 x 32 per warp.
            (DType::F16 | DType::Bf16, true) => Config {
                bm: 128,
                bn: 64,
                bk: 32,
                x: 4,
                y: 2,
                stages: 3,
                min_blocks: 2,
                mma: true,
            },
            // 16 x 16 threads with 8 x 8 outputs each.
            (DType::F32, false) => Config {
                bm: 128,
                bn: 128,
                bk: 8,
                x: 8,
                y: 8,
                stages: 2,
                min_blocks: 1,
                mma: false,
            },
            // 16 x 16 threads with 4 x 8 outputs each, twice.
            (DType::F32, true) => Config {
                bm: 64,
                bn: 128,
                bk: 8,
                x: 4,
                y: 8,
                stages: 2,
                min_blocks: 1,
                mma: false,
            },
        }
    }

    pub(crate) fn threads(&self) -> u32 {
        if self.mma {
            self.x * self.y * 32
        } else {
            (self.bm / self.x) * (self.bn / self.y)
        }
    }

    /// Mirrors `GemmMma::kSmemBytes` / `GemmSimt::kSmemBytes`; the generated file checks the two
    /// agree with a `static_assert`.
    pub(crate) fn smem_bytes(&self, la: MatLayout, lb: MatLayout, dual: bool) -> u32 {
        let nb = if dual { 2 } else { 1 };
        if self.mma {
            let tile = |rows: u32, cols: u32| rows * (cols + 8);
            let a = match la {
                MatLayout::N => tile(self.bm, self.bk),
                MatLayout::T => tile(self.bk, self.bm),
            };
            let b = match lb {
                MatLayout::T => tile(self.bn, self.bk),
                MatLayout::N => tile(self.bk, self.bn),
            };
            self.stages * (a + nb * b) * 2
        } else {
            2 * (self.bk * self.bm + nb * self.bk * self.bn) * 4
        }
    }

    pub(crate) fn template(&self) -> String {
        if self.mma {
            format!(
                "mlpc::MmaConfig<{}, {}, {}, {}, {}, {}>",
                self.bm, self.bn, self.bk, self.x, self.y, self.stages
            )
        } else {
            format!(
                "mlpc::SimtConfig<{}, {}, {}, {}, {}>",
                self.bm, self.bn, self.bk, self.x, self.y
            )
        }
    }
}

/// The f32 GEMM on the FP64 tensor cores (`GemmDmma` in `gemm_dmma.cuh`): the FFMA kernel's
/// tile and launch (threads and grid), which it runs itself for inputs its copies cannot take;
/// 8 warps as 2 x 4, `stages` stages of `slices` 16-deep k slices.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DmmaConfig {
    pub(crate) bm: u32,
    pub(crate) bn: u32,
    pub(crate) warps_m: u32,
    pub(crate) warps_n: u32,
    pub(crate) stages: u32,
    pub(crate) slices: u32,
    pub(crate) dual: bool,
}

impl DmmaConfig {
    /// Plain GEMMs: 128 x 128 tiles, warps of 64 x 32 (128 f64 accumulator registers a thread),
    /// 2 stages of four slices of 16 KB. Dual GEMMs: 64 x 128 tiles, warps of 32 x 32 for the
    /// gate and the up accumulators (the same 128 registers), 2 stages of four slices of 20 KB.
    /// One CTA per SM: half as wide tiles at two CTAs per SM (64 accumulator registers, 128 in
    /// all) spilled. Stages x slices on the H200 (gpt2-mlp and bert-large f32, T = 8192):
    /// 4 x 1 1.632 / 2.865 ms, 3 x 2 1.566 / 2.740, 4 x 2 1.576 / 2.737, 2 x 4 1.501 / 2.614,
    /// 3 x 4 1.504 / 2.625: a barrier a stage is what costs.
    pub(crate) fn for_gemm(dual: bool) -> DmmaConfig {
        let cfg = Config::choose(DType::F32, dual);
        DmmaConfig {
            bm: cfg.bm,
            bn: cfg.bn,
            warps_m: 2,
            warps_n: 4,
            stages: 2,
            slices: 4,
            dual,
        }
    }

    pub(crate) fn threads(&self) -> u32 {
        self.warps_m * self.warps_n * 32
    }

    /// Mirrors `GemmDmma::kSmemBytes` (checked by the generated file's `static_assert`).
    pub(crate) fn smem_bytes(&self) -> u32 {
        let b_rows = if self.dual { 2 * self.bn } else { self.bn };
        self.stages * self.slices * (self.bm + b_rows) * 16 * 4
    }

    pub(crate) fn template(&self) -> String {
        format!(
            "mlpc::DmmaConfig<{}, {}, {}, {}, {}, {}>",
            self.bm, self.bn, self.warps_m, self.warps_n, self.stages, self.slices
        )
    }

    pub(crate) fn tag(&self) -> String {
        format!("{}x{}x16_dmma", self.bm, self.bn)
    }
}

/// The role of one epilogue operand slot.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SlotKind {
    Bias,
    Add,
    Mul,
}

impl SlotKind {
    fn name(self) -> &'static str {
        match self {
            SlotKind::Bias => "bias",
            SlotKind::Add => "add",
            SlotKind::Mul => "mul",
        }
    }
}

/// The matrix operands of a GEMM kernel, checked: logical views and physical layouts.
struct Operands {
    a: MatrixView,
    c: MatrixView,
    la: MatLayout,
    lda: Extent,
    lb: MatLayout,
    ldb: Extent,
    /// The row stride of the up weight of a dual GEMM.
    up: Option<Extent>,
}

impl Operands {
    fn new(ctx: &Ctx<'_>, g: &Gemm) -> Result<Operands, CodegenError> {
        let kname = ctx.name();
        let dual = g.dual.is_some();

        let layout_err = |b: &mlpc_ir::Buffer, reason: String| CodegenError::Layout {
            kernel: kname.clone(),
            buffer: b.name.clone(),
            ty: b.ty.to_string(),
            reason,
        };
        let view = |b: &mlpc_ir::Buffer| matrix_view(&b.ty).map_err(|r| layout_err(b, r));
        let oriented = |b: &mlpc_ir::Buffer, l: MatLayout| {
            view(b).map(|v| match l {
                MatLayout::N => v,
                MatLayout::T => v.transposed(),
            })
        };
        let shape_err = |what: String, expected: &Extent, actual: &Extent| CodegenError::Shape {
            kernel: kname.clone(),
            what,
            expected: expected.to_string(),
            actual: actual.to_string(),
        };

        // Logical A [M, K], B [K, N], C [M, N].
        let a = oriented(ctx.args[0], g.a)?;
        let b = oriented(ctx.args[1], g.b)?;
        let c = view(ctx.out)?;
        let (m, k, n) = (&c.rows, &a.cols, &c.cols);
        if &a.rows != m {
            return Err(shape_err(
                format!("the row count of A `{}`", ctx.args[0].name),
                m,
                &a.rows,
            ));
        }
        if &b.rows != k {
            return Err(shape_err(
                format!("the row count of B `{}`", ctx.args[1].name),
                k,
                &b.rows,
            ));
        }
        if &b.cols != n {
            return Err(shape_err(
                format!("the column count of B `{}`", ctx.args[1].name),
                n,
                &b.cols,
            ));
        }
        check_output_columns(ctx, &c)?;

        // Physical layouts: which dimension of each operand is contiguous.
        let (la, lda) = a_layout(ctx, &a)?;
        let b_phys = |bv: &MatrixView, buf: &mlpc_ir::Buffer| {
            if is_one(&bv.row_stride) {
                Ok((MatLayout::T, bv.col_stride.clone()))
            } else if is_one(&bv.col_stride) {
                Ok((MatLayout::N, bv.row_stride.clone()))
            } else {
                Err(layout_err(buf, "neither K nor N is contiguous".to_string()))
            }
        };
        let (lb, ldb) = b_phys(&b, ctx.args[1])?;
        let up = if dual {
            let bu = oriented(ctx.args[2], g.b)?;
            if bu.rows != b.rows || bu.cols != b.cols {
                return Err(shape_err(
                    format!("the shape of up B `{}`", ctx.args[2].name),
                    &b.rows.checked_mul(&b.cols).unwrap_or(Extent::constant(0)),
                    &bu.rows.checked_mul(&bu.cols).unwrap_or(Extent::constant(0)),
                ));
            }
            let (lbu, ldbu) = b_phys(&bu, ctx.args[2])?;
            if lbu != lb {
                return Err(layout_err(
                    ctx.args[2],
                    format!(
                        "the up weight is stored {} but the gate weight {}; both must match",
                        lbu.letter(),
                        lb.letter()
                    ),
                ));
            }
            Some(ldbu)
        } else {
            None
        };

        Ok(Operands {
            a,
            c,
            la,
            lda,
            lb,
            ldb,
            up,
        })
    }

    /// The Hopper configuration the heuristic picks (see `wgmma::select`).
    fn hopper(&self, ctx: &Ctx<'_>, dual: bool) -> Option<crate::wgmma::WgmmaConfig> {
        let strides: Vec<&Extent> = [&self.lda, &self.ldb]
            .into_iter()
            .chain(self.up.as_ref())
            .collect();
        crate::wgmma::select(
            ctx.opts.arch,
            ctx.out.ty.dtype,
            dual,
            (self.la, self.lb),
            &strides,
            &self.a.cols,
            &self.c.cols,
        )
    }

    /// Whether the copy engine can store the output: a tensor map describes it when its columns
    /// are contiguous and its rows a constant multiple of 16 bytes (8 16-bit elements) apart.
    fn tma_storable(&self) -> bool {
        is_one(&self.c.col_stride) && self.c.row_stride.as_constant().is_some_and(|s| s % 8 == 0)
    }

    /// The tuning key of an f32 GEMM (plain or dual) that the FP64 tensor-core kernel can run
    /// (sm_90 or sm_90a, both operands k-contiguous, constant K and N); its choices are
    /// [`f32_candidates`].
    fn f32_tunable(&self, ctx: &Ctx<'_>, dual: bool) -> Option<TileKey> {
        let fits = matches!(ctx.opts.arch, Arch::Sm90 | Arch::Sm90a)
            && ctx.out.ty.dtype == DType::F32
            && self.la == MatLayout::N
            && self.lb == MatLayout::T;
        if !fits {
            return None;
        }
        Some(TileKey {
            dtype: DType::F32,
            dual,
            k: self.a.cols.as_constant()?,
            n: self.c.cols.as_constant()?,
            sparse: false,
            block: [0, 0],
        })
    }

    /// The tuning key of the GEMM and its heuristic configuration, when it is tunable.
    fn tunable(&self, ctx: &Ctx<'_>, dual: bool) -> Option<(TileKey, crate::wgmma::WgmmaConfig)> {
        let h = self.hopper(ctx, dual).filter(|h| h.family == Family::Tma)?;
        let key = TileKey {
            dtype: ctx.out.ty.dtype,
            dual,
            k: self.a.cols.as_constant()?,
            n: self.c.cols.as_constant()?,
            sparse: false,
            block: [0, 0],
        };
        Some((key, h))
    }
}

/// The tile key and valid tile choices of a GEMM kernel (the heuristic's first), or `None` when
/// it is not tunable.
pub(crate) fn tile_candidates(
    ctx: &Ctx<'_>,
    g: &Gemm,
) -> Result<Option<(TileKey, Vec<TileChoice>)>, CodegenError> {
    let dual = g.dual.is_some();
    let ops = Operands::new(ctx, g)?;
    if let Some(key) = ops.f32_tunable(ctx, dual) {
        let cfg = Config::choose(DType::F32, dual);
        return Ok(Some((key, f32_candidates(cfg.bm, cfg.bn))));
    }
    Ok(ops
        .tunable(ctx, dual)
        .map(|(key, h)| (key, crate::wgmma::candidates(h, dual, key.n))))
}

/// The choices of a tunable f32 GEMM whose FFMA kernel takes `bm` x `bn` tiles: the FP64
/// tensor-core kernel on that tile and launch (the heuristic's: 1.5x the FFMA kernel on the
/// H200, 2x on block-sparse GEMMs; docs/perf-notes.md), then the FFMA kernel.
pub(crate) fn f32_candidates(bm: u32, bn: u32) -> Vec<TileChoice> {
    let ffma = TileChoice {
        bm,
        ..TileChoice::new(bn, 1)
    };
    vec![ffma.on_fp64_tensor_cores(), ffma]
}

/// The FP64 tensor-core choice of a tunable f32 GEMM (its key, if it has one, and its
/// candidates), or `None` for the FFMA kernel: the choice in `ctx.tiles` for its key, which
/// must be one of the candidates, else the heuristic's (the first candidate).
pub(crate) fn f32_fp64_choice(
    ctx: &Ctx<'_>,
    key: Option<TileKey>,
    candidates: &[TileChoice],
) -> Result<Option<TileChoice>, CodegenError> {
    let Some(key) = key else {
        return Ok(None);
    };
    match ctx.tiles.get(&key) {
        None => Ok(candidates.first().copied().filter(|c| c.fp64_tensor)),
        Some(c) if candidates.contains(&c) => Ok(c.fp64_tensor.then_some(c)),
        Some(c) => Err(CodegenError::TileChoice {
            kernel: ctx.name(),
            key: key.to_string(),
            choice: c.to_string(),
            reason: format!(
                "this f32 GEMM takes {}",
                candidates
                    .iter()
                    .map(|c| format!("`{c}`"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        }),
    }
}

pub fn generate(ctx: &Ctx<'_>, g: &Gemm) -> Result<CudaKernel, CodegenError> {
    let kname = ctx.name();
    let dtype = ctx.out.ty.dtype;
    let dual = g.dual.is_some();
    let ops = Operands::new(ctx, g)?;
    // B (and Bu) do not change during a run (weights, or the caller's inputs): the small-M
    // entries may load them before the kernel before has finished (early launch).
    let const_b = ctx.args[1..g.matrix_operands()]
        .iter()
        .all(|b| matches!(b.kind, BufferKind::Input | BufferKind::Weight));
    let cfg = Config::choose(dtype, dual);
    let dmma = f32_fp64_choice(
        ctx,
        ops.f32_tunable(ctx, dual),
        &f32_candidates(cfg.bm, cfg.bn),
    )?
    .map(|_| DmmaConfig::for_gemm(dual));
    let heuristic = ops.hopper(ctx, dual);
    let chosen = match ops.tunable(ctx, dual) {
        Some((key, h)) => match ctx.tiles.get(&key) {
            Some(choice) => Some(crate::wgmma::with_choice(h, dual, key.n, choice).map_err(
                |reason| CodegenError::TileChoice {
                    kernel: kname.clone(),
                    key: key.to_string(),
                    choice: choice.to_string(),
                    reason,
                },
            )?),
            None => Some(h),
        },
        None => heuristic,
    };
    let hopper = chosen
        // The epilogue's stores by the copy engine, where the output and the tile's shared
        // memory allow (decided after the tile, whose ring it shares).
        .map(|h| h.with_tma_store(dual, ops.tma_storable()))
        // Split K where the GEMM is deep enough (the runtime splits only short grids).
        .map(|h| h.with_split_k(&ops.a.cols, dual));
    // The heuristic's wide tiles of a deep GEMM come with smaller ones for the grids that would
    // split K (`ShortGrid`); another tile the tuner chose stands alone.
    let short = hopper
        .filter(|h| h.family == Family::Tma && chosen == heuristic)
        .and_then(|h| h.short_grid(&ops.a.cols, dual, ops.tma_storable()));
    let Operands {
        a,
        c,
        la,
        lda,
        lb,
        ldb,
        up,
    } = ops;
    let (m, k, n) = (&c.rows, &a.cols, &c.cols);
    let mut syms = Symbols::default();
    let epi = epilogue_code(ctx, g, m, n, &mut syms)?;
    let (n_slots, epi_lines, epi_type, summary, name_parts) =
        (epi.n_slots, epi.lines, epi.ty, epi.summary, epi.name_parts);
    let mut arg_names: Vec<String> = vec!["a".into(), "b".into()];
    if dual {
        arg_names.push("b_up".into());
    }
    arg_names.extend(epi.arg_names);
    arg_names.push("out".into());

    // sm_90a: K-major f16 / bf16 operands take the wgmma family (see wgmma.rs), with the tile
    // of the heuristic or of `ctx.tiles`.
    // f32 on sm_90 / sm_90a where `ctx.tiles` chooses it: the FP64 tensor-core kernel, which
    // keeps the FFMA kernel's threads, tile and grid (see `DmmaConfig`).
    let threads = match (hopper, dmma) {
        (Some(h), _) => h.threads(),
        (None, Some(d)) => d.threads(),
        (None, None) => cfg.threads(),
    };
    let smem = match (hopper, dmma) {
        (Some(h), _) => h.smem_bytes(dual),
        (None, Some(d)) => d.smem_bytes(),
        (None, None) => cfg.smem_bytes(la, lb, dual),
    };
    let (bm, bn) = hopper.map_or((cfg.bm, cfg.bn), |h| (h.bm, h.bn));
    let elem = cpp::elem_type(dtype);

    let entry = format!(
        "mlpc_{}_{}_{}{}_{}",
        name_parts.join("_"),
        dtype.name(),
        la.letter(),
        lb.letter(),
        match (hopper, dmma) {
            (Some(h), _) => h.tag(),
            (None, Some(d)) => d.tag(),
            (None, None) => format!("{}x{}x{}", cfg.bm, cfg.bn, cfg.bk),
        }
    );

    // Body: fill the parameter struct.
    let mut body = Vec::new();
    body.push(format!("    mlpc::GemmParams<{elem}, {n_slots}> p;"));
    body.push("    p.a = a;".to_string());
    body.push("    p.b = b;".to_string());
    body.push(format!(
        "    p.b_up = {};",
        if dual { "b_up" } else { "nullptr" }
    ));
    body.push("    p.c = out;".to_string());
    body.push(format!("    p.m = {};", syms.expr(m)));
    body.push(format!("    p.n = {};", syms.expr(n)));
    body.push(format!("    p.k = {};", syms.expr(k)));
    body.push(format!("    p.lda = {};", syms.expr(&lda)));
    body.push(format!("    p.ldb = {};", syms.expr(&ldb)));
    body.push(format!(
        "    p.ldb_up = {};",
        up.as_ref()
            .map_or_else(|| "0".to_string(), |e| syms.expr(e))
    ));
    body.push(format!("    p.ldc = {};", syms.expr(&c.row_stride)));
    body.extend(epi_lines);
    let fill = body.clone();
    let tma = hopper.is_some_and(|h| h.family == Family::Tma);
    // The output's map, where an entry of the module stores by the copy engine.
    let store_map = [hopper, short]
        .iter()
        .any(|h| h.is_some_and(|h| h.tma_store));
    // The call of a TMA kernel of the module (`kernel`, reading B through `tm_b`), passed the
    // workspace (`ws`) by the split-K entries.
    let tma_run = |kernel: &str, tm_b: &str, ws: &str| {
        // Unused maps are passed as another map of the kernel.
        let bu = if dual { "tm_bu" } else { tm_b };
        let tc = if store_map { "tm_c" } else { "tm_a" };
        format!("    {kernel}::run(p, tm_a, {tm_b}, {bu}, {tc}{ws});")
    };
    if tma {
        body.push(tma_run("Kernel", "tm_b", ""));
    } else {
        body.push("    Kernel::run(p);".to_string());
    }

    let symbols = syms.into_sorted();
    let template = if cfg.mma { "GemmMma" } else { "GemmSimt" };
    let include = if cfg.mma {
        "gemm_mma.cuh"
    } else {
        "gemm_simt.cuh"
    };
    // The main entry never splits K (its code stays that of the kernel without it); the split
    // entry is a second one.
    let no_split = hopper.map(|h| crate::wgmma::WgmmaConfig {
        split_k: false,
        ..h
    });
    let (template, include, config) = match (no_split, dmma) {
        (Some(h), _) if tma => ("GemmWgmmaTma", "gemm_wgmma.cuh", h.template()),
        (Some(h), _) => ("GemmWgmma", "gemm_wgmma.cuh", h.template()),
        (None, Some(d)) => ("GemmDmma", "gemm_dmma.cuh", d.template()),
        (None, None) => (template, include, cfg.template()),
    };
    // The TMA kernel reads A, B (and Bu) through tensor maps, passed after the symbols; the
    // small-M entries of the module take the same arguments and ignore them.
    let mut maps: Vec<(&str, Param)> = Vec::new();
    if let Some(h) = hopper.filter(|_| tma) {
        let map = |buf: usize, rows: &Extent, ld: &Extent, box_rows: u32| Param::TensorMap {
            buffer: ctx.kernel.args[buf],
            rows: rows.clone(),
            cols: k.clone(),
            row_stride: ld.clone(),
            box_rows,
            box_cols: crate::wgmma::BK,
        };
        // With clusters each CTA copies its share of the shared tile's rows (into every CTA).
        let (share_a, share_b) = match (h.cluster.max(1), h.share_b) {
            (c, true) => (1, c),
            (c, false) => (c, 1),
        };
        maps.push(("tm_a", map(0, m, &lda, h.bm / share_a)));
        maps.push(("tm_b", map(1, n, &ldb, h.bn / share_b)));
        if let Some(ldbu) = &up {
            maps.push(("tm_bu", map(2, n, ldbu, h.bn / share_b)));
        }
        if let Some(s) = short {
            maps.push(("tm_bs", map(1, n, &ldb, s.bn)));
        }
        if store_map {
            maps.push(("tm_c", output_store_map(ctx, &c, m, n)));
        }
    }
    let map_names: Vec<&str> = maps.iter().map(|(name, _)| *name).collect();
    let mut sig = signature(elem, &arg_names, ctx.args.len(), &symbols, &map_names);
    // Split K: a second entry, and the run's workspace as the last argument of every entry
    // (`Param::Workspace`).
    let split_entry = format!("{entry}_splitk");
    let split = hopper
        .filter(|_| tma)
        .and_then(|h| h.split(k, dual, &split_entry));
    if split.is_some() {
        sig.push_str(",\n    unsigned char* __restrict__ workspace");
    }
    // A plain ping-pong GEMM: its tile on the cooperative schedule as a second entry, for grids
    // whose blocks have one tile each (same threads and, checked, the same shared memory).
    let coop_entry = format!("{entry}_coop");
    let coop = no_split
        .filter(|h| tma && h.pingpong && !dual && h.cluster == 1)
        .map(|h| crate::wgmma::WgmmaConfig {
            pingpong: false,
            ..h
        })
        .filter(|c| c.smem_bytes(dual) == smem && c.threads() == threads);
    let mut src = ctx.header(&format!("out[m, n] = {summary}"), &arg_names);
    src.push_str(&format!("#include \"{include}\"\n\n"));
    src.push_str("namespace {\n");
    src.push_str(&format!("using Config = {config};\n"));
    src.push_str(&format!("using Epilogue = {epi_type};\n"));
    if tma {
        src.push_str(&format!(
            "using Kernel = mlpc::{template}<{elem}, Config, Epilogue>;\n"
        ));
        if let Some(c) = coop {
            src.push_str(&format!("using CoopConfig = {};\n", c.template()));
            src.push_str(&format!(
                "using CoopKernel = mlpc::{template}<{elem}, CoopConfig, Epilogue>;\n"
            ));
            src.push_str(
                "static_assert(CoopKernel::kSmemBytes == Kernel::kSmemBytes && \
                 CoopKernel::kThreads == Kernel::kThreads, \"one launch description for both \
                 entries\");\n",
            );
        }
        if let Some(s) = short {
            let whole = crate::wgmma::WgmmaConfig {
                split_k: false,
                ..s
            };
            src.push_str(&format!("using ShortConfig = {};\n", whole.template()));
            src.push_str(&format!(
                "using ShortKernel = mlpc::{template}<{elem}, ShortConfig, Epilogue>;\n"
            ));
            src.push_str(&format!(
                "static_assert(ShortKernel::kThreads == {} && ShortKernel::kSmemBytes == {}, \
                 \"launch description of the short-grid entry\");\n",
                s.threads(),
                s.smem_bytes(dual)
            ));
            src.push_str(&format!("using ShortSplitConfig = {};\n", s.template()));
            src.push_str(&format!(
                "using ShortSplitKernel = mlpc::{template}<{elem}, ShortSplitConfig, Epilogue>;\n"
            ));
            src.push_str(
                "static_assert(ShortSplitKernel::kSmemBytes == ShortKernel::kSmemBytes, \"one \
                 launch description for both short-grid entries\");\n",
            );
        }
        if let Some(h) = hopper.filter(|_| split.is_some()) {
            src.push_str(&format!("using SplitConfig = {};\n", h.template()));
            src.push_str(&format!(
                "using SplitKernel = mlpc::{template}<{elem}, SplitConfig, Epilogue>;\n"
            ));
            src.push_str(
                "static_assert(SplitKernel::kSmemBytes == Kernel::kSmemBytes, \"one launch \
                 description for both entries\");\n",
            );
        }
    } else {
        src.push_str(&format!(
            "using Kernel = mlpc::{template}<{elem}, {}, {}, Config, Epilogue>;\n",
            cpp::layout(la),
            cpp::layout(lb)
        ));
    }
    src.push_str(&format!(
        "static_assert(Kernel::kThreads == {threads}, \"block size of the launch description\");\n"
    ));
    src.push_str(&format!(
        "static_assert(Kernel::kSmemBytes == {smem}, \"shared memory of the launch description\");\n"
    ));
    src.push_str("}  // namespace\n\n");
    // A cluster shape compiled into the entry: `cuLaunchKernel` and graph kernel nodes then
    // launch clusters with no launch attribute (the grid's x is a multiple of it).
    let cluster_dims = match hopper.filter(|h| tma && h.cluster > 1) {
        Some(h) => format!("__cluster_dims__({}, 1, 1) ", h.cluster),
        None => String::new(),
    };
    src.push_str(&format!(
        "extern \"C\" __global__ void {cluster_dims}__launch_bounds__({threads}, {}) {entry}(\n{}) {{\n",
        hopper.map_or(cfg.min_blocks, |h| h.ctas),
        sig
    ));
    src.push_str(&body.join("\n"));
    src.push_str("\n}\n");
    let fill_text = fill.join("\n");
    if coop.is_some() {
        push_entry(
            &mut src,
            "// The same tile on the cooperative schedule (launched instead of the entry above when \
             every\n// CTA has at most one tile: both consumer warpgroups on it).\n",
            (threads, 1),
            (&coop_entry, &sig),
            &fill_text,
            &tma_run("CoopKernel", "tm_b", ""),
        );
    }
    if split.is_some() {
        push_entry(
            &mut src,
            "// Split K: the same GEMM, each tile's k slices split over `gridDim.x / tiles` CTAs \
             (launched\n// instead of the entry above when the runtime splits the grid).\n",
            (threads, hopper.map_or(cfg.min_blocks, |h| h.ctas)),
            (&split_entry, &sig),
            &fill_text,
            &tma_run("SplitKernel", "tm_b", ", workspace"),
        );
    }
    let short_entry = format!("{entry}_short");
    let short_split_entry = format!("{short_entry}_splitk");
    if let Some(s) = short {
        let comment = format!(
            "// The same GEMM on {}x{} tiles (launched instead of the entries above when the grid \
             of theirs\n// would split K), and that entry with split K.\n",
            s.bm, s.bn
        );
        let call = tma_run("ShortKernel", "tm_bs", "");
        push_entry(
            &mut src,
            &comment,
            (s.threads(), 1),
            (&short_entry, &sig),
            &fill_text,
            &call,
        );
        let call = tma_run("ShortSplitKernel", "tm_bs", ", workspace");
        push_entry(
            &mut src,
            "",
            (s.threads(), 1),
            (&short_split_entry, &sig),
            &fill_text,
            &call,
        );
    }
    let small_m = crate::gemv::append(
        &mut src,
        &crate::gemv::Parts {
            arch: ctx.opts.arch,
            dtype,
            dual,
            la,
            lb,
            m,
            n,
            k,
            entry: &entry,
            epilogue: &epi_type,
            const_b,
            signature: &sig,
            fill: &fill,
        },
    );

    let mut params = ctx.buffer_params();
    params.extend(dim_params(&symbols));
    params.extend(maps.into_iter().map(|(_, p)| p));
    if split.is_some() {
        params.push(Param::Workspace);
    }
    let short_grid = short.map(|s| ShortGrid {
        entry: short_entry,
        launch: Launch {
            block: [s.threads(), 1, 1],
            smem_bytes: s.smem_bytes(dual),
            early_launch: false,
            walk_costs: Vec::new(),
            grid: Grid::Persistent {
                m: m.clone(),
                n: n.clone(),
                tile_m: s.bm,
                tile_n: s.bn,
                per_sm: s.ctas,
                cluster: 1,
                cluster_rows: false,
                split_k: s.split(k, dual, &short_split_entry),
                one_tile: None,
            },
        },
    });
    let (m, n) = (m.clone(), n.clone());
    let grid = if let Some(h) = hopper.filter(|_| tma) {
        Grid::Persistent {
            m,
            n,
            tile_m: bm,
            tile_n: bn,
            per_sm: h.ctas,
            cluster: h.cluster,
            cluster_rows: h.share_b,
            split_k: split,
            one_tile: coop.map(|_| coop_entry),
        }
    } else {
        Grid::Tiles {
            m,
            n,
            tile_m: bm,
            tile_n: bn,
        }
    };
    Ok(CudaKernel {
        name: kname.clone(),
        entry,
        source: src,
        launch: Launch {
            block: [threads, 1, 1],
            smem_bytes: smem,
            early_launch: false,
            walk_costs: Vec::new(),
            grid,
        },
        params,
        small_m,
        relayouts: Vec::new(),
        short_grids: short_grid.into_iter().collect(),
        tile_fixed_cols: 0,
    })
}

/// Appends a further entry to a GEMM module: after a blank line, `comment` (whole lines, or
/// nothing), the entry `name` over the module's signature `sig` with its launch bounds, the
/// parameter fill and the kernel's `call`.
fn push_entry(
    src: &mut String,
    comment: &str,
    (threads, blocks): (u32, u32),
    (name, sig): (&str, &str),
    fill: &str,
    call: &str,
) {
    src.push_str(&format!(
        "\n{comment}extern \"C\" __global__ void __launch_bounds__({threads}, {blocks}) \
         {name}(\n{sig}) {{\n{fill}\n{call}\n}}\n"
    ));
}

/// The fused epilogue of a GEMM kernel, as pieces of the generated entry.
pub(crate) struct EpilogueCode {
    /// Number of epilogue operands (`p.epi[0..n_slots]`).
    pub n_slots: usize,
    /// The `p.epi[j] = {...};` lines.
    pub lines: Vec<String>,
    /// Argument names of the epilogue operands (`e0_bias`, ...), in operand order.
    pub arg_names: Vec<String>,
    /// `mlpc::SingleEpilogue<...>` or `mlpc::DualEpilogue<...>`.
    pub ty: String,
    /// The formula of the output, e.g. `gelu(A @ B + e0[n])`.
    pub summary: String,
    /// Entry-name parts: `gemm`, `bias`, `gelu`, or `dual_gemm`, gate steps, `x`, up steps, ...
    pub name_parts: Vec<String>,
}

/// Checks the epilogue operands of the GEMM `g` (operands after its matrix operands) against the
/// `[m, n]` output and renders the epilogue; symbols used by strides go to `syms`.
fn layout_error(ctx: &Ctx<'_>, b: &mlpc_ir::Buffer, reason: String) -> CodegenError {
    CodegenError::Layout {
        kernel: ctx.name(),
        buffer: b.name.clone(),
        ty: b.ty.to_string(),
        reason,
    }
}

/// The output's columns must be contiguous (or there is only one).
/// The tensor map through which the epilogue's stores by the copy engine write the output `c`
/// (`m` x `n`): boxes of 64 x 64, the staging buffers' chunks (`wgmma_detail::store_chunk_tma`,
/// `GemmBsrWgmma::store_tma`).
pub(crate) fn output_store_map(ctx: &Ctx<'_>, c: &MatrixView, m: &Extent, n: &Extent) -> Param {
    Param::TensorMap {
        buffer: ctx.kernel.out,
        rows: m.clone(),
        cols: n.clone(),
        row_stride: c.row_stride.clone(),
        box_rows: 64,
        box_cols: 64,
    }
}

pub(crate) fn check_output_columns(ctx: &Ctx<'_>, c: &MatrixView) -> Result<(), CodegenError> {
    if !is_one(&c.col_stride) && c.cols.as_constant() != Some(1) {
        return Err(layout_error(
            ctx,
            ctx.out,
            format!(
                "the output's columns must be contiguous, not {} apart",
                c.col_stride
            ),
        ));
    }
    Ok(())
}

/// The physical layout of A (which of M and K is contiguous) and its leading dimension.
pub(crate) fn a_layout(ctx: &Ctx<'_>, a: &MatrixView) -> Result<(MatLayout, Extent), CodegenError> {
    if is_one(&a.col_stride) {
        Ok((MatLayout::N, a.row_stride.clone()))
    } else if is_one(&a.row_stride) {
        Ok((MatLayout::T, a.col_stride.clone()))
    } else {
        Err(layout_error(
            ctx,
            ctx.args[0],
            "neither M nor K is contiguous".to_string(),
        ))
    }
}

pub(crate) fn epilogue_code(
    ctx: &Ctx<'_>,
    g: &Gemm,
    m: &Extent,
    n: &Extent,
    syms: &mut Symbols,
) -> Result<EpilogueCode, CodegenError> {
    let kname = ctx.name();
    let nmat = g.matrix_operands();
    let layout_err = |b: &mlpc_ir::Buffer, reason: String| CodegenError::Layout {
        kernel: kname.clone(),
        buffer: b.name.clone(),
        ty: b.ty.to_string(),
        reason,
    };
    let view = |b: &mlpc_ir::Buffer| matrix_view(&b.ty).map_err(|r| layout_err(b, r));
    let shape_err = |what: String, expected: &Extent, actual: &Extent| CodegenError::Shape {
        kernel: kname.clone(),
        what,
        expected: expected.to_string(),
        actual: actual.to_string(),
    };
    // Epilogue operand slots: operand nmat + j is `p.epi[j]`.
    let n_slots = ctx.args.len() - nmat;
    let mut slots: Vec<Option<SlotKind>> = vec![None; n_slots];
    for step in g.all_steps() {
        let (operand, kind) = match *step {
            Epilogue::Bias { operand } => (operand, SlotKind::Bias),
            Epilogue::Add { operand } => (operand, SlotKind::Add),
            Epilogue::Mul { operand } => (operand, SlotKind::Mul),
            Epilogue::Act(_) => continue,
        };
        let slot = operand
            .checked_sub(nmat)
            .filter(|&j| j < n_slots)
            .ok_or_else(|| CodegenError::Epilogue {
                kernel: kname.clone(),
                operand,
                problem: format!(
                    "is not one of the epilogue operands {nmat}..{}",
                    ctx.args.len()
                ),
            })?;
        if slots[slot].replace(kind).is_some() {
            return Err(CodegenError::Epilogue {
                kernel: kname.clone(),
                operand,
                problem: "is used by two steps".to_string(),
            });
        }
    }

    let mut epi_lines = Vec::new();
    let mut arg_names: Vec<String> = Vec::new();
    for (j, kind) in slots.iter().enumerate() {
        let operand = nmat + j;
        let buf = ctx.args[operand];
        let kind = kind.ok_or_else(|| CodegenError::Epilogue {
            kernel: kname.clone(),
            operand,
            problem: "is not used by any epilogue step".to_string(),
        })?;
        let v = view(buf)?;
        if &v.cols != n {
            return Err(shape_err(
                format!("the column count of `{}`", buf.name),
                n,
                &v.cols,
            ));
        }
        let row_stride = match kind {
            SlotKind::Bias if v.rows.as_constant() == Some(1) => Extent::constant(0),
            SlotKind::Bias => {
                return Err(shape_err(
                    format!("the row count of bias `{}`", buf.name),
                    &Extent::constant(1),
                    &v.rows,
                ))
            }
            _ if &v.rows == m => v.row_stride.clone(),
            _ if v.rows.as_constant() == Some(1) => Extent::constant(0),
            _ => {
                return Err(shape_err(
                    format!("the row count of `{}`", buf.name),
                    m,
                    &v.rows,
                ))
            }
        };
        let name = format!("e{j}_{}", kind.name());
        epi_lines.push(format!(
            "    p.epi[{j}] = {{{name}, {}, {}}};",
            syms.expr(&row_stride),
            syms.expr(&v.col_stride)
        ));
        arg_names.push(name);
    }

    // Epilogue type and a readable formula.
    let chain = |steps: &[Epilogue]| -> String {
        let parts: Vec<String> = steps
            .iter()
            .map(|s| match *s {
                Epilogue::Bias { operand } => format!("mlpc::Bias<{}>", operand - nmat),
                Epilogue::Add { operand } => format!("mlpc::AddTensor<{}>", operand - nmat),
                Epilogue::Mul { operand } => format!("mlpc::MulTensor<{}>", operand - nmat),
                Epilogue::Act(a) => format!("mlpc::Act<{}>", cpp::act_kind(a)),
            })
            .collect();
        format!("mlpc::Chain<{}>", parts.join(", "))
    };
    let formula = |steps: &[Epilogue], start: String| -> String {
        steps.iter().fold(start, |acc, s| match *s {
            Epilogue::Bias { operand } => format!("{acc} + e{}[n]", operand - nmat),
            Epilogue::Add { operand } => format!("{acc} + e{}[m, n]", operand - nmat),
            Epilogue::Mul { operand } => format!("({acc}) * e{}[m, n]", operand - nmat),
            Epilogue::Act(a) => format!("{}({acc})", a.name()),
        })
    };
    let (epi_type, summary) = match &g.dual {
        None => (
            format!("mlpc::SingleEpilogue<{}>", chain(&g.epilogue)),
            formula(&g.epilogue, "A @ B".to_string()),
        ),
        Some(d) => {
            let gate = formula(&d.gate, "A @ B".to_string());
            let up = formula(&d.up, "A @ B_up".to_string());
            (
                format!(
                    "mlpc::DualEpilogue<{}, {}, {}>",
                    chain(&d.gate),
                    chain(&d.up),
                    chain(&g.epilogue)
                ),
                formula(&g.epilogue, format!("({gate}) * ({up})")),
            )
        }
    };

    let steps_name = |steps: &[Epilogue]| -> Vec<String> {
        steps
            .iter()
            .map(|s| match s {
                Epilogue::Bias { .. } => "bias".to_string(),
                Epilogue::Add { .. } => "add".to_string(),
                Epilogue::Mul { .. } => "mul".to_string(),
                Epilogue::Act(a) => a.name().to_string(),
            })
            .collect()
    };
    let mut name_parts: Vec<String> = Vec::new();
    match &g.dual {
        None => name_parts.push("gemm".into()),
        Some(d) => {
            name_parts.push("dual_gemm".into());
            name_parts.extend(steps_name(&d.gate));
            name_parts.push("x".into());
            name_parts.extend(steps_name(&d.up));
            if !g.epilogue.is_empty() {
                name_parts.push("then".into());
            }
        }
    }
    name_parts.extend(steps_name(&g.epilogue));
    Ok(EpilogueCode {
        n_slots,
        lines: epi_lines,
        arg_names,
        ty: epi_type,
        summary,
        name_parts,
    })
}
