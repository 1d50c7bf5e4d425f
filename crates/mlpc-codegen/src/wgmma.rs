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

use crate::Arch;

/// Bytes of one k row of a tile: 64 16-bit values, one 128-byte swizzle row.
pub(crate) const ROW_BYTES: u32 = 128;
/// The k depth of one shared-memory slice.
pub(crate) const BK: u32 = 64;
/// The dynamic shared memory a block may use on sm_90 (227 KiB).
const SMEM_LIMIT: u32 = 227 * 1024;

/// A `GemmWgmma` tile configuration (`mlpc::WgmmaConfig<BM, BN, STAGES>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WgmmaConfig {
    pub bm: u32,
    pub bn: u32,
    pub stages: u32,
}

impl WgmmaConfig {
    /// One consumer warpgroup (128 threads) per 64 rows.
    pub fn threads(&self) -> u32 {
        self.bm / 64 * 128
    }

    /// Mirrors `GemmWgmma::kSmemBytes`: the stage ring plus 1024 bytes of alignment slack.
    pub fn smem_bytes(&self, dual: bool) -> u32 {
        self.stages * stage_bytes(self.bm, self.bn, dual) + 1024
    }

    pub fn template(&self) -> String {
        format!(
            "mlpc::WgmmaConfig<{}, {}, {}>",
            self.bm, self.bn, self.stages
        )
    }

    /// The tile part of the entry name, e.g. `wgmma_128x256x64`.
    pub fn tag(&self) -> String {
        format!("wgmma_{}x{}x{}", self.bm, self.bn, BK)
    }
}

fn stage_bytes(bm: u32, bn: u32, dual: bool) -> u32 {
    let nb = if dual { 2 } else { 1 };
    (bm + nb * bn) * ROW_BYTES
}

/// The wgmma configuration for a GEMM, or `None` when it must stay on `GemmMma`. `la` / `lb` are
/// the physical layouts (which dimension is contiguous), `strides` the row strides of the matrix
/// operands (A, B and, for a dual GEMM, B_up), `n` the output's column count.
pub(crate) fn select(
    arch: Arch,
    dtype: DType,
    dual: bool,
    (la, lb): (MatLayout, MatLayout),
    strides: &[&Extent],
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
    // Narrow outputs get a narrower tile; the widest is 256 (128 for the two accumulators of a
    // dual GEMM, which hold as many registers).
    let widest = if dual { 128 } else { 256 };
    let bn = match n.as_constant() {
        Some(c) if c <= 64 => 64,
        Some(c) if c <= 128 => 128,
        _ => widest,
    }
    .min(widest);
    let bm = 128;
    let stages = ((SMEM_LIMIT - 1024) / stage_bytes(bm, bn, dual)).min(4);
    Some(WgmmaConfig { bm, bn, stages })
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

    #[test]
    fn every_element_wgmma_reads_is_the_one_the_loads_wrote() {
        // A stage as the template lays it out: A (BM rows), B (BN rows), at a 1024-aligned base.
        for (bm, bn) in [(128, 256), (128, 128), (64, 64)] {
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
            bm: 128,
            bn: 256,
            stages: 4,
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
        let pick = |arch, dtype, dual, l, strides: &[&Extent], n: &Extent| {
            select(arch, dtype, dual, l, strides, n)
        };
        let big = Some(WgmmaConfig {
            bm: 128,
            bn: 256,
            stages: 4,
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
        // A symbolic stride is checked in the kernel.
        let sym = Extent::of_dim(&mlpc_ir::Dim::sym("T"));
        assert!(pick(Arch::Sm90a, DType::Bf16, false, nt, &[&sym, &s], &n).is_some());
        // Dual GEMMs: 128 wide, two B tiles per stage.
        let dual = pick(Arch::Sm90a, DType::Bf16, true, nt, &[&s, &s, &s], &n).unwrap();
        assert_eq!((dual.bm, dual.bn, dual.stages), (128, 128, 4));
        assert_eq!(dual.smem_bytes(true), 4 * (128 + 256) * 128 + 1024);
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
