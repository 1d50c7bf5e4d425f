//! Block-sparse GEMM kernels: a plan `sparse_gemm` / `sparse_dual_gemm` becomes an instantiation of
//! `GemmBsrWgmma` (`gemm_bsr_wgmma.cuh`: sm_90a, f16 / bf16), `GemmBsrMma` (other f16 / bf16) or
//! `GemmBsrDmma` (f32 on the FP64 tensor cores: sm_90 / sm_90a, A k-contiguous, blocks of 8 to 32
//! rows in multiples of 8 and widths in multiples of 4) or `GemmBsrSimt` (other f32) from
//! `gemm_bsr.cuh`.
//!
//! The block pattern is compiled into the source as `__device__ const int` arrays, so the kernel
//! ABI is unchanged (buffers and symbolic dims only). The packed weight buffers are
//! `[kept, rows, cols]` as the IR defines them.
//!
//! # `GemmBsrMma` / `GemmBsrSimt`
//! The kept-block lists are compressed sparse rows (`row_ptr`, `col_idx`). One CTA computes a
//! `BM x BN` tile inside one block row of the weight; `BN` is the block's row count rounded up
//! (f32: to 16; f16 / bf16: to 16, 32, 48, 64, 96 or 128, whose warp tiles hold whole pairs of
//! n8 fragments; at most 128, 64 for dual GEMMs), so a block row of more rows than that is split
//! over several CTAs.
//!
//! # `GemmBsrWgmma` (Hopper)
//! Taken for [`Arch::Sm90a`], f16 / bf16, A stored `[M, K]` (no constant row stride that is not a
//! multiple of 8), a block height that is a wgmma N ([`WGMMA_N`]), a block width that is a
//! multiple of 16 and fewer than 32768 block columns. One CTA computes 128 rows of the output and
//! a GROUP of `G` block rows (`G * BR <= 256` columns, 128 for dual GEMMs, `G <= 16`; 352 for
//! 32-row blocks where K >= 4096, 160 for dual GEMMs of them), one accumulator array per block
//! row: consecutive ones, or ones chosen to keep blocks in the same columns ([`Groups`]). Its k loop walks the group's steps: the union of the kept
//! block columns of its rows, each with the mask of the rows that keep it ([`GroupSteps`]). A
//! step's A slice is loaded once for all of them. See the template's comment for the shared
//! layout (swizzled K-major atoms of 64, 32 or 16 elements) and the pipeline; the tests below
//! check its address math against the PTX ISA's canonical layouts on the CPU.
//!
//! # Small M
//! Where [`crate::CodegenOptions::sparse_gemv`] asks for them, f16 / bf16 kernels with A
//! k-contiguous also get weight-streaming entries for few output rows (`gemv_bsr.cuh`, one CTA a
//! block row; `gemv::append_bsr`), which read the weight through the inverse of the
//! module's [`Relayout`] where it has one.

use crate::cpp::{self, Symbols};
use crate::gemm::{
    a_layout, check_output_columns, epilogue_code, f32_candidates, f32_fp64_choice,
    output_store_map, Config,
};
use crate::view::{is_one, matrix_view};
use crate::{
    dim_params, signature, Arch, CodegenError, Ctx, CudaKernel, Grid, Launch, Param, Relayout,
    ShortGrid, TileChoice, TileKey, WALK_CAP,
};
use mlpc_ir::{BlockPattern, DType, Extent, MatLayout, SparseGemm};
use std::fmt::Write;

mod groups;

pub(crate) use groups::{GroupSteps, Groups, PairOrder, StepUnit};

fn round_up(v: u32, to: u32) -> u32 {
    v.div_ceil(to) * to
}

/// The tile configuration of a BSR kernel, in the dense kernel's terms (`MmaConfig`/`SimtConfig`),
/// for an A operand stored in layout `la`.
fn choose(dtype: DType, dual: bool, la: MatLayout, block: [u32; 2]) -> Config {
    let [br, bc] = block;
    let cap = if dual { 64 } else { 128 };
    let mut c = match dtype {
        DType::F16 | DType::Bf16 => {
            // BN: the block's rows rounded up to a tile these warp layouts split into warp tiles
            // of whole pairs of n8 fragments. Warps: 4 along M up to 48 columns (32 x BN each),
            // 4 x 2 at 64 and 96, 2 x 4 at 128 (like the dense kernel). A dual GEMM's two
            // accumulator sets fit the registers only up to 32 columns a warp, so it skips 48.
            // BK = the block's columns rounded to the mma k, at most 32.
            let widths: &[u32] = if dual {
                &[16, 32, 64]
            } else {
                &[16, 32, 48, 64, 96, 128]
            };
            let bn = widths.iter().copied().find(|&w| w >= br).unwrap_or(cap);
            let (bm, x, y) = match bn {
                16 | 32 | 48 => (128, 4, 1),
                64 | 96 => (128, 4, 2),
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
            let bn = round_up(br, 16).clamp(16, cap);
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
    // slice registers need more), and for the dual GEMMs on tensor cores that spilled under 128
    // registers: 32-column tiles (two sets of 32 x 32 accumulators a warp, with a warp's A and
    // both B fragments), and 16-column tiles over 32-deep k slices of a transposed A (its
    // fragments gathered by `ldmatrix.trans` for the whole slice).
    let per_sm = if !c.mma || (dual && dual_needs_registers(&c, la)) {
        256
    } else {
        512
    };
    c.min_blocks = (per_sm / c.threads()).max(1);
    c
}

/// Whether a dual `GemmBsrMma` tile needs more than 128 registers a thread (ptxas spilled
/// these under `__launch_bounds__(128, 4)`, `docs/perf-notes.md`).
fn dual_needs_registers(c: &Config, la: MatLayout) -> bool {
    c.bn == 32 || (c.bn == 16 && c.bk == 32 && la == MatLayout::T)
}

/// `name[len] = {v, v, ...};`, 16 values per line.
pub(crate) fn int_array(name: &str, values: &[u32]) -> String {
    typed_array("int", name, values)
}

/// The narrowest of the index types the tables use that holds every value of `values`:
/// `unsigned short` up to 65535, else `int`.
pub(crate) fn index_type(values: &[u32]) -> &'static str {
    match values.iter().all(|&v| v <= u32::from(u16::MAX)) {
        true => "unsigned short",
        false => "int",
    }
}

/// [`int_array`] in the narrowest index type that holds its values ([`index_type`]), for
/// tables the kernels read by name.
pub(crate) fn index_array(name: &str, values: &[u32]) -> String {
    typed_array(index_type(values), name, values)
}

/// The type of the block-index tables a kernel reads through its parameters (`row_ptr` /
/// `col_idx` of the portable kernels, `step_first` / `step_blk` / `step_col1` of the Hopper
/// kernel: the template's `MLPC_BSR_IDX`): 16 bits where the pattern's index width is 2 bytes
/// ([`BlockPattern::index_width`]: at most 65535 kept blocks and block columns), which halves
/// the tables' bytes in the kernel image. Each of those values is a kept block's position (at
/// most the kept count) or a block column.
pub(crate) fn block_index_type(p: &BlockPattern) -> &'static str {
    match p.index_width() {
        2 => "unsigned short",
        _ => "int",
    }
}

/// `name[len] = {v, v, ...};` of element type `ty`, 16 values per line.
pub(crate) fn typed_array(ty: &str, name: &str, values: &[u32]) -> String {
    let mut s = format!("__device__ const {ty} {name}[{}] = {{", values.len());
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

/// The block heights the grouped Hopper kernel has a wgmma for (`wgmma_detail::Mma<T, N>` of
/// gemm_wgmma.cuh).
pub(crate) const WGMMA_N: [u32; 10] = [8, 16, 24, 32, 48, 64, 96, 128, 192, 256];
/// The dynamic shared memory a block may use on sm_90 (227 KiB).
const SMEM_LIMIT: u32 = 227 * 1024;
/// Bytes of one staging buffer of the epilogue's TMA stores (`wgmma_detail::kStagingBufferBytes`).
const STAGING_BUFFER_BYTES: u32 = 64 * 64 * 2;
/// At most this many stages: more buys nothing once the loads of a few slices cover the latency.
/// At density 0.1 (5 slots of 32 x 32 blocks a stage, room for 12): 8 stages 0.0805 ms, 10
/// 0.0788, 12 0.0784 (4096^2, T = 4096, H200; docs/perf-notes.md, block-sparse variant 12).
const MAX_STAGES: u32 = 12;

/// A `GemmBsrWgmma` configuration (`mlpc::BsrWgmmaConfig<BM, G, BK, STAGES>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WgmmaBsr {
    pub bm: u32,
    /// Block rows per CTA.
    pub g: u32,
    /// The k depth of one slice: a divisor of the block width, or `wb` whole blocks.
    pub bk: u32,
    /// Block columns per slice: 1, or 2 for 32-wide blocks (a K window of 64, so that the A piece
    /// is copied in rows of 128 bytes; docs/perf-notes.md, block-sparse variant 8).
    pub wb: u32,
    pub stages: u32,
    /// The A piece of a slice read into registers once and shared by the kept rows' wgmmas.
    pub a_regs: bool,
    /// Each kept block copied as one box of 128-byte rows from a copy of the packed weight
    /// rearranged into the shared-memory image of its slot ([`wide_block_perm`]), instead of
    /// boxes of its own narrower rows: the copy engine's cost follows the rows of its boxes
    /// (docs/perf-notes.md, block-sparse variant 9).
    pub wide: bool,
    /// Block slots per stage: the most blocks any step of the pattern keeps (at most `wb * g`);
    /// a step's j-th kept block takes slot j.
    pub slots: u32,
    /// The epilogue's 8 KB staging buffers per consumer warpgroup: 0 (stores from registers),
    /// or 2 or 1 (the stores by the copy engine; [`WgmmaBsr::with_tma_store`]).
    pub staging_bufs: u32,
    /// With `wb` = 2: a step is two consecutive block columns of the group's union of kept
    /// columns, wherever they lie in the weight ([`GroupSteps::pairs`]), instead of a window of
    /// two neighbouring ones; the A piece is then copied as one box per column.
    pub pairs: bool,
    /// With `pairs`: the pairs balanced by their kept blocks and every step of more than this
    /// many kept blocks split ([`PairOrder::Balanced`]), for plain GEMMs whose natural pairs leave
    /// the ring four stages or fewer where that gives it more ([`SliceForm::choose`]); `None`:
    /// the group's kept columns two by two in increasing order.
    pub pair_cap: Option<u32>,
    /// The groups' block rows chosen to share kept blocks ([`Groups::by_overlap`]) instead of
    /// consecutive ones (the template's `Rows`). Kept only where the copy engine stores each
    /// 32-row block row in a box of its own ([`WgmmaBsr::stored`]).
    pub listed: bool,
    /// With `listed`: the groups balanced by their modelled cost ([`Groups::by_overlap`]).
    pub balanced: bool,
}

impl WgmmaBsr {
    /// One consumer warpgroup (128 threads) per 64 rows, then the producer warpgroup.
    pub fn threads(&self) -> u32 {
        self.bm / 64 * 128 + 128
    }

    /// Mirrors `GemmBsrWgmma::kStageBytes`: the A slice and `slots` block slots of `bk / wb`
    /// columns (twice for dual).
    /// Mirrors `GemmBsrWgmma::kStageBytes`: A's tile and the slots, padded to whole 1024-byte
    /// swizzle periods (where [`slots_for`]'s cap leaves the slots a part of one).
    fn stage_bytes(bm: u32, slots: u32, br: u32, bk: u32, wb: u32, dual: bool) -> u32 {
        let nb = if dual { 2 } else { 1 };
        (bm * bk * 2 + nb * slots * br * (bk / wb) * 2).next_multiple_of(1024)
    }

    /// Mirrors `GemmBsrWgmma::kSmemBytes`: the ring, 1024 bytes of alignment slack, and per stage
    /// a `full` and an `empty` mbarrier and the word of its slice's row mask.
    pub fn smem_bytes(&self, br: u32, dual: bool) -> u32 {
        let stage = Self::stage_bytes(self.bm, self.slots, br, self.bk, self.wb, dual);
        self.stages * (stage + 20) + self.staging_bytes() + 1024
    }

    /// Mirrors `GemmBsrWgmma::kStagingBytes`.
    fn staging_bytes(&self) -> u32 {
        self.bm / 64 * self.staging_bufs * STAGING_BUFFER_BYTES
    }

    /// The epilogue stored by the copy engine (through staging buffers).
    pub fn tma_store(&self) -> bool {
        self.staging_bufs > 0
    }

    /// This configuration with the epilogue's stores by the copy engine when `ok` (the output's
    /// rows 16-byte multiples apart, its columns contiguous), the group's columns hold at least
    /// one whole 64-column chunk (block rows past the last whole chunk, the eleventh 32-row
    /// block of a wide group, are stored from registers), and the staging buffers leave the ring
    /// its stages or at least 4 of them: 4 stages with the stores are level with 5 without on
    /// the 4096^2 weight at density 0.25, 5 with them 3.5 % faster than 6 without on the sparse
    /// bert-large FFN, 3 with them 44 % slower than 4 without at density 0.5
    /// (docs/perf-notes.md, block-sparse variant 26). Two staging buffers per warpgroup where
    /// they leave that, else one where it does: at density 0.5 one buffer and 4 stages are 1.8 %
    /// faster than 4 stages without the stores, while one buffer where two fit measured 0.8-1 %
    /// slower on the sparse models, whose sixth stage is worth less than the second buffer
    /// (variant 27).
    pub fn with_tma_store(self, br: u32, dual: bool, ok: bool) -> WgmmaBsr {
        // Consecutive groups store whole 64-column chunks of their columns, listed ones each
        // block row in a box of its own 32 columns.
        let chunks = match self.listed {
            true => br == 32,
            false => self.g * br >= 64 && ((self.g * br).is_multiple_of(64) || 64 % br == 0),
        };
        if !ok || !chunks {
            return self;
        }
        let stage = Self::stage_bytes(self.bm, self.slots, br, self.bk, self.wb, dual);
        [2, 1]
            .into_iter()
            .map(|staging_bufs| {
                let cfg = WgmmaBsr {
                    staging_bufs,
                    ..self
                };
                let stages = stages_fitting(stage, cfg.staging_bytes());
                WgmmaBsr { stages, ..cfg }
            })
            .find(|cfg| cfg.stages == self.stages || cfg.stages >= 4)
            .unwrap_or(self)
    }

    /// The groups this configuration's steps run over: listed ones by the overlap of the units
    /// its steps copy A for (windows of two block columns, else block columns), or consecutive.
    pub fn groups(&self, pattern: &BlockPattern) -> Groups {
        match self.listed {
            true => Groups::by_overlap(
                pattern,
                self.g,
                StepUnit::of(self.wb, self.pairs),
                self.balanced,
            ),
            false => Groups::Consecutive { g: self.g },
        }
    }

    /// This configuration with the epilogue's stores chosen ([`WgmmaBsr::with_tma_store`]),
    /// where `ok` says whether the copy engine can store the output. Listed groups need the copy
    /// engine's stores: where it cannot store them they go back to consecutive block rows (their
    /// register stores at a listed group's columns slow the consumers' k loop: docs/perf-notes.md,
    /// block-sparse variant 35), in the slice form consecutive groups take (windows where the
    /// listed groups took pairs over windows).
    pub fn stored(self, pattern: &BlockPattern, dual: bool, ok: bool) -> WgmmaBsr {
        let br = pattern.block[0];
        let cfg = self.with_tma_store(br, dual, ok);
        if !cfg.listed || cfg.tma_store() {
            return cfg;
        }
        // The slice form consecutive groups would have taken: windows where the listed groups
        // took pairs over windows (same block columns a slice, so the same depth).
        let form = SliceForm::choose(pattern, self.g, false, dual);
        debug_assert_eq!(form.wb, self.wb, "{self:?}");
        let consecutive = WgmmaBsr {
            listed: false,
            balanced: false,
            pairs: form.pairs,
            pair_cap: form.pair_cap,
            ..self
        };
        let steps = form.steps;
        let slots = slots_for(&steps, br, self.bk / self.wb, self.wb * self.g);
        let stage = WgmmaBsr::stage_bytes(self.bm, slots, br, self.bk, self.wb, dual);
        let stages = stages_fitting(stage, 0);
        WgmmaBsr {
            slots,
            stages,
            ..consecutive
        }
        .with_tma_store(br, dual, ok)
    }

    /// The width in elements of one swizzle atom column of the A piece
    /// (`GemmBsrWgmma::SW`: `SliceAtom<BK>::SW`, with pairs a block's width): the inner size of
    /// A's TMA boxes.
    pub fn atom(&self) -> u32 {
        if self.pairs {
            slice_atom(self.bk / self.wb)
        } else {
            slice_atom(self.bk)
        }
    }

    /// The same for a block's piece of a slice (`SliceAtom<BK / WB>::SW`): the kept blocks' boxes.
    pub fn block_atom(&self) -> u32 {
        slice_atom(self.bk / self.wb)
    }

    /// Box rows of a kept block in the wide form: its bytes in rows of 128.
    pub fn wide_rows(br: u32, bc: u32) -> u32 {
        br * bc * 2 / 128
    }

    pub fn template(&self) -> String {
        let tail = match (
            self.a_regs,
            self.wb,
            self.wide,
            self.slots == self.wb * self.g,
        ) {
            _ if self.tma_store() || self.pairs => format!(
                ", {}, {}, {}, {}, {}{}",
                self.a_regs,
                self.wb,
                self.wide,
                self.slots,
                self.tma_store(),
                match (self.pairs, self.staging_bufs) {
                    (pairs, 1) => format!(", {pairs}, 1"),
                    (true, _) => ", true".to_string(),
                    (false, _) => String::new(),
                }
            ),
            (false, 1, false, true) => String::new(),
            (true, 1, false, true) => ", true".to_string(),
            (a_regs, wb, false, true) => format!(", {a_regs}, {wb}"),
            (a_regs, wb, true, true) => format!(", {a_regs}, {wb}, true"),
            (a_regs, wb, wide, false) => format!(", {a_regs}, {wb}, {wide}, {}", self.slots),
        };
        format!(
            "mlpc::BsrWgmmaConfig<{}, {}, {}, {}{tail}>",
            self.bm, self.g, self.bk, self.stages
        )
    }
}

/// The stages of `stage` bytes (and their barriers and mask word) that fit the shared memory
/// beside `staging` bytes of staging buffers and the ring's alignment slack, at most
/// `MAX_STAGES` (`WgmmaBsr::smem_bytes`).
fn stages_fitting(stage: u32, staging: u32) -> u32 {
    ((SMEM_LIMIT - 1024 - staging) / (stage + 20)).min(MAX_STAGES)
}

/// Block slots a stage needs for `steps`: the most blocks a step keeps, rounded up so that the
/// slots (of `br` x `bkb` elements each) fill whole 1024-byte swizzle periods, since every stage
/// must start on one (an odd count of 512-byte 16 x 16 slots would not), at most `all` (`wb * g`;
/// where that cap leaves a part of a period, [`WgmmaBsr::stage_bytes`] pads the stage).
fn slots_for(steps: &GroupSteps, br: u32, bkb: u32, all: u32) -> u32 {
    let most = steps.masks().map(u32::count_ones).max().unwrap_or(1).max(1);
    let slot = br * bkb * 2;
    let period = 1024 / gcd(slot, 1024);
    round_up(most, period).min(all)
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The widest swizzle atom (64, 32 or 16 elements) that divides a k depth.
fn slice_atom(bk: u32) -> u32 {
    [64, 32, 16]
        .into_iter()
        .find(|w| bk.is_multiple_of(*w))
        .unwrap_or(16)
}

/// The grouped Hopper kernel's configuration for a block-sparse GEMM, or `None` when it keeps
/// `GemmBsrMma` / `GemmBsrSimt`. `la` is A's physical layout and `lda` its row stride.
pub(crate) fn select_wgmma(
    arch: Arch,
    dtype: DType,
    dual: bool,
    la: (MatLayout, &Extent),
    p: &BlockPattern,
) -> Option<WgmmaBsr> {
    let cols = wide_group_cols(dual, p);
    let own = select_wgmma_cols(arch, dtype, dual, la, p, cols)?;
    // Wide groups whose slots leave the ring three stages (a step keeping 21 or 22 of its 22
    // blocks: density 0.7 and up) run about 1.5x slower than with four (docs/perf-notes.md,
    // block-sparse variant 43); groups of eight keep four there (dual GEMMs: groups of four
    // for five, by the same rule, not timed).
    let narrow_cols = if dual { 128 } else { 256 };
    if cols > narrow_cols && own.stages < 4 {
        if let Some(narrow) = select_wgmma_cols(arch, dtype, dual, la, p, narrow_cols) {
            if narrow.stages >= 4 {
                return Some(narrow);
            }
        }
    }
    Some(own)
}

/// Accumulator columns of the kernel's own entry: 352 for a plain GEMM of 32 x 32 blocks whose K
/// is at least 4096 (eleven block rows a group, a 22-bit mask with windows of two; the block
/// column in the step's 9 bits above it and below the sign, so fewer than 512 block columns:
/// K < 16384; docs/perf-notes.md, block-sparse variant 52: llama's down projection, K = 11008,
/// 13 % faster than in groups of eight), else 256 (128 for dual
/// GEMMs, two accumulator sets). Eleven rows share each A piece among more kept blocks: 3-5 %
/// faster on the 4096^2 weight at density 0.5 / 0.25 (level at 0.1) where the waves of groups
/// come out even; where they do not, the short-grid entry of eight rows runs instead
/// ([`select_wgmma_short_grids`]). Not for shorter K: at K = 1024 (the sparse bert-large FFN's up
/// projection) eleven rows measured 7 % slower on the model with the epilogue's register
/// stores (variant 23), and still 5 % slower with both sides storing by the copy engine
/// (docs/perf-notes.md, block-sparse variant 26). [`select_wgmma`] takes 256 after all where the
/// wide groups' slots would leave the ring fewer than four stages (density 0.7 and up).
///
/// Dual GEMMs of the same blocks and K take 160 (groups of five block rows, 160 accumulators
/// a thread for the two products, against four rows' 128): each A slice then feeds a fifth more
/// kept blocks. Llama's MLP at T = 4096 and d = 0.25 ran 7.5 % faster with its gated pair
/// packed to the union of their patterns, 2.3 % with the pair pruned together; the seed GeGLU
/// (K = 768) ran level to 1 % slower, so not for shorter K (docs/perf-notes.md, block-sparse
/// variant 51). Six rows (192) spill and serialise the wgmmas.
fn wide_group_cols(dual: bool, p: &BlockPattern) -> u32 {
    let wide_32 = p.block == [32, 32] && p.inp >= 4096;
    match dual {
        true if wide_32 => 160,
        true => 128,
        false if wide_32 && p.block_cols() < 1 << 9 => 352,
        false => 256,
    }
}

/// The configurations of the short-grid entries beside the kernel's own, widest first: groups
/// of at most 256, 192, 128 and 64 accumulator columns (eight, six, four and two 32-row
/// blocks), each kept where it has fewer block rows a group than the one before. The runtime launches one
/// where its waves of groups end sooner ([`crate::CudaKernel::short_grid_for`]): the eight-row
/// groups beside eleven-row ones where the latter's waves come out uneven, the narrower ones at
/// a few row tiles (T = 128-512 on the 4096^2 weight), where the wide groups leave most SMs
/// idle (docs/perf-notes.md, block-sparse variant 46).
pub(crate) fn select_wgmma_short_grids(
    arch: Arch,
    dtype: DType,
    dual: bool,
    la: (MatLayout, &Extent),
    p: &BlockPattern,
) -> Vec<WgmmaBsr> {
    let Some(own) = select_wgmma(arch, dtype, dual, la, p) else {
        return Vec::new();
    };
    let mut shorts: Vec<WgmmaBsr> = Vec::new();
    for cols in SHORT_GRID_COLS {
        if let Some(s) = select_wgmma_cols(arch, dtype, dual, la, p, cols) {
            // The same block copies as the kernel's (one tensor map of the kept blocks).
            if s.g < shorts.last().map_or(own.g, |w| w.g) && s.wide == own.wide {
                shorts.push(s);
            }
        }
    }
    shorts
}

/// The accumulator columns of the short-grid entries' groups ([`select_wgmma_short_grids`]).
/// The six-row groups (192) measured 4-17 % faster at T = 768-2304 and on geglu-sparse
/// (docs/perf-notes.md, block-sparse variant 48).
const SHORT_GRID_COLS: [u32; 4] = [256, 192, 128, 64];

/// What a tile of the grouped kernel costs beyond its area, in output columns
/// ([`crate::CudaKernel::tile_fixed_cols`]): each tile copies its rows' A pieces whatever its
/// width. Measured (H200, 2026-12-05, the 4096^2 weight at d = 0.25, T = 128: one tile a CTA):
/// groups of 2 / 4 / 8 rows took 0.0150 / 0.0205 / 0.0299 ms, about 0.0095 ms plus 0.0026 a
/// 32-row block, so the fixed part is about four blocks' columns.
const TILE_FIXED_COLS: u32 = 128;

/// [`select_wgmma`] for groups of at most `cols` accumulator columns.
fn select_wgmma_cols(
    arch: Arch,
    dtype: DType,
    dual: bool,
    (la, lda): (MatLayout, &Extent),
    p: &BlockPattern,
    cols: u32,
) -> Option<WgmmaBsr> {
    let [br, bc] = p.block;
    if arch != Arch::Sm90a || !matches!(dtype, DType::F16 | DType::Bf16) || la != MatLayout::N {
        return None;
    }
    if lda.as_constant().is_some_and(|c| c % 8 != 0) {
        return None;
    }
    // The step's block column shares an int with the row mask (16 bits; up to 22 for wide
    // groups, which [`wide_group_cols`] gives only patterns of fewer than 512 block columns).
    if !WGMMA_N.contains(&br) || bc % 16 != 0 || p.block_cols() >= 1 << 15 {
        return None;
    }
    // Accumulators: G * BR / 2 f32 registers per thread and product, at most 176 in all.
    if br > cols {
        return None;
    }
    let rows = u32::try_from(p.block_rows()).unwrap_or(u32::MAX);
    // Wide groups (more than 256 columns: a mask of up to 24 bits) spread the rows evenly over
    // the groups they need (24 rows: three groups of 8, not 11, 11 and 2).
    let most = (cols / br).min(if cols > 256 { 12 } else { 16 }).max(1);
    let g = match cols > 256 {
        true => rows.div_ceil(rows.div_ceil(most).max(1)).min(most).max(1),
        false => most.min(rows).max(1),
    };
    let SliceForm {
        wb,
        pairs,
        pair_cap,
        steps,
        listed,
        balanced,
    } = SliceForm::choose(p, g, !dual, dual);
    let bk = if wb == 2 {
        64
    } else {
        [64, 48, 32, 16].into_iter().find(|d| bc % d == 0)?
    };
    let bm = 128;
    // Slots for the most blocks a step keeps: the stages hold no slot that no step fills
    // (docs/perf-notes.md, block-sparse variant 11).
    let slots = slots_for(&steps, br, bk / wb, wb * g);
    let stage = WgmmaBsr::stage_bytes(bm, slots, br, bk, wb, dual);
    let stages = stages_fitting(stage, 0);
    // A from registers where the RS wgmma has the block height (`wgmma_detail::MmaRs`): the kept
    // rows' wgmmas then read only their block from shared memory (docs/perf-notes.md,
    // block-sparse variant 5: 10-11 % faster at density 0.5, 6-9 % at 0.25 and 0.1).
    let a_regs = matches!(br, 16 | 32 | 64);
    // The wide block copies: where a slice takes whole blocks whose atom rows are narrower than
    // 128 bytes, and a block is whole 1024-byte periods of the 128B swizzle (so that every slot
    // starts on one) of at most 256 box rows.
    let bkb = bk / wb;
    let wide = bkb == bc
        && slice_atom(bkb) < 64
        && (br * bc * 2) % 1024 == 0
        && WgmmaBsr::wide_rows(br, bc) <= 256;
    (stages >= 3).then_some(WgmmaBsr {
        bm,
        g,
        bk,
        wb,
        stages,
        a_regs,
        wide,
        slots,
        staging_bufs: 0,
        pairs,
        pair_cap,
        listed,
        balanced,
    })
}

/// How a `GemmBsrWgmma` kernel slices its k loop, and over which groups.
struct SliceForm {
    /// Block columns a slice: 2 (windows, or pairs with `pairs`) or 1.
    wb: u32,
    pairs: bool,
    /// With `pairs`: balanced pairs, steps past this many kept blocks split.
    pair_cap: Option<u32>,
    /// The steps over the chosen groups.
    steps: GroupSteps,
    /// Whether the groups are listed ([`Groups::by_overlap`]) rather than consecutive.
    listed: bool,
    /// With `listed`: whether they are balanced.
    balanced: bool,
}

impl SliceForm {
    /// The slice form and groups of `g` block rows for pattern `p`; listed groups only where
    /// `listable` (plain GEMMs whose output the copy engine stores: not dual GEMMs, whose groups
    /// of four rows gain few steps and whose sparse GeGLU measured 3 % slower listed, nor outputs
    /// stored from registers, whose scattered columns slow the k loop: docs/perf-notes.md,
    /// block-sparse variant 35).
    fn choose(p: &BlockPattern, g: u32, listable: bool, dual: bool) -> SliceForm {
        // 32-wide blocks: slices over K windows of two block columns where the row mask has room
        // for both and the pattern's windows are at most 0.6 of its block-column steps (the A
        // piece's box rows are then 128 bytes, as in the dense kernels: the copy engine's cost
        // follows its box rows; a window whose second column few rows keep costs A bytes for
        // nothing: perf-notes, block-sparse variant 8, 8 % faster at 0.50 of the steps, 6 %
        // slower at 0.71).
        let consecutive = Groups::Consecutive { g };
        let steps = |wb| GroupSteps::new(p, &consecutive, wb).step_info.len();
        let windows_pay = || 5 * steps(2) <= 3 * steps(1);
        // Where the windows do not pay (low density: a window's second column is mostly empty),
        // 32-wide blocks take pairs of the group's kept columns instead: half the slices of single
        // columns, each with about twice the kept blocks, and no A rows for an empty column
        // (docs/perf-notes.md, block-sparse variant 15).
        // Pairs, like windows, only where they are at most 0.6 of the single columns' steps (a
        // group of one kept column would copy its A piece twice for nothing).
        let pairs_pay = || {
            5 * GroupSteps::pairs(p, &consecutive, PairOrder::Natural)
                .step_info
                .len()
                <= 3 * steps(1)
        };
        // The steps of a form of slice (`wb` block columns; with `pairs`, two of the group's
        // kept ones) over its groups: groups of block rows that share kept blocks where they
        // take at least 5 % fewer steps than consecutive ones, i.e. fewer A pieces and slices
        // for the same wgmmas (docs/perf-notes.md, block-sparse variant 35: 3.5 % faster at
        // density 0.25, 11 % at 0.1). Only where `listable`. The second item says whether the
        // groups are listed.
        let grouped = |wb: u32, pairs: bool| -> (GroupSteps, bool) {
            let steps_in = |groups: &Groups| match pairs {
                true => GroupSteps::pairs(p, groups, PairOrder::Natural),
                false => GroupSteps::new(p, groups, wb),
            };
            let in_order = steps_in(&consecutive);
            let by_overlap = listable
                .then(|| steps_in(&Groups::by_overlap(p, g, StepUnit::of(wb, pairs), false)))
                .filter(|s| 20 * s.step_info.len() <= 19 * in_order.step_info.len());
            match by_overlap {
                Some(s) => (s, true),
                None => (in_order, false),
            }
        };
        // Where windows pay, pairs still win where their own groups take at most 0.92 of the
        // windows' steps: at density 0.25 the listed pairs take 0.91 and run 1 % faster on the
        // 4096^2 weight and 2.5 % on the sparse bert-large FFN, while at 0.5 (the same steps)
        // they run 2.5 % slower, the A piece being two boxes of 64-byte rows instead of one of
        // 128 (docs/perf-notes.md, block-sparse variant 36). Where the groups cannot be
        // listed, windows.
        let ((wb, pairs), (steps, listed)) = match p.block[1] == 32 && 2 * g <= 24 {
            true if windows_pay() => {
                let windows = grouped(2, false);
                let paired = (listable && pairs_pay())
                    .then(|| grouped(2, true))
                    .filter(|(s, _)| 25 * s.step_info.len() <= 23 * windows.0.step_info.len());
                match paired {
                    Some(paired) => ((2, true), paired),
                    None => ((2, false), windows),
                }
            }
            true if pairs_pay() => ((2, true), grouped(2, true)),
            _ => ((1, false), grouped(1, false)),
        };
        // The ring's stages for steps of two 32-wide block columns (the copy engine's stores
        // through two staging buffers a warpgroup).
        let stages = |s: &GroupSteps| {
            let slots = slots_for(s, p.block[0], 32, 2 * g);
            let stage = WgmmaBsr::stage_bytes(128, slots, p.block[0], 64, 2, false);
            stages_fitting(stage, 2 * 2 * STAGING_BUFFER_BYTES)
        };
        // Windows over groups balanced by their modelled cost ([`balance`]) where that lowers
        // the costliest group's by at least 3 % and the ring keeps its stages: the persistent
        // CTAs take a few tiles each, so the costliest groups set the busiest CTA's time. On the
        // 4096^2 weight at density 0.5 (eleven-row groups, the last of seven, all 64 windows
        // each) groups of ten and eleven rows with even kept blocks run 2.2-2.7 % faster. Not
        // for pairs: there the balance costs steps, and measured 1 % slower at density 0.25 and
        // on the sparse bert-large FFN's up projection, 1.2-1.7 % faster at 0.1
        // (docs/perf-notes.md, block-sparse variant 44). Listed groups, so only where
        // `listable`.
        let (steps, listed, balanced) = match listable && wb == 2 && !pairs {
            true => {
                let groups = Groups::by_overlap(p, g, StepUnit::Windows, true);
                let even = GroupSteps::new(p, &groups, 2);
                match 100 * even.costliest() <= 97 * steps.costliest()
                    && stages(&even) >= stages(&steps)
                {
                    true => (even, true, true),
                    false => (steps, listed, false),
                }
            }
            false => (steps, listed, false),
        };
        // Pairs balanced by their kept blocks where the natural ones leave the ring four stages
        // or fewer and the smaller stages of the balanced ones make it deeper (docs/perf-notes.md,
        // block-sparse variant 39: at density 0.25 five stages instead of four, 2.7 % faster;
        // where the stages stay, the balanced pairs cost 0.7 % at 0.1, their A pieces less in
        // order, and past five stages a stage is worth about as much). Chosen after the slice
        // form, whose step counts the splits would move. Plain GEMMs only (the dual ones, with
        // twice the slots a stage, have not been timed with them).
        let (pair_cap, steps) = match pairs && !dual {
            true => {
                let groups = match listed {
                    true => Groups::by_overlap(p, g, StepUnit::Pairs, false),
                    false => consecutive,
                };
                let even_pairs = GroupSteps::pairs(p, &groups, PairOrder::Balanced);
                let cap = even_pairs.cap_within(2);
                let even_pairs = even_pairs.split_above(cap);
                match stages(&steps) <= 4 && stages(&even_pairs) > stages(&steps) {
                    true => (Some(cap), even_pairs),
                    false => (None, steps),
                }
            }
            false => (None, steps),
        };
        SliceForm {
            wb,
            pairs,
            pair_cap,
            steps,
            listed,
            balanced,
        }
    }
}

/// The wide form's rearrangement of one packed block (`br` x `bc`, row-major, 16-bit elements) in
/// 16-byte chunks: device chunk `d` is packed chunk `perm[d]`. The device block, copied as
/// `br * bc * 2 / 128` box rows of 128 bytes with the 128B swizzle into a 1024-aligned slot, lands
/// as the slot's image: atom column `a` (of `swb = slice_atom(bc)` elements) at byte
/// `a * br * 2 * swb`, its row `n` at `n * 2 * swb` within it, chunk `c` of the row at chunk
/// position `c ^ ((n >> s) & (swb / 8 - 1))` (the atom's own swizzle, `bsr_wgmma::Atom`).
pub(crate) fn wide_block_perm(br: u32, bc: u32) -> Vec<u32> {
    let swb = slice_atom(bc);
    let shift = match swb {
        64 => 0,
        32 => 1,
        _ => 2,
    };
    let (row_bytes, atom_bytes) = (2 * swb, br * 2 * swb);
    let chunks = br * bc * 2 / 16;
    (0..chunks)
        .map(|d| {
            // The copy engine writes device chunk d (box row d / 8, chunk d % 8) at slot chunk
            // position s: the 128B swizzle XORs the chunk with the row's place in its period.
            let (row, q) = (d / 8, d % 8);
            let at = (row * 8 + (q ^ (row % 8))) * 16;
            // What the slot holds there.
            let (a, within) = (at / atom_bytes, at % atom_bytes);
            let (n, pos) = (within / row_bytes, within % row_bytes / 16);
            let c = pos ^ ((n >> shift) & (swb / 8 - 1));
            (n * bc + a * swb + c * 8) / 8
        })
        .collect()
}

/// The inverse of a permutation: `inv[perm[i]] = i`.
fn inverse(perm: &[u32]) -> Vec<u32> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p as usize] = i as u32;
    }
    inv
}

/// Stages of `GemmBsrDmma`'s ring (16-deep slices of 10 KB for 32-row blocks).
const DMMA_STAGES: u32 = 4;

/// The tuning key of an f32 block-sparse GEMM that `GemmBsrDmma` (FP64 tensor cores) can run:
/// sm_90 / sm_90a, plain, A k-contiguous, block heights 8 to 32 in multiples of 8 (one warp
/// spans the tile's columns) and widths in multiples of 4 (16-byte copies).
fn f32_key(ctx: &Ctx<'_>, sg: &SparseGemm) -> Option<TileKey> {
    let [br, bc] = sg.pattern.block;
    let fits = matches!(ctx.opts.arch, Arch::Sm90 | Arch::Sm90a)
        && ctx.out.ty.dtype == DType::F32
        && sg.gemm.dual.is_none()
        && br % 8 == 0
        && br <= 32
        && bc % 4 == 0;
    if !fits {
        return None;
    }
    let v = matrix_view(&ctx.args[0].ty).ok()?;
    let a = match sg.gemm.a {
        MatLayout::N => v,
        MatLayout::T => v.transposed(),
    };
    let (la, _) = a_layout(ctx, &a).ok()?;
    (la == MatLayout::N).then_some(TileKey {
        dtype: DType::F32,
        dual: false,
        k: sg.pattern.inp,
        n: sg.pattern.out,
        sparse: true,
        block: sg.pattern.block,
    })
}

/// The tile key and choices of a block-sparse GEMM kernel, or `None` when it is not tunable
/// (only the f32 ones `GemmBsrDmma` can run are).
pub(crate) fn tile_candidates(
    ctx: &Ctx<'_>,
    sg: &SparseGemm,
) -> Option<(TileKey, Vec<TileChoice>)> {
    let cfg = choose(DType::F32, false, MatLayout::N, sg.pattern.block);
    f32_key(ctx, sg).map(|key| (key, f32_candidates(cfg.bm, cfg.bn)))
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
    // Measured on the H200 (W 4096 x 4096, T = 4096, 32 x 32 blocks, docs/perf-notes.md): the
    // TMA-fed grouped kernel is ahead of `GemmBsrMma` at every density measured (0.245 / 0.179 /
    // 0.114 ms against 0.58 / 0.31 / 0.14 at density 0.5 / 0.25 / 0.1).
    // The copy engine stores the output where a tensor map describes it (contiguous columns,
    // rows a constant multiple of 16 bytes apart).
    let storable = is_one(&c.col_stride) && c.row_stride.as_constant().is_some_and(|s| s % 8 == 0);
    let hopper = select_wgmma(ctx.opts.arch, dtype, dual, (la, &lda), p)
        .map(|h| h.stored(p, dual, storable));
    // Beside the kernel's groups, entries of narrower ones for the grids whose waves of groups
    // they end sooner (the kernel's short grids).
    let shorts: Vec<WgmmaBsr> = match hopper {
        Some(_) => select_wgmma_short_grids(ctx.opts.arch, dtype, dual, (la, &lda), p)
            .into_iter()
            .map(|h| h.stored(p, dual, storable))
            .collect(),
        None => Vec::new(),
    };
    // The work-item tables of the persistent walk, where asked for (`CodegenOptions::bsr_walk`).
    let walk = ctx.opts.bsr_walk && hopper.is_some();
    // The suffix of a short grid's lists and kernel type: its rows a group.
    let short_sfx = |s: &WgmmaBsr| format!("_g{}", s.g);
    let cfg = choose(dtype, dual, la, p.block);
    // f32 where it has a key, unless `ctx.tiles` asks for the FFMA kernel: `GemmBsrDmma`, with
    // `GemmBsrSimt`'s launch and the larger of the two kernels' shared memory.
    let dmma = f32_fp64_choice(ctx, f32_key(ctx, sg), &f32_candidates(cfg.bm, cfg.bn))?.is_some();
    // Kept blocks are read as the `[N, K]` weight, B layout `t`.
    let (threads, smem, min_blocks, bm) = match hopper {
        Some(h) => (h.threads(), h.smem_bytes(br, dual), 1, h.bm),
        None => {
            let simt = cfg.smem_bytes(la, MatLayout::T, dual);
            let ring = DMMA_STAGES * (cfg.bm + cfg.bn) * 16 * 4;
            let smem = if dmma { simt.max(ring) } else { simt };
            (cfg.threads(), smem, cfg.min_blocks, cfg.bm)
        }
    };
    let nsub = br.div_ceil(cfg.bn);
    // Grid columns: one per group of block rows (wgmma), or per BN share of a block row.
    let groups = |h: &WgmmaBsr| p.block_rows().div_ceil(u64::from(h.g));
    let col_tiles = match hopper {
        Some(h) => groups(&h),
        None => p.block_rows() * u64::from(nsub),
    };
    let hopper_entry = |h: &WgmmaBsr| {
        format!(
            "mlpc_bsr_{}_{}_nt_b{br}x{bc}_wgmma_{}x{}x{}",
            epi.name_parts.join("_"),
            dtype.name(),
            h.bm,
            h.g * br,
            h.bk
        )
    };
    let entry = match hopper {
        Some(h) => hopper_entry(&h),
        None => format!(
            "mlpc_bsr_{}_{}_{}t_b{br}x{bc}_{}x{}x{}{}",
            epi.name_parts.join("_"),
            dtype.name(),
            la.letter(),
            cfg.bm,
            cfg.bn,
            if dmma { 16 } else { cfg.bk },
            if dmma { "_dmma" } else { "" }
        ),
    };

    let params_ty = if hopper.is_some() {
        "BsrWgmmaParams"
    } else {
        "BsrParams"
    };
    let body = vec![
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
    let epi_lines = epi.lines;
    // The Hopper kernel reads A and the kept blocks through tensor maps, passed after the
    // symbols: A as [M, K] in boxes of BM rows, the packed blocks as a [kept * BR, BC] matrix in
    // boxes of one block's BR rows; both one swizzle atom column (`atom` elements) wide. The
    // short-grid entries read the same blocks (the same block shape gives the same block boxes).
    let mut maps: Vec<(String, Param)> = Vec::new();
    // The body of a Hopper entry: its groups and step lists (names ending in `sfx`), then the
    // call of kernel `Kernel{sfx}`.
    let hopper_body = |h: &WgmmaBsr, sfx: &str, ta: &str, tc: &str| {
        let mut lines = body.clone();
        lines.push(format!("    p.groups = {};", groups(h)));
        for l in [
            "grp_ptr",
            "grp_order",
            "step_info",
            "step_first",
            "step_blk",
        ] {
            lines.push(format!("    p.{l} = {l}{sfx};"));
        }
        lines.push(match h.pairs {
            true => format!("    p.step_col1 = step_col1{sfx};"),
            false => "    p.step_col1 = nullptr;".to_string(),
        });
        if walk {
            lines.push("    p.walk = &walk;".to_string());
        }
        lines.extend(epi_lines.iter().cloned());
        let bu = if dual { "tm_bu" } else { "tm_b" };
        lines.push(format!("    Kernel{sfx}::run(p, {ta}, tm_b, {bu}, {tc});"));
        lines
    };
    let (main_body, short_bodies) = match hopper {
        Some(h) => {
            // Wide: the rearranged blocks as a [kept * wide_rows, 64] matrix of 128-byte rows.
            let (rows, cols, box_rows, box_cols) = if h.wide {
                let r = WgmmaBsr::wide_rows(br, bc);
                (u64::from(r), 64, r, 64)
            } else {
                (u64::from(br), u64::from(bc), br, h.block_atom())
            };
            let blocks = |buf: usize| Param::TensorMap {
                buffer: ctx.kernel.args[buf],
                rows: Extent::constant(p.kept.len() as u64 * rows),
                cols: Extent::constant(cols),
                row_stride: Extent::constant(cols),
                box_rows,
                box_cols,
            };
            let a_map = |h: &WgmmaBsr| Param::TensorMap {
                buffer: ctx.kernel.args[0],
                rows: m.clone(),
                cols: k.clone(),
                row_stride: lda.clone(),
                box_rows: h.bm,
                box_cols: h.atom(),
            };
            maps.push(("tm_a".into(), a_map(&h)));
            // The short-grid entries' A boxes where they differ (windows in one, pairs or
            // single columns in another): a map for each other width, named by it.
            let a_name = |e: &WgmmaBsr| match e.atom() == h.atom() {
                true => "tm_a".to_string(),
                false => format!("tm_a{}", e.atom()),
            };
            let mut a_names: Vec<String> = vec!["tm_a".into()];
            for s in &shorts {
                let name = a_name(s);
                if !a_names.contains(&name) {
                    maps.push((name.clone(), a_map(s)));
                    a_names.push(name);
                }
            }
            maps.push(("tm_b".into(), blocks(1)));
            if dual {
                maps.push(("tm_bu".into(), blocks(2)));
            }
            // The output's boxes: 64 columns for consecutive groups, one block row's 32 for
            // listed ones (a map each where the two entries differ). Unused maps are passed as
            // another map of the kernel.
            let store_box = |e: &WgmmaBsr| {
                e.tma_store().then_some(if e.listed {
                    ("tm_cl", br)
                } else {
                    ("tm_c", 64)
                })
            };
            let mut stores: Vec<&str> = Vec::new();
            for (name, cols) in std::iter::once(&h).chain(&shorts).filter_map(&store_box) {
                if !stores.contains(&name) {
                    let mut map = output_store_map(ctx, &c, m, n);
                    if let Param::TensorMap { box_cols, .. } = &mut map {
                        *box_cols = cols;
                    }
                    maps.push((name.into(), map));
                    stores.push(name);
                }
            }
            let unused = stores.first().copied().unwrap_or("tm_a");
            let tc_of = |e: &WgmmaBsr| store_box(e).map_or(unused, |(name, _)| name);
            let short_bodies: Vec<Vec<String>> = shorts
                .iter()
                .map(|s| hopper_body(s, &short_sfx(s), &a_name(s), tc_of(s)))
                .collect();
            (hopper_body(&h, "", "tm_a", tc_of(&h)), short_bodies)
        }
        None => {
            let mut lines = body.clone();
            lines.extend(["row_ptr", "col_idx"].map(|l| format!("    p.{l} = {l};")));
            lines.extend(epi_lines.iter().cloned());
            lines.push("    Kernel::run(p);".to_string());
            (lines, Vec::new())
        }
    };

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
    let idx = block_index_type(p);
    if idx != "int" {
        src.push_str(&format!(
            "// The block-index tables in 16 bits: {} kept blocks, {} block columns.\n\
             #define MLPC_BSR_IDX {idx}\n",
            p.kept.len(),
            p.inp / u64::from(bc)
        ));
    }
    if walk {
        src.push_str(&format!("#define MLPC_BSR_WALK_CAP {WALK_CAP}\n"));
    }
    src.push_str(&format!("#include \"{include}\"\n\n"));
    src.push_str("namespace {\n");
    // Each Hopper entry's work-item costs (`Launch::walk_costs`), the own entry's first.
    let mut walk_costs: Vec<Vec<u32>> = Vec::new();
    let epilogue = format!("using Epilogue = {};\n", epi.ty);
    match hopper {
        Some(h) => {
            let (lists, costs) = hopper_lists(p, &h, "");
            src.push_str(&lists);
            walk_costs.push(costs);
            src.push_str(&hopper_kernel(elem, br, bc, &h, "", dual, &epilogue));
            for s in &shorts {
                src.push_str(&format!(
                    "// A short-grid entry's groups of {} block rows (launched instead of the \
                     entry of {}\n// where its waves of groups end sooner).\n",
                    s.g, h.g
                ));
                let (lists, costs) = hopper_lists(p, s, &short_sfx(s));
                src.push_str(&lists);
                walk_costs.push(costs);
                src.push_str(&hopper_kernel(elem, br, bc, s, &short_sfx(s), dual, ""));
            }
        }
        None => {
            let template = match (cfg.mma, dmma) {
                (true, _) => "GemmBsrMma",
                (false, true) => "GemmBsrDmma",
                (false, false) => "GemmBsrSimt",
            };
            let stages = if dmma {
                format!(", {DMMA_STAGES}")
            } else {
                String::new()
            };
            let col_idx: Vec<u32> = p.kept.iter().map(|&(_, c)| c).collect();
            src.push_str("// Kept blocks of block row r: col_idx[row_ptr[r] .. row_ptr[r + 1]].\n");
            src.push_str(&typed_array(idx, "row_ptr", &p.row_ptr()));
            src.push_str(&typed_array(idx, "col_idx", &col_idx));
            src.push_str(&format!("using Config = {};\n", cfg.template()));
            src.push_str(&epilogue);
            src.push_str(&format!(
                "using Kernel = mlpc::{template}<{elem}, {}, {br}, {bc}, Config, Epilogue{stages}>;\n",
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
        }
    }
    src.push_str("}  // namespace\n\n");
    let map_names: Vec<&str> = maps.iter().map(|(name, _)| name.as_str()).collect();
    let mut sig = signature(elem, &arg_names, ctx.args.len(), &symbols, &map_names);
    if walk {
        sig.push_str(",\n    const __grid_constant__ mlpc::BsrWalk walk");
    }
    let push_entry = |src: &mut String, threads: u32, entry: &str, body: &[String]| {
        src.push_str(&format!(
            "extern \"C\" __global__ void __launch_bounds__({threads}, {min_blocks}) {entry}(\n{sig}) {{\n"
        ));
        src.push_str(&body.join("\n"));
        src.push_str("\n}\n");
    };
    push_entry(&mut src, threads, &entry, &main_body);
    for (s, body) in shorts.iter().zip(&short_bodies) {
        src.push('\n');
        push_entry(&mut src, s.threads(), &hopper_entry(s), body);
    }

    // Weight-streaming entries for few output rows, where asked for
    // (`CodegenOptions::sparse_gemv`, on by default): f16 / bf16 GEMMs with A k-contiguous.
    let relayout = hopper.is_some_and(|h| h.wide);
    let small_m = match ctx.opts.sparse_gemv && la == MatLayout::N {
        true => {
            let mut fill = body.clone();
            fill.extend(epi_lines.iter().cloned());
            let col_idx: Vec<u32> = p.kept.iter().map(|&(_, c)| c).collect();
            crate::gemv::append_bsr(
                &mut src,
                &crate::gemv::BsrParts {
                    arch: ctx.opts.arch,
                    dtype,
                    dual,
                    block: p.block,
                    m,
                    n: p.out,
                    row_ptr: &p.row_ptr(),
                    col_idx: &col_idx,
                    chunk_at: relayout.then(|| inverse(&wide_block_perm(br, bc))),
                    entry: &entry,
                    epilogue: &epi.ty,
                    signature: &sig,
                    fill: &fill,
                },
            )
        }
        false => None,
    };

    let mut params = ctx.buffer_params();
    params.extend(dim_params(&symbols));
    params.extend(maps.into_iter().map(|(_, p)| p));
    if walk {
        params.push(Param::Walk);
    }
    let mut walk_costs = walk_costs
        .into_iter()
        .map(|c| if walk { c } else { Vec::new() });
    // Hopper: a persistent grid over the (BM rows, group) tiles, one CTA per SM at most.
    let persistent = |h: &WgmmaBsr| Grid::Persistent {
        m: m.clone(),
        n: n.clone(),
        tile_m: h.bm,
        tile_n: h.g * br,
        per_sm: 1,
        cluster: 1,
        cluster_rows: false,
        split_k: None,
        one_tile: None,
    };
    Ok(CudaKernel {
        name: kname.clone(),
        entry,
        source: src,
        launch: Launch {
            block: [threads, 1, 1],
            smem_bytes: smem,
            early_launch: false,
            walk_costs: walk_costs.next().unwrap_or_default(),
            // Otherwise one CTA per BM rows and BN-column share of a block row, a row tile's
            // column tiles consecutive (`bsr_row_tile` in `gemm_bsr.cuh`).
            grid: match hopper {
                Some(h) => persistent(&h),
                None => Grid::RowTiles {
                    m: m.clone(),
                    n: Extent::constant(col_tiles),
                    tile_m: bm,
                    tile_n: 1,
                },
            },
        },
        params,
        small_m,
        relayouts: match hopper {
            Some(h) if h.wide => {
                let perm = wide_block_perm(br, bc);
                (1..nmat)
                    .map(|i| Relayout {
                        buffer: ctx.kernel.args[i],
                        chunk_bytes: 16,
                        perm: perm.clone(),
                    })
                    .collect()
            }
            _ => Vec::new(),
        },
        short_grids: shorts
            .iter()
            .map(|s| ShortGrid {
                entry: hopper_entry(s),
                launch: Launch {
                    block: [s.threads(), 1, 1],
                    smem_bytes: s.smem_bytes(br, dual),
                    early_launch: false,
                    walk_costs: walk_costs.next().unwrap_or_default(),
                    grid: persistent(s),
                },
            })
            .collect(),
        tile_fixed_cols: match shorts.is_empty() {
            true => 0,
            false => TILE_FIXED_COLS,
        },
    })
}

/// The step lists of a Hopper entry's groups, as arrays whose names end in `sfx`.
fn hopper_lists(p: &BlockPattern, h: &WgmmaBsr, sfx: &str) -> (String, Vec<u32>) {
    let steps = GroupSteps::of(p, h);
    let columns = if h.pairs {
        "block columns c0 = step_info{sfx}[s] >> {b} and c1 = step_col1{sfx}[s]; bit w * {g} + i of\n\
         // the mask step_info{sfx}[s] & {low} is set when row i keeps column cw"
    } else {
        "block columns c = step_info{sfx}[s] >> {b} .. c + {wb}; bit w * {g} + i of the mask\n\
         // step_info{sfx}[s] & {low} is set when row i keeps column c + w"
    };
    let columns = columns
        .replace("{sfx}", sfx)
        .replace("{g}", &h.g.to_string())
        .replace("{wb}", &h.wb.to_string())
        .replace("{b}", &steps.mask_bits.to_string())
        .replace("{low}", &format!("{:#x}", (1u32 << steps.mask_bits) - 1));
    let rows = match h.listed {
        true => format!("the block rows GroupRows{sfx} lists"),
        false => format!("block rows {g}j .. {g}j + {g}", g = h.g),
    };
    let mut src = format!(
        "// Group j ({rows}) runs steps grp_ptr{sfx}[j] .. grp_ptr{sfx}[j + 1]. Step s is\n\
         // {columns}; their packed blocks are\n\
         // step_blk{sfx}[step_first{sfx}[s] ..], in increasing bit.\n",
    );
    if let Groups::Listed { rows, .. } = h.groups(p) {
        src.push_str(&group_rows(&format!("GroupRows{sfx}"), &rows, p));
    }
    src.push_str(&int_array(&format!("grp_ptr{sfx}"), &steps.grp_ptr));
    src.push_str(
        "// The groups in the order the CTAs take them in each row tile: costliest first.\n",
    );
    src.push_str(&int_array(&format!("grp_order{sfx}"), &steps.order()));
    src.push_str(&int_array(&format!("step_info{sfx}"), &steps.step_info));
    let idx = block_index_type(p);
    if h.pairs {
        src.push_str(&typed_array(
            idx,
            &format!("step_col1{sfx}"),
            &steps.step_col1,
        ));
    }
    src.push_str(&typed_array(
        idx,
        &format!("step_first{sfx}"),
        &steps.step_first,
    ));
    src.push_str(&typed_array(
        idx,
        &format!("step_blk{sfx}"),
        &steps.step_blk,
    ));
    (src, steps.walk_costs())
}

/// The list `{name}_cols` of each group's slots' first output columns (N for an empty slot) and
/// the type `name` through which a kernel of listed groups reads it (the template's `Rows`).
fn group_rows(name: &str, slots: &[u32], p: &BlockPattern) -> String {
    let br = u64::from(p.block[0]);
    let cols: Vec<u32> = slots
        .iter()
        .map(|&r| (u64::from(r) * br).min(p.out) as u32)
        .collect();
    let mut s = format!(
        "// Each group's slots' first output columns ({} for an empty slot).\n",
        p.out
    );
    s.push_str(&int_array(&format!("{name}_cols"), &cols).replacen(
        "__device__ const",
        "__constant__",
        1,
    ));
    let _ = write!(
        s,
        "struct {name} {{\n    static constexpr bool kListed = true;\n    \
         __device__ __forceinline__ static int at(int i) {{ return {name}_cols[i]; }}\n}};\n"
    );
    s
}

/// `Config{sfx}` and `Kernel{sfx}`, a Hopper entry's kernel type (`epilogue`, the `Epilogue`
/// alias where it is not yet declared, between them), with the checks that it is the one the
/// launch describes.
fn hopper_kernel(
    elem: &str,
    br: u32,
    bc: u32,
    h: &WgmmaBsr,
    sfx: &str,
    dual: bool,
    epilogue: &str,
) -> String {
    format!(
        "using Config{sfx} = {config};\n\
         {epilogue}\
         using Kernel{sfx} = mlpc::GemmBsrWgmma<{elem}, {br}, {bc}, Config{sfx}, Epilogue{rows}>;\n\
         static_assert(Kernel{sfx}::kThreads == {threads}, \"block size of the launch description\");\n\
         static_assert(Kernel{sfx}::kSmemBytes == {smem}, \"shared memory of the launch description\");\n\
         static_assert(Kernel{sfx}::kGroup == {g}, \"block rows per CTA of the launch description\");\n",
        config = h.template(),
        rows = if h.listed {
            format!(", GroupRows{sfx}")
        } else {
            String::new()
        },
        threads = h.threads(),
        smem = h.smem_bytes(br, dual),
        g = h.g,
    )
}

#[cfg(test)]
mod tests {
    //! The CPU proof of `GemmBsrWgmma`'s address math. The functions below transcribe the
    //! template's (a test checks the template still says what they transcribe); `wgmma_reads`
    //! follows the PTX ISA instead. An emulator runs whole CTAs: the loads of every thread write
    //! tagged elements into a model of shared memory, the ring is walked in the template's order,
    //! and every element each wgmma reads through its descriptors must be the operand element the
    //! product needs; the accumulated values must equal the pruned GEMM.

    use super::*;
    use mlpc_ir::{Bindings, Dim};
    use std::collections::HashMap;

    const TEMPLATE: &str = include_str!("../../../kernels-templates/gemm_bsr_wgmma.cuh");
    /// The kernels of every target but sm_90a (`GemmBsrMma`, `GemmBsrSimt`, `GemmBsrDmma`).
    const PORTABLE: &str = include_str!("../../../kernels-templates/gemm_bsr.cuh");

    /// The block-index tables take 16 bits exactly while every value they can hold fits: kept
    /// positions up to the kept count, block columns below the column count.
    #[test]
    fn block_index_tables_in_16_bits_where_every_index_fits() {
        let pattern = |kept: usize, inp: u64| BlockPattern {
            block: [1, 1],
            out: 1 << 20,
            inp,
            kept: (0..kept as u32).map(|i| (i, 0)).collect(),
        };
        assert_eq!(block_index_type(&pattern(65535, 65535)), "unsigned short");
        assert_eq!(block_index_type(&pattern(65536, 64)), "int");
        assert_eq!(block_index_type(&pattern(4, 65536)), "int");
        // `--explain` counts the compressed-sparse-rows arrays at the same width.
        assert_eq!(
            pattern(65535, 65535).index_bytes(),
            2 * ((1 << 20) + 1 + 65535)
        );
        assert_eq!(
            pattern(65536, 64).index_bytes(),
            4 * ((1 << 20) + 1 + 65536)
        );
        assert_eq!(index_type(&[0, 65535]), "unsigned short");
        assert_eq!(index_type(&[65536]), "int");
        assert_eq!(
            index_array("t", &[1, 70000]),
            "__device__ const int t[2] = {\n    1, 70000,\n};\n"
        );
        // The maxima of every table the type covers, over all groupings of a real pattern.
        let k = Extent::constant(4096);
        let p = scattered([32, 32], 4096, 4096, 0.1, 3, None);
        let h = select_wgmma(Arch::Sm90a, DType::Bf16, false, (MatLayout::N, &k), &p).unwrap();
        assert!(h.pairs, "{h:?}");
        let steps = GroupSteps::of(&p, &h);
        let max = steps
            .step_blk
            .iter()
            .chain(&steps.step_first)
            .chain(&steps.step_col1)
            .chain(&p.row_ptr())
            .copied()
            .max()
            .unwrap_or(0);
        assert!(max as usize <= p.kept.len(), "{max} > {}", p.kept.len());
    }

    /// The portable kernels find their tile as `Grid::RowTiles` lays its blocks out (the lines
    /// below, transcribed from the template, which this test checks still says them): every
    /// (row tile, column tile) is computed by exactly one block, and the blocks of the last
    /// layer past the row tiles return, also where the row tiles exceed one layer.
    /// `GemmBsrMma`'s tile for every block height meets `MmaConfig`'s static assertions (warp
    /// tiles of whole m16 rows and whole pairs of n8 fragments), covers the block row (or 128 /
    /// 64 columns of it) and keeps the accumulators within the 128 registers a thread the launch
    /// bound allows (64 floats a thread, as the dense kernel).
    #[test]
    fn mma_tiles_fit_every_block_height() {
        for dtype in [DType::F16, DType::Bf16] {
            for (dual, la, bc) in [false, true]
                .into_iter()
                .flat_map(|d| [MatLayout::N, MatLayout::T].map(|la| (d, la)))
                .flat_map(|(d, la)| [16, 32].map(|bc| (d, la, bc)))
            {
                for br in 1..=256 {
                    let c = choose(dtype, dual, la, [br, bc]);
                    let at = format!("{dtype:?}, dual {dual}, A {la:?}, {br} x {bc}: {c:?}");
                    assert!(c.mma, "{at}");
                    assert!(
                        c.bm.is_multiple_of(c.x) && (c.bm / c.x).is_multiple_of(16),
                        "{at}"
                    );
                    assert!(
                        c.bn.is_multiple_of(c.y) && (c.bn / c.y).is_multiple_of(16),
                        "{at}"
                    );
                    assert!(c.bn >= br.min(if dual { 64 } else { 128 }), "{at}");
                    let sets = if dual { 2 } else { 1 };
                    assert!(c.bm * c.bn * sets / c.threads() <= 64, "{at}");
                    let wide = c.bn == 32 || (c.bn == 16 && bc == 32 && la == MatLayout::T);
                    let per_sm = if dual && wide { 256 } else { 512 };
                    assert_eq!(c.min_blocks * c.threads(), per_sm, "{at}");
                }
            }
        }
    }

    #[test]
    fn row_tile_grids_give_every_tile_one_block() {
        assert!(PORTABLE.contains("return (i64)blockIdx.y + (i64)blockIdx.z * gridDim.y;"));
        for line in [
            "const i64 m0 = bsr_row_tile() * BM;",
            "if (m0 >= p.m) return;",
            "const int brow = (int)blockIdx.x / kNSub;",
            "const int nb0 = ((int)blockIdx.x % kNSub) * BN;",
        ] {
            assert_eq!(
                PORTABLE.matches(line).count(),
                3,
                "each kernel says `{line}`"
            );
        }
        let (bm, cols) = (128u64, 3u32);
        let launch = Launch {
            block: [128, 1, 1],
            smem_bytes: 0,
            early_launch: false,
            walk_costs: Vec::new(),
            grid: Grid::RowTiles {
                m: Extent::of_dim(&Dim::sym("T")),
                n: Extent::constant(u64::from(cols)),
                tile_m: bm as u32,
                tile_n: 1,
            },
        };
        for t in [1, 129, 4096, 65535 * bm, 65535 * bm + 1, 65536 * bm + 77] {
            let mut b = Bindings::new();
            b.bind(&"T".into(), t).unwrap();
            let [gx, gy, gz] = launch.grid(&b, 132).unwrap();
            let rows = t.div_ceil(bm);
            let mut seen = vec![0u8; (rows * u64::from(cols)) as usize];
            for z in 0..u64::from(gz) {
                for y in 0..u64::from(gy) {
                    let m0 = (y + z * u64::from(gy)) * bm;
                    if m0 >= t {
                        continue;
                    }
                    for x in 0..u64::from(gx) {
                        seen[(m0 / bm * u64::from(cols) + x) as usize] += 1;
                    }
                }
            }
            assert!(
                seen.iter().all(|&n| n == 1),
                "T = {t}: a tile without one block"
            );
        }
    }
    /// Consumer threads (two warpgroups); the producer warpgroup follows them.
    const CONSUMERS: u32 = 256;

    /// `bsr_wgmma::SliceAtom<BK>::SW`.
    fn atom(bk: u32) -> u32 {
        if bk.is_multiple_of(64) {
            64
        } else if bk.is_multiple_of(32) {
            32
        } else {
            16
        }
    }

    /// Where the copy engine puts element (r, e) of a box of `sw`-element rows written at shared
    /// address `dst` with the swizzle of its row width (CUDA driver API, `CU_TENSOR_MAP_SWIZZLE_
    /// {32,64,128}B`): rows laid out one after the other, then byte-address bits [4, 4 + b) XOR
    /// bits [7, 7 + b), b = 1, 2, 3 for 32-, 64- and 128-byte rows.
    fn tma_box_address(sw: u32, dst: u32, r: u32, e: u32) -> u32 {
        let b = match sw {
            64 => 3,
            32 => 2,
            _ => 1,
        };
        let linear = dst + r * 2 * sw + 2 * e;
        linear ^ (((linear >> 7) & ((1 << b) - 1)) << 4)
    }

    /// `bsr_wgmma::desc_lo(addr)`.
    fn desc_lo(addr: u32) -> u32 {
        ((addr & 0x3FFFF) >> 4) | (1 << 16)
    }

    /// `bsr_wgmma::desc_of<SW>(lo)`.
    fn desc_of(sw: u32, lo: u32) -> u64 {
        let layout: u64 = match sw {
            64 => 1,
            32 => 2,
            _ => 3,
        };
        u64::from(lo) | (u64::from((8 * 2 * sw) >> 4) << 32) | (layout << 62)
    }

    /// The descriptor of an operand starting at `addr`: `desc_of<SW>(desc_lo(addr))`.
    fn descriptor(sw: u32, addr: u32) -> u64 {
        desc_of(sw, desc_lo(addr))
    }

    /// A descriptor's low word plus `offset >> 4` is the low word of the descriptor at
    /// `addr + offset` (what the consumers rely on to build a slice's descriptors with one add
    /// each) for every 16-byte-aligned shared address and offset below the 227 KB limit.
    #[test]
    fn descriptor_offsets_add_without_carry() {
        let limit = 227 * 1024;
        for sw in [16, 32, 64] {
            for addr in (0..limit).step_by(1024) {
                for offset in (0..limit - addr).step_by(16 * 37) {
                    assert_eq!(
                        desc_of(sw, desc_lo(addr) + (offset >> 4)),
                        descriptor(sw, addr + offset),
                        "SW {sw} at {addr} + {offset}"
                    );
                }
            }
        }
    }

    /// `bsr_wgmma::work_item(r, b, P)`.
    fn work_item(r: u32, b: u32, ctas: u32) -> u32 {
        r * ctas + if r & 1 == 1 { ctas - 1 - b } else { b }
    }

    /// Every tile is taken by exactly one CTA of a persistent grid, whatever its size; and the
    /// order puts the costliest groups first by the model (steps and kept blocks), ties in
    /// group order.
    #[test]
    fn the_persistent_walk_takes_every_tile_once() {
        for tiles in [1u32, 2, 5, 64, 131, 132, 133, 512, 1000] {
            for ctas in [1u32, 2, 7, 132].into_iter().filter(|&c| c <= tiles) {
                let mut taken = vec![0u32; tiles as usize];
                for b in 0..ctas {
                    for w in (0..)
                        .map(|r| work_item(r, b, ctas))
                        .take_while(|&w| w < tiles)
                    {
                        taken[w as usize] += 1;
                    }
                }
                assert!(
                    taken.iter().all(|&n| n == 1),
                    "{tiles} tiles on {ctas} CTAs"
                );
            }
        }
        // With a work-item table (`Param::Walk`), the kernel's `item_at`: the table's item of
        // round r where the table covers the grid's items, none (`tiles`) past its rounds or at
        // 0xffff.
        let table_item = |table: &[u16], r: u32, b: u32, ctas: u32, tiles: u32| {
            let rounds = table.len() as u32 / ctas;
            assert!(rounds * ctas >= tiles && rounds * ctas <= crate::WALK_CAP as u32);
            match r < rounds {
                true => match table[(r * ctas + b) as usize] {
                    0xffff => tiles,
                    w => u32::from(w),
                },
                false => tiles,
            }
        };
        for (groups, row_tiles) in [(12u32, 32u32), (12, 48), (16, 7), (5, 1), (64, 4)] {
            let costs: Vec<u32> = (0..groups).map(|j| 1000 + (j * 7919) % 503).collect();
            let tiles = groups * row_tiles;
            for ctas in [1u32, 7, 132].into_iter().filter(|&c| c <= tiles) {
                let table = crate::walk_table(&costs, row_tiles, ctas).unwrap();
                let mut taken = vec![0u32; tiles as usize];
                for b in 0..ctas {
                    for w in (0..)
                        .map(|r| table_item(&table, r, b, ctas, tiles))
                        .take_while(|&w| w < tiles)
                    {
                        taken[w as usize] += 1;
                    }
                }
                assert!(
                    taken.iter().all(|&n| n == 1),
                    "{tiles} tiles on {ctas} CTAs by a table"
                );
            }
        }
        let mut steps = GroupSteps {
            grp_ptr: vec![0, 2, 7, 7, 12],
            step_info: vec![0; 12],
            step_col1: Vec::new(),
            step_first: vec![0; 12],
            step_blk: Vec::new(),
            mask_bits: 16,
        };
        assert_eq!(steps.order(), vec![1, 3, 0, 2]);
        // Group 3's steps keep eight blocks each: as many steps as group 1, costlier.
        steps.step_info[7..].fill(0xff);
        assert_eq!(steps.order(), vec![3, 1, 0, 2]);
    }

    /// `bsr_wgmma::kstep_offset<ROWS, BK, SW>(j)`.
    fn kstep_offset(rows: u32, sw: u32, j: u32) -> u32 {
        (16 * j / sw) * (rows * 2 * sw) + (16 * j % sw) * 2
    }

    /// The shared address wgmma reads element `(r, k)` (k < 16) of a K-major 16-bit operand from,
    /// following the PTX ISA ("Shared Memory Matrix Layout"): the canonical layouts
    /// `Swizzle<b,4,3> o ((8, m), (T, 2k)) : ((nT, SBO), (1, T))` with T = 8 elements (16 bytes)
    /// and (n, b) = (8, 3), (4, 2), (2, 1) for the 128-, 64- and 32-byte swizzles (layout types
    /// 1, 2, 3): rows of a group of 8 are n * 16 bytes apart, groups SBO bytes apart, the two
    /// 8-element halves of the k16 step 16 bytes apart; the swizzle XORs byte-address bits
    /// [4, 4 + b) with bits [7, 7 + b).
    fn wgmma_reads(desc: u64, r: u32, k: u32) -> u32 {
        let (row_bytes, b) = match desc >> 62 {
            1 => (128, 3),
            2 => (64, 2),
            3 => (32, 1),
            other => panic!("layout type {other} is not a swizzled K-major layout"),
        };
        assert_eq!((desc >> 49) & 7, 0, "base offset");
        assert_eq!((desc >> 16) & 0x3FFF, 1, "leading byte offset (unused, 1)");
        assert_eq!(
            (desc >> 14) & 3,
            0,
            "start address overflow into reserved bits"
        );
        let start = ((desc & 0x3FFF) as u32) << 4;
        let sbo = (((desc >> 32) & 0x3FFF) as u32) << 4;
        let linear = start + (r / 8) * sbo + (r % 8) * row_bytes + (k / 8) * 16 + (k % 8) * 2;
        linear ^ (((linear >> 7) & ((1 << b) - 1)) << 4)
    }

    #[test]
    fn the_model_is_the_templates_address_math() {
        for line in [
            "static constexpr int kSbo = 8 * kRowBytes;",
            "static constexpr int kChunks = SW / 8;",
            "static constexpr int kLayout = SW == 64 ? 1 : (SW == 32 ? 2 : 3);",
            "static constexpr int kShift = SW == 64 ? 0 : (SW == 32 ? 1 : 2);",
            "static constexpr int SW = BK % 64 == 0 ? 64 : (BK % 32 == 0 ? 32 : 16);",
            "return ((addr & 0x3FFFFu) >> 4) | (1u << 16);",
            "return (u64)lo | ((u64)(A::kSbo >> 4) << 32) | ((u64)A::kLayout << 62);",
            "return (u32)((16 * j / SW) * (ROWS * 2 * SW) + (16 * j % SW) * 2);",
            "PAIRS ? bsr_wgmma::SliceAtom<BK / WB>::SW : bsr_wgmma::SliceAtom<BK>::SW;",
            "static constexpr int kStageBytes = (kTileABytes + kSlotsBytes * (kDual ? 2 : 1) + 1023) / 1024 * 1024;",
            "static constexpr int kAtoms = BK / SW;",
            "static constexpr int kAtomsB = BKB / SWB;",
            "static constexpr int BKB = BK / WB;",
            "static constexpr int kKSub = BC / BKB;",
            "static constexpr int kSlotBytes = BR * BKB * 2;",
            "const u32 ring = (smem_addr(mlpc_smem) + 1023u) & ~1023u;",
            "return lane < __popc(info & kMaskLow) ? p.step_blk[first + lane] : 0;",
            "const int col = (int)(info >> Cfg::kMaskBits) * BC;",
            "static constexpr int kMaskBits = G * WB > 16 ? G * WB : 16;",
            "static constexpr u32 kMaskLow = (1u << Cfg::kMaskBits) - 1u;",
            "const u32 sa = ring + stage * kStageBytes;",
            "bar, kTileABytes + __popc(mask) * kSlotBytes * (kDual ? 2 : 1));",
            "const int x = PAIRS ? (a == 0 ? col : col1 * BC) : col + ks * BKB + a * SW;",
            "tma_load_2d(sa + a * (BM * 2 * SW), map_a, x, m0, bar);",
            "auto col1_at = [&](int sl) { return PAIRS && sl < slices ? p.step_col1[s0 + sl] : 0; };",
            // The persistent walk.
            "return r * P + ((r & 1) ? P - 1 - b : b);",
            "const int tiles = m_tiles * p.groups;",
            "t.group = p.grp_order[w % p.groups];",
            "t.m0 = (w / p.groups) * BM;",
            "int sl = ((pw - before) % kProducerWarps + kProducerWarps) % kProducerWarps;",
            "for (; sl < slices; sl += kProducerWarps) {",
            "const int stage = (before + sl) % STAGES;",
            "before += slices;",
            "st_shared_u32(masks + 4 * stage, mask);",
            "const u32 mask = ld_shared_u32(masks + 4 * stage);",
            "init_acc(p, t.group, (i64)t.group * (G * BR), tid, acc, acc_up);",
            "store(p, (i64)t.m0, t.group, (i64)t.group * (G * BR), tid, acc, acc_up, map_c, staging,",
            "return Rows::at(group * G + g);",
            "return n0 + g * BR;",
            "return Rows::at(group * G + G - 1) < n;",
            "tma_store_2d(map_c, (int)cols(g0), (int)row0, buf);",
            "tma_store_2d(map_c, (int)cols(g0 + 1), (int)row0, buf + kHalfBytes);",
            "for (u32 rest = mask; rest != 0u; rest &= rest - 1u, ++j) {",
            "const int b = __shfl_sync(0xffffffffu, blk, j);",
            "const u32 slot = sa + kTileABytes + j * kSlotBytes;",
            "tma_load_2d(slot, map_b, 0, b * kWideRows, bar);",
            "tma_load_2d(slot + kSlotsBytes, map_bu, 0, b * kWideRows, bar);",
            "static constexpr int kWideRows = BR * BC * 2 / 128;",
            "const int x = ks * BKB + a * SWB;",
            "tma_load_2d(slot + a * (BR * 2 * SWB), map_b, x, b * BR, bar);",
            "tma_load_2d(slot + kSlotsBytes + a * (BR * 2 * SWB), map_bu,",
            "const u32 da_lo = bsr_wgmma::desc_lo(sa + wg * (64 * 2 * SW));",
            "if (((mask >> (w * G + g)) & 1u) == 0) continue;",
            "u32 slot_lo = bsr_wgmma::desc_lo(sa + kTileABytes);",
            "mma(g, w * KJB + j, slot_lo + (kstep_offset<BR, BKB>(j) >> 4));",
            "slot_lo += kSlotBytes >> 4;",
            "static constexpr int kSlotsBytes = Cfg::SLOTS * kSlotBytes;",
            "static constexpr int SLOTS = SLOTS_ > 0 ? SLOTS_ : WB * G;",
            "const u64 a_j = bsr_wgmma::desc_of<SW>(da_lo + (kstep_offset<BM, BK, SW>(ja) >> 4));",
            "wgmma_detail::Mma<T, BR>::run(acc[g], a_j, bsr_wgmma::desc_of<SWB>(b_lo));",
            "bsr_wgmma::desc_of<SWB>(b_lo + (kSlotsBytes >> 4)));",
            "wgmma_detail::MmaRs<T, BR>::run(acc[g], f[ja], bsr_wgmma::desc_of<SWB>(b_lo));",
            "const i64 col = cols(g) + i * 8 + (lane & 3) * 2;",
            "const i64 row = m0 + wg * 64 + q * 16 + (lane >> 2) + h * 8;",
            "if (cols(g) >= p.n) break;",
        ] {
            assert!(
                TEMPLATE.contains(line),
                "gemm_bsr_wgmma.cuh no longer says `{line}`"
            );
        }
    }

    /// `bsr_wgmma::ldsm_a_addr<BM, BK, SW>(sa, wg, q, lane, j)`.
    fn ldsm_a_addr(bm: u32, sw: u32, sa: u32, wg: u32, q: u32, lane: u32, j: u32) -> u32 {
        let (shift, chunks) = match sw {
            64 => (0, 8),
            32 => (1, 4),
            _ => (2, 2),
        };
        let i = lane >> 3;
        let row = wg * 64 + q * 16 + (i & 1) * 8 + (lane & 7);
        let chunk = (16 * j % sw) / 8 + (i >> 1);
        let pos = chunk ^ ((row >> shift) & (chunks - 1));
        sa + (16 * j / sw) * (bm * 2 * sw) + row * 2 * sw + pos * 16
    }

    /// With A in registers, the row of 8 elements each lane hands `ldmatrix.x4` is exactly where
    /// the descriptor form of the same wgmma reads them: matrix i = lane / 8 holds rows
    /// 8 (i % 2) .. + 7 of the warp's 16 and k 8 (i / 2) .. + 7 of the k16 step, which makes its
    /// registers the m16n8k16 A fragment (rows g, g + 8; k 2t, 2t + 8), the RS form's per-warp
    /// A layout. Every slice depth and both warpgroups; a wrong chunk, XOR or row fails it.
    #[test]
    fn a_fragments_come_from_where_the_descriptor_reads() {
        for line in [
            "const int row = wg * 64 + q * 16 + (i & 1) * 8 + (lane & 7);",
            "const int chunk = (16 * j % SW) / 8 + (i >> 1);",
            "const int pos = chunk ^ ((row >> A::kShift) & (A::kChunks - 1));",
            "return sa + (u32)((16 * j / SW) * (BM * 2 * SW) + row * A::kRowBytes + pos * 16);",
            "a_off[j] = bsr_wgmma::ldsm_a_addr<BM, BK, SW>(0, wg, q, lane, j);",
            "bsr_wgmma::ldsm_x4(f[j], sa + a_off[j]);",
            "wgmma_detail::MmaRs<T, BR>::run(acc[g], f[ja], bsr_wgmma::desc_of<SWB>(b_lo));",
        ] {
            assert!(
                TEMPLATE.contains(line),
                "gemm_bsr_wgmma.cuh no longer says `{line}`"
            );
        }
        let bm = 128;
        let sa = 4096;
        // (BK, SW): each slice depth in its widest atom, and BK 64 in atoms of 32 (pairs).
        for (bk, sw) in [(16, 16), (32, 32), (48, 16), (64, 64), (64, 32)] {
            for wg in 0..bm / 64 {
                let da = descriptor(sw, sa + wg * (64 * 2 * sw));
                for j in 0..bk / 16 {
                    let a_j = da + u64::from(kstep_offset(bm, sw, j) >> 4);
                    for q in 0..4 {
                        for lane in 0..32 {
                            let i = lane >> 3;
                            let r = q * 16 + (i & 1) * 8 + (lane & 7);
                            let at = sa + ldsm_a_addr(bm, sw, 0, wg, q, lane, j);
                            assert_eq!(at % 16, 0, "ldmatrix rows are 16-byte aligned");
                            for e in 0..8 {
                                assert_eq!(
                                    at + 2 * e,
                                    wgmma_reads(a_j, r, (i >> 1) * 8 + e),
                                    "BK {bk} SW {sw} wg {wg} step {j} warp {q} lane {lane} element {e}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// What the loads put at a shared-memory element.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Elem {
        /// A[m, k].
        A { m: u64, k: u64 },
        /// The weight (or the up weight) at [n, k], from a packed block.
        W { up: bool, n: u64, k: u64 },
        /// Zero-fill (A rows past M).
        Zero,
    }

    /// Small integers, so that every sum below is exact in f64.
    fn a_val(m: u64, k: u64) -> f64 {
        ((m * 7 + k * 3) % 11) as f64 - 5.0
    }

    fn w_val(up: bool, n: u64, k: u64) -> f64 {
        ((n * 5 + k * 13 + u64::from(up) * 3) % 9) as f64 - 4.0
    }

    fn value(e: Elem) -> f64 {
        match e {
            Elem::A { m, k } => a_val(m, k),
            Elem::W { up, n, k } => w_val(up, n, k),
            Elem::Zero => 0.0,
        }
    }

    /// The emulated outputs: gate (or plain) and up accumulators by (row, col).
    type Acc = HashMap<(u64, u64), f64>;

    /// Runs every CTA of the kernel for `pattern` over `m` rows, checking each read; returns the
    /// accumulators and how often each output element is written by the epilogue.
    fn emulate(
        pattern: &BlockPattern,
        cfg: WgmmaBsr,
        dual: bool,
        m: u64,
    ) -> (Acc, Acc, HashMap<(u64, u64), u32>) {
        let [br, bc] = pattern.block;
        let (g, bk, wb, bm, stages) = (cfg.g, cfg.bk, cfg.wb, cfg.bm, cfg.stages);
        assert_eq!(cfg.threads(), CONSUMERS + 128);
        // A block's piece of a slice: `bkb` columns (the whole block in a window of `wb`).
        let bkb = bk / wb;
        assert!(wb == 1 || bkb == bc, "a window is whole blocks");
        // Pairs: A in one atom column per block column.
        let (sw, swb) = (if cfg.pairs { atom(bkb) } else { atom(bk) }, atom(bkb));
        assert_eq!(sw, cfg.atom(), "A's tensor map box width");
        assert_eq!(swb, cfg.block_atom(), "the blocks' tensor map box width");
        let sw_atoms = bk / sw;
        let kksub = bc / bkb;
        let tile_a = bm * bk * 2;
        let slot = br * bkb * 2;
        let slots = cfg.slots * slot;
        let stage_bytes = tile_a + slots * if dual { 2 } else { 1 };
        assert_eq!(cfg.smem_bytes(br, dual), stages * (stage_bytes + 20) + 1024);
        let steps = GroupSteps::of(pattern, &cfg);
        let grouping = cfg.groups(pattern);
        assert!(cfg.slots <= wb * g);
        let groups = steps.grp_ptr.len() - 1;
        // The template aligns the ring to 1024 bytes inside the dynamic allocation.
        let ring = 1024u32;
        let (mut acc, mut acc_up) = (Acc::new(), Acc::new());
        let mut written: HashMap<(u64, u64), u32> = HashMap::new();
        let mut mask_words = vec![0u32; stages as usize];

        // The persistent walk: CTA b's tile of round r (`work_item`, then `tile_at`'s group and
        // rows), on a grid of at most three CTAs so that each takes several tiles, in both
        // directions of the snake; the ring's slice numbers run on across a CTA's tiles.
        let m_tiles = m.div_ceil(u64::from(bm)) as u32;
        let tiles = m_tiles * groups as u32;
        let order = steps.order();
        let ctas = tiles.min(3);
        for cta in 0..ctas {
            let mut before = 0usize;
            for w in (0..)
                .map(|r| work_item(r, cta, ctas))
                .take_while(|&w| w < tiles)
            {
                let group = order[w as usize % groups] as usize;
                let m0 = u64::from(w / groups as u32 * bm);
                let start = before;
                before +=
                    (steps.grp_ptr[group + 1] - steps.grp_ptr[group]) as usize * kksub as usize;
                let n0 = (group as u64) * u64::from(g * br);
                // `SlotCols`: the output column of slot gg's first column.
                let slot_col = |gg: u32| -> u64 {
                    match &grouping {
                        Groups::Consecutive { .. } => n0 + u64::from(gg * br),
                        Groups::Listed { rows, .. } => {
                            u64::from(rows[(group as u32 * g + gg) as usize]) * u64::from(br)
                        }
                    }
                };
                let mut smem: HashMap<u32, Elem> = HashMap::new();
                let s0 = steps.grp_ptr[group] as usize;
                let slices = (steps.grp_ptr[group + 1] as usize - s0) * kksub as usize;
                // The producer's copies of slice `sl` into `stage`: one TMA box per atom column
                // of the A piece and of each kept block (the j-th set bit of the mask takes the
                // j-th block of the step, as the lanes hold them).
                let load = |smem: &mut HashMap<u32, Elem>, stage: u32, sl: usize| {
                    let s = s0 + sl / kksub as usize;
                    let ks = (sl % kksub as usize) as u32;
                    let mask = steps.mask(s);
                    let col = steps.column(s) * bc;
                    let mut bytes = 0u32;
                    let mut box_copy =
                        |smem: &mut HashMap<u32, Elem>,
                         dst: u32,
                         rows: u32,
                         sw: u32,
                         e: &dyn Fn(u32, u32) -> Elem| {
                            assert_eq!(dst % 128, 0, "a TMA box starts 128-byte aligned");
                            for r in 0..rows {
                                for i in 0..sw {
                                    let at = tma_box_address(sw, dst, r, i);
                                    assert!(
                                        at >= stage && at + 2 <= stage + stage_bytes,
                                        "outside the stage"
                                    );
                                    assert!(
                                        smem.insert(at, e(r, i)).is_none(),
                                        "two elements of slice {sl} at {at}"
                                    );
                                    bytes += 2;
                                }
                            }
                        };
                    // Earlier slices' elements in this stage are stale: the consumers released it.
                    smem.retain(|&at, _| at < stage || at >= stage + stage_bytes);
                    for a in 0..sw_atoms {
                        // Pairs: atom column a is block column a of the pair.
                        let x = match (cfg.pairs, a) {
                            (true, 0) => col,
                            (true, _) => steps.step_col1[s] * bc,
                            (false, _) => col + ks * bkb + a * sw,
                        };
                        box_copy(smem, stage + a * (bm * 2 * sw), bm, sw, &|r, i| {
                            let row = m0 + u64::from(r);
                            if row < m {
                                Elem::A {
                                    m: row,
                                    k: u64::from(x + i),
                                }
                            } else {
                                Elem::Zero
                            }
                        });
                    }
                    let first = steps.step_first[s];
                    // The j-th kept block (mask bit w * G + g: block row g, window column w)
                    // into slot j.
                    for (j, _) in (0..wb * g).filter(|k| (mask >> k) & 1 == 1).enumerate() {
                        let blk = steps.step_blk[(first + j as u32) as usize] as usize;
                        // The packed block's own place in the weight, not the step's claim:
                        // box rows blk * BR .. of the packed [kept * BR, BC] matrix.
                        let (brow, bcol) = pattern.kept[blk];
                        let slot_at = stage + tile_a + j as u32 * slot;
                        if cfg.wide {
                            // One box of 128-byte rows from the rearranged copy: its element
                            // (r, i) is element e of packed chunk perm[r * 8 + i / 8] of the block.
                            let perm = wide_block_perm(br, bc);
                            for (up, at) in [(false, slot_at), (true, slot_at + slots)] {
                                if up && !dual {
                                    continue;
                                }
                                let rows = WgmmaBsr::wide_rows(br, bc);
                                box_copy(smem, at, rows, 64, &|r, i| {
                                    let e = perm[(r * 8 + i / 8) as usize] * 8 + i % 8;
                                    Elem::W {
                                        up,
                                        n: u64::from(brow * br + e / bc),
                                        k: u64::from(bcol * bc + e % bc),
                                    }
                                });
                            }
                            continue;
                        }
                        for a in 0..bkb / swb {
                            let x = ks * bkb + a * swb;
                            for (up, at) in [(false, slot_at), (true, slot_at + slots)] {
                                if up && !dual {
                                    continue;
                                }
                                box_copy(smem, at + a * (br * 2 * swb), br, swb, &|r, i| Elem::W {
                                    up,
                                    n: u64::from(brow * br + r),
                                    k: u64::from(bcol * bc + x + i),
                                });
                            }
                        }
                    }
                    // The bytes the `full` barrier expects.
                    let kept = mask.count_ones();
                    assert_eq!(bytes, tile_a + kept * slot * if dual { 2 } else { 1 });
                    // The row mask lane 0 publishes in the stage's mask word.
                    mask
                };

                // The ring, in the template's order: slice kt in stage kt % STAGES, loaded once
                // the consumers released the stage's previous slice (kt - STAGES).
                // The consumers take each slice's row mask from its stage's mask word.
                for kt in 0..slices {
                    let read_stage = (start + kt) % stages as usize;
                    mask_words[read_stage] =
                        load(&mut smem, ring + read_stage as u32 * stage_bytes, kt);
                    let mask = mask_words[read_stage];
                    let sa = ring + read_stage as u32 * stage_bytes;
                    for wg in 0..bm / 64 {
                        let da_lo = desc_lo(sa + wg * (64 * 2 * sw));
                        let mut slot_lo = desc_lo(sa + tile_a);
                        for k in (0..wb * g).filter(|k| (mask >> k) & 1 == 1) {
                            let (w, gg) = (k / g, k % g);
                            let this_lo = slot_lo;
                            slot_lo += slot >> 4;
                            for j in 0..bkb / 16 {
                                let ja = w * (bkb / 16) + j;
                                let a_j = desc_of(sw, da_lo + (kstep_offset(bm, sw, ja) >> 4));
                                let b_lo = this_lo + (kstep_offset(br, swb, j) >> 4);
                                let b_j = desc_of(swb, b_lo);
                                let read = |d: u64, r: u32, k: u32| {
                                    let at = wgmma_reads(d, r, k);
                                    *smem.get(&at).unwrap_or_else(|| {
                                        panic!("slice {kt}: wgmma reads {at}, never written")
                                    })
                                };
                                let a: Vec<Vec<Elem>> = (0..64)
                                    .map(|r| (0..16).map(|k| read(a_j, r, k)).collect())
                                    .collect();
                                let mut products = vec![(false, b_j)];
                                if dual {
                                    products.push((true, desc_of(swb, b_lo + (slots >> 4))));
                                }
                                for (up, d) in products {
                                    for nn in 0..br {
                                        let col = slot_col(gg) + u64::from(nn);
                                        for kk in 0..16 {
                                            let w = read(d, nn, kk);
                                            let Elem::W { up: wu, n, k } = w else {
                                                panic!("B ({nn}, {kk}) of slot {gg} holds {w:?}")
                                            };
                                            assert_eq!((wu, n), (up, col), "slot {gg} row {nn}");
                                            for (r, arow) in a.iter().enumerate() {
                                                match arow[kk as usize] {
                                                    Elem::A { m: am, k: ak } => {
                                                        assert_eq!(
                                                            am,
                                                            m0 + u64::from(wg * 64) + r as u64
                                                        );
                                                        assert_eq!(ak, k, "A's k against B's");
                                                    }
                                                    Elem::Zero => {
                                                        assert!(
                                                            m0 + u64::from(wg * 64) + r as u64 >= m
                                                        )
                                                    }
                                                    other => {
                                                        panic!("A ({r}, {kk}) holds {other:?}")
                                                    }
                                                }
                                            }
                                        }
                                        for (r, arow) in a.iter().enumerate() {
                                            let row = m0 + u64::from(wg * 64) + r as u64;
                                            if row >= m {
                                                continue;
                                            }
                                            let dot: f64 = (0..16)
                                                .map(|kk| {
                                                    value(arow[kk]) * value(read(d, nn, kk as u32))
                                                })
                                                .sum();
                                            let target = if up { &mut acc_up } else { &mut acc };
                                            *target.entry((row, col)).or_insert(0.0) += dot;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }

                // The epilogue's stores.
                for tid in 0..CONSUMERS {
                    let (wg, lane, q) = (tid >> 7, tid & 31, (tid >> 5) & 3);
                    for h in 0..2 {
                        let row = m0 + u64::from(wg * 64 + q * 16 + (lane >> 2) + h * 8);
                        if row >= m {
                            continue;
                        }
                        for gg in 0..g {
                            if slot_col(gg) >= pattern.out {
                                break;
                            }
                            for i in 0..br / 8 {
                                let col = slot_col(gg) + u64::from(i * 8 + (lane & 3) * 2);
                                for c in [col, col + 1] {
                                    *written.entry((row, c)).or_insert(0) += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        (acc, acc_up, written)
    }

    /// The pruned GEMM on the CPU: (gate or plain, up) at (row, col).
    fn reference(pattern: &BlockPattern, m: u64, up: bool) -> Acc {
        let [br, bc] = pattern.block.map(u64::from);
        let mut out = Acc::new();
        for &(r, c) in &pattern.kept {
            for row in 0..m {
                for n in u64::from(r) * br..(u64::from(r) + 1) * br {
                    let dot: f64 = (u64::from(c) * bc..(u64::from(c) + 1) * bc)
                        .map(|k| a_val(row, k) * w_val(up, n, k))
                        .sum();
                    *out.entry((row, n)).or_insert(0.0) += dot;
                }
            }
        }
        out
    }

    /// Emulates the configuration `select_wgmma` picks (and, where it copies blocks wide, also
    /// the form with boxes of their own rows; and the short-grid entry's, where there is one)
    /// against the pruned GEMM.
    fn check(pattern: &BlockPattern, dual: bool, m: u64, expect: Option<(u32, u32, u32, bool)>) {
        let la = (MatLayout::N, &Extent::constant(pattern.inp));
        let cfg = select_wgmma(Arch::Sm90a, DType::Bf16, dual, la, pattern)
            .unwrap_or_else(|| panic!("{:?} takes the wgmma kernel", pattern.block));
        if let Some((g, bk, wb, wide)) = expect {
            assert_eq!(
                (cfg.g, cfg.bk, cfg.wb, cfg.wide),
                (g, bk, wb, wide),
                "{:?}",
                pattern.block
            );
        }
        check_cfg(pattern, cfg, dual, m);
        if cfg.wide {
            check_cfg(pattern, WgmmaBsr { wide: false, ..cfg }, dual, m);
        }
        // The other grouping (block rows chosen by overlap where the selection kept consecutive
        // ones, and back), with a slot for every block a step may keep.
        let other = WgmmaBsr {
            listed: !cfg.listed,
            staging_bufs: 0,
            ..cfg
        };
        let slots = slots_for(
            &GroupSteps::of(pattern, &other),
            pattern.block[0],
            cfg.bk / cfg.wb,
            cfg.wb * cfg.g,
        );
        let stage = WgmmaBsr::stage_bytes(cfg.bm, slots, pattern.block[0], cfg.bk, cfg.wb, dual);
        let stages = stages_fitting(stage, 0);
        check_cfg(
            pattern,
            WgmmaBsr {
                slots,
                stages,
                ..other
            },
            dual,
            m,
        );
        let mut g = cfg.g;
        for short in select_wgmma_short_grids(Arch::Sm90a, DType::Bf16, dual, la, pattern) {
            assert!(short.g < g && short.wide == cfg.wide, "{:?}", pattern.block);
            g = short.g;
            check_cfg(pattern, short, dual, m);
        }
    }

    fn check_cfg(pattern: &BlockPattern, cfg: WgmmaBsr, dual: bool, m: u64) {
        assert!(
            cfg.smem_bytes(pattern.block[0], dual) <= SMEM_LIMIT,
            "{cfg:?}"
        );
        let (acc, acc_up, written) = emulate(pattern, cfg, dual, m);
        let what = format!("{:?} dual={dual} M={m} wide={}", pattern.block, cfg.wide);
        let nonzero = |a: &Acc| -> Acc {
            a.iter()
                .filter(|e| *e.1 != 0.0)
                .map(|(k, v)| (*k, *v))
                .collect()
        };
        assert_eq!(
            nonzero(&acc),
            nonzero(&reference(pattern, m, false)),
            "{what}"
        );
        if dual {
            assert_eq!(
                nonzero(&acc_up),
                nonzero(&reference(pattern, m, true)),
                "{what}"
            );
        } else {
            assert!(acc_up.is_empty());
        }
        // Every output element is stored once, none outside [M, N].
        assert_eq!(written.len() as u64, m * pattern.out, "{what}");
        assert!(
            written
                .iter()
                .all(|(&(r, c), &n)| n == 1 && r < m && c < pattern.out),
            "{what}"
        );
    }

    /// A random-looking pattern with about `density` of the blocks, and block row `empty` kept
    /// empty (an LCG: the tests need no crate for it).
    fn scattered(
        block: [u32; 2],
        out: u64,
        inp: u64,
        density: f64,
        seed: u64,
        empty: Option<u32>,
    ) -> BlockPattern {
        let mut x = seed;
        let rows = (out / u64::from(block[0])) as u32;
        let cols = (inp / u64::from(block[1])) as u32;
        let mut kept = Vec::new();
        for r in 0..rows {
            for c in 0..cols {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (x >> 33) as f64 / (1u64 << 31) as f64;
                if u < density && Some(r) != empty {
                    kept.push((r, c));
                }
            }
        }
        if kept.is_empty() {
            kept.push((0, 0));
        }
        let p = BlockPattern {
            block,
            out,
            inp,
            kept,
        };
        p.check().unwrap();
        p
    }

    #[test]
    fn every_element_wgmma_reads_is_the_one_the_loads_wrote() {
        // (block, weight, dual, expected (G, BK, WB)): the three swizzle modes, several atom
        // columns per slice (48), two slices per block (128), windows of two 32-wide blocks (A
        // in 128-byte rows, blocks in 64-byte ones; K an odd number of block columns, so the
        // last window is half outside A), 32-wide blocks one per slice (G = 16), tall blocks,
        // a last group with fewer rows, dual; long k loops that wrap the ring several times.
        // Blocks whose rows are narrower than 128 bytes and whose bytes are whole 1024-byte
        // periods are copied wide (the last field); both forms are emulated for them.
        type Case = ([u32; 2], u64, u64, bool, (u32, u32, u32, bool));
        let cases: [Case; 14] = [
            ([32, 32], 256, 2048, false, (8, 64, 2, true)),
            ([64, 64], 256, 1024, true, (2, 64, 1, false)),
            ([32, 32], 384, 224, false, (8, 64, 2, true)),
            ([16, 16], 256, 64, false, (16, 16, 1, false)),
            ([64, 64], 256, 256, false, (4, 64, 1, false)),
            ([16, 48], 96, 144, false, (6, 48, 1, false)),
            ([16, 128], 64, 256, false, (4, 64, 1, false)),
            ([8, 16], 256, 64, false, (16, 16, 1, false)),
            ([192, 32], 384, 64, false, (1, 32, 1, true)),
            ([32, 32], 256, 128, true, (4, 64, 2, true)),
            ([16, 16], 160, 64, true, (8, 16, 1, false)),
            ([64, 32], 192, 96, true, (2, 64, 2, true)),
            ([16, 32], 256, 160, false, (16, 32, 1, true)),
            ([16, 32], 128, 480, true, (8, 64, 2, true)),
        ];
        for (i, (block, out, inp, dual, expect)) in cases.into_iter().enumerate() {
            let p = scattered(block, out, inp, 0.45, 17 + i as u64, Some(1));
            check(&p, dual, 130, Some(expect));
        }
        // Eleven block rows a group (21 rows: the last group of ten; the kernel's own entry where
        // K is at least 4096): a 22-bit mask in the step's low 22 bits, windows of two, and at
        // low density pairs of kept columns; with 258 block columns too (K = 8256: the column
        // in the step's bits 22-30; M = 65 there, to keep the emulation short).
        for (density, pairs, inp, m) in [
            (0.9, false, 224, 130),
            (0.1, true, 224, 130),
            (0.9, false, 8256, 65),
            (0.1, true, 8256, 65),
        ] {
            let p = scattered([32, 32], 672, inp, density, 40, Some(3));
            let la = (MatLayout::N, &Extent::constant(p.inp));
            let cfg = select_wgmma_cols(Arch::Sm90a, DType::Bf16, false, la, &p, 352).unwrap();
            assert_eq!((cfg.g, cfg.wb, cfg.pairs), (11, 2, pairs));
            check_cfg(&p, cfg, false, m);
            check_cfg(&p, WgmmaBsr { wide: false, ..cfg }, false, m);
            // The kernel's own entry takes them where K >= 4096.
            if pairs {
                let own = select_wgmma(Arch::Sm90a, DType::Bf16, false, la, &p).unwrap();
                assert_eq!(own.g, if inp >= 4096 { 11 } else { 8 }, "K = {inp}");
            }
        }
    }

    /// Balanced groups: every block row once, at most `g` a group, rows increasing and empty
    /// slots last; the costliest group's modelled cycles never above the unbalanced groups'. On a
    /// weight like the benchmark's at density 0.5 (128 block rows in groups of eleven, the last
    /// of seven; windows) the selection lists balanced groups, which lower the costliest by at
    /// least 3 %; at density 0.25 (pairs) it keeps the unbalanced ones.
    #[test]
    fn balanced_groups_lower_the_costliest_group() {
        for (density, seed) in [(0.5, 2), (0.3, 3), (0.1, 4), (0.9, 5)] {
            let p = scattered([32, 32], 4096, 4096, density, seed, None);
            for unit in [StepUnit::Windows, StepUnit::Pairs, StepUnit::Columns] {
                let g = 11;
                let steps = |groups: &Groups| match unit {
                    StepUnit::Pairs => GroupSteps::pairs(&p, groups, PairOrder::Natural),
                    StepUnit::Windows => GroupSteps::new(&p, groups, 2),
                    StepUnit::Columns => GroupSteps::new(&p, groups, 1),
                };
                let plain = Groups::by_overlap(&p, g, unit, false);
                let even = Groups::by_overlap(&p, g, unit, true);
                let Groups::Listed { rows, .. } = &even else {
                    panic!("{even:?}");
                };
                let block_rows = p.block_rows() as u32;
                let mut seen: Vec<u32> = rows.iter().copied().filter(|&r| r < block_rows).collect();
                for group in rows.chunks(g as usize) {
                    let filled = group.iter().take_while(|&&r| r < block_rows).count();
                    assert!(filled > 0 && group[filled..].iter().all(|&r| r == block_rows));
                    assert!(group[..filled].windows(2).all(|w| w[0] < w[1]));
                }
                seen.sort_unstable();
                assert_eq!(seen, (0..block_rows).collect::<Vec<_>>());
                assert!(steps(&even).costliest() <= steps(&plain).costliest());
            }
        }
        let k = Extent::constant(4096);
        let la = (MatLayout::N, &k);
        let p50 = scattered([32, 32], 4096, 4096, 0.5, 2, None);
        let c = select_wgmma(Arch::Sm90a, DType::Bf16, false, la, &p50).unwrap();
        assert!(c.listed && c.balanced && !c.pairs && c.wb == 2, "{c:?}");
        let even = GroupSteps::of(&p50, &c);
        let consecutive = GroupSteps::new(&p50, &Groups::Consecutive { g: c.g }, 2);
        assert!(100 * even.costliest() <= 97 * consecutive.costliest());
        let p25 = scattered([32, 32], 4096, 4096, 0.25, 7, None);
        let c25 = select_wgmma(Arch::Sm90a, DType::Bf16, false, la, &p25).unwrap();
        assert!(c25.pairs && !c25.balanced, "{c25:?}");
    }

    /// The kernel's own entry takes groups of eleven block rows only where their slots leave
    /// the ring four stages: from density 0.7 on a step keeps up to all 22 blocks of its window,
    /// which leaves eleven rows three stages, and groups of eight run with four instead
    /// (docs/perf-notes.md, block-sparse variant 43: 1.5x faster at density 0.7 to 1).
    #[test]
    fn wide_groups_only_where_the_ring_keeps_four_stages() {
        for (density, g) in [(0.5, 11), (0.8, 8), (1.0, 8)] {
            let p = scattered([32, 32], 4096, 4096, density, 5, None);
            let la = (MatLayout::N, &Extent::constant(p.inp));
            let cfg = select_wgmma(Arch::Sm90a, DType::Bf16, false, la, &p).unwrap();
            assert_eq!(
                (cfg.g, cfg.stages >= 4),
                (g, true),
                "density {density}: {cfg:?}"
            );
            let wide = select_wgmma_cols(Arch::Sm90a, DType::Bf16, false, la, &p, 352).unwrap();
            assert_eq!(wide.stages < 4, g == 8, "density {density}: {wide:?}");
            // Groups of eight are already the first short grid's.
            let short = select_wgmma_short_grids(Arch::Sm90a, DType::Bf16, false, la, &p);
            assert_eq!(
                short.iter().map(|s| s.g).collect::<Vec<_>>(),
                if g == 11 {
                    vec![8, 6, 4, 2]
                } else {
                    vec![6, 4, 2]
                },
                "density {density}"
            );
        }
    }

    /// Low density: 32-wide blocks take pairs of the group's kept columns (the windows do not
    /// pay); A arrives in one box per column, wherever the two lie, and a group with an odd
    /// number of kept columns ends on a pair of one column.
    #[test]
    fn pairs_of_kept_columns_read_what_the_loads_wrote() {
        for (seed, dual, m) in [(31, false, 130), (32, true, 70), (33, false, 300)] {
            let p = scattered([32, 32], 256, 1024, 0.1, seed, Some(2));
            let la = (MatLayout::N, &Extent::constant(p.inp));
            let cfg = select_wgmma(Arch::Sm90a, DType::Bf16, dual, la, &p).unwrap();
            assert!(cfg.pairs && cfg.wb == 2 && cfg.atom() == 32, "{cfg:?}");
            let steps = GroupSteps::of(&p, &cfg);
            assert!(
                steps
                    .step_col1
                    .iter()
                    .enumerate()
                    .any(|(s, c)| steps.column(s) == *c),
                "seed {seed}: some group ends on a pair of one column"
            );
            check(&p, dual, m, Some((cfg.g, 64, 2, true)));
        }
    }

    /// Balanced pairs ([`PairOrder::Balanced`]) and their split steps: every kept block once,
    /// under a mask bit of its row and of its column's place in the pair, each group's kept
    /// columns in one pair each (a split step repeating its pair), no step past the cap, the
    /// largest step smaller than the natural pairs', and the emulated CTAs of a configuration
    /// that walks them read what the loads wrote.
    #[test]
    fn balanced_pairs_keep_every_block_once_in_smaller_steps() {
        for (seed, density, m) in [(41, 0.25, 130), (42, 0.1, 200)] {
            let p = scattered([32, 32], 256, 1024, density, seed, None);
            let la = (MatLayout::N, &Extent::constant(p.inp));
            let picked = select_wgmma(Arch::Sm90a, DType::Bf16, false, la, &p).unwrap();
            assert_eq!(picked.wb, 2, "{picked:?}");
            let groups = Groups::Consecutive { g: picked.g };
            let natural = GroupSteps::pairs(&p, &groups, PairOrder::Natural);
            let balanced = GroupSteps::pairs(&p, &groups, PairOrder::Balanced);
            let most = |s: &GroupSteps| s.masks().map(u32::count_ones).max().unwrap_or(0);
            // Never larger; smaller on the denser pattern (at d = 0.1 on this small weight the
            // runs of 16 find no better pairs for the largest step).
            assert!(most(&balanced) <= most(&natural), "seed {seed}");
            assert!(
                density < 0.2 || most(&balanced) < most(&natural),
                "seed {seed}"
            );
            let cap = balanced.cap_within(2);
            let capped = balanced.split_above(cap);
            assert!(
                most(&capped) <= cap && cap <= most(&balanced),
                "seed {seed}: cap {cap}"
            );
            let added = capped.step_info.len() - balanced.step_info.len();
            assert!(
                50 * added <= balanced.step_info.len(),
                "seed {seed}: {added} more steps"
            );
            // A cap that splits some steps whatever the pattern.
            let cap = most(&balanced) - 1;
            let split = balanced.split_above(cap);
            assert!(most(&split) == cap && split.step_info.len() > balanced.step_info.len());
            // The packed blocks are the kept ones in row-major order.
            let packed = &p.kept;
            for s in [&natural, &balanced, &capped, &split] {
                let mut seen = Vec::new();
                for j in 0..s.grp_ptr.len() - 1 {
                    let mut pairs = Vec::new();
                    for st in s.grp_ptr[j] as usize..s.grp_ptr[j + 1] as usize {
                        let cols = [s.column(st), s.step_col1[st]];
                        let mask = s.mask(st);
                        let blocks = s.blocks(st);
                        assert_eq!(mask.count_ones() as usize, blocks.len());
                        let bits = (0..24).filter(|b| mask >> b & 1 == 1);
                        for (bit, &at) in bits.zip(blocks) {
                            let (w, i) = (bit / picked.g, bit % picked.g);
                            let (r, c) = packed[at as usize];
                            assert_eq!((r, c), (j as u32 * picked.g + i, cols[w as usize]));
                            seen.push(at);
                        }
                        if pairs.last() != Some(&cols) {
                            pairs.push(cols);
                        }
                    }
                    let mut walked: Vec<u32> = pairs.iter().flat_map(|c| [c[0], c[1]]).collect();
                    walked.sort_unstable();
                    walked.dedup();
                    let mut columns: Vec<u32> = packed
                        .iter()
                        .filter(|k| k.0 / picked.g == j as u32)
                        .map(|k| k.1)
                        .collect();
                    columns.sort_unstable();
                    columns.dedup();
                    assert_eq!(walked, columns, "group {j}: its kept columns");
                    let pair_cols: usize =
                        pairs.iter().map(|c| if c[0] == c[1] { 1 } else { 2 }).sum();
                    assert_eq!(
                        pair_cols,
                        columns.len(),
                        "group {j}: each column in one pair"
                    );
                }
                seen.sort_unstable();
                assert_eq!(seen, (0..p.kept.len() as u32).collect::<Vec<_>>());
            }
            let steps_cfg = WgmmaBsr {
                pairs: true,
                pair_cap: Some(cap),
                listed: false,
                slots: slots_for(&split, 32, 32, 2 * picked.g),
                ..picked
            };
            assert_eq!(GroupSteps::of(&p, &steps_cfg), split);
            check_cfg(&p, steps_cfg, false, m);
        }
    }

    #[test]
    fn edge_densities() {
        // Every block kept; a single block; all but one block row empty; M below one tile.
        let full = scattered([32, 32], 256, 128, 1.0, 1, None);
        check(&full, false, 64, None);
        let single = BlockPattern {
            block: [32, 32],
            out: 256,
            inp: 128,
            kept: vec![(5, 2)],
        };
        check(&single, false, 128, None);
        check(&single, true, 1, None);
        let one_row = scattered([16, 32], 512, 128, 0.6, 9, None);
        let one_row = BlockPattern {
            kept: one_row.kept.into_iter().filter(|&(r, _)| r == 20).collect(),
            ..one_row
        };
        check(&one_row, false, 200, None);
    }

    #[test]
    fn group_steps_cover_each_kept_block_once_in_column_order() {
        for (seed, density, wb) in [
            (3, 0.1, 1),
            (4, 0.5, 1),
            (5, 0.9, 1),
            (6, 0.3, 2),
            (7, 0.7, 2),
        ] {
            let p = scattered([16, 16], 400, 256, density, seed, Some(7));
            let groupings = [1, 3, 8, 16]
                .into_iter()
                .filter(|g| g * wb <= 16)
                .flat_map(|g| {
                    [
                        Groups::Consecutive { g },
                        Groups::by_overlap(&p, g, StepUnit::of(wb, false), false),
                        Groups::by_overlap(&p, g, StepUnit::of(wb, false), true),
                    ]
                });
            for groups in groupings {
                let g = groups.g();
                let s = GroupSteps::new(&p, &groups, wb);
                assert_eq!(
                    s.grp_ptr.len() as u64,
                    p.block_rows().div_ceil(u64::from(g)) + 1
                );
                let row_of =
                    |j: usize, i: u32| groups.slots(&p, j as u32).find(|s| s.0 == i).map(|s| s.1);
                let mut seen = Vec::new();
                for j in 0..s.grp_ptr.len() - 1 {
                    let (a, b) = (s.grp_ptr[j] as usize, s.grp_ptr[j + 1] as usize);
                    let cols: Vec<u32> = (a..b).map(|st| s.column(st)).collect();
                    assert!(cols.windows(2).all(|w| w[0] < w[1]), "columns increase");
                    for st in a..b {
                        let (col, mask) = (s.column(st), s.mask(st));
                        assert!(mask != 0 && mask < 1 << (g * wb));
                        assert_eq!(col % wb, 0, "a window starts on a multiple of its width");
                        let first = s.step_first[st] as usize;
                        for (n, bit) in (0..g * wb).filter(|b| (mask >> b) & 1 == 1).enumerate() {
                            let blk = s.step_blk[first + n] as usize;
                            let (w, i) = (bit / g, bit % g);
                            assert_eq!(Some(p.kept[blk]), row_of(j, i).map(|r| (r, col + w)));
                            seen.push(blk);
                        }
                    }
                }
                assert_eq!(s.step_first.len(), s.step_info.len());
                assert_eq!(s.step_blk.len(), p.kept.len());
                seen.sort_unstable();
                assert_eq!(seen, (0..p.kept.len()).collect::<Vec<_>>());
            }
        }
    }

    /// Pairs: a group's steps walk its kept columns two by two in increasing order, every
    /// column once (the last alone when they are odd), and each kept block once under the bit
    /// of its row and its place in the pair.
    #[test]
    fn pairs_cover_each_kept_column_and_block_once() {
        for (seed, density) in [(3, 0.05), (4, 0.1), (5, 0.3), (6, 0.9)] {
            let p = scattered([32, 32], 512, 2048, density, seed, Some(5));
            for g in [1, 3, 8] {
                let s = GroupSteps::pairs(&p, &Groups::Consecutive { g }, PairOrder::Natural);
                assert_eq!(s.step_col1.len(), s.step_info.len());
                let mut seen = Vec::new();
                for j in 0..s.grp_ptr.len() - 1 {
                    let (a, b) = (s.grp_ptr[j] as usize, s.grp_ptr[j + 1] as usize);
                    let rows = j as u32 * g..((j as u32 + 1) * g);
                    let mut union: Vec<u32> = p
                        .kept
                        .iter()
                        .filter(|k| rows.contains(&k.0))
                        .map(|k| k.1)
                        .collect();
                    union.dedup();
                    union.sort_unstable();
                    union.dedup();
                    let mut walked = Vec::new();
                    for st in a..b {
                        let (c0, c1) = (s.column(st), s.step_col1[st]);
                        let mask = s.mask(st);
                        walked.push(c0);
                        if c1 != c0 {
                            walked.push(c1);
                        } else {
                            assert_eq!(st, b - 1, "only the last pair has one column");
                            assert_eq!(mask >> g, 0, "nothing kept in its second column");
                        }
                        let first = s.step_first[st] as usize;
                        for (n, bit) in (0..2 * g).filter(|b| (mask >> b) & 1 == 1).enumerate() {
                            let blk = s.step_blk[first + n] as usize;
                            let col = if bit < g { c0 } else { c1 };
                            assert_eq!(p.kept[blk], (j as u32 * g + bit % g, col));
                            seen.push(blk);
                        }
                    }
                    assert_eq!(walked, union, "group {j}: the kept columns in order, once");
                }
                seen.sort_unstable();
                assert_eq!(seen, (0..p.kept.len()).collect::<Vec<_>>());
            }
        }
    }

    /// 32-wide blocks take windows of two block columns where the pattern's windows are at most
    /// 0.6 of its block-column steps: at density 0.5 and 0.25 of a random pattern (about 0.50
    /// and 0.55), not at 0.1 (about 0.71), which takes pairs of kept columns instead (about
    /// 0.5), nor for a single block (1.0 either way).
    #[test]
    fn windows_of_two_block_columns_where_they_halve_the_steps() {
        let k = Extent::constant(2048);
        let la = (MatLayout::N, &k);
        let wb = |p: &BlockPattern| {
            let c = select_wgmma(Arch::Sm90a, DType::Bf16, false, la, p).unwrap();
            let groups = Groups::Consecutive { g: c.g };
            let steps = |wb| GroupSteps::new(p, &groups, wb).step_info.len() as f64;
            ((c.wb, c.pairs), steps(2) / steps(1))
        };
        // Where the windows do not pay, pairs of kept columns; at 0.25 pairs too, over groups
        // chosen for them (listed), where they take under 0.92 of the windows' steps.
        for (density, expect) in [(0.5, (2, false)), (0.25, (2, true)), (0.1, (2, true))] {
            let p = scattered([32, 32], 2048, 2048, density, 11, None);
            let (got, ratio) = wb(&p);
            assert_eq!(got, expect, "density {density}: windows / steps {ratio:.2}");
        }
        let single = BlockPattern {
            block: [32, 32],
            out: 2048,
            inp: 2048,
            kept: vec![(3, 7)],
        };
        assert_eq!(
            wb(&single).0,
            (1, false),
            "a single column: nothing to pair"
        );
    }

    /// Listed groups come with the copy engine's stores: where the output cannot take them, or
    /// the blocks are not 32 rows high, the groups go back to consecutive block rows (whose
    /// slots and stages follow their own steps).
    #[test]
    fn listed_groups_keep_the_copy_engines_stores() {
        let k = Extent::constant(4096);
        let la = (MatLayout::N, &k);
        let p = scattered([32, 32], 4096, 4096, 0.1, 7, None);
        let c = select_wgmma(Arch::Sm90a, DType::Bf16, false, la, &p).unwrap();
        assert!(c.listed, "{c:?}");
        let stored = c.stored(&p, false, true);
        assert!(stored.listed && stored.tma_store(), "{stored:?}");
        let unstored = c.stored(&p, false, false);
        assert!(!unstored.listed && !unstored.tma_store(), "{unstored:?}");
        let steps = GroupSteps::of(&p, &unstored);
        let all = unstored.wb * unstored.g;
        assert_eq!(unstored.slots, slots_for(&steps, 32, 32, all));
        assert!(unstored.smem_bytes(32, false) <= SMEM_LIMIT);
        // At density 0.25 the listed groups take pairs over windows, the consecutive ones
        // windows.
        let p25 = scattered([32, 32], 4096, 4096, 0.25, 7, None);
        let c25 = select_wgmma(Arch::Sm90a, DType::Bf16, false, la, &p25).unwrap();
        assert!(c25.listed && c25.pairs, "{c25:?}");
        let back = c25.stored(&p25, false, false);
        assert!(!back.listed && !back.pairs && back.wb == 2, "{back:?}");
        let windows = GroupSteps::new(&p25, &Groups::Consecutive { g: back.g }, 2);
        assert_eq!(GroupSteps::of(&p25, &back), windows);
        assert_eq!(back.slots, slots_for(&windows, 32, 32, 2 * back.g));
        let p16 = scattered([16, 16], 4096, 4096, 0.1, 7, None);
        let c16 = select_wgmma(Arch::Sm90a, DType::Bf16, false, la, &p16).unwrap();
        assert!(c16.listed, "{c16:?}");
        assert!(!c16.stored(&p16, false, true).listed);
    }

    /// Every stage starts on a 1024-byte swizzle period (the template asserts it): the slots are
    /// rounded up where a step's most kept blocks would not fill whole periods (an odd count of
    /// 16 x 16 blocks, 512 bytes each, failed the assertion at density 0.1).
    #[test]
    fn stages_fill_whole_swizzle_periods() {
        let mut rounded = 0;
        for block in [[16, 16], [8, 16], [16, 32], [32, 32], [16, 64]] {
            for (density, seed) in [(0.05, 1), (0.1, 2), (0.3, 3), (0.7, 4)] {
                let p = scattered(block, 1024, 1024, density, seed, None);
                let k = Extent::constant(p.inp);
                let la = (MatLayout::N, &k);
                let Some(c) = select_wgmma(Arch::Sm90a, DType::Bf16, false, la, &p) else {
                    continue;
                };
                let most = GroupSteps::of(&p, &c).masks().map(u32::count_ones).max();
                rounded += usize::from(Some(c.slots) > most);
                let stage = WgmmaBsr::stage_bytes(c.bm, c.slots, block[0], c.bk, c.wb, false);
                assert_eq!(stage % 1024, 0, "{block:?} at {density}: {c:?}");
            }
        }
        assert!(rounded > 0, "some pattern has its slots rounded up");
    }

    /// The wide rearrangement is a permutation of each block's chunks, and `Relayout::apply`
    /// moves each chunk where it says (the emulator proves that the copies then land as the
    /// slots' images).
    #[test]
    fn the_wide_rearrangement_permutes_each_block() {
        for [br, bc] in [[32, 32], [16, 32], [64, 32], [192, 32], [32, 16]] {
            let perm = wide_block_perm(br, bc);
            let mut sorted = perm.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..br * bc / 8).collect::<Vec<_>>(), "{br}x{bc}");
            assert_ne!(perm, sorted, "{br}x{bc}: the swizzles move chunks");
        }
        let r = Relayout {
            buffer: 1,
            chunk_bytes: 2,
            perm: vec![2, 0, 1],
        };
        assert_eq!(
            r.apply(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]).unwrap(),
            [4, 5, 0, 1, 2, 3, 10, 11, 6, 7, 8, 9]
        );
        assert_eq!(r.apply(&[0; 8]), None, "not whole periods");
        let twice = Relayout {
            perm: vec![0, 0, 1],
            ..r
        };
        assert_eq!(twice.apply(&[0; 6]), None, "not a permutation");
    }

    #[test]
    fn only_sm_90a_half_k_contiguous_blocks_of_a_wgmma_height_take_the_kernel() {
        let p = |block: [u32; 2]| scattered(block, 3840, 768, 0.5, 2, None);
        let k = Extent::constant(768);
        let n = (MatLayout::N, &k);
        let pick =
            |arch, dtype, dual, la, pat: &BlockPattern| select_wgmma(arch, dtype, dual, la, pat);
        let b32 = p([32, 32]);
        let wide = scattered([32, 32], 3840, 4096, 0.5, 2, None);
        let k4096 = Extent::constant(4096);
        let n4096 = (MatLayout::N, &k4096);
        assert_eq!(
            pick(Arch::Sm90a, DType::Bf16, false, n4096, &wide),
            Some(WgmmaBsr {
                bm: 128,
                g: 11,
                bk: 64,
                wb: 2,
                // Eleven block rows a group (120 rows: eleven groups, the last of ten; a 22-bit
                // mask; K = 4096): the most blocks a window of this pattern keeps is 18, so 4
                // stages fit.
                stages: 4,
                a_regs: true,
                wide: true,
                slots: 18,
                staging_bufs: 0,
                pairs: false,
                pair_cap: None,
                listed: false,
                balanced: false,
            })
        );
        // The epilogue's TMA stores: 32 KB of staging would leave 13 slots 4 stages, so they
        // keep the register stores; with 11 slots (the 4096^2 weight at density 0.25) the 5
        // stages stay, and the staging with them.
        // (Of eight block rows a group: the first short-grid entry's, which only patterns of
        // 32-row blocks whose own groups are wider have; then six, four and two rows.)
        let short = select_wgmma_short_grids(Arch::Sm90a, DType::Bf16, false, n4096, &wide);
        assert_eq!((short[0].g, short[0].wb, short[0].slots), (8, 2, 15));
        let gs = |s: Vec<WgmmaBsr>| s.iter().map(|s| s.g).collect::<Vec<_>>();
        assert_eq!(gs(short), [8, 6, 4, 2]);
        // Dual GEMMs (groups of five at this K) and shorter K (groups of eight): the narrower
        // ones only.
        assert_eq!(
            pick(Arch::Sm90a, DType::Bf16, true, n4096, &wide)
                .unwrap()
                .g,
            5
        );
        assert_eq!(
            gs(select_wgmma_short_grids(
                Arch::Sm90a,
                DType::Bf16,
                true,
                n4096,
                &wide
            )),
            [4, 2]
        );
        let own = pick(Arch::Sm90a, DType::Bf16, false, n, &b32).unwrap();
        assert_eq!((own.g, own.wb), (8, 2));
        assert_eq!(
            gs(select_wgmma_short_grids(
                Arch::Sm90a,
                DType::Bf16,
                false,
                n,
                &b32
            )),
            [6, 4, 2]
        );
        // 64-row blocks: groups of four, then three, two and one.
        assert_eq!(
            gs(select_wgmma_short_grids(
                Arch::Sm90a,
                DType::Bf16,
                false,
                n,
                &p([64, 64])
            )),
            [3, 2, 1]
        );
        let h = WgmmaBsr {
            g: 8,
            stages: 5,
            slots: 13,
            listed: false,
            ..pick(Arch::Sm90a, DType::Bf16, false, n, &b32).unwrap()
        };
        // 13 slots: the staging takes the fifth stage, and four are enough.
        let stored = h.with_tma_store(32, false, true);
        assert!(stored.staging_bufs == 2 && stored.stages == 4);
        // Listed groups' block rows lie apart in the output: the copy engine stores each in a
        // box of its own 32 columns, other block heights keep the register stores.
        let listed = WgmmaBsr { listed: true, ..h };
        let stored = listed.with_tma_store(32, false, true);
        assert!(stored.staging_bufs == 2 && stored.stages == 4 && stored.listed);
        assert_eq!(listed.with_tma_store(16, false, true), listed);
        assert!(stored.smem_bytes(32, false) <= SMEM_LIMIT);
        // Eleven block rows of 32 (five whole 64-column chunks and a block row from registers)
        // with 18 slots: two staging buffers would leave 3 of 4 stages, too few; one leaves 4.
        let wide = WgmmaBsr {
            g: 11,
            slots: 18,
            stages: 4,
            ..h
        };
        let stored = wide.with_tma_store(32, false, true);
        assert!(stored.staging_bufs == 1 && stored.stages == 4);
        assert!(stored.smem_bytes(32, false) <= SMEM_LIMIT);
        assert!(stored
            .template()
            .ends_with(", true, 2, true, 18, true, false, 1>"));
        // With 19 slots not even one buffer leaves 4 stages.
        let deep = WgmmaBsr {
            slots: 19,
            stages: 4,
            ..wide
        };
        assert_eq!(deep.with_tma_store(32, false, true), deep);
        let stored = WgmmaBsr { slots: 14, ..wide }.with_tma_store(32, false, true);
        assert!(stored.staging_bufs == 2 && stored.stages == 4 && stored.g == 11);
        assert!(stored.smem_bytes(32, false) <= SMEM_LIMIT);
        // Fewer than 64 columns: no whole chunk to stage.
        let narrow = WgmmaBsr { g: 1, ..h };
        assert_eq!(narrow.with_tma_store(32, false, true), narrow);
        let eleven = WgmmaBsr { slots: 11, ..h };
        let stored = eleven.with_tma_store(32, false, true);
        assert_eq!(stored.staging_bufs, 2);
        assert_eq!(stored.stages, 5);
        assert!(stored.smem_bytes(32, false) <= SMEM_LIMIT);
        assert!(stored.template().ends_with(", true, 2, true, 11, true>"));
        assert_eq!(eleven.with_tma_store(32, false, false), eleven);
        // Pairs at density 0.1 (6 slots, 8 stages): the staging leaves 6, enough.
        let pairs = WgmmaBsr {
            slots: 6,
            stages: 8,
            pairs: true,
            ..h
        };
        let stored = pairs.with_tma_store(32, false, true);
        assert!(stored.staging_bufs == 2 && stored.stages == 6);
        assert!(stored.smem_bytes(32, false) <= SMEM_LIMIT);
        assert!(stored
            .template()
            .ends_with(", true, 2, true, 6, true, true>"));
        assert!(pick(Arch::Sm90a, DType::F16, false, n, &b32).is_some());
        assert_eq!(pick(Arch::Sm90, DType::Bf16, false, n, &b32), None);
        assert_eq!(pick(Arch::Sm80, DType::Bf16, false, n, &b32), None);
        assert_eq!(pick(Arch::Sm90a, DType::F32, false, n, &b32), None);
        assert_eq!(
            pick(Arch::Sm90a, DType::Bf16, false, (MatLayout::T, &k), &b32),
            None
        );
        let odd = Extent::constant(13);
        assert_eq!(
            pick(Arch::Sm90a, DType::Bf16, false, (MatLayout::N, &odd), &b32),
            None
        );
        let sym = Extent::of_dim(&mlpc_ir::Dim::sym("K"));
        assert!(pick(Arch::Sm90a, DType::Bf16, false, (MatLayout::N, &sym), &b32).is_some());
        // Block heights without a wgmma N, widths that are not whole k16 steps.
        for block in [[40, 32], [12, 16], [32, 24], [32, 8], [384, 32]] {
            assert_eq!(
                pick(Arch::Sm90a, DType::Bf16, false, n, &p(block)),
                None,
                "{block:?}"
            );
        }
        // A from registers exactly for the block heights with an RS wgmma.
        for (block, a_regs) in [
            ([16, 16], true),
            ([64, 64], true),
            ([8, 16], false),
            ([128, 64], false),
        ] {
            assert_eq!(
                pick(Arch::Sm90a, DType::Bf16, false, n, &p(block)).map(|c| c.a_regs),
                Some(a_regs),
                "{block:?}"
            );
        }
        // Dual: at most 128 columns of two accumulators; 192 rows do not fit.
        let dual = pick(Arch::Sm90a, DType::Bf16, true, n, &b32).unwrap();
        assert_eq!((dual.g, dual.bk, dual.wb), (4, 64, 2));
        assert_eq!(pick(Arch::Sm90a, DType::Bf16, true, n, &p([192, 32])), None);
        assert_eq!(
            pick(Arch::Sm90a, DType::Bf16, false, n, &p([192, 32])).map(|c| c.g),
            Some(1)
        );
        // Accumulators <= 128 registers (176 plain, wide groups), shared memory within the limit,
        // >= 3 stages.
        for block in [
            [8, 16],
            [16, 16],
            [32, 32],
            [64, 64],
            [128, 64],
            [256, 64],
            [16, 48],
            [32, 128],
        ] {
            for dual in [false, true] {
                let Some(c) = pick(Arch::Sm90a, DType::Bf16, dual, n, &p(block)) else {
                    continue;
                };
                let accs = c.g * block[0] / 2 * if dual { 2 } else { 1 };
                assert!(
                    accs <= if dual { 128 } else { 176 },
                    "{block:?} {dual}: {accs}"
                );
                assert!(c.g <= 16 && c.stages >= 3 && c.stages <= MAX_STAGES);
                assert!(c.smem_bytes(block[0], dual) <= SMEM_LIMIT);
                let bkb = c.bk / c.wb;
                assert_eq!(block[1] % bkb, 0);
                assert!(c.wb == 1 || bkb == block[1], "a window is whole blocks");
            }
        }
    }
}
