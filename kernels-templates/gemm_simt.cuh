// mlpc kernel templates: register-blocked GEMM on the FFMA pipes, in true f32 (no TF32), with the
// same epilogue machinery and operand layouts as the tensor-core family.
//
// Structure of one CTA (a BM x BN tile of C), the classic SGEMM blocking:
//   - two shared-memory buffers, each with the BK slice of A as As[BK][BM] and of B as Bs[BK][BN]
//     (k-major, so that a thread reads its rows / columns of one k as float4s);
//   - the next slice is fetched into registers while the current one is multiplied, then written
//     to the other buffer: one barrier per slice;
//   - each thread owns a TM x TN block of C, as TM/4 x TN/4 groups of 4x4 spread BM/(TM/4) rows and
//     BN/(TN/4) columns apart, so that a warp's shared reads are broadcasts or contiguous;
//   - global loads are 4-element vectors when the operand is aligned for it, bounds-checked scalars
//     otherwise; everything outside the matrix reads as zero, so any M, N, K is correct.
// The element type may be f32, f16 or bf16 (converted to f32 on the way to shared memory).
#pragma once

#include "common.cuh"

namespace mlpc {

/// Tile configuration: a BM x BN tile of C per CTA, BK-deep slices, a TM x TN block per thread.
template <int BM_, int BN_, int BK_, int TM_, int TN_>
struct SimtConfig {
    static constexpr int BM = BM_, BN = BN_, BK = BK_, TM = TM_, TN = TN_;
    static constexpr int TX = BN / TN, TY = BM / TM;
    static constexpr int kThreads = TX * TY;
    static_assert(TM % 4 == 0 && TN % 4 == 0, "thread blocks are made of 4x4 groups");
    static_assert(BM % TM == 0 && BN % TN == 0, "thread blocks must tile the CTA tile");
    static_assert(BK % 4 == 0, "BK must be a multiple of 4");
};

namespace simt_detail {

/// Four consecutive elements as f32; `vec`: one aligned vector load.
template <class T>
__device__ __forceinline__ void load4(const T* p, bool vec, float (&v)[4]);

template <>
__device__ __forceinline__ void load4<float>(const float* p, bool vec, float (&v)[4]) {
    if (vec) {
        asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
                     : "l"(p));
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = p[e];
    }
}

template <class T>
__device__ __forceinline__ void load4_16(const T* p, bool vec, float (&v)[4]) {
    if (vec) {
        u32 w0, w1;
        asm volatile("ld.global.v2.u32 {%0, %1}, [%2];\n" : "=r"(w0), "=r"(w1) : "l"(p));
        unpack2<T>(w0, v[0], v[1]);
        unpack2<T>(w1, v[2], v[3]);
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = to_f32(p[e]);
    }
}

template <>
__device__ __forceinline__ void load4<bf16>(const bf16* p, bool vec, float (&v)[4]) {
    load4_16(p, vec, v);
}

template <>
__device__ __forceinline__ void load4<f16>(const f16* p, bool vec, float (&v)[4]) {
    load4_16(p, vec, v);
}

/// Reads a BK x BX slice of an operand, as f32, into registers, and writes it to a k-major
/// shared array `s[BK][BX]`. The operand is a row-major matrix with row stride `ld`:
///   KCONTIG = false: stored [k][x] (x contiguous), e.g. A^T or a row-major B;
///   KCONTIG = true:  stored [x][k] (k contiguous), e.g. a row-major A or an nn.Linear weight.
/// (k0, x0) is the slice origin; `kext`, `xext` the matrix extents.
template <class T, int BK, int BX, int THREADS, bool KCONTIG>
struct SliceLoader {
    static constexpr int kChunks = BK * BX / 4;
    static constexpr int kIters = ceil_div(kChunks, THREADS);
    float r[kIters][4];

    __device__ __forceinline__ void fetch(const T* g, i64 ld, i64 k0, i64 x0, i64 kext, i64 xext,
                                          bool vec, int tid) {
#pragma unroll
        for (int it = 0; it < kIters; ++it) {
            const int i = tid + it * THREADS;
            if (kChunks % THREADS != 0 && i >= kChunks) break;
            // Consecutive threads take consecutive x so that the shared stores do not conflict
            // (KCONTIG) or global loads coalesce (x contiguous).
            int kk, xx;
            if constexpr (KCONTIG) {
                xx = i % BX;
                kk = (i / BX) * 4;
            } else {
                xx = (i % (BX / 4)) * 4;
                kk = i / (BX / 4);
            }
            const i64 gk = k0 + kk, gx = x0 + xx;
            // Along the contiguous dimension the chunk spans 4 elements; across it, one.
            const i64 row = KCONTIG ? gx : gk, col = KCONTIG ? gk : gx;
            const i64 rows = KCONTIG ? xext : kext, cols = KCONTIG ? kext : xext;
            if (row < rows && col + 3 < cols) {
                load4(g + row * ld + col, vec, r[it]);
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    r[it][e] = (row < rows && col + e < cols) ? load_f32(g, row * ld + col + e) : 0.0f;
                }
            }
        }
    }

    __device__ __forceinline__ void store(float* s, int tid) const {
#pragma unroll
        for (int it = 0; it < kIters; ++it) {
            const int i = tid + it * THREADS;
            if (kChunks % THREADS != 0 && i >= kChunks) break;
            if constexpr (KCONTIG) {
                const int xx = i % BX, kk = (i / BX) * 4;
#pragma unroll
                for (int e = 0; e < 4; ++e) s[(kk + e) * BX + xx] = r[it][e];
            } else {
                const int xx = (i % (BX / 4)) * 4, kk = i / (BX / 4);
                *reinterpret_cast<float4*>(s + kk * BX + xx) =
                    make_float4(r[it][0], r[it][1], r[it][2], r[it][3]);
            }
        }
    }
};

/// A thread's TM x TN block of a CTA's BM x BN tile (and as many accumulators for a dual GEMM's
/// up product): TM/4 x TN/4 groups of 4x4, BM/(TM/4) rows and BN/(TN/4) columns apart, the
/// thread's group at (ty * 4, tx * 4) of each. Its k loop runs over slices in two shared-memory
/// buffers of kBufFloats floats, each A's BK x BM slice, then B's BK x BN, then the up weight's,
/// k-major (`SliceLoader::store`'s layout). `GemmSimt` and `GemmBsrSimt` differ only in where
/// their slices come from and where their tile's columns end.
template <int BM, int BN, int BK, int TM, int TN, bool DUAL>
struct ThreadTile {
    static constexpr int CM = TM / 4, CN = TN / 4;
    static constexpr int kBufFloats = BK * BM + BK * BN * (DUAL ? 2 : 1);
    float acc[TM][TN];
    float acc_up[DUAL ? TM : 1][DUAL ? TN : 1];

    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                acc[i][j] = 0.0f;
                if constexpr (DUAL) acc_up[i][j] = 0.0f;
            }
    }

    /// Multiplies the slice at `sa` into the accumulators.
    __device__ __forceinline__ void slice(const float* sa, int tx, int ty) {
        const float* sb = sa + BK * BM;
        const float* sbu = sb + BK * BN;
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[TM];
#pragma unroll
            for (int cm = 0; cm < CM; ++cm) {
                const float4 v = *reinterpret_cast<const float4*>(sa + k * BM + cm * (BM / CM) + ty * 4);
                a[cm * 4 + 0] = v.x; a[cm * 4 + 1] = v.y; a[cm * 4 + 2] = v.z; a[cm * 4 + 3] = v.w;
            }
            // The thread's columns of row k of a weight slice `s`, times a, into `c`.
            auto mul = [&](const float* s, float (&c)[TM][TN]) {
                float b[TN];
#pragma unroll
                for (int cn = 0; cn < CN; ++cn) {
                    const float4 v = *reinterpret_cast<const float4*>(s + k * BN + cn * (BN / CN) + tx * 4);
                    b[cn * 4 + 0] = v.x; b[cn * 4 + 1] = v.y; b[cn * 4 + 2] = v.z; b[cn * 4 + 3] = v.w;
                }
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) c[i][j] = fmaf(a[i], b[j], c[i][j]);
            };
            mul(sb, acc);
            if constexpr (DUAL) mul(sbu, acc_up);
        }
    }

    /// The k loop over `steps` slices: `fetch(kt)` reads slice kt into registers, `store(buf)`
    /// writes them to the buffer at `buf`; the next slice is fetched while the current one is
    /// multiplied, then written to the other buffer: one barrier per slice.
    template <class I, class Fetch, class Store>
    __device__ __forceinline__ void run(float* smem, I steps, int tx, int ty, Fetch&& fetch, Store&& store) {
        if (steps > 0) {
            fetch(0);
            store(smem);
        }
        __syncthreads();
        for (I kt = 0; kt < steps; ++kt) {
            const int buf = (int)(kt & 1);
            const bool more = kt + 1 < steps;
            if (more) fetch(kt + 1);
            slice(smem + buf * kBufFloats, tx, ty);
            if (more) store(smem + (buf ^ 1) * kBufFloats);
            // The other buffer is complete, and everyone is done reading this one before the
            // next iteration's store overwrites it.
            __syncthreads();
        }
    }

    /// The epilogue: element (i, j) of the thread's block is C[row(i)][col(j)], for the rows
    /// inside M and the columns before `n_end`.
    template <class T, class Epi, class P>
    __device__ __forceinline__ void store_tile(const P& p, i64 m0, i64 n0, i64 n_end, int tx, int ty) const {
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const i64 row = m0 + (i / 4) * (BM / CM) + ty * 4 + (i % 4);
            if (row >= p.m) continue;
            T* out_row = p.c + row * p.ldc;
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const i64 col = n0 + (j / 4) * (BN / CN) + tx * 4 + (j % 4);
                if (col >= n_end) continue;
                const float up = DUAL ? acc_up[DUAL ? i : 0][DUAL ? j : 0] : 0.0f;
                out_row[col] = from_f32<T>(Epi::apply(acc[i][j], up, row, col, p));
            }
        }
    }
};

}  // namespace simt_detail

/// The SIMT GEMM. Launch with `kThreads` threads, grid `(ceil(M / BM), ceil(N / BN))` and
/// `kSmemBytes` bytes of dynamic shared memory.
template <class T, Layout LA, Layout LB, class Cfg, class Epi>
struct GemmSimt {
    static constexpr bool kDual = Epi::kDual;
    static constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, TM = Cfg::TM, TN = Cfg::TN;
    static constexpr int kThreads = Cfg::kThreads;
    typedef simt_detail::ThreadTile<BM, BN, BK, TM, TN, kDual> Tile;
    static constexpr int kSmemBytes = 2 * Tile::kBufFloats * 4;

    typedef simt_detail::SliceLoader<T, BK, BM, kThreads, LA == Layout::N> LoaderA;
    typedef simt_detail::SliceLoader<T, BK, BN, kThreads, LB == Layout::T> LoaderB;

    template <class P>
    __device__ __forceinline__ static void run(const P& p) {
        extern __shared__ __align__(128) unsigned char mlpc_smem[];
        float* smem = reinterpret_cast<float*>(mlpc_smem);

        const int tid = (int)threadIdx.x;
        const int tx = tid % Cfg::TX;
        const int ty = tid / Cfg::TX;
        const i64 m0 = (i64)blockIdx.x * BM;
        const i64 n0 = (i64)blockIdx.y * BN;

        constexpr u64 kVecBytes = 4 * sizeof(T);
        const bool vec_a = is_aligned(p.a, kVecBytes) && (p.lda % 4 == 0);
        const bool vec_b = is_aligned(p.b, kVecBytes) && (p.ldb % 4 == 0);
        const bool vec_bu = kDual && is_aligned(p.b_up, kVecBytes) && (p.ldb_up % 4 == 0);

        Tile tile;
        tile.zero();
        LoaderA la;
        LoaderB lb;
        LoaderB lbu;
        auto fetch = [&](i64 kt) {
            const i64 k0 = kt * BK;
            la.fetch(p.a, p.lda, k0, m0, p.k, p.m, vec_a, tid);
            lb.fetch(p.b, p.ldb, k0, n0, p.k, p.n, vec_b, tid);
            if constexpr (kDual) lbu.fetch(p.b_up, p.ldb_up, k0, n0, p.k, p.n, vec_bu, tid);
        };
        auto store = [&](float* s) {
            la.store(s, tid);
            lb.store(s + BK * BM, tid);
            if constexpr (kDual) lbu.store(s + BK * BM + BK * BN, tid);
        };
        tile.run(smem, ceil_div(p.k, (i64)BK), tx, ty, fetch, store);
        tile.template store_tile<T, Epi>(p, m0, n0, p.n, tx, ty);
    }
};

}  // namespace mlpc
