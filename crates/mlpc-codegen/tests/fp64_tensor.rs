//! The f32 GEMM on the FP64 tensor cores (`gemm_dmma.cuh`): which f32 GEMMs offer it as a tile
//! choice, what it generates, that it compiles for sm_90 and sm_90a without local memory, that it
//! is the heuristic's choice, and that the FFMA choice changes only its kernel.

use mlpc_codegen::samples::{self, PlanBuilder};
use mlpc_codegen::{
    generate, generate_kernel_tiled, generate_tiled, plan_tile_candidates, Arch, CodegenError,
    CodegenOptions, Grid, TileChoice, TileOverrides,
};
use mlpc_ir::{BufferKind, DType, Dual, Gemm, MatLayout, Op, Plan};

mod nvrtc_checks;

fn opts(arch: Arch) -> CodegenOptions {
    CodegenOptions {
        arch,
        allow_tf32: false,
        sparse_gemv: false,
        bsr_walk: false,
    }
}

fn gemm_op(a: MatLayout, b: MatLayout, dual: bool) -> Op {
    Op::Gemm(Gemm {
        a,
        b,
        dual: dual.then(|| Dual {
            gate: Default::default(),
            up: Default::default(),
        }),
        epilogue: Default::default(),
    })
}

/// f32 kernels: a plain nn.Linear GEMM (tunable), a dual one, one with A stored `[K, M]`, one
/// with a symbolic K (none of these three tunable).
fn plan() -> Plan {
    let mut p = PlanBuilder::new("f32_tiles", DType::F32);
    let x = p.dense("x", BufferKind::Input, &["T", "768"]);
    let w = p.dense("w", BufferKind::Weight, &["3000", "768"]);
    let wu = p.dense("wu", BufferKind::Weight, &["3000", "768"]);
    let xt = p.dense("xt", BufferKind::Input, &["768", "T"]);
    let xs = p.dense("xs", BufferKind::Input, &["T", "D"]);
    let ws = p.dense("ws", BufferKind::Weight, &["3000", "D"]);
    let y = p.dense("y", BufferKind::Intermediate, &["T", "3000"]);
    let h = p.dense("h", BufferKind::Intermediate, &["T", "3000"]);
    let yt = p.dense("yt", BufferKind::Intermediate, &["T", "3000"]);
    let z = p.dense("z", BufferKind::Output, &["T", "3000"]);
    p.kernel(
        "plain",
        gemm_op(MatLayout::N, MatLayout::T, false),
        &[x, w],
        y,
    );
    p.kernel(
        "dual",
        gemm_op(MatLayout::N, MatLayout::T, true),
        &[x, w, wu],
        h,
    );
    p.kernel(
        "a_t",
        gemm_op(MatLayout::T, MatLayout::T, false),
        &[xt, w],
        yt,
    );
    p.kernel(
        "symbolic_k",
        gemm_op(MatLayout::N, MatLayout::T, false),
        &[xs, ws],
        z,
    );
    p.finish()
}

/// The choices of a `bm` x `bn` tile: on the FP64 tensor cores (the heuristic's), then the FFMA
/// kernel.
fn choices(bm: u32, bn: u32) -> Vec<TileChoice> {
    let ffma = TileChoice {
        bm,
        ..TileChoice::new(bn, 1)
    };
    vec![ffma.on_fp64_tensor_cores(), ffma]
}

#[test]
fn k_major_f32_gemms_on_sm_90_offer_the_fp64_tensor_cores() {
    let p = plan();
    for arch in [Arch::Sm90, Arch::Sm90a] {
        let cands = plan_tile_candidates(&p, &opts(arch)).unwrap();
        let names: Vec<&str> = cands.iter().map(|c| c.kernel.as_str()).collect();
        assert_eq!(names, ["plain", "dual"], "{arch:?}");
        for (c, dual) in cands.iter().zip([false, true]) {
            assert_eq!(
                (c.key.dtype, c.key.dual, c.key.k, c.key.n, c.key.sparse),
                (DType::F32, dual, 768, 3000, false)
            );
        }
        // The FFMA kernel's tiles: 128 x 128, and 64 x 128 with two accumulators.
        assert_eq!(cands[0].choices, choices(128, 128));
        assert_eq!(cands[1].choices, choices(64, 128));
    }
    assert!(plan_tile_candidates(&p, &opts(Arch::Sm80))
        .unwrap()
        .is_empty());
    assert_eq!(
        choices(64, 128)[0].to_string(),
        "64x128 x1 CTA, FP64 tensor cores"
    );
}

#[test]
fn the_default_is_the_fp64_tensor_kernel_and_the_ffma_choice_changes_only_its_kernel() {
    let p = plan();
    let o = opts(Arch::Sm90);
    let heuristic = generate(&p, &o).unwrap();
    assert!(heuristic[0].source.contains("GemmDmma<"));
    assert!(heuristic[1].source.contains("GemmDmma<"));
    assert_eq!(forced(&p, &o), heuristic);
    let key = plan_tile_candidates(&p, &o).unwrap()[0].key;
    let mut tiles = TileOverrides::new();
    tiles.insert(key, choices(128, 128)[0]);
    assert_eq!(generate_tiled(&p, &o, &tiles).unwrap(), heuristic);

    tiles.insert(key, TileChoice::new(128, 1));
    let ffma = generate_tiled(&p, &o, &tiles).unwrap();
    for (f, h) in ffma.iter().zip(&heuristic) {
        assert_eq!(f == h, f.name != "plain", "{}", f.name);
    }
    assert!(ffma[0].source.contains("mlpc::GemmSimt<"));
    let k = &heuristic[0];
    assert_eq!(k.entry, "mlpc_gemm_f32_nt_128x128x16_dmma");
    assert!(k.source.contains("#include \"gemm_dmma.cuh\""));
    assert!(k
        .source
        .contains("using Config = mlpc::DmmaConfig<128, 128, 2, 4, 2, 4>;"));
    assert!(k.source.contains(
        "using Kernel = mlpc::GemmDmma<float, mlpc::Layout::N, mlpc::Layout::T, Config, Epilogue>;"
    ));
    // The FFMA kernel's launch, with the ring's shared memory.
    let h = &ffma[0];
    assert_eq!(k.launch.block, h.launch.block);
    assert_eq!(k.launch.grid, h.launch.grid);
    assert!(matches!(
        k.launch.grid,
        Grid::Tiles {
            tile_m: 128,
            tile_n: 128,
            ..
        }
    ));
    assert_eq!(k.launch.smem_bytes, 2 * 4 * (128 + 128) * 16 * 4);
}

#[test]
fn other_choices_for_an_f32_gemm_are_errors_and_f16_refuses_the_fp64_tensor_cores() {
    let p = plan();
    let o = opts(Arch::Sm90a);
    let key = plan_tile_candidates(&p, &o).unwrap()[0].key;
    for bad in [TileChoice::new(256, 1), TileChoice::new(128, 2)] {
        let mut tiles = TileOverrides::new();
        tiles.insert(key, bad);
        let e = generate_tiled(&p, &o, &tiles).unwrap_err();
        assert!(
            matches!(&e, CodegenError::TileChoice { kernel, .. } if kernel == "plain"),
            "{e}"
        );
        assert!(e.to_string().contains("FP64 tensor cores"), "{e}");
    }
    // A bf16 GEMM on the TMA kernel: not a choice of its.
    let bf16 = samples::linear_bias_bf16();
    let c = &plan_tile_candidates(&bf16, &o).unwrap()[0];
    assert!(c.choices.iter().all(|c| !c.fp64_tensor));
    let mut tiles = TileOverrides::new();
    tiles.insert(c.key, choices(128, 128)[0]);
    let e = generate_tiled(&bf16, &o, &tiles).unwrap_err();
    assert!(e.to_string().contains("f32 GEMMs only"), "{e}");
}

/// Every tunable kernel of `p` with the FP64 tensor cores chosen (`fp64`) or the FFMA kernel.
fn chosen(p: &Plan, o: &CodegenOptions, fp64: bool) -> Vec<mlpc_codegen::CudaKernel> {
    let mut tiles = TileOverrides::new();
    for c in plan_tile_candidates(p, o).unwrap() {
        let choice = c.choices.iter().find(|c| c.fp64_tensor == fp64).unwrap();
        tiles.insert(c.key, *choice);
    }
    assert!(!tiles.is_empty(), "{}", p.name);
    generate_tiled(p, o, &tiles).unwrap()
}

/// Every tunable kernel of `p` with the FP64 tensor cores chosen.
fn forced(p: &Plan, o: &CodegenOptions) -> Vec<mlpc_codegen::CudaKernel> {
    chosen(p, o, true)
}

/// Every FP64 tensor-core choice of every tunable kernel of `p` compiles for sm_90 and sm_90a:
/// the templates' `static_assert`s hold (launch, fallback, warps, blocks), the f64 mma and the
/// 16-byte copies are in the PTX, and neither the kernel nor its FFMA fallback spills at the
/// CTAs per SM its launch bounds name. Needs NVRTC 13.0, as the other NVRTC tests.
fn compiles_without_local_memory(p: &Plan) {
    for arch in [Arch::Sm90, Arch::Sm90a] {
        let o = opts(arch);
        let mut kernels = Vec::new();
        for c in plan_tile_candidates(p, &o).unwrap() {
            let kernel = p.kernels.iter().find(|k| k.name == c.kernel).unwrap();
            for &choice in c.choices.iter().filter(|c| c.fp64_tensor) {
                let mut tiles = TileOverrides::new();
                tiles.insert(c.key, choice);
                kernels.push(generate_kernel_tiled(p, kernel, &o, &tiles).unwrap());
            }
        }
        assert!(!kernels.is_empty(), "{}", p.name);
        let compiled = nvrtc_checks::compile_clean(&kernels, arch);
        for (k, c) in kernels.iter().zip(&compiled) {
            assert!(k.entry.contains("_dmma"), "{}", k.entry);
            for needle in [
                "mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64",
                "cp.async.cg.shared.global",
            ] {
                assert!(c.ptx.contains(needle), "{}: {needle}", k.entry);
            }
        }
    }
}

/// The GPT-2 MLP's two f32 GEMMs (bias, GELU); a plain and a dual GEMM.
#[test]
fn the_fp64_tensor_kernels_compile_without_local_memory() {
    let p = samples::gpt2_mlp_f32();
    assert_eq!(forced(&p, &opts(Arch::Sm90)).len(), 2);
    compiles_without_local_memory(&p);
    compiles_without_local_memory(&plan());
}

const TEMPLATE: &str = include_str!("../../../kernels-templates/gemm_dmma.cuh");

/// The fragments of `mma.sync.aligned.m16n8k16.row.col.f64` (PTX ISA; CuTe's
/// `SM90_16x8x16_F64F64F64F64_TN` layouts): the (row, k) of A in register `v` of `lane`, the
/// (k, column) of B, the (row, column) of C.
fn a_elem(lane: usize, v: usize) -> (usize, usize) {
    (lane / 4 + 8 * (v % 2), lane % 4 + 4 * (v / 2))
}
fn b_elem(lane: usize, v: usize) -> (usize, usize) {
    (lane % 4 + 4 * v, lane / 4)
}
fn c_elem(lane: usize, v: usize) -> (usize, usize) {
    (lane / 4 + 8 * (v / 2), 2 * (lane % 4) + v % 2)
}

/// What one warp's `mma` computes from its lanes' registers: `d += A B` with A, B and d
/// gathered from and scattered to the lanes by the fragment layouts.
fn mma(d: &mut [[f64; 4]; 32], a: &[[f64; 8]; 32], b: &[[f64; 4]; 32]) {
    let mut am = [[0.0; 16]; 16];
    let mut bm = [[0.0; 8]; 16];
    for (lane, (al, bl)) in a.iter().zip(b).enumerate() {
        for (v, &x) in al.iter().enumerate() {
            let (r, k) = a_elem(lane, v);
            am[r][k] = x;
        }
        for (v, &x) in bl.iter().enumerate() {
            let (k, c) = b_elem(lane, v);
            bm[k][c] = x;
        }
    }
    for (lane, dl) in d.iter_mut().enumerate() {
        for (v, dv) in dl.iter_mut().enumerate() {
            let (r, c) = c_elem(lane, v);
            *dv += (0..16).map(|k| am[r][k] * bm[k][c]).sum::<f64>();
        }
    }
}

/// One warp's work on one stage (`GemmDmma` and `GemmBsrDmma` alike): the B fragments of its
/// `fm` x `fn_` m16n8 tiles at columns `wn ..`, then per m16 tile at rows `wm ..` the A fragment
/// and its mmas into `acc[i * fn_ + j]`.
fn warp_slice(
    sa: &[f32],
    sb: &[f32],
    wm: usize,
    wn: usize,
    fm: usize,
    fn_: usize,
    acc: &mut [[[f64; 4]; 32]],
) {
    let frag_offset = |row: usize, t: usize| row * 16 + t * 4;
    let mut bf = vec![[[0.0f64; 4]; 32]; fn_];
    for (j, bj) in bf.iter_mut().enumerate() {
        for (lane, bl) in bj.iter_mut().enumerate() {
            let (g, t) = (lane / 4, lane % 4);
            let o = frag_offset(wn + j * 8 + g, t);
            for (e, x) in bl.iter_mut().enumerate() {
                *x = f64::from(sb[o + e]);
            }
        }
    }
    for i in 0..fm {
        let mut af = [[0.0f64; 8]; 32];
        for (lane, al) in af.iter_mut().enumerate() {
            let (g, t) = (lane / 4, lane % 4);
            let lo = frag_offset(wm + i * 16 + g, t);
            let hi = frag_offset(wm + i * 16 + g + 8, t);
            // {lo.x, hi.x, lo.y, hi.y, lo.z, hi.z, lo.w, hi.w}
            for e in 0..4 {
                al[2 * e] = f64::from(sa[lo + e]);
                al[2 * e + 1] = f64::from(sa[hi + e]);
            }
        }
        for (j, bj) in bf.iter().enumerate() {
            mma(&mut acc[i * fn_ + j], &af, bj);
        }
    }
}

/// The epilogue's mapping: c[2r + e] of tile (i, j) to C[r0 + 16i + g + 8r][c0 + 8j + 2t + e],
/// where `keep(row, column)`; C has `n` columns.
#[allow(clippy::too_many_arguments)]
fn scatter(
    acc: &[[[f64; 4]; 32]],
    r0: usize,
    c0: usize,
    fm: usize,
    fn_: usize,
    keep: impl Fn(usize, usize) -> bool,
    n: usize,
    out: &mut [f64],
) {
    for i in 0..fm {
        for j in 0..fn_ {
            for (lane, c) in acc[i * fn_ + j].iter().enumerate() {
                let (g, t) = (lane / 4, lane % 4);
                for r in 0..2 {
                    let row = r0 + i * 16 + g + r * 8;
                    for e in 0..2 {
                        let col = c0 + j * 8 + t * 2 + e;
                        if keep(row, col) {
                            out[row * n + col] = c[2 * r + e];
                        }
                    }
                }
            }
        }
    }
}

/// `GemmDmma` on the CPU, line for line where it places data (the lines are checked against the
/// template below): C = A B^T for A `[m, k]` and B `[n, k]`, row-major, with the configuration
/// of `DmmaConfig::for_gemm`; for a dual GEMM (`bu`, the up weight) also A Bu^T, the second
/// result (the epilogue combines the two).
fn emulate(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    b: &[f32],
    bu: Option<&[f32]>,
) -> (Vec<f64>, Vec<f64>) {
    let dual = bu.is_some();
    let bm = if dual { 64 } else { 128 };
    const BN: usize = 128;
    const BK: usize = 16;
    const SLICES: usize = 4;
    const WARPS_N: usize = 4;
    let (wm_size, wn_size) = (bm / 2, BN / WARPS_N);
    let (fm, fn_) = (wm_size / 16, wn_size / 8);
    let b_rows = if dual { 2 * BN } else { BN };
    let mut out = vec![f64::NAN; m * n];
    let mut out_up = vec![f64::NAN; m * n];
    for bx in 0..m.div_ceil(bm) {
        for by in 0..n.div_ceil(BN) {
            let (m0, n0) = (bx * bm, by * BN);
            let mut acc = vec![vec![[[0.0f64; 4]; 32]; fn_ * fm]; 8];
            let mut acc_up = acc.clone();
            let slice_floats = (bm + b_rows) * BK;
            for kt in 0..k.div_ceil(SLICES * BK) {
                // `load`: SLICES slices, each in 16-byte chunks, A rows, then B rows, then Bu
                // rows, zero outside.
                let mut stage = vec![f32::NAN; SLICES * slice_floats];
                for s in 0..SLICES {
                    let k0 = (kt * SLICES + s) * BK;
                    let at = s * slice_floats;
                    for c in 0..(bm + b_rows) * (BK / 4) {
                        let (row, q) = (c / (BK / 4), c % (BK / 4));
                        let is_a = row < bm;
                        let is_up = dual && row >= bm + BN;
                        let grow = match (is_a, is_up) {
                            (true, _) => m0 + row,
                            (false, true) => n0 + (row - bm - BN),
                            (false, false) => n0 + (row - bm),
                        };
                        let (rows, src) = match (is_a, bu) {
                            (true, _) => (m, a),
                            (false, Some(bu)) if is_up => (n, bu),
                            _ => (n, b),
                        };
                        let gk = k0 + q * 4;
                        for e in 0..4 {
                            let inside = grow < rows && gk < k;
                            stage[at + row * BK + q * 4 + e] =
                                if inside { src[grow * k + gk + e] } else { 0.0 };
                        }
                    }
                }
                for slice in stage.chunks(slice_floats) {
                    let (sa, sbs) = slice.split_at(bm * BK);
                    let (sb, sbu) = sbs.split_at(BN * BK);
                    for warp in 0..8 {
                        let wm = (warp / WARPS_N) * wm_size;
                        let wn = (warp % WARPS_N) * wn_size;
                        warp_slice(sa, sb, wm, wn, fm, fn_, &mut acc[warp]);
                        if dual {
                            warp_slice(sa, sbu, wm, wn, fm, fn_, &mut acc_up[warp]);
                        }
                    }
                }
            }
            for warp in 0..8 {
                let wm = (warp / WARPS_N) * wm_size;
                let wn = (warp % WARPS_N) * wn_size;
                let keep = |r: usize, c: usize| r < m && c < n;
                scatter(&acc[warp], m0 + wm, n0 + wn, fm, fn_, keep, n, &mut out);
                scatter(
                    &acc_up[warp],
                    m0 + wm,
                    n0 + wn,
                    fm,
                    fn_,
                    keep,
                    n,
                    &mut out_up,
                );
            }
        }
    }
    (out, out_up)
}

#[test]
fn the_model_is_the_templates_data_placement() {
    // The lines `emulate` transcribes; a change to either side must change both.
    for line in [
        "__device__ __forceinline__ int frag_offset(int row, int t) { return row * 16 + t * 4; }",
        "const int row = c / 4, q = c % 4;",
        "const i64 grow = row0 + row, gk = k0 + q * 4;",
        "const bool in = grow < rows && gk < k;",
        "mma_detail::cp_async_16(dst + (u32)(c * 16), in ? base + grow * ld + gk : base,",
        "(p.k + SLICES * BK - 1) / (SLICES * BK),",
        "const i64 k0 = (kt * SLICES + s) * BK;",
        "const u32 at = stage_addr + (u32)(s * kSliceFloats * 4);",
        "static constexpr int kSliceFloats = (BM + kBRows) * BK;",
        "static constexpr int kStageFloats = SLICES * kSliceFloats;",
        "dmma_detail::copy_slice<BM, kThreads>(at, p.a, p.lda, m0, p.m, k0, p.k, tid);",
        "dmma_detail::copy_slice<BN, kThreads>(at + BM * BK * 4, p.b, p.ldb, n0, p.n, k0, p.k,",
        "dmma_detail::copy_slice<BN, kThreads>(at + (BM + BN) * BK * 4, p.b_up, p.ldb_up,",
        "n0, p.n, k0, p.k, tid);",
        "const float* sa = smem + stage * kStageFloats + s * kSliceFloats;",
        "const int wm = (warp / Cfg::WARPS_N) * Cfg::WM;",
        "const int wn = (warp % Cfg::WARPS_N) * Cfg::WN;",
        "dmma_detail::slice(sa, sa + BM * BK, wm, wn, g, t, acc);",
        "dmma_detail::slice_dual(sa, sa + BM * BK, sa + (BM + BN) * BK, wm, wn, g,",
        "const float4 v = *reinterpret_cast<const float4*>(sb + frag_offset(row + g, t));",
        "b[0] = v.x; b[1] = v.y; b[2] = v.z; b[3] = v.w;",
        "for (int j = 0; j < FN; ++j) b_frag(sb, wn + j * 8, g, t, b[j]);",
        "b_frag(sb, wn + j * 8, g, t, b);",
        "b_frag(sbu, wn + j * 8, g, t, bu);",
        "b_frags(sbu, wn, g, t, bu);",
        "lo = *reinterpret_cast<const float4*>(sa + frag_offset(row + g, t));",
        "hi = *reinterpret_cast<const float4*>(sa + frag_offset(row + g + 8, t));",
        "a_rows(sa, wm + i * 16, g, t, lo, hi);",
        "const double a[8] = {lo.x, hi.x, lo.y, hi.y, lo.z, hi.z, lo.w, hi.w};",
        "a[i][0] = lo.x; a[i][1] = hi.x; a[i][2] = lo.y; a[i][3] = hi.y;",
        "a[i][4] = lo.z; a[i][5] = hi.z; a[i][6] = lo.w; a[i][7] = hi.w;",
        "for (int j = 0; j < FN; ++j) mma_16816_f64(acc[i][j], a, b[j]);",
        "for (int i = 0; i < FM; ++i) mma_16816_f64(acc[i][j], a[i], b);",
        "mma_16816_f64(acc_up[i][j], a, bu[j]);",
        "mma_16816_f64(acc_up[i][j], a[i], bu);",
        "dmma_detail::store<T, Epi>(acc, acc, p, m0 + wm, n0 + wn, p.n, pairs, g, t);",
        "dmma_detail::store<T, Epi>(acc, acc_up, p, m0 + wm, n0 + wn, p.n, pairs, g, t);",
        "const i64 row = r0 + i * 16 + g + r * 8;",
        "const i64 col = c0 + j * 8 + t * 2;",
        "if (col >= c_end) continue;",
        "Epi::apply((float)acc[i][j][2 * r], up(i, j, 2 * r), row, col, p);",
        "Epi::apply((float)acc[i][j][2 * r + 1], up(i, j, 2 * r + 1),",
    ] {
        assert!(
            TEMPLATE.contains(line),
            "the template no longer has: {line}"
        );
    }
}

/// `n` values in [-1, 1), deterministic in `seed` (24 significant bits: exact in f32).
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The k order of the fragments (logical k = t + 4j read from k = 4t + j of the slice) and the
/// rest of the data placement compute the GEMM, on tails in M, N and K (K a multiple of 4: the
/// copies' condition).
#[test]
fn the_emulated_kernel_computes_the_gemm() {
    let check = |got: &[f64], a: &[f32], b: &[f32], (m, n, k): (usize, usize, usize)| {
        for r in 0..m {
            for c in 0..n {
                let want: f64 = (0..k)
                    .map(|i| f64::from(a[r * k + i]) * f64::from(b[c * k + i]))
                    .sum();
                let g = got[r * n + c];
                assert!(
                    (g - want).abs() <= 1e-12 * (1.0 + want.abs()),
                    "{m}x{n}x{k} C[{r}][{c}] = {g}, want {want}"
                );
            }
        }
    };
    for (m, n, k) in [(200, 136, 40), (128, 128, 16), (1, 8, 4), (130, 250, 68)] {
        let a = random(m * k, 1);
        let b = random(n * k, 2);
        let bu = random(n * k, 3);
        check(&emulate(m, n, k, &a, &b, None).0, &a, &b, (m, n, k));
        let (gate, up) = emulate(m, n, k, &a, &b, Some(&bu));
        check(&gate, &a, &b, (m, n, k));
        check(&up, &a, &bu, (m, n, k));
    }
}

// ---------------------------------------------------------------------------------------------
// Block-sparse: `GemmBsrDmma` in gemm_bsr.cuh
// ---------------------------------------------------------------------------------------------

const BSR_TEMPLATE: &str = include_str!("../../../kernels-templates/gemm_bsr.cuh");

#[test]
fn f32_block_sparse_gemms_with_small_blocks_offer_the_fp64_tensor_cores() {
    let p = samples::bsr_fp64_tensor_f32();
    for arch in [Arch::Sm90, Arch::Sm90a] {
        let cands = plan_tile_candidates(&p, &opts(arch)).unwrap();
        let names: Vec<&str> = cands.iter().map(|c| c.kernel.as_str()).collect();
        assert_eq!(
            names,
            [
                "bsr_gemm_bias_gelu_tanh_f32_nt_b32x32",
                "bsr_gemm_f32_nt_b8x4",
                "bsr_gemm_relu_f32_nt_b24x8"
            ]
        );
        // The FFMA kernel's tiles: 128 rows by the block height rounded up to 16.
        for (c, bn) in cands.iter().zip([32, 16, 32]) {
            assert!(c.key.sparse && c.key.dtype == DType::F32 && !c.key.dual);
            assert_eq!(c.choices, choices(128, bn));
        }
        assert_eq!((cands[0].key.k, cands[0].key.n), (256, 128));
    }
    assert!(plan_tile_candidates(&p, &opts(Arch::Sm80))
        .unwrap()
        .is_empty());
    // 64-row blocks, a dual GEMM, A stored [K, M], 3 x 5 blocks: not tunable.
    let other = samples::bsr_f32();
    for arch in [Arch::Sm90, Arch::Sm90a] {
        assert!(plan_tile_candidates(&other, &opts(arch))
            .unwrap()
            .is_empty());
    }
}

#[test]
fn the_block_sparse_default_is_gemm_bsr_dmma_with_the_ffma_launch() {
    let p = samples::bsr_fp64_tensor_f32();
    let o = opts(Arch::Sm90);
    let heuristic = generate(&p, &o).unwrap();
    let forced = forced(&p, &o);
    assert_eq!(forced, heuristic);
    let ffma = chosen(&p, &o, false);
    assert!(ffma.iter().all(|k| k.source.contains("GemmBsrSimt<")));
    let want = [
        (
            "mlpc_bsr_gemm_bias_gelu_tanh_f32_nt_b32x32_128x32x16_dmma",
            32,
            128,
        ),
        ("mlpc_bsr_gemm_f32_nt_b8x4_128x16x16_dmma", 8, 64),
        ("mlpc_bsr_gemm_relu_f32_nt_b24x8_128x32x16_dmma", 24, 128),
    ];
    for ((k, h), (entry, br, threads)) in forced.iter().zip(&ffma).zip(want) {
        assert_eq!(k.entry, entry);
        assert!(
            k.source
                .contains(&format!("mlpc::GemmBsrDmma<float, mlpc::Layout::N, {br}, ")),
            "{}",
            k.source
        );
        assert!(k.source.contains(", Config, Epilogue, 4>;"), "{}", k.entry);
        assert_eq!(k.launch.block, [threads, 1, 1]);
        assert_eq!(
            (k.launch.block, &k.launch.grid),
            (h.launch.block, &h.launch.grid)
        );
        // The ring of four [128 + BN][16] f32 stages, or the FFMA kernel's buffers if larger.
        let bn = if br <= 16 { 16 } else { 32 };
        assert_eq!(
            k.launch.smem_bytes,
            (4 * (128 + bn) * 16 * 4).max(h.launch.smem_bytes)
        );
    }
}

/// The forced block-sparse kernels: 32 x 32, 8 x 4 and 24 x 8 blocks.
#[test]
fn the_block_sparse_fp64_tensor_kernels_compile_without_local_memory() {
    compiles_without_local_memory(&samples::bsr_fp64_tensor_f32());
}

/// `GemmBsrDmma` on the CPU, where it places data (the lines are checked against the template
/// below): C = A W^T for A `[m, k]` and the weight of `pattern` packed as `[kept, br, bc]`, with
/// `GemmBsrSimt`'s tile (128 rows, BN = the block height rounded up to 16) and threads.
fn emulate_bsr(m: usize, pattern: &mlpc_ir::BlockPattern, a: &[f32], packed: &[f32]) -> Vec<f64> {
    const BM: usize = 128;
    const BK: usize = 16;
    let [br, bc] = pattern.block.map(|v| v as usize);
    let (n, k) = (pattern.out as usize, pattern.inp as usize);
    let bn = br.div_ceil(16) * 16;
    let warps = (BM / 8) * (bn / 4) / 32;
    let wm = BM / warps;
    let (fm, fn_) = (wm / 16, bn / 8);
    let ksub = bc.div_ceil(BK);
    let row_ptr = pattern.row_ptr();
    let mut out = vec![f64::NAN; m * n];
    for bx in 0..m.div_ceil(BM) {
        for brow in 0..n / br {
            let (m0, nb0) = (bx * BM, 0);
            let n0 = brow * br + nb0;
            let n_end = (brow * br + br).min(n);
            let mut acc = vec![vec![[[0.0f64; 4]; 32]; fm * fn_]; warps];
            let first = row_ptr[brow] as usize;
            let steps = (row_ptr[brow + 1] as usize - first) * ksub;
            for s in 0..steps {
                let blk = first + s / ksub;
                let (bcol, ks) = (pattern.kept[blk].1 as usize, s % ksub);
                let mut stage = vec![f32::NAN; (BM + bn) * BK];
                for c in 0..(BM + bn) * (BK / 4) {
                    let (row, q) = (c / (BK / 4), c % (BK / 4));
                    let bk = ks * BK + q * 4;
                    for e in 0..4 {
                        let v = if row < BM {
                            let grow = m0 + row;
                            let inside = bk < bc && grow < m;
                            inside.then(|| a[grow * k + bcol * bc + bk + e])
                        } else {
                            let nr = nb0 + (row - BM);
                            let inside = bk < bc && nr < br;
                            inside.then(|| packed[blk * br * bc + nr * bc + bk + e])
                        };
                        stage[row * BK + q * 4 + e] = v.unwrap_or(0.0);
                    }
                }
                let (sa, sb) = stage.split_at(BM * BK);
                for (warp, wacc) in acc.iter_mut().enumerate() {
                    warp_slice(sa, sb, warp * wm, 0, fm, fn_, wacc);
                }
            }
            for (warp, wacc) in acc.iter().enumerate() {
                let keep = |r: usize, c: usize| r < m && c < n_end;
                scatter(wacc, m0 + warp * wm, n0, fm, fn_, keep, n, &mut out);
            }
        }
    }
    out
}

#[test]
fn the_block_sparse_model_is_the_templates_data_placement() {
    // The fragments, mmas and stores are `dmma_detail`'s, checked with the dense kernel.
    for line in [
        "static constexpr int WM = BM / kWarps;",
        "static constexpr int FM = WM / 16, FN = BN / 8;",
        "const int k0 = ks * BK;",
        "dmma_detail::copy_slice<BM, kThreads>(stage_addr, p.a + (i64)bcol * BC + k0, p.lda, m0,",
        "p.m, 0, BC - k0, tid);",
        "dmma_detail::copy_slice<BN, kThreads>(stage_addr + BM * BK * 4,",
        "p.b + (i64)blk * (BR * BC) + k0, BC, nb0, BR, 0,",
        "const int blk = first + (int)s / kKSub;",
        "(int)s % kKSub, tid);",
        "const int wm = warp * WM;",
        "dmma_detail::slice(sa, sa + BM * BK, wm, 0, g, t, acc);",
        "dmma_detail::store<T, Epi>(acc, acc, p, m0 + wm, n0, n_end, pairs, g, t);",
    ] {
        assert!(
            BSR_TEMPLATE.contains(line),
            "gemm_bsr.cuh no longer has: {line}"
        );
    }
}

/// The emulated block-sparse kernel computes the pruned GEMM for every block shape it takes, with
/// empty block rows (their outputs zero: the epilogue of zero) and tails in M.
#[test]
fn the_emulated_block_sparse_kernel_computes_the_pruned_gemm() {
    let p = samples::bsr_fp64_tensor_f32();
    for (kernel, m) in p.kernels.iter().zip([200, 130, 7]) {
        let Op::SparseGemm(sg) = &kernel.op else {
            panic!("{}", kernel.name)
        };
        let pat = &sg.pattern;
        let [br, bc] = pat.block.map(|v| v as usize);
        let (n, k) = (pat.out as usize, pat.inp as usize);
        let a = random(m * k, 3);
        let packed = random(pat.kept.len() * br * bc, 4);
        let mut w = vec![0.0f64; n * k];
        for (i, &(r, c)) in pat.kept.iter().enumerate() {
            for y in 0..br {
                for x in 0..bc {
                    w[(r as usize * br + y) * k + c as usize * bc + x] =
                        f64::from(packed[(i * br + y) * bc + x]);
                }
            }
        }
        let got = emulate_bsr(m, pat, &a, &packed);
        for r in 0..m {
            for c in 0..n {
                let want: f64 = (0..k).map(|i| f64::from(a[r * k + i]) * w[c * k + i]).sum();
                let g = got[r * n + c];
                assert!(
                    (g - want).abs() <= 1e-12 * (1.0 + want.abs()),
                    "{}: C[{r}][{c}] = {g}, want {want}",
                    kernel.name
                );
            }
        }
    }
}

/// The FP64 tensor-core microbenchmark (`scripts/gpu/dmma_issue.cu`, built with nvcc on a CUDA
/// machine) reuses the template's mma wrapper: its device part must keep compiling with it, the
/// mma as `DMMA` (not a fallback), and no entry may spill (a spilling entry would time local
/// memory, not the pipes).
#[test]
fn the_dmma_microbenchmark_compiles_with_the_template() {
    use mlpc_jit::{compile_all, JitOptions};
    let template = forced(&samples::gpt2_mlp_f32(), &opts(Arch::Sm90)).remove(0);
    let kernel = mlpc_codegen::CudaKernel {
        name: "dmma_issue".to_string(),
        entry: "dmma_issue_kernel_mix".to_string(),
        source: include_str!("../../../scripts/gpu/dmma_issue.cu").to_string(),
        small_m: None,
        relayouts: Vec::new(),
        short_grids: Vec::new(),
        tile_fixed_cols: 0,
        ..template
    };
    let jit = JitOptions {
        arch: Arch::Sm90,
        no_cache: true,
        cache_dir: None,
    };
    let c = compile_all(std::slice::from_ref(&kernel), &jit)
        .unwrap_or_else(|e| panic!("{e}"))
        .remove(0);
    assert_eq!(c.ptx.matches(".entry dmma_issue_").count(), 5);
    assert!(c
        .ptx
        .contains("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64"));
    assert!(c.ptx.contains("cvt.f64.f32"));
    // ptxas reports every entry: none may spill or keep a stack frame.
    let frames: Vec<&str> = c
        .log
        .lines()
        .filter(|l| l.contains("bytes stack frame"))
        .collect();
    assert_eq!(frames.len(), 5, "{}", c.log);
    for line in frames {
        assert!(
            line.contains(" 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"),
            "{line}"
        );
    }
}

/// Snapshots of the kernels the FP64 tensor-core choice generates (sm_90): the GPT-2 MLP's
/// two f32 GEMMs, and the block-sparse plan's three, so that every change to them is reviewed as
/// a diff (the default generation's snapshots keep the FFMA kernels).
#[test]
fn fp64_tensor_kernels_snapshots() {
    for p in [samples::gpt2_mlp_f32(), samples::bsr_fp64_tensor_f32()] {
        for k in forced(&p, &opts(Arch::Sm90)) {
            insta::assert_snapshot!(format!("{}__{}", p.name, k.name), k.listing());
        }
    }
}
