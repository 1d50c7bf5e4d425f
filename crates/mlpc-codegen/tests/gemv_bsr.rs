//! The block-sparse small-M (weight-streaming) entries (`gemv_bsr.cuh`, asked for with
//! `CodegenOptions::sparse_gemv`): which kernels get them, NVRTC compilation without local
//! memory, and a CPU replay of the template's work decomposition.
//!
//! No GPU here: the replay follows, lane by lane, the index arithmetic of `GemvBsrMma::run`
//! (the block row of a CTA, its steps and chunks, the warps' share of them, each lane's weight
//! offsets through the module's `gemv_chunk` map and the rearranged weight the runtime hands the
//! kernel, the block column of each step in A), on the generated sources' own configurations,
//! and checks the sums (small integers, exact in f64) against the block-sparse product and every
//! kept product's count. The pairing of a lane's weight and activation words inside one
//! `mma.sync.m16n8k16` is `GemvMma`'s, replayed from the PTX ISA's fragment layouts in
//! `tests/gemv.rs`.
//!
//! The NVRTC tests need NVRTC 13.0 (`LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib`, or
//! `MLPC_NVRTC_LIB`, as `scripts/test.sh` sets up); without it they fail rather than skip.

// The replay indexes its arrays with the kernel's own loop variables, on purpose.
#![allow(clippy::needless_range_loop)]

mod bsr_plans;

use mlpc_codegen::{generate, samples, Arch, CodegenOptions, CudaKernel, Grid};
use mlpc_ir::{BlockPattern, Op, Plan};
use mlpc_jit::{compile_all, ensure_nvrtc, entry_resources, JitOptions};

fn opts(arch: Arch, sparse_gemv: bool) -> CodegenOptions {
    CodegenOptions {
        arch,
        allow_tf32: false,
        sparse_gemv,
        bsr_walk: false,
    }
}

fn plans() -> Vec<Plan> {
    let mut v = bsr_plans::all();
    v.extend(samples::sparse());
    // A dual GEMM of 32 x 32 blocks (those of `bsr_plans` are 16, 64 x 32 and 64 x 64 wide),
    // with an empty block row.
    v.push(bsr_plans::plan(
        "b32x32_dual_gemv",
        mlpc_ir::DType::Bf16,
        bsr_plans::pattern([32, 32], 256, 512, |r, c| r != 3 && (r + 2 * c) % 3 != 0),
        true,
        true,
        false,
    ));
    v
}

/// Every block-sparse kernel of [`plans`] for `arch`, with the plan's pattern and whether it is
/// an f16 / bf16 one (`Some(dual)`).
fn sparse_kernels(arch: Arch, sparse_gemv: bool) -> Vec<(CudaKernel, BlockPattern, Option<bool>)> {
    let mut out = Vec::new();
    for plan in plans() {
        let kernels = generate(&plan, &opts(arch, sparse_gemv)).unwrap();
        for (pk, k) in plan.kernels.iter().zip(kernels) {
            if let Op::SparseGemm(s) = &pk.op {
                let dtype = plan.buffers[pk.out].ty.dtype;
                let half = (dtype != mlpc_ir::DType::F32).then_some(s.gemm.dual.is_some());
                out.push((k, (*s.pattern).clone(), half));
            }
        }
    }
    out
}

#[test]
fn sixteen_bit_block_sparse_gemms_get_small_m_entries_only_when_asked() {
    for arch in [Arch::Sm90a, Arch::Sm90, Arch::Sm80] {
        assert!(sparse_kernels(arch, false)
            .iter()
            .all(|(k, _, _)| k.small_m.is_none()));
        let mut with = 0;
        let mut duals = 0;
        for (k, p, half) in sparse_kernels(arch, true) {
            let [br, bc] = p.block;
            // Weight words a lane for one block's steps: at most 64 registers.
            let words = |dual: bool| br / 16 * (bc / 32) * if dual { 2 } else { 1 } <= 8;
            let eligible =
                half.is_some_and(words) && k.entry.contains("_nt_") && br % 16 == 0 && bc % 32 == 0;
            assert_eq!(k.small_m.is_some(), eligible, "{} {:?}", k.name, p.block);
            let Some(small) = &k.small_m else { continue };
            with += 1;
            duals += usize::from(half == Some(true));
            assert!(k.source.contains("#include \"gemv_bsr.cuh\""), "{}", k.name);
            let maxes: Vec<u64> = small.variants.iter().map(|v| v.max_m).collect();
            assert!(maxes.windows(2).all(|w| w[0] < w[1]), "{maxes:?}");
            assert_eq!(maxes[0], 8, "{}", k.name);
            for v in &small.variants {
                assert_eq!(v.entry, format!("{}_gemv_m{}", k.entry, v.max_m));
                assert_eq!(v.launch.smem_bytes, 0);
                assert_eq!(v.launch.early_launch, arch != Arch::Sm80);
                // One CTA a block row.
                match &v.launch.grid {
                    Grid::Tiles { m, tile_m, .. } => {
                        assert_eq!(m.as_constant(), Some(p.out));
                        assert_eq!(*tile_m, br);
                    }
                    g => panic!("{}: {g:?}", v.entry),
                }
            }
        }
        assert!(with >= 6, "{arch}: only {with} kernels with entries");
        assert!(duals >= 2, "{arch}: only {duals} dual kernels with entries");
    }
}

/// The small-M part of two modules, as generated: a Hopper kernel that reads its weight
/// rearranged (`gemv_chunk`) and a portable one that reads the packed order.
#[test]
fn block_sparse_small_m_sources() {
    for (arch, rearranged) in [(Arch::Sm90a, true), (Arch::Sm90, false)] {
        let (k, _, _) = sparse_kernels(arch, true)
            .into_iter()
            .find(|(k, _, _)| k.small_m.is_some() && k.relayouts.is_empty() != rearranged)
            .unwrap_or_else(|| panic!("{arch}: no such kernel"));
        let at = k
            .source
            .find("\n// Small-M entries (gemv_bsr.cuh)")
            .unwrap();
        insta::assert_snapshot!(format!("{}_{arch}", k.name), &k.source[at..]);
    }
}

// ---------------------------------------------------------------------------------------------
// NVRTC
// ---------------------------------------------------------------------------------------------

fn check_nvrtc(arch: Arch) {
    if let Err(e) = ensure_nvrtc() {
        panic!("these tests need NVRTC 13.0: {e}");
    }
    let kernels: Vec<CudaKernel> = sparse_kernels(arch, true)
        .into_iter()
        .map(|(k, _, _)| k)
        .filter(|k| k.small_m.is_some())
        .collect();
    let jit = JitOptions {
        arch,
        no_cache: true,
        cache_dir: None,
    };
    let compiled = compile_all(&kernels, &jit).unwrap_or_else(|e| panic!("{e}"));
    for (k, c) in kernels.iter().zip(&compiled) {
        for v in &k.small_m.as_ref().unwrap().variants {
            let r = entry_resources(&c.log, &v.entry)
                .unwrap_or_else(|| panic!("{}: no ptxas report in the log:\n{}", v.entry, c.log));
            eprintln!("{}: {r:?}", v.entry);
            assert!(
                !r.uses_local_memory(),
                "{} uses local memory on {arch}: {r:?}\n{}",
                v.entry,
                c.log
            );
            assert!(
                c.ptx.contains(&format!(".entry {}(", v.entry)),
                "{}: not in the PTX",
                v.entry
            );
        }
        // The kept-block lists are constants of the module.
        assert!(c.ptx.contains("gemv_col_idx"), "{}", k.name);
    }
}

#[test]
fn block_sparse_small_m_entries_compile_for_sm_90a_without_local_memory() {
    check_nvrtc(Arch::Sm90a);
}

#[test]
fn block_sparse_small_m_entries_compile_for_sm_90_without_local_memory() {
    check_nvrtc(Arch::Sm90);
}

#[test]
fn block_sparse_small_m_entries_compile_for_sm_80_without_local_memory() {
    check_nvrtc(Arch::Sm80);
}

// ---------------------------------------------------------------------------------------------
// The work decomposition, replayed
// ---------------------------------------------------------------------------------------------

/// `mlpc::GemvConfig<MG, RT, WARPS, UNROLL>` of entry `SmallM{max_m}` in `source`.
fn config_of(source: &str, max_m: u64) -> [usize; 4] {
    let line = source
        .lines()
        .find(|l| l.starts_with(&format!("using SmallM{max_m} = ")))
        .unwrap_or_else(|| panic!("no SmallM{max_m} in the source"));
    let at = line.find("GemvConfig<").unwrap() + "GemvConfig<".len();
    let end = at + line[at..].find('>').unwrap();
    let v: Vec<usize> = line[at..end]
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect();
    assert_eq!(v.len(), 4, "{line}");
    [v[0], v[1], v[2], v[3]]
}

/// The module's `gemv_chunk` array, or the identity when it reads the packed order.
fn chunk_map(source: &str, chunks: usize) -> Vec<usize> {
    // In 16 bits where every position fits, else 32.
    let at = ["unsigned short", "int"]
        .iter()
        .find_map(|t| source.find(&format!("__device__ const {t} gemv_chunk[")));
    let Some(at) = at else {
        assert!(source.contains("return q; }"));
        return (0..chunks).collect();
    };
    let body = &source[at + source[at..].find('{').unwrap() + 1..];
    let body = &body[..body.find('}').unwrap()];
    let v: Vec<usize> = body
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(v.len(), chunks);
    v
}

/// `GemvBsrMma::run` over the whole grid for `m` tokens: `dev` is the weight as the kernel
/// receives it (the packed blocks, rearranged where the module says so), `a` is `[m, K]`.
/// Returns the outputs `[m, N]` and, per (n, k) of the weight, how many times the first token
/// multiplied it.
fn replay(
    p: &BlockPattern,
    dev: &[f64],
    a: &[f64],
    m: usize,
    [mg, rt, warps, unroll]: [usize; 4],
    chunk_at: &[usize],
) -> (Vec<f64>, Vec<u32>) {
    let [br, bc] = [p.block[0] as usize, p.block[1] as usize];
    let (n, k) = (p.out as usize, p.inp as usize);
    let steps_per_block = bc / 32;
    assert_eq!(16 * rt, br, "a CTA owns one block row");
    assert_eq!(unroll % steps_per_block, 0, "a chunk is whole blocks");
    let row_ptr = p.row_ptr();
    let mut out = vec![f64::NAN; m * n];
    let mut hits = vec![0u32; n * k];
    for r in 0..p.block_rows() as usize {
        let first = row_ptr[r] as usize;
        let steps = (row_ptr[r + 1] as usize - first) * steps_per_block;
        let chunks = steps.div_ceil(unroll);
        let mut m0 = 0;
        while m0 < m {
            // acc[warp][row of the block][token of the pass]
            let mut acc = vec![vec![vec![0.0f64; 8 * mg]; br]; warps];
            for (warp, acc) in acc.iter_mut().enumerate() {
                for c in (warp..chunks).step_by(warps) {
                    for u in 0..unroll {
                        let q = c * unroll + u;
                        if q >= steps {
                            continue; // its loads read zeros
                        }
                        let blk = first + q / steps_per_block;
                        let s = u % steps_per_block;
                        assert_eq!(s, q % steps_per_block);
                        let col = p.kept[blk].1 as usize;
                        // Lane (g, t): weight rows 16 rt + 8 h + g, A tokens 8 mg + g, k 8t..8t+7
                        // of the step; the mma pairs equal t and word positions.
                        for lane in 0..32 {
                            let (g, t) = (lane / 4, lane % 4);
                            for tile in 0..rt {
                                for h in 0..2 {
                                    let row = 16 * tile + 8 * h + g;
                                    let woff = 8 * chunk_at[(row * bc + 32 * s + 8 * t) / 8];
                                    let w = &dev[blk * br * bc + woff..][..8];
                                    let ka = col * bc + 32 * s + 8 * t;
                                    for tok in 0..8 * mg {
                                        let mm = m0 + tok;
                                        if mm >= m {
                                            continue;
                                        }
                                        let x = &a[mm * k + ka..][..8];
                                        acc[row][tok] +=
                                            w.iter().zip(x).map(|(w, x)| w * x).sum::<f64>();
                                        if mm == 0 {
                                            for e in 0..8 {
                                                hits[(r * br + row) * k + ka + e] += 1;
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            // The reduction in warp order, then one store per output of the pass.
            for row in 0..br {
                for tok in 0..8 * mg {
                    if m0 + tok < m {
                        let s: f64 = (0..warps).map(|w| acc[w][row][tok]).sum();
                        out[(m0 + tok) * n + r * br + row] = s;
                    }
                }
            }
            m0 += 8 * mg;
        }
    }
    (out, hits)
}

/// Small pseudo-random integers (a 64-bit LCG: the test needs no distribution, only values that
/// tell the products apart).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// The kernel's weight buffer: the packed blocks (elements as 16-bit words holding small
/// integers), rearranged by the kernel's relayout where it has one.
fn device_weight(k: &CudaKernel, packed: &[u16]) -> Vec<f64> {
    let bytes: Vec<u8> = packed.iter().flat_map(|v| v.to_le_bytes()).collect();
    let bytes = match k.relayouts.first() {
        Some(r) => r.apply(&bytes).expect("the packed weight is whole periods"),
        None => bytes,
    };
    bytes
        .chunks_exact(2)
        .map(|b| f64::from(u16::from_le_bytes([b[0], b[1]])))
        .collect()
}

/// Replays every small-M entry of `k` (a kernel of pattern `p`; `half`: `Some(dual)` for f16 /
/// bf16) at `ms(max_m)` tokens on small random integers and checks the outputs against the
/// block-sparse product and that every kept (n, k) is multiplied exactly once. Returns how many
/// entries it replayed (none where `k` has no small-M entries).
fn check_replay(
    k: &CudaKernel,
    p: &BlockPattern,
    half: Option<bool>,
    rng: &mut Lcg,
    ms: impl Fn(usize) -> Vec<usize>,
) -> usize {
    let Some(small) = &k.small_m else { return 0 };
    let [br, bc] = [p.block[0] as usize, p.block[1] as usize];
    let (n, kk) = (p.out as usize, p.inp as usize);
    // The gate (or only) weight and, for a dual GEMM, the up weight: the template reads both at
    // the same offsets.
    let weights: Vec<Vec<u16>> = (0..if half == Some(true) { 2 } else { 1 })
        .map(|_| {
            (0..p.kept.len() * br * bc)
                .map(|_| rng.below(7) as u16)
                .collect()
        })
        .collect();
    let chunk_at = chunk_map(&k.source, br * bc / 8);
    let mut kept = vec![0u32; n * kk];
    for &(r, c) in &p.kept {
        let (r, c) = (r as usize, c as usize);
        for row in r * br..(r + 1) * br {
            for e in c * bc..(c + 1) * bc {
                kept[row * kk + e] = 1;
            }
        }
    }
    for v in &small.variants {
        let cfg = config_of(&k.source, v.max_m);
        for m in ms(v.max_m as usize) {
            for packed in &weights {
                let dev = device_weight(k, packed);
                let a: Vec<f64> = (0..m * kk).map(|_| rng.below(5) as f64).collect();
                let (out, hits) = replay(p, &dev, &a, m, cfg, &chunk_at);
                // The block-sparse product from the packed blocks.
                let mut want = vec![0.0f64; m * n];
                for (i, &(r, c)) in p.kept.iter().enumerate() {
                    let (r, c) = (r as usize, c as usize);
                    for row in 0..br {
                        for e in 0..bc {
                            let w = f64::from(packed[(i * br + row) * bc + e]);
                            for mm in 0..m {
                                want[mm * n + r * br + row] += w * a[mm * kk + c * bc + e];
                            }
                        }
                    }
                }
                assert_eq!(out, want, "{} m = {m}", v.entry);
                assert_eq!(hits, kept, "{}: a kept product missed or repeated", v.entry);
            }
        }
    }
    small.variants.len()
}

#[test]
fn the_block_sparse_decomposition_covers_every_kept_product_once() {
    let mut rng = Lcg(7);
    let mut replayed = 0;
    for arch in [Arch::Sm90a, Arch::Sm90] {
        for (k, p, half) in sparse_kernels(arch, true) {
            // One token, a full pass, and two passes with a partial one.
            replayed += check_replay(&k, &p, half, &mut rng, |max| vec![1, max, max + 3]);
        }
    }
    assert!(replayed >= 20, "only {replayed} entries replayed");
}

/// Random masks: blocks of 16 to 64 rows and 16 to 64 columns (16-wide ones get no entries),
/// 1-5 block rows and columns, from a single kept block to all of them, empty block rows among
/// them; plain and dual, f16 and bf16, on the Hopper module (weight rearranged where its blocks
/// are 32 wide) and the portable one.
mod random_masks {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn the_replay_equals_the_block_sparse_product(
            block in prop::sample::select(vec![
                [16u32, 32u32], [32, 32], [32, 64], [64, 32], [64, 64], [32, 16],
            ]),
            rows in 1u32..=5,
            cols in 1u32..=5,
            bits in any::<u32>(),
            mode in 0u8..3,
            dual in any::<bool>(),
            f16 in any::<bool>(),
            hopper in any::<bool>(),
            seed in any::<u64>(),
        ) {
            // Each (r, c) by a bit of `bits`, a single block, or every block.
            let single = (seed % u64::from(rows)) as u32;
            let mut keep = |r: u32, c: u32| match mode {
                0 => bits >> ((r * cols + c) % 32) & 1 == 1,
                1 => r == single && c == (seed as u32 >> 8) % cols,
                _ => true,
            };
            prop_assume!((0..rows).any(|r| (0..cols).any(|c| keep(r, c))));
            let pat = bsr_plans::pattern(
                block,
                u64::from(rows * block[0]),
                u64::from(cols * block[1]),
                &mut keep,
            );
            let dtype = if f16 { mlpc_ir::DType::F16 } else { mlpc_ir::DType::Bf16 };
            let plan = bsr_plans::plan("random_mask", dtype, pat.clone(), dual, true, false);
            let arch = if hopper { Arch::Sm90a } else { Arch::Sm90 };
            let k = generate(&plan, &opts(arch, true)).unwrap().remove(0);
            // Whole 16-row tiles, 32-wide k steps, at most 64 weight registers a lane.
            let words = block[0] / 16 * (block[1] / 32) * if dual { 2 } else { 1 };
            let eligible = block[1] % 32 == 0 && words <= 8;
            prop_assert_eq!(k.small_m.is_some(), eligible, "{:?}", block);
            let mut rng = Lcg(seed);
            check_replay(&k, &pat, Some(dual), &mut rng, |max| vec![1, max + 3]);
        }
    }
}
