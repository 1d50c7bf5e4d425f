// mlpc kernel templates: f32 GEMM on the FP64 tensor cores (sm_90: `mma.sync` m16n8k16 in f64).
//
//   C[m, n] = Epi(sum_k A[m, k] * B[k, n])           (plain, A [M, K] and B stored [N, K])
//   C[m, n] = Out(Gate(A @ Bg) * Up(A @ Bu))[m, n]   (dual: both accumulators in one CTA)
//
// Every f32 value is exact in f64 and every product of two is exact in f64 (48 significant bits
// of 53), so the sum is accumulated in f64 from exact products and rounded to f32 once, before
// the epilogue: at least as accurate as FFMA accumulation in f32, and never TF32. On Hopper the
// FP64 tensor cores run as many flops a cycle as the FFMA pipes, but one `mma` does the work of
// 64 FFMA instructions a thread: the issue slots, loads and latencies that hold the FFMA kernel
// (`gemm_simt.cuh`) near half the pipe's peak are not in its way.
//
// Structure of one CTA (a BM x BN tile of C, 16-deep k slices):
//   - a STAGES-deep ring of shared-memory stages, each SLICES consecutive 16-deep slices, each
//     slice the A slice as [BM][16] and the B slice as [BN][16] f32 (then, for a dual GEMM, the
//     up B slice), k contiguous as the operands are stored, filled by 16-byte `cp.async` with
//     zero-fill outside the matrix; the CTA meets at a barrier once a stage, so four slices a
//     stage (two stages) cut the barriers to a quarter (8 % faster than four stages of one on
//     the H200, docs/perf-notes.md);
//   - WARPS_M x WARPS_N warps, each owning a WM x WN sub-tile as FM x FN m16n8 tiles of f64
//     accumulators (two sets for a dual GEMM, each A fragment serving both); fragments are read
//     as float4 along k and converted to f64;
//   - the epilogue runs on the accumulators (rounded to f32) and stores straight to global memory.
// Inputs the 16-byte copies cannot take (K or a row stride not a multiple of 4 elements, a base
// not 16-byte aligned) run the FFMA kernel instead, with the same launch, as does every input on
// a target before sm_90 (`MLPC_HAS_DMMA`).
//
// Fragments of m16n8k16 f64 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with .f64"), with
// g = lane / 4 and t = lane % 4:
//   A (16x16):  a[2j + r] = A[g + 8r][t + 4j]     (r = 0, 1; j = 0..3)
//   B (16x8):   b[j]      = B[t + 4j][g]
//   C (16x8):   c[2r + e] = C[g + 8r][2t + e]     (e = 0, 1)
// The mma sums over its 16 k in any order of k, provided A and B agree: logical k = t + 4j is
// taken from physical k = 4t + j of the slice, so that each lane reads its four k of a row as one
// float4 (A rows g and g + 8, B row g). Eight lanes of a quarter warp then read two whole 64-byte
// rows: no bank conflicts.
#pragma once

#include "gemm_mma.cuh"
#include "gemm_simt.cuh"

// The f64 m16n8k16 mma exists from sm_90 on. Compiled for an older target (a source generated
// for sm_90 handed to NVRTC for sm_80), the kernels of this file and `GemmBsrDmma` run their
// FFMA fallback instead.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define MLPC_HAS_DMMA 0
#else
#define MLPC_HAS_DMMA 1
#endif

namespace mlpc {

/// Tile configuration: a BM x BN tile of C per CTA, WARPS_M x WARPS_N warps, STAGES stages of
/// SLICES 16-deep k slices.
template <int BM_, int BN_, int WARPS_M_, int WARPS_N_, int STAGES_, int SLICES_>
struct DmmaConfig {
    static constexpr int BM = BM_, BN = BN_, BK = 16;
    static constexpr int WARPS_M = WARPS_M_, WARPS_N = WARPS_N_, STAGES = STAGES_;
    static constexpr int SLICES = SLICES_;
    static constexpr int kThreads = WARPS_M * WARPS_N * 32;
    /// Warp tile and the number of m16n8 tiles in it.
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
    static constexpr int FM = WM / 16, FN = WN / 8;
    static_assert(BM % WARPS_M == 0 && BN % WARPS_N == 0, "warps must divide the tile");
    static_assert(WM % 16 == 0 && WN % 8 == 0, "warp tiles are whole m16n8 tiles");
    static_assert(STAGES >= 2, "at least double buffering");
    static_assert(SLICES >= 1, "at least one slice a stage");
};

namespace dmma_detail {

/// d += a b on the FP64 tensor cores (fragments as in the file comment).
__device__ __forceinline__ void mma_16816_f64(double (&d)[4], const double (&a)[8],
                                              const double (&b)[4]) {
#if MLPC_HAS_DMMA
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, {%0, %1, %2, %3};\n"
        : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
        : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]),
          "d"(a[7]), "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
#else
    __trap();  // unreachable: the kernels take their fallback on such targets
#endif
}

/// Float offset of the float4 of k (4t .. 4t + 3) of row `row` in a [ROWS][16] slice.
__device__ __forceinline__ int frag_offset(int row, int t) { return row * 16 + t * 4; }

/// Copies a [ROWS][16] slice of a k-contiguous operand into shared memory at `dst` by 16-byte
/// chunks, THREADS threads: rows `row0 ..` (valid below `rows`) and k `k0 ..` (valid below
/// `k`, a multiple of 4 away from `k0`) of the matrix at `base` with row stride `ld`; zero
/// outside.
template <int ROWS, int THREADS, class T>
__device__ __forceinline__ void copy_slice(u32 dst, const T* base, i64 ld, i64 row0, i64 rows,
                                           i64 k0, i64 k, int tid) {
    constexpr int kChunks = ROWS * 4;
#pragma unroll
    for (int it = 0; it < (kChunks + THREADS - 1) / THREADS; ++it) {
        const int c = tid + it * THREADS;
        if (kChunks % THREADS != 0 && c >= kChunks) break;
        const int row = c / 4, q = c % 4;
        const i64 grow = row0 + row, gk = k0 + q * 4;
        const bool in = grow < rows && gk < k;
        mma_detail::cp_async_16(dst + (u32)(c * 16), in ? base + grow * ld + gk : base,
                                in ? 16 : 0);
    }
}

/// The cp.async ring over `slices` slices: `load(slice, stage)` issues one slice's copies into a
/// stage, `compute(stage)` runs on a landed one. Slice s has landed for every thread once each
/// has waited for its own copies of it and passed the barrier, by which point every warp is
/// also done with slice s - 1, whose stage the next copy refills.
template <int STAGES, class Load, class Compute>
__device__ __forceinline__ void ring(i64 slices, Load load, Compute compute) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < slices) load((i64)s, s);
        mma_detail::cp_async_commit();
    }
    for (i64 s = 0; s < slices; ++s) {
        mma_detail::cp_async_wait<STAGES - 2>();
        __syncthreads();
        const i64 next = s + STAGES - 1;
        if (next < slices) load(next, (int)(next % STAGES));
        mma_detail::cp_async_commit();
        compute((int)(s % STAGES));
    }
}

template <int FM, int FN>
__device__ __forceinline__ void zero(double (&acc)[FM][FN][4]) {
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0;
}

/// The A fragment of the m16 tile at row `row` of the [.][16] slice at `sa`, as the float4s of
/// its rows g and g + 8.
__device__ __forceinline__ void a_rows(const float* sa, int row, int g, int t, float4& lo,
                                       float4& hi) {
    lo = *reinterpret_cast<const float4*>(sa + frag_offset(row + g, t));
    hi = *reinterpret_cast<const float4*>(sa + frag_offset(row + g + 8, t));
}

/// The B fragment of the n8 tile at row (output column) `row` of the [.][16] slice at `sb`.
__device__ __forceinline__ void b_frag(const float* sb, int row, int g, int t, double (&b)[4]) {
    const float4 v = *reinterpret_cast<const float4*>(sb + frag_offset(row + g, t));
    b[0] = v.x; b[1] = v.y; b[2] = v.z; b[3] = v.w;
}

/// The B fragments of FN n8 tiles: rows (output columns) `wn ..` of the [.][16] slice at `sb`.
template <int FN>
__device__ __forceinline__ void b_frags(const float* sb, int wn, int g, int t, double (&b)[FN][4]) {
#pragma unroll
    for (int j = 0; j < FN; ++j) b_frag(sb, wn + j * 8, g, t, b[j]);
}

/// The A fragments of FM m16 tiles at rows `wm ..` of the [.][16] slice at `sa`.
template <int FM>
__device__ __forceinline__ void a_frags(const float* sa, int wm, int g, int t, double (&a)[FM][8]) {
#pragma unroll
    for (int i = 0; i < FM; ++i) {
        float4 lo, hi;
        a_rows(sa, wm + i * 16, g, t, lo, hi);
        a[i][0] = lo.x; a[i][1] = hi.x; a[i][2] = lo.y; a[i][3] = hi.y;
        a[i][4] = lo.z; a[i][5] = hi.z; a[i][6] = lo.w; a[i][7] = hi.w;
    }
}

/// Whether a warp of FM x FN tiles holds its A fragments through the slice and reads the B
/// fragments one n8 tile at a time (`A_STATIONARY`), or the other way round: whichever operand
/// takes fewer registers held (A: 8 doubles a tile, B: 4).
template <int FM, int FN>
struct SliceOrder {
    static constexpr bool A_STATIONARY = 2 * FM <= FN && FM < 4;
};

/// One warp's share of a 16-deep slice: A rows `wm ..` of the slice at `sa`, B rows (output
/// columns) `wn ..` of the one at `sb`, FM x FN m16n8 tiles into `acc`.
template <int FM, int FN>
__device__ __forceinline__ void slice(const float* sa, const float* sb, int wm, int wn, int g,
                                      int t, double (&acc)[FM][FN][4]) {
    if constexpr (SliceOrder<FM, FN>::A_STATIONARY) {
        double a[FM][8];
        a_frags(sa, wm, g, t, a);
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            double b[4];
            b_frag(sb, wn + j * 8, g, t, b);
#pragma unroll
            for (int i = 0; i < FM; ++i) mma_16816_f64(acc[i][j], a[i], b);
        }
    } else {
        double b[FN][4];
        b_frags(sb, wn, g, t, b);
#pragma unroll
        for (int i = 0; i < FM; ++i) {
            float4 lo, hi;
            a_rows(sa, wm + i * 16, g, t, lo, hi);
            const double a[8] = {lo.x, hi.x, lo.y, hi.y, lo.z, hi.z, lo.w, hi.w};
#pragma unroll
            for (int j = 0; j < FN; ++j) mma_16816_f64(acc[i][j], a, b[j]);
        }
    }
}

/// `slice` of a dual GEMM: each A fragment serves the gate (`sb`) and the up (`sbu`) tiles.
template <int FM, int FN>
__device__ __forceinline__ void slice_dual(const float* sa, const float* sb, const float* sbu,
                                           int wm, int wn, int g, int t,
                                           double (&acc)[FM][FN][4], double (&acc_up)[FM][FN][4]) {
    if constexpr (SliceOrder<FM, FN>::A_STATIONARY) {
        double a[FM][8];
        a_frags(sa, wm, g, t, a);
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            double b[4], bu[4];
            b_frag(sb, wn + j * 8, g, t, b);
            b_frag(sbu, wn + j * 8, g, t, bu);
#pragma unroll
            for (int i = 0; i < FM; ++i) {
                mma_16816_f64(acc[i][j], a[i], b);
                mma_16816_f64(acc_up[i][j], a[i], bu);
            }
        }
    } else {
        double b[FN][4], bu[FN][4];
        b_frags(sb, wn, g, t, b);
        b_frags(sbu, wn, g, t, bu);
#pragma unroll
        for (int i = 0; i < FM; ++i) {
            float4 lo, hi;
            a_rows(sa, wm + i * 16, g, t, lo, hi);
            const double a[8] = {lo.x, hi.x, lo.y, hi.y, lo.z, hi.z, lo.w, hi.w};
#pragma unroll
            for (int j = 0; j < FN; ++j) {
                mma_16816_f64(acc[i][j], a, b[j]);
                mma_16816_f64(acc_up[i][j], a, bu[j]);
            }
        }
    }
}

/// The epilogue of a warp's tiles: c[2r + e] of tile (i, j) is C[r0 + 16i + g + 8r][c0 + 8j +
/// 2t + e], stored where the row is below `p.m` and the column below `c_end`; two columns at
/// once with `pairs` (an 8-byte aligned pair: even `ldc` and `c0`, aligned base). `acc_up` is
/// the up accumulator of a dual GEMM, read only when `Epi::kDual`.
template <class T, class Epi, int FM, int FN, class P>
__device__ __forceinline__ void store(const double (&acc)[FM][FN][4],
                                      const double (&acc_up)[FM][FN][4], const P& p, i64 r0,
                                      i64 c0, i64 c_end, bool pairs, int g, int t) {
    auto up = [&](int i, int j, int e) { return Epi::kDual ? (float)acc_up[i][j][e] : 0.0f; };
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const i64 row = r0 + i * 16 + g + r * 8;
            if (row >= p.m) continue;
            T* out_row = p.c + row * p.ldc;
#pragma unroll
            for (int j = 0; j < FN; ++j) {
                const i64 col = c0 + j * 8 + t * 2;
                if (col >= c_end) continue;
                const float v0 = Epi::apply((float)acc[i][j][2 * r], up(i, j, 2 * r), row, col, p);
                if (col + 1 < c_end) {
                    const float v1 = Epi::apply((float)acc[i][j][2 * r + 1], up(i, j, 2 * r + 1),
                                                row, col + 1, p);
                    if (pairs) {
                        *reinterpret_cast<float2*>(out_row + col) = make_float2(v0, v1);
                    } else {
                        out_row[col] = from_f32<T>(v0);
                        out_row[col + 1] = from_f32<T>(v1);
                    }
                } else {
                    out_row[col] = from_f32<T>(v0);
                }
            }
        }
}

}  // namespace dmma_detail

/// The f32 GEMM on FP64 tensor cores. Launch with `kThreads` threads, grid
/// `(ceil(M / BM), ceil(N / BN))` and `kSmemBytes` bytes of dynamic shared memory.
template <class T, Layout LA, Layout LB, class Cfg, class Epi>
struct GemmDmma {
    static_assert(sizeof(T) == 4, "the FP64 tensor-core GEMM takes f32 operands");
    static_assert(LA == Layout::N && LB == Layout::T, "both operands k-contiguous");
    static constexpr bool kDual = Epi::kDual;
    static constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
    static constexpr int SLICES = Cfg::SLICES;
    static constexpr int FM = Cfg::FM, FN = Cfg::FN;
    static constexpr int kThreads = Cfg::kThreads;
    /// A slice: the A slice, then the B slice (and, for a dual GEMM, the up B slice); a stage:
    /// SLICES of them.
    static constexpr int kBRows = kDual ? 2 * BN : BN;
    static constexpr int kSliceFloats = (BM + kBRows) * BK;
    static constexpr int kStageFloats = SLICES * kSliceFloats;
    static constexpr int kSmemBytes = STAGES * kStageFloats * 4;

    /// Inputs the copies cannot take: the FFMA kernel with the same threads and tile.
    typedef GemmSimt<T, LA, LB, SimtConfig<BM, BN, 8, BM / 16, BN / 16>, Epi> Fallback;
    static_assert(Fallback::kThreads == kThreads, "the fallback takes the same launch");
    static_assert(Fallback::kSmemBytes <= kSmemBytes, "the fallback fits the shared memory");

    /// Copies the k slices of stage `kt` (slices `kt * SLICES ..`) of A, B (and Bu) into the
    /// stage at `stage_addr`, each slice's operands one after the other (16-byte chunks, zero
    /// outside; K is a multiple of 4 on this path).
    template <class P>
    __device__ __forceinline__ static void load(const P& p, u32 stage_addr, i64 m0, i64 n0, i64 kt,
                                                int tid) {
#pragma unroll
        for (int s = 0; s < SLICES; ++s) {
            const i64 k0 = (kt * SLICES + s) * BK;
            const u32 at = stage_addr + (u32)(s * kSliceFloats * 4);
            dmma_detail::copy_slice<BM, kThreads>(at, p.a, p.lda, m0, p.m, k0, p.k, tid);
            dmma_detail::copy_slice<BN, kThreads>(at + BM * BK * 4, p.b, p.ldb, n0, p.n, k0, p.k,
                                                  tid);
            if constexpr (kDual) {
                dmma_detail::copy_slice<BN, kThreads>(at + (BM + BN) * BK * 4, p.b_up, p.ldb_up,
                                                      n0, p.n, k0, p.k, tid);
            }
        }
    }

    template <class P>
    __device__ __forceinline__ static void run(const P& p) {
        const bool copies = p.k % 4 == 0 && p.lda % 4 == 0 && p.ldb % 4 == 0 &&
                            is_aligned(p.a, 16) && is_aligned(p.b, 16) &&
                            (!kDual || (p.ldb_up % 4 == 0 && is_aligned(p.b_up, 16)));
        if (!MLPC_HAS_DMMA || !copies) {
            Fallback::run(p);
            return;
        }
        extern __shared__ __align__(128) unsigned char mlpc_smem[];
        const float* smem = reinterpret_cast<const float*>(mlpc_smem);
        const u32 smem0 = smem_addr(mlpc_smem);

        const int tid = (int)threadIdx.x;
        const int lane = tid % 32, warp = tid / 32;
        const int g = lane / 4, t = lane % 4;
        const int wm = (warp / Cfg::WARPS_N) * Cfg::WM;
        const int wn = (warp % Cfg::WARPS_N) * Cfg::WN;
        const i64 m0 = (i64)blockIdx.x * BM;
        const i64 n0 = (i64)blockIdx.y * BN;

        double acc[FM][FN][4];
        double acc_up[kDual ? FM : 1][kDual ? FN : 1][4];
        dmma_detail::zero(acc);
        dmma_detail::zero(acc_up);

        dmma_detail::ring<STAGES>(
            (p.k + SLICES * BK - 1) / (SLICES * BK),
            [&](i64 kt, int stage) {
                load(p, smem0 + (u32)(stage * kStageFloats * 4), m0, n0, kt, tid);
            },
            [&](int stage) {
#pragma unroll
                for (int s = 0; s < SLICES; ++s) {
                    const float* sa = smem + stage * kStageFloats + s * kSliceFloats;
                    if constexpr (kDual) {
                        dmma_detail::slice_dual(sa, sa + BM * BK, sa + (BM + BN) * BK, wm, wn, g,
                                                t, acc, acc_up);
                    } else {
                        dmma_detail::slice(sa, sa + BM * BK, wm, wn, g, t, acc);
                    }
                }
            });

        const bool pairs = p.ldc % 2 == 0 && is_aligned(p.c, 8);
        if constexpr (kDual) {
            dmma_detail::store<T, Epi>(acc, acc_up, p, m0 + wm, n0 + wn, p.n, pairs, g, t);
        } else {
            dmma_detail::store<T, Epi>(acc, acc, p, m0 + wm, n0 + wn, p.n, pairs, g, t);
        }
    }
};

}  // namespace mlpc
