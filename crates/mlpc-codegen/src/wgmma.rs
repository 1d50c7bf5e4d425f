//! The Hopper GEMM path (`gemm_wgmma.cuh`): which dense f16 / bf16 GEMMs take it, and its tile
//! configuration. `gemm.rs` asks [`select`]; everything else of the kernel (operand checks, the
//! `GemmParams` fill, the epilogue) is shared with the `mma.sync` family, whose template takes the
//! same parameters.
//!
//! # When
//! Only for [`Arch::Sm90a`] (wgmma does not exist in portable sm_90 code), f16 / bf16, A stored
//! `[M, K]` and B stored `[N, K]` (both k-contiguous, "K-major", the nn.Linear case). A row stride
//! that is a known constant must be a multiple of 8 elements, so that the 16-byte copies of the
//! fast path apply; a symbolic stride is checked at run time by the kernel, which falls back to
//! plain loads into the same shared layout. Every other GEMM keeps `GemmMma`.
//!
//! # Shared layout and descriptors
//! See the comment at the top of `gemm_wgmma.cuh`. The unit tests transcribe the template's
//! address math (the swizzled position a load writes, the descriptor wgmma reads through) and
//! check, on the CPU, that every element wgmma reads, following the PTX ISA's canonical K-major
//! 128-byte-swizzle layout, is the element the loads wrote there.

use mlpc_ir::{DType, Extent, MatLayout};

use crate::{Arch, TileChoice};

/// Bytes of one k row of a tile: 64 16-bit values, one 128-byte swizzle row.
pub(crate) const ROW_BYTES: u32 = 128;
/// The k depth of one shared-memory slice.
pub(crate) const BK: u32 = 64;
/// The dynamic shared memory a block may use on sm_90 (227 KiB).
const SMEM_LIMIT: u32 = 227 * 1024;
/// Shared memory per SM on sm_90 (228 KiB), of which the system reserves 1 KiB per resident CTA.
const SMEM_PER_SM: u32 = 228 * 1024;
const SMEM_RESERVED_PER_CTA: u32 = 1024;

/// The dynamic shared memory each of `ctas` CTAs may use for that many to fit on one SM: 227 KiB
/// for one, 113 KiB for two (half of 228 KiB less the 1 KiB reserved for each).
fn smem_per_cta(ctas: u32) -> u32 {
    (SMEM_PER_SM / ctas.max(1) - SMEM_RESERVED_PER_CTA).min(SMEM_LIMIT)
}

/// Which Hopper kernel a configuration instantiates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    /// `GemmWgmmaTma`: persistent, one TMA producer warpgroup, BM / 64 consumer warpgroups.
    Tma,
    /// `GemmWgmma`: every thread loads with cp.async and computes (the first Hopper kernel, kept
    /// as the reference point of the notes in docs/perf-notes.md).
    CpAsync,
}

/// A Hopper tile configuration (`mlpc::WgmmaTmaConfig<BM, BN, STAGES, GROUP_M>` or
/// `mlpc::WgmmaConfig<BM, BN, STAGES>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WgmmaConfig {
    pub family: Family,
    pub bm: u32,
    pub bn: u32,
    pub stages: u32,
    /// CTAs per SM the registers and shared memory are budgeted for (TMA kernel: 1 or 2).
    pub ctas: u32,
    /// TMA kernel, one CTA per SM: two consumer warpgroups taking whole tiles in turn.
    pub pingpong: bool,
    /// TMA kernel: CTAs per cluster (2: neighbouring column tiles sharing the A tile's loads).
    pub cluster: u32,
    /// With clusters: neighbouring row tiles sharing the B tile's loads instead.
    pub share_b: bool,
    /// TMA kernel: the epilogue stores through shared memory and the copy engine (two 8 KB
    /// staging buffers per consumer warpgroup), where the output's row stride allows.
    pub tma_store: bool,
    /// TMA kernel without clusters, deep enough (`with_split_k`): the runtime may split each
    /// tile's k slices over several CTAs when the tiles fill less than half of the SMs
    /// (`crate::SplitK`).
    pub split_k: bool,
}

/// Row tiles per group of the persistent kernel's tile order.
const GROUP_M: u32 = 8;

impl WgmmaConfig {
    /// Mirrors `kThreads`: one consumer warpgroup (128 threads) per 64 rows (two for 256-row
    /// tiles, of two bands each) and, for the TMA kernel, a producer warpgroup; with ping-pong,
    /// two consumer warpgroups and the producer; with two CTAs per SM, one consumer warpgroup for
    /// the whole tile and a producer warp.
    pub fn threads(&self) -> u32 {
        match (self.family, self.ctas) {
            (Family::Tma, 1) if self.pingpong => 2 * 128 + 128,
            (Family::Tma, 1) => (self.bm / 64).min(2) * 128 + 128,
            (Family::Tma, _) => 128 + 32,
            (Family::CpAsync, _) => self.bm / 64 * 128,
        }
    }

    /// Mirrors `kSmemBytes`: the stage ring, 1024 bytes of alignment slack and, for the TMA
    /// kernel, the staging buffers of TMA stores and a full and an empty barrier (8 bytes each)
    /// per stage.
    pub fn smem_bytes(&self, dual: bool) -> u32 {
        let ring = self.stages * stage_bytes(self.bm, self.bn, dual) + 1024;
        match self.family {
            Family::Tma => ring + self.staging_bytes() + 2 * 8 * self.stages,
            Family::CpAsync => ring,
        }
    }

    /// Mirrors `kStagingBytes`: with TMA stores, two 64 x 64 buffers of 16-bit values per
    /// consumer warpgroup.
    fn staging_bytes(&self) -> u32 {
        if self.family == Family::Tma && self.tma_store {
            let consumers = self.threads() / 128 - u32::from(self.ctas == 1);
            consumers * 2 * STAGING_BYTES
        } else {
            0
        }
    }

    pub fn template(&self) -> String {
        match self.family {
            Family::Tma => {
                // The optional parameters, up to the last that differs from its default.
                let optional = [
                    (self.pingpong.to_string(), "false"),
                    (self.cluster.to_string(), "1"),
                    (self.share_b.to_string(), "false"),
                    (self.tma_store.to_string(), "false"),
                    (self.split_k.to_string(), "false"),
                ];
                let used = optional
                    .iter()
                    .rposition(|(v, default)| v != default)
                    .map_or(0, |i| i + 1);
                let tail: String = optional[..used]
                    .iter()
                    .map(|(v, _)| format!(", {v}"))
                    .collect();
                format!(
                    "mlpc::WgmmaTmaConfig<{}, {}, {}, {GROUP_M}, {}{tail}>",
                    self.bm, self.bn, self.stages, self.ctas,
                )
            }
            Family::CpAsync => format!(
                "mlpc::WgmmaConfig<{}, {}, {}>",
                self.bm, self.bn, self.stages
            ),
        }
    }

    /// The tile part of the entry name, e.g. `wgmma_tma_128x256x64`.
    pub fn tag(&self) -> String {
        let family = match self.family {
            Family::Tma => "wgmma_tma",
            Family::CpAsync => "wgmma",
        };
        let schedule = if self.pingpong { "_pp" } else { "" };
        let cluster = if self.cluster > 1 {
            let shared = if self.share_b { "b" } else { "" };
            format!("_c{}{shared}", self.cluster)
        } else {
            String::new()
        };
        format!("{family}_{}x{}x{}{schedule}{cluster}", self.bm, self.bn, BK)
    }
}

/// Bytes of one staging buffer of a TMA store (`wgmma_detail::kStagingBufferBytes`).
const STAGING_BYTES: u32 = 64 * 64 * 2;

fn stage_bytes(bm: u32, bn: u32, dual: bool) -> u32 {
    let nb = if dual { 2 } else { 1 };
    (bm + nb * bn) * ROW_BYTES
}

/// The wgmma configuration for a GEMM, or `None` when it must stay on `GemmMma`. `la` / `lb` are
/// the physical layouts (which dimension is contiguous), `strides` the row strides of the matrix
/// operands (A, B and, for a dual GEMM, B_up), `k` the reduction depth and `n` the output's column
/// count.
pub(crate) fn select(
    arch: Arch,
    dtype: DType,
    dual: bool,
    (la, lb): (MatLayout, MatLayout),
    strides: &[&Extent],
    k: &Extent,
    n: &Extent,
) -> Option<WgmmaConfig> {
    if arch != Arch::Sm90a || !matches!(dtype, DType::F16 | DType::Bf16) {
        return None;
    }
    if la != MatLayout::N || lb != MatLayout::T {
        return None;
    }
    if strides
        .iter()
        .any(|s| s.as_constant().is_some_and(|c| c % 8 != 0))
    {
        return None;
    }
    // A tensor map needs row strides of a multiple of 16 bytes, which only a constant stride
    // guarantees at compile time; a symbolic one keeps the cp.async kernel, which checks it at
    // run time and falls back to plain loads.
    let family = if strides.iter().all(|s| s.as_constant().is_some()) {
        Family::Tma
    } else {
        Family::CpAsync
    };
    // Shallow plain GEMMs (K <= 1024: at most 16 slices per tile) spend a large share of each
    // tile in the epilogue: they take 128-wide tiles (192-wide where 192 divides N: below) with
    // the ping-pong schedule, so that one consumer warpgroup's epilogue runs under the other's
    // wgmmas. Measured with `--autotune` (docs/perf-notes.md 3d) on the gpt2 up-projection:
    // ping-pong 0.142 ms for the whole MLP, two CTAs per SM 0.150, one cooperative CTA 0.163,
    // 256-wide tiles 0.160. Deep ones, and dual GEMMs (two accumulators), keep the cooperative
    // schedule with the widest tile.
    let shallow = !dual
        && family == Family::Tma
        && k.as_constant().is_some_and(|k| k <= 1024)
        && n.as_constant().is_none_or(|n| n > 128);
    // Dual GEMMs on the TMA kernel take 128 x 96 tiles with the ping-pong schedule: each
    // consumer warpgroup holds gate and up of a whole tile (192 registers a thread), issues
    // them as one m64n192k16 a band and k16 step, and its epilogue (activation and product)
    // runs under the other's wgmmas. Measured with `--autotune` (docs/perf-notes.md 3h) against
    // 128 x 128 cooperative tiles: llama-swiglu at T = 4096 1.606 -> 1.459 ms for the whole MLP,
    // seed-geglu at T = 8192 0.173 -> 0.165 (then 128 x 64); 96 wide against 64 (3y): 0.6 % on
    // llama-swiglu at T = 4096, 3.6 % at T = 1000, 2.4 % on seed-geglu at T = 8192.
    let dual_pingpong = dual && family == Family::Tma;
    // Narrow outputs get a narrower tile; the widest is 256 (128 for the two accumulators of a
    // dual GEMM on the cp.async kernel, which hold as many registers, and for shallow GEMMs; 96
    // for dual ping-pong tiles). A
    // width that 192 divides but 256 does not, or that makes few 256-wide column tiles (N = 768:
    // 3 of 256 or 4 of 192), takes 192 wide tiles: more, smaller tiles fill the 132 SMs in
    // fuller waves.
    // Shallow GEMMs whose N is a multiple of 192 take 128 x 192 ping-pong tiles (each consumer
    // warpgroup then holds 192 accumulator registers a thread): `--autotune` picked it for the
    // gpt2 up projection (768 -> 3072) over 128 x 128 and, forced through its cache, the whole
    // MLP ran 2.8 % faster at T = 8192 and level at T = 2048 (docs/perf-notes.md 3o).
    let shallow_192 = shallow && n.as_constant().is_some_and(|c| c % 192 == 0);
    let widest = if dual_pingpong {
        96
    } else if shallow_192 {
        192
    } else if dual || shallow {
        128
    } else {
        256
    };
    let bn = match n.as_constant() {
        Some(c) if c <= 64 => 64,
        Some(c) if c <= 128 => 128,
        Some(c) if c % 192 == 0 && (c % 256 != 0 || c / 256 < 8) => 192,
        _ => widest,
    }
    .min(widest);
    // A shallow GEMM's width is 128 or 192 (its N is over 128 or unknown): always ping-pong.
    let pingpong = shallow || dual_pingpong;
    let mut cfg = WgmmaConfig {
        family,
        bm: 128,
        bn,
        stages: 2,
        ctas: 1,
        pingpong,
        cluster: 1,
        share_b: false,
        tma_store: false,
        split_k: false,
    };
    cfg.stages = cfg.deepest(dual).unwrap_or(2);
    Some(cfg)
}

impl WgmmaConfig {
    /// The most stages (2 to 5) whose ring (and staging buffers) fit one CTA's share of the
    /// shared memory (`smem_per_cta`: with two CTAs per SM, both must fit).
    fn deepest(&self, dual: bool) -> Option<u32> {
        (2..=5).rev().find(|&stages| {
            WgmmaConfig { stages, ..*self }.smem_bytes(dual) <= smem_per_cta(self.ctas)
        })
    }

    /// This configuration with the epilogue's stores by the copy engine when `ok` (the output's
    /// rows are 16-byte multiples apart, its columns contiguous), the kernel is the TMA one and
    /// the staging buffers cost the ring at most one stage and leave it three (128 x 192 tiles:
    /// 5 -> 4, measured faster; two CTAs per SM of 128 x 128: 3 -> 2, kept on register stores);
    /// the stages are recounted around the staging buffers.
    pub fn with_tma_store(self, dual: bool, ok: bool) -> WgmmaConfig {
        if self.family != Family::Tma || !ok {
            return self;
        }
        let cfg = WgmmaConfig {
            tma_store: true,
            ..self
        };
        match cfg.deepest(dual) {
            Some(stages) if stages >= 3 && stages + 1 >= self.stages => {
                WgmmaConfig { stages, ..cfg }
            }
            _ => self,
        }
    }

    /// This configuration with split K compiled in (`WgmmaTmaConfig::kSplitK`) when it is the
    /// TMA kernel without clusters, `k` is a constant of at least
    /// [`crate::SplitK::MIN_K_SLICES`] slices and a tile's f32 values fit the stage ring (the
    /// CTA that sums the splits reads them through it): such a GEMM may run so few tiles as to
    /// leave most SMs idle while each walks a long k loop (gpt2's down projection at T = 1000:
    /// 32 tiles of 48 slices on 132 SMs).
    pub fn with_split_k(self, k: &Extent, dual: bool) -> WgmmaConfig {
        let deep = k
            .as_constant()
            .is_some_and(|k| k.div_ceil(u64::from(BK)) >= u64::from(crate::SplitK::MIN_K_SLICES));
        let fits = self.partial_bytes(dual) <= self.stages * stage_bytes(self.bm, self.bn, dual);
        WgmmaConfig {
            split_k: self.family == Family::Tma && self.cluster == 1 && deep && fits,
            ..self
        }
    }

    /// The tile of the short-grid entry (`crate::ShortGrid`) of this configuration, or `None`:
    /// for a plain cooperative TMA GEMM without clusters, on tiles wider than 128, compiled with
    /// split K (the entry runs only where this one's grid would split), the same GEMM on
    /// cooperative 128 x 128 tiles, with the epilogue's stores and split K as their own rules
    /// give them. `compile --autotune --bind T=1000` picked those tiles for the deep GEMMs of
    /// gpt2 and bert-large at that size (docs/perf-notes.md 3p).
    pub fn short_grid(&self, k: &Extent, dual: bool, tma_storable: bool) -> Option<WgmmaConfig> {
        let wide = self.family == Family::Tma
            && !dual
            && !self.pingpong
            && self.cluster == 1
            && self.ctas == 1
            && self.bm == 128
            && self.bn > 128
            && self.split_k;
        if !wide {
            return None;
        }
        let mut cfg = WgmmaConfig {
            bn: 128,
            tma_store: false,
            split_k: false,
            ..*self
        };
        cfg.stages = cfg.deepest(dual)?;
        let cfg = cfg.with_tma_store(dual, tma_storable).with_split_k(k, dual);
        cfg.split_k.then_some(cfg)
    }

    /// Bytes of a tile's f32 accumulators (both of a dual GEMM).
    fn partial_bytes(&self, dual: bool) -> u32 {
        self.bm * self.bn * 4 * if dual { 2 } else { 1 }
    }

    /// The split-K description of the launch (`Grid::Persistent::split_k`): the tile's k slices,
    /// the bytes of one work item's partial tile (f32, both accumulators of a dual GEMM) and the
    /// entry compiled with split K.
    pub fn split(&self, k: &Extent, dual: bool, entry: &str) -> Option<crate::SplitK> {
        let k = k.as_constant().filter(|_| self.split_k)?;
        Some(crate::SplitK {
            k_slices: u32::try_from(k.div_ceil(u64::from(BK))).ok()?,
            partial_bytes: self.partial_bytes(dual),
            entry: entry.to_string(),
        })
    }
}

/// The tile widths a choice may name (96 for dual GEMMs only).
const WIDTHS: [u32; 5] = [64, 96, 128, 192, 256];
/// The tile heights a choice may name.
const HEIGHTS: [u32; 2] = [128, 256];

/// `heuristic` (what [`select`] chose for a GEMM with `n` output columns) with its tile replaced
/// by `choice`, or why `choice` is not valid for it. The rules are the heuristic's: only the TMA
/// kernel is tunable; a width of 64, 96, 128, 192 or 256, 64 only for outputs of at most 64
/// columns and above 128 only for outputs wider than 128; 96 only for dual GEMMs (gate and up
/// as one m64n192k16) of outputs wider than 64; 192 only when it divides `n`; at most 128 for a
/// dual GEMM; two CTAs per SM only with 128-wide plain tiles; the ping-pong schedule only with
/// one CTA per SM and tiles whose accumulators one warpgroup holds (both 64-row bands, and for a
/// dual GEMM gate and up: 192 registers per thread at most, so at most 192 wide for a plain GEMM
/// and 96 for a dual one, the one case where a 64-wide tile serves a wider output); 256 rows
/// only with the cooperative schedule on one CTA per SM, under the same register bound (each
/// consumer warpgroup holds two bands: at most 192 wide, 96 for a dual GEMM, whose 64-wide tile
/// may then serve a wider output too); at least two stages in shared memory.
pub(crate) fn with_choice(
    heuristic: WgmmaConfig,
    dual: bool,
    n: u64,
    choice: TileChoice,
) -> Result<WgmmaConfig, String> {
    let TileChoice {
        bn,
        ctas,
        pingpong,
        cluster,
        share_b,
        bm,
        fp64_tensor,
    } = choice;
    if fp64_tensor {
        return Err("the FP64 tensor cores take f32 GEMMs only".into());
    }
    if heuristic.family != Family::Tma {
        return Err(
            "only GEMMs on the TMA kernel (constant row strides) take a tile choice".into(),
        );
    }
    if !WIDTHS.contains(&bn) {
        return Err(format!("the tile width must be one of {WIDTHS:?}"));
    }
    if !(1..=2).contains(&ctas) {
        return Err("the kernel runs 1 or 2 CTAs per SM".into());
    }
    if !HEIGHTS.contains(&bm) {
        return Err(format!("the tile height must be one of {HEIGHTS:?}"));
    }
    // A warpgroup's accumulators in the ping-pong schedule and with 256-row tiles: two bands,
    // twice for a dual GEMM.
    let two_band_regs = 2 * (bn / 2) * if dual { 2 } else { 1 };
    if bn == 64 && n > 64 && !(dual && (pingpong || bm == 256)) {
        return Err(format!(
            "64-wide tiles are for outputs of at most 64 columns (N = {n})"
        ));
    }
    if bn == 96 && (!dual || n <= 64) {
        return Err(format!(
            "96-wide tiles are for dual GEMMs of outputs wider than 64 columns (gate and up as \
             one m64n192k16; N = {n})"
        ));
    }
    if bn > 128 && n <= 128 {
        return Err(format!(
            "tiles wider than 128 are for outputs wider than 128 columns (N = {n})"
        ));
    }
    if bn == 192 && !n.is_multiple_of(192) {
        return Err(format!("192-wide tiles need N divisible by 192 (N = {n})"));
    }
    if dual && bn > 128 {
        return Err("a dual GEMM's tile is at most 128 wide (two accumulators)".into());
    }
    if ctas == 2 && (dual || bn != 128) {
        return Err("two CTAs per SM take 128-wide tiles of a plain GEMM".into());
    }
    if pingpong && (ctas != 1 || two_band_regs > 192) {
        return Err(
            "the ping-pong schedule runs one CTA per SM with tiles at most 192 wide (96 for a \
             dual GEMM)"
                .into(),
        );
    }
    if bm == 256 && (ctas != 1 || pingpong || two_band_regs > 192) {
        return Err(
            "256-row tiles run the cooperative schedule on one CTA per SM, at most 192 wide (96 \
             for a dual GEMM)"
                .into(),
        );
    }
    if !(1..=2).contains(&cluster) {
        return Err("clusters are of 1 or 2 CTAs".into());
    }
    if cluster == 2 && ctas != 1 {
        return Err("clusters of 2 run one CTA per SM".into());
    }
    if share_b && cluster != 2 {
        return Err("sharing B takes clusters of 2".into());
    }
    let cfg = WgmmaConfig {
        bm,
        bn,
        ctas,
        pingpong,
        cluster,
        share_b,
        ..heuristic
    };
    let stages = cfg
        .deepest(dual)
        .ok_or_else(|| "two stages do not fit in shared memory".to_string())?;
    Ok(WgmmaConfig { stages, ..cfg })
}

/// Every valid choice for a GEMM on which [`select`] chose `heuristic` (see [`with_choice`]),
/// the heuristic's first; empty when the GEMM is not tunable.
pub(crate) fn candidates(heuristic: WgmmaConfig, dual: bool, n: u64) -> Vec<TileChoice> {
    if heuristic.family != Family::Tma {
        return Vec::new();
    }
    let first = TileChoice {
        bn: heuristic.bn,
        ctas: heuristic.ctas,
        pingpong: heuristic.pingpong,
        cluster: heuristic.cluster,
        share_b: heuristic.share_b,
        bm: heuristic.bm,
        fp64_tensor: false,
    };
    let mut out = vec![first];
    for bm in HEIGHTS {
        for (cluster, share_b) in [(1, false), (2, false), (2, true)] {
            for bn in WIDTHS {
                for (ctas, pingpong) in [(1, false), (1, true), (2, false)] {
                    let c = TileChoice {
                        bn,
                        ctas,
                        pingpong,
                        cluster,
                        share_b,
                        bm,
                        fp64_tensor: false,
                    };
                    if c != first && with_choice(heuristic, dual, n, c).is_ok() {
                        out.push(c);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const TEMPLATE: &str = include_str!("../../../kernels-templates/gemm_wgmma.cuh");

    /// Byte offset of element `(r, k)` (row `r`, k index `k` < 64) in a K-major tile with the
    /// 128-byte swizzle, as the template's loads place it (`wgmma_detail::chunk_offset` plus the
    /// element's place in its 16-byte chunk).
    fn element_offset(r: u32, k: u32) -> u32 {
        r * ROW_BYTES + (((k / 8) ^ (r % 8)) << 4) + (k % 8) * 2
    }

    /// The matrix descriptor of a K-major, 128B-swizzled operand at shared address `addr`
    /// (`wgmma_detail::make_desc`).
    fn descriptor(addr: u32) -> u64 {
        u64::from((addr & 0x3FFFF) >> 4) | (1 << 16) | ((1024u64 >> 4) << 32) | (1 << 62)
    }

    #[test]
    fn the_model_is_the_templates_address_math() {
        // The two functions above transcribe these lines of the template; a change to either
        // side must change both.
        for line in [
            "return (u32)(r * 128 + ((c ^ (r & 7)) << 4));",
            "return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) |",
            "((u64)1 << 62);",
            "Mma<T, BN>::run(acc, da + 2 * j, db + 2 * j);",
            "const u64 da = make_desc(sa + wg * (64 * 128));",
            "const u64 da = make_desc(sa + (band0 + b) * (64 * 128));",
            "Mma<T, BN>::run(acc, da + 2 * j, db + 2 * j);",
            "const u64 db = make_desc(sa + kTileABytes);",
            "const u32 ring = (smem_addr(mlpc_smem) + 1023u) & ~1023u;",
        ] {
            assert!(
                TEMPLATE.contains(line),
                "gemm_wgmma.cuh no longer says `{line}`"
            );
        }
    }

    /// The shared address wgmma reads element `(r, k)` of its operand from (r < 64 for A, < N for
    /// B; k < 16), for a K-major operand with the 128-byte swizzle, following the PTX ISA:
    /// canonical layout `Swizzle<3,4,3> o ((8, m), (T, 2k)) : ((8T, SBO), (1, T))` with T = 8
    /// 16-bit elements (16 bytes): within a group of 8 rows, rows are 8T elements (128 bytes)
    /// apart; groups are SBO bytes apart; the two 8-element chunks of a k16 step are T elements
    /// apart. The swizzle then XORs byte-address bits [4, 7) with bits [7, 10).
    fn wgmma_reads(desc: u64, r: u32, k: u32) -> u32 {
        assert_eq!(desc >> 62, 1, "128-byte swizzle mode");
        assert_eq!((desc >> 49) & 7, 0, "base offset");
        let start = ((desc & 0x3FFF) as u32) << 4;
        let sbo = (((desc >> 32) & 0x3FFF) as u32) << 4;
        let elem = 2;
        let linear =
            start + (r / 8) * sbo + (r % 8) * 8 * 8 * elem + (k / 8) * 8 * elem + (k % 8) * elem;
        linear ^ (((linear >> 7) & 7) << 4)
    }

    /// `store_chunk_tma`'s staging (for `store_tile_tma`), transcribed: lane `lane` of warp `q`
    /// (in its warpgroup) hands `stmatrix` the address of one row of one of four 8 x 8 matrices
    /// for the column groups `i`, `i + 1` of a 64-column chunk, and holds in register j the pair
    /// of accumulators `4 g + 2 j`, `4 g + 2 j + 1` (g = the chunk's first column group + i).
    fn stmatrix_address(q: u32, lane: u32, i: u32) -> u32 {
        let j = lane >> 3;
        let row_addr = (16 * q + 8 * (j & 1) + (lane & 7)) * 128;
        let swz = lane & 7;
        row_addr + (((i + (j >> 1)) ^ swz) << 4)
    }

    #[test]
    fn every_staged_element_is_where_the_tma_store_reads_it() {
        for line in [
            "const u32 row_addr = (u32)((16 * q + 8 * (j & 1) + (lane & 7)) * 128);",
            "const int swz = lane & 7;",
            "const u32 addr = buf + row_addr + (u32)((((i + (j >> 1)) ^ swz)) << 4);",
            "stmatrix_x4(addr, pair(i, 0), pair(i, 1), pair(i + 1, 0), pair(i + 1, 1));",
            "[&](int i, int h) { return packed(4 * (8 * c + i) + 2 * h); });",
            "const u32 w = pack2<T>(acc[r], acc[r + 1]);",
        ] {
            assert!(
                TEMPLATE.contains(line),
                "gemm_wgmma.cuh no longer says `{line}`"
            );
        }
        // The band's chunk: 64 rows x 64 columns of 2 bytes, each written exactly once, at the
        // byte the copy engine reads it from (the box's 128-byte swizzle: `element_offset`).
        let mut written = vec![None; 64 * 64];
        for q in 0..4u32 {
            for i in (0..8u32).step_by(2) {
                // stmatrix: matrix m's row rr is stored at the address of lane 8 m + rr; its
                // element (rr, cc) comes from lane t = 4 rr + cc / 2, register m, half cc % 2.
                for m in 0..4u32 {
                    for rr in 0..8u32 {
                        let addr = stmatrix_address(q, 8 * m + rr, i);
                        for cc in 0..8u32 {
                            let t = 4 * rr + cc / 2;
                            // Register m of lane t holds accumulators 4 g + 2 m + e, e = cc % 2,
                            // which the wgmma fragment layout (`store_tile`) puts at row
                            // 16 q + t / 4 + 8 h and column 8 g' + 2 (t % 4) + e, where
                            // 4 g + 2 m = 4 g' + 2 h.
                            let idx = 4 * i + 2 * m + cc % 2;
                            let (gp, h, e) = (idx / 4, (idx / 2) % 2, idx % 2);
                            let row = 16 * q + t / 4 + 8 * h;
                            let col = 8 * gp + 2 * (t % 4) + e;
                            let at = addr + cc * 2;
                            assert_eq!(
                                at,
                                element_offset(row, col),
                                "warp {q}, groups {i}.., matrix {m}, row {rr}, column {cc}"
                            );
                            let slot = &mut written[(row * 64 + col) as usize];
                            assert!(slot.is_none(), "({row}, {col}) written twice");
                            *slot = Some(at);
                        }
                    }
                }
            }
        }
        assert!(written.iter().all(Option::is_some));
    }

    #[test]
    fn every_element_wgmma_reads_is_the_one_the_loads_wrote() {
        // A stage as the template lays it out: A (BM rows), B (BN rows), at a 1024-aligned base.
        // `wg` is the 64-row band (a warpgroup's own, or one of two with 256-row tiles).
        for (bm, bn) in [(128, 256), (128, 128), (64, 64), (256, 128), (256, 192)] {
            let base = 3 * 1024;
            let a = base;
            let b = base + bm * ROW_BYTES;
            for wg in 0..bm / 64 {
                let da = descriptor(a + wg * 64 * ROW_BYTES);
                for j in 0..BK / 16 {
                    // The template adds 2 j to the descriptor: 32 j bytes.
                    let d = da + 2 * u64::from(j);
                    for r in 0..64 {
                        for kk in 0..16 {
                            let (row, k) = (wg * 64 + r, 16 * j + kk);
                            assert_eq!(
                                wgmma_reads(d, r, kk),
                                a + element_offset(row, k),
                                "A: warpgroup {wg}, step {j}, row {row}, k {k}"
                            );
                        }
                    }
                }
            }
            let db = descriptor(b);
            for j in 0..BK / 16 {
                let d = db + 2 * u64::from(j);
                for r in 0..bn {
                    for kk in 0..16 {
                        assert_eq!(
                            wgmma_reads(d, r, kk),
                            b + element_offset(r, 16 * j + kk),
                            "B: step {j}, row {r}, k {}",
                            16 * j + kk
                        );
                    }
                }
            }
        }
    }

    /// A dual GEMM's gate and up tiles lie one after the other in a stage, so one descriptor at
    /// the gate tile, as a 2 BN-row operand (`MmaPair`), reads the gate's
    /// rows and then the up's, each where its own loads put it.
    #[test]
    fn one_descriptor_reads_a_dual_gemms_gate_and_up_tiles() {
        for line in [
            "MmaPair<T, BN>::run(acc[b], acc_up[b], da + 2 * j, db + 2 * j);",
            "const u64 dbu = make_desc(sa + kTileABytes + kTileBBytes);",
            "static constexpr int kStageBytes = kTileABytes + kTileBBytes * (kDual ? 2 : 1);",
        ] {
            assert!(
                TEMPLATE.contains(line),
                "gemm_wgmma.cuh no longer says `{line}`"
            );
        }
        for (bm, bn) in [(128, 128), (128, 96), (128, 64)] {
            let base = 5 * 1024;
            let b = base + bm * ROW_BYTES;
            let bu = b + bn * ROW_BYTES;
            for j in 0..BK / 16 {
                let d = descriptor(b) + 2 * u64::from(j);
                for r in 0..2 * bn {
                    for kk in 0..16 {
                        let k = 16 * j + kk;
                        let want = if r < bn {
                            b + element_offset(r, k)
                        } else {
                            bu + element_offset(r - bn, k)
                        };
                        assert_eq!(wgmma_reads(d, r, kk), want, "BN {bn}: row {r}, k {k}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_swizzle_is_a_permutation_of_each_tile() {
        for rows in [64, 128, 256] {
            let mut seen = HashSet::new();
            for r in 0..rows {
                for k in 0..BK {
                    let o = element_offset(r, k);
                    assert!(o < rows * ROW_BYTES);
                    assert_eq!(o % 2, 0);
                    assert!(seen.insert(o), "({r}, {k}) collides");
                }
            }
            // Eight consecutive rows of one 16-byte chunk column land in eight distinct bank
            // groups (the conflict-free property of the swizzle).
            for c in 0..8 {
                let groups: HashSet<u32> = (0..8)
                    .map(|r| (element_offset(r, 8 * c) % 128) / 16)
                    .collect();
                assert_eq!(groups.len(), 8);
            }
        }
    }

    #[test]
    fn descriptor_fields() {
        let d = descriptor(0x1_2340);
        assert_eq!(d & 0x3FFF, 0x1234, "start address >> 4");
        assert_eq!((d >> 16) & 0x3FFF, 1, "leading byte offset (unused, 1)");
        assert_eq!((d >> 32) & 0x3FFF, 64, "stride byte offset 1024 >> 4");
        assert_eq!((d >> 49) & 7, 0);
        assert_eq!(d >> 62, 1);
        // Stepping k by 16 elements (32 bytes) stays inside the 14-bit field for every stage
        // address of the largest configuration.
        let cfg = WgmmaConfig {
            family: Family::Tma,
            bm: 128,
            bn: 192,
            stages: 5,
            ctas: 1,
            pingpong: false,
            cluster: 1,
            share_b: false,
            tma_store: false,
            split_k: false,
        };
        let top = cfg.smem_bytes(false);
        assert!(top <= SMEM_LIMIT);
        assert!(((top >> 4) + 6) < (1 << 14));
    }

    #[test]
    fn only_sm_90a_nt_half_gemms_with_aligned_strides_take_the_path() {
        let s = Extent::constant(768);
        let odd = Extent::constant(13);
        let n = Extent::constant(3072);
        let nt = (MatLayout::N, MatLayout::T);
        let deep = Extent::constant(3072);
        let pick = |arch, dtype, dual, l, strides: &[&Extent], n: &Extent| {
            select(arch, dtype, dual, l, strides, &deep, n)
        };
        let big = Some(WgmmaConfig {
            family: Family::Tma,
            bm: 128,
            bn: 256,
            stages: 4,
            ctas: 1,
            pingpong: false,
            cluster: 1,
            share_b: false,
            tma_store: false,
            split_k: false,
        });
        assert_eq!(
            pick(Arch::Sm90a, DType::Bf16, false, nt, &[&s, &s], &n),
            big
        );
        assert_eq!(pick(Arch::Sm90a, DType::F16, false, nt, &[&s, &s], &n), big);
        assert_eq!(
            pick(Arch::Sm90, DType::Bf16, false, nt, &[&s, &s], &n),
            None
        );
        assert_eq!(
            pick(Arch::Sm80, DType::Bf16, false, nt, &[&s, &s], &n),
            None
        );
        assert_eq!(
            pick(Arch::Sm90a, DType::F32, false, nt, &[&s, &s], &n),
            None
        );
        for l in [
            (MatLayout::T, MatLayout::T),
            (MatLayout::N, MatLayout::N),
            (MatLayout::T, MatLayout::N),
        ] {
            assert_eq!(
                pick(Arch::Sm90a, DType::Bf16, false, l, &[&s, &s], &n),
                None
            );
        }
        assert_eq!(
            pick(Arch::Sm90a, DType::Bf16, false, nt, &[&odd, &s], &n),
            None
        );
        // A symbolic stride is checked in the kernel: the cp.async kernel, which can fall back to
        // plain loads, takes it.
        let sym = Extent::of_dim(&mlpc_ir::Dim::sym("T"));
        let cp = pick(Arch::Sm90a, DType::Bf16, false, nt, &[&sym, &s], &n).unwrap();
        assert_eq!(cp.family, Family::CpAsync);
        assert_eq!(
            (cp.threads(), cp.smem_bytes(false)),
            (256, 4 * 384 * 128 + 1024)
        );
        // Dual GEMMs: 96 wide with the ping-pong schedule, two B tiles per stage; a producer
        // warpgroup and two barriers per stage.
        let dual = pick(Arch::Sm90a, DType::Bf16, true, nt, &[&s, &s, &s], &n).unwrap();
        assert_eq!(
            (dual.bm, dual.bn, dual.stages, dual.pingpong),
            (128, 96, 5, true)
        );
        assert_eq!(dual.threads(), 384);
        assert_eq!(dual.smem_bytes(true), 5 * (128 + 192) * 128 + 1024 + 5 * 16);
        assert_eq!(dual.tag(), "wgmma_tma_128x96x64_pp");
        // The cooperative 128 x 128 tile and the 64-wide ping-pong tile stay tuning candidates.
        let coop = with_choice(dual, true, 4096, TileChoice::new(128, 1)).unwrap();
        assert_eq!((coop.bn, coop.stages, coop.pingpong), (128, 4, false));
        let pp64 = TileChoice {
            pingpong: true,
            ..TileChoice::new(64, 1)
        };
        let narrow_pp = with_choice(dual, true, 4096, pp64).unwrap();
        assert_eq!((narrow_pp.bn, narrow_pp.stages), (64, 5));
        assert!(candidates(dual, true, 4096).contains(&pp64));
        // 96 wide: dual GEMMs of outputs wider than 64 only (there is no m64n96k16 of its own).
        let plain = pick(Arch::Sm90a, DType::Bf16, false, nt, &[&s, &s], &n).unwrap();
        let pp96 = TileChoice {
            pingpong: true,
            ..TileChoice::new(96, 1)
        };
        assert!(with_choice(plain, false, 4096, pp96).is_err());
        assert!(with_choice(plain, false, 4096, TileChoice::new(96, 1)).is_err());
        assert!(with_choice(dual, true, 64, pp96).is_err());
        assert!(!candidates(plain, false, 4096).iter().any(|c| c.bn == 96));
        // TMA stores: two 8 KB staging buffers per consumer warpgroup after the ring; the stages
        // are recounted around them (128 x 192: 5 -> 4) and the flag is the template's last
        // parameter.
        let stored = |c: WgmmaConfig, dual: bool| {
            let t = c.with_tma_store(dual, true);
            assert!(t.tma_store && t.smem_bytes(dual) <= SMEM_LIMIT);
            assert_eq!(
                t.smem_bytes(dual),
                t.stages * stage_bytes(t.bm, t.bn, dual) + 1024 + 2 * 2 * 8192 + 16 * t.stages
            );
            assert!(t.template().ends_with(", true>"), "{}", t.template());
            (t.bn, t.stages)
        };
        let wide = pick(Arch::Sm90a, DType::Bf16, false, nt, &[&s, &s], &n).unwrap();
        assert_eq!(stored(wide, false), (256, 4));
        assert_eq!(stored(dual, true), (96, 4));
        let n768 = pick(Arch::Sm90a, DType::Bf16, false, nt, &[&s, &s], &s).unwrap();
        assert_eq!(stored(n768, false), (192, 4));
        assert_eq!(n768.with_tma_store(false, false), n768);
        assert!(dual
            .with_tma_store(true, true)
            .template()
            .ends_with(", true, 1, false, true>"));
        // Two CTAs per SM of 128 x 128: both must fit in 228 KiB with 1 KiB reserved for each;
        // the staging buffers would leave two stages, so they keep the register stores.
        assert_eq!((smem_per_cta(1), smem_per_cta(2)), (SMEM_LIMIT, 113 * 1024));
        let two = with_choice(wide, false, 4096, TileChoice::new(128, 2)).unwrap();
        assert_eq!(two.stages, 3);
        assert!(two.smem_bytes(false) <= smem_per_cta(2));
        assert_eq!(two.with_tma_store(false, true), two);
        assert_eq!(
            cp.with_tma_store(false, true),
            cp,
            "the cp.async kernel stores from registers"
        );
        // N = 768: four 192-wide column tiles instead of three 256-wide ones; N = 1536 too
        // (six of 256 would be few); N = 6144 keeps 256 (24 column tiles).
        for (cols, bn, stages) in [(768, 192, 5), (1536, 192, 5), (6144, 256, 4)] {
            let c = pick(
                Arch::Sm90a,
                DType::Bf16,
                false,
                nt,
                &[&s, &s],
                &Extent::constant(cols),
            )
            .unwrap();
            assert_eq!((c.bn, c.stages), (bn, stages), "N = {cols}");
            assert!(c.smem_bytes(false) <= SMEM_LIMIT);
        }
        // Shallow plain GEMMs: 128 x 128 tiles with the ping-pong schedule, one CTA per SM, five
        // stages, or 128 x 192 where 192 divides N; dual ones 128 x 96 tiles with the ping-pong
        // schedule.
        let shallow_n = |dual: bool, strides: &[&Extent], n: &Extent| {
            select(
                Arch::Sm90a,
                DType::Bf16,
                dual,
                nt,
                strides,
                &Extent::constant(768),
                n,
            )
            .unwrap()
        };
        let shallow = |dual: bool, strides: &[&Extent]| shallow_n(dual, strides, &n);
        let pp192 = shallow(false, &[&s, &s]);
        assert_eq!(
            (pp192.bn, pp192.ctas, pp192.pingpong),
            (192, 1, true),
            "N = 3072"
        );
        assert!(pp192.smem_bytes(false) <= SMEM_LIMIT);
        for cols in [768, 1536] {
            let c = shallow_n(false, &[&s, &s], &Extent::constant(cols));
            assert_eq!((c.bn, c.pingpong), (192, true), "N = {cols}");
        }
        let pp = shallow_n(false, &[&s, &s], &Extent::constant(4096));
        assert_eq!((pp.bn, pp.stages, pp.ctas, pp.pingpong), (128, 5, 1, true));
        assert_eq!(pp.threads(), 384);
        assert!(pp.smem_bytes(false) <= SMEM_LIMIT);
        assert!(pp.template().ends_with(", 8, 1, true>"));
        assert!(pp.tag().ends_with("_pp"));
        // The cooperative schedule, as a tuning candidate.
        let coop = with_choice(pp, false, 3072, TileChoice::new(128, 1)).unwrap();
        assert_eq!(
            (coop.threads(), coop.stages, coop.pingpong),
            (384, 5, false)
        );
        assert!(coop.template().ends_with(", 8, 1>"));
        // 256-row tiles: two consumer warpgroups of two bands each, four stages of 48 KB.
        let tall = with_choice(
            pp,
            false,
            3072,
            TileChoice {
                bm: 256,
                ..TileChoice::new(128, 1)
            },
        )
        .unwrap();
        assert_eq!((tall.threads(), tall.stages), (384, 4));
        assert_eq!(
            tall.smem_bytes(false),
            4 * (256 + 128) * 128 + 1024 + 4 * 16
        );
        assert!(tall
            .template()
            .starts_with("mlpc::WgmmaTmaConfig<256, 128, 4, 8, 1>"));
        assert!(tall.tag().ends_with("_256x128x64"));
        for bad in [
            TileChoice {
                bm: 256,
                ..TileChoice::new(256, 1)
            },
            TileChoice {
                bm: 256,
                ..TileChoice::new(128, 2)
            },
            TileChoice {
                bm: 256,
                pingpong: true,
                ..TileChoice::new(128, 1)
            },
            TileChoice {
                bm: 64,
                ..TileChoice::new(128, 1)
            },
        ] {
            assert!(with_choice(pp, false, 3072, bad).is_err(), "{bad}");
        }
        let dual_shallow = shallow(true, &[&s, &s, &s]);
        assert_eq!(
            (dual_shallow.bn, dual_shallow.ctas, dual_shallow.pingpong),
            (96, 1, true)
        );
        // Narrow outputs.
        let narrow = pick(
            Arch::Sm90a,
            DType::Bf16,
            false,
            nt,
            &[&s, &s],
            &Extent::constant(40),
        );
        assert_eq!(narrow.map(|c| c.bn), Some(64));
        let mid = pick(
            Arch::Sm90a,
            DType::Bf16,
            false,
            nt,
            &[&s, &s],
            &Extent::constant(100),
        );
        assert_eq!(mid.map(|c| c.bn), Some(128));
    }
}
