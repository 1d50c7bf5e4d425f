// mlpc kernel templates: tiled GEMM on tensor cores for f16 / bf16 with f32 accumulation and a
// compile-time epilogue chain.
//
//   C[m, n] = Epi(sum_k A[m, k] * B[k, n])            (plain)
//   C[m, n] = Out(Gate(A @ Bg) * Up(A @ Bu))[m, n]     (dual: both accumulators in one CTA)
//
// Structure of one CTA (a BM x BN tile of C):
//   - a STAGES-deep ring of shared-memory stages; each stage holds the A tile and one (or, for a
//     dual GEMM, two) B tiles of one BK slice. Tiles are kept in the operand's memory layout (the
//     contiguous dimension stays contiguous), rows padded by 16 bytes so that ldmatrix is
//     conflict-free.
//   - global -> shared copies use 16-byte `cp.async` with zero-fill when the operand allows it
//     (base 16-byte aligned, row stride a multiple of 8 elements), and plain bounds-checked loads
//     otherwise. Every element outside the matrix reads as zero, so any M, N, K is correct.
//   - WARPS_M x WARPS_N warps, each owning a WM x WN sub-tile computed with
//     `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`; fragments come from `ldmatrix`
//     (`.trans` when the tile's contiguous dimension is not the one the fragment wants).
//   - the epilogue runs on the accumulator registers and stores straight to global memory.
//
// Fragment layouts of m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"); with
// g = lane / 4 and t = lane % 4, each register holds two 16-bit values, the lower column (A) or
// lower k (B) in the low half:
//   A (16x16, row-major):  a0 = A[g][2t..2t+1]     a1 = A[g+8][2t..2t+1]
//                          a2 = A[g][2t+8..2t+9]   a3 = A[g+8][2t+8..2t+9]
//   B (16x8, "col"):       b0 = B[2t..2t+1][g]     b1 = B[2t+8..2t+9][g]
//   C (16x8, f32):         c0, c1 = C[g][2t], C[g][2t+1]      c2, c3 = C[g+8][2t], C[g+8][2t+1]
// `ldmatrix.x4` loads four 8x8 matrices; lanes 8i..8i+7 give the row addresses of matrix i and
// register i receives, in each lane, row lane/4 and columns 2(lane%4), +1 of matrix i (with
// `.trans`: rows 2(lane%4), +1 of column lane/4). The address mappings below follow from these.
#pragma once

#include "common.cuh"

namespace mlpc {

/// Tile configuration: a BM x BN tile of C per CTA, BK-deep k slices, WARPS_M x WARPS_N warps,
/// STAGES shared-memory stages.
template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_>
struct MmaConfig {
    static constexpr int BM = BM_, BN = BN_, BK = BK_;
    static constexpr int WARPS_M = WARPS_M_, WARPS_N = WARPS_N_, STAGES = STAGES_;
    static constexpr int kThreads = WARPS_M * WARPS_N * 32;
    /// Warp tile and the number of 16x8 mma tiles in it.
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
    static constexpr int MT = WM / 16, NT = WN / 8;
    static_assert(BM % WARPS_M == 0 && BN % WARPS_N == 0, "warps must divide the tile");
    static_assert(WM % 16 == 0, "warp tile M must be a multiple of 16");
    static_assert(WN % 16 == 0, "warp tile N must be a multiple of 16 (B fragments come in pairs)");
    static_assert(BK % 16 == 0, "BK must be a multiple of the mma k (16)");
    static_assert(STAGES >= 2, "at least double buffering");
};

namespace mma_detail {

/// A ROWS x COLS tile of 16-bit values in shared memory, rows padded by 8 elements (16 bytes):
/// 16-byte aligned rows for cp.async and ldmatrix, and eight consecutive rows start in eight
/// distinct 16-byte bank groups.
template <int ROWS, int COLS>
struct SmemTile {
    static_assert(COLS % 8 == 0, "tile rows must be whole 16-byte chunks");
    static constexpr int kStride = COLS + 8;
    static constexpr int kElems = ROWS * kStride;
};

__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, int src_bytes) {
    // Copies src_bytes (0..16) and zero-fills the rest of the 16 destination bytes.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void st_shared_v4(u32 addr, u32 a, u32 b, u32 c, u32 d) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c),
                 "r"(d));
}

__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/// d += a * b for one m16n8k16 tile.
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]);

template <>
__device__ __forceinline__ void mma_16816<bf16>(float (&d)[4], const u32 (&a)[4],
                                                const u32 (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_16816<f16>(float (&d)[4], const u32 (&a)[4],
                                               const u32 (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/// Copies the ROWS x COLS block at (row0, col0) of a row-major matrix (`rows` x `cols`, row
/// stride `ld`) into the shared tile at `dst`, zero-filling everything outside the matrix.
/// `vec`: the base is 16-byte aligned and `ld` a multiple of 8, so every 8-element chunk that
/// starts inside a row is one 16-byte aligned cp.async (partial chunks at the row end copy fewer
/// bytes and zero-fill the rest).
template <class T, int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_tile(u16* dst, const T* g, i64 ld, i64 row0, i64 col0,
                                          i64 rows, i64 cols, bool vec, int tid) {
    typedef SmemTile<ROWS, COLS> Tile;
    constexpr int kChunksPerRow = COLS / 8;
    constexpr int kChunks = ROWS * kChunksPerRow;
#pragma unroll
    for (int it = 0; it < ceil_div(kChunks, THREADS); ++it) {
        const int i = tid + it * THREADS;
        if (kChunks % THREADS != 0 && i >= kChunks) break;
        const int r = i / kChunksPerRow;
        const int c = (i % kChunksPerRow) * 8;
        const i64 gr = row0 + r;
        const i64 gc = col0 + c;
        const u32 s = smem_addr(dst + r * Tile::kStride + c);
        if (vec) {
            int bytes = 0;
            if (gr < rows && gc < cols) {
                const i64 rem = (cols - gc) * 2;
                bytes = rem >= 16 ? 16 : (int)rem;
            }
            // A chunk that reads nothing still needs a valid address.
            const T* src = bytes > 0 ? g + gr * ld + gc : g;
            cp_async_16(s, src, bytes);
        } else {
            u32 w[4];
            const bool row_in = gr < rows;
            const T* src = g + (row_in ? gr * ld : 0);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const i64 c0 = gc + 2 * e;
                const u32 lo = (row_in && c0 < cols) ? src[c0].bits : 0u;
                const u32 hi = (row_in && c0 + 1 < cols) ? src[c0 + 1].bits : 0u;
                w[e] = lo | (hi << 16);
            }
            st_shared_v4(s, w[0], w[1], w[2], w[3]);
        }
    }
}

}  // namespace mma_detail

/// The tensor-core GEMM. `T` is `bf16` or `f16`; `LA`, `LB` the operand layouts; `Cfg` a
/// `MmaConfig`; `Epi` a `SingleEpilogue` or `DualEpilogue`. Launch with `kThreads` threads,
/// grid `(ceil(M / BM), ceil(N / BN))` and `kSmemBytes` bytes of dynamic shared memory.
template <class T, Layout LA, Layout LB, class Cfg, class Epi>
struct GemmMma {
    static constexpr bool kDual = Epi::kDual;
    static constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
    static constexpr int WM = Cfg::WM, WN = Cfg::WN, MT = Cfg::MT, NT = Cfg::NT;
    static constexpr int kThreads = Cfg::kThreads;

    // Shared tiles, in the operand's memory layout: (rows x cols) as stored.
    typedef mma_detail::SmemTile<LA == Layout::N ? BM : BK, LA == Layout::N ? BK : BM> TileA;
    typedef mma_detail::SmemTile<LB == Layout::T ? BN : BK, LB == Layout::T ? BK : BN> TileB;
    static constexpr int kStageElems = TileA::kElems + TileB::kElems * (kDual ? 2 : 1);
    static constexpr int kSmemBytes = STAGES * kStageElems * 2;

    /// Loads the BK slice `kt` of A and B (and Bu) into `stage`.
    template <class P>
    __device__ __forceinline__ static void load_stage(u16* stage, const P& p, i64 m0, i64 n0,
                                                      i64 kt, bool vec_a, bool vec_b,
                                                      bool vec_bu, int tid) {
        using mma_detail::load_tile;
        const i64 k0 = kt * BK;
        u16* sa = stage;
        u16* sb = stage + TileA::kElems;
        if constexpr (LA == Layout::N) {
            load_tile<T, BM, BK, kThreads>(sa, p.a, p.lda, m0, k0, p.m, p.k, vec_a, tid);
        } else {
            load_tile<T, BK, BM, kThreads>(sa, p.a, p.lda, k0, m0, p.k, p.m, vec_a, tid);
        }
        if constexpr (LB == Layout::T) {
            load_tile<T, BN, BK, kThreads>(sb, p.b, p.ldb, n0, k0, p.n, p.k, vec_b, tid);
            if constexpr (kDual) {
                load_tile<T, BN, BK, kThreads>(sb + TileB::kElems, p.b_up, p.ldb_up, n0, k0,
                                               p.n, p.k, vec_bu, tid);
            }
        } else {
            load_tile<T, BK, BN, kThreads>(sb, p.b, p.ldb, k0, n0, p.k, p.n, vec_b, tid);
            if constexpr (kDual) {
                load_tile<T, BK, BN, kThreads>(sb + TileB::kElems, p.b_up, p.ldb_up, k0, n0,
                                               p.k, p.n, vec_bu, tid);
            }
        }
    }

    /// The A fragment of the warp's m-tile `mt` for the k16 step at `kk`.
    __device__ __forceinline__ static void load_a_frag(u32 (&af)[4], const u16* sa, int kk, int mt,
                                                       int warp_m, int lane) {
        if constexpr (LA == Layout::N) {
            // Tile rows are m, k contiguous: lanes 0-15 give rows 0-15 at k 0, lanes 16-31 rows
            // 0-15 at k 8: matrices a0, a1, a2, a3 in order.
            const int r = warp_m * WM + mt * 16 + (lane & 15);
            const int c = kk + (lane >> 4) * 8;
            mma_detail::ldsm_x4(af, smem_addr(sa + r * TileA::kStride + c));
        } else {
            // Tile rows are k, m contiguous: matrix i covers m 8(i%2).., k 8(i/2)..,
            // transposed on load.
            const int i = lane >> 3;
            const int r = kk + (i >> 1) * 8 + (lane & 7);
            const int c = warp_m * WM + mt * 16 + (i & 1) * 8;
            mma_detail::ldsm_x4_trans(af, smem_addr(sa + r * TileA::kStride + c));
        }
    }

    /// B fragments of the warp's NT n-tiles for the k16 step at `kk`, two n-tiles per ldmatrix.
    __device__ __forceinline__ static void load_b_frags(u32 (&bf)[NT][2], const u16* sb, int kk,
                                                        int warp_n, int lane) {
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            u32 r[4];
            if constexpr (LB == Layout::T) {
                // Tile rows are n, k contiguous: matrices (n0-7,k0-7) (n0-7,k8-15) (n8-15,k0-7)
                // (n8-15,k8-15) for lanes 0-7, 8-15, 16-23, 24-31.
                const int n = warp_n * WN + np * 16 + (lane & 7) + (lane >> 4) * 8;
                const int k = kk + ((lane >> 3) & 1) * 8;
                mma_detail::ldsm_x4(r, smem_addr(sb + n * TileB::kStride + k));
            } else {
                // Tile rows are k, n contiguous: the same four matrices, transposed on load.
                const int i = lane >> 3;
                const int k = kk + (i & 1) * 8 + (lane & 7);
                const int n = warp_n * WN + np * 16 + (i >> 1) * 8;
                mma_detail::ldsm_x4_trans(r, smem_addr(sb + k * TileB::kStride + n));
            }
            bf[2 * np][0] = r[0];
            bf[2 * np][1] = r[1];
            bf[2 * np + 1][0] = r[2];
            bf[2 * np + 1][1] = r[3];
        }
    }

    /// The warp's accumulators: MT x NT m16n8 tiles, and as many for a dual GEMM's up product.
    typedef float AccTiles[MT][NT][4];
    typedef float AccUpTiles[kDual ? MT : 1][kDual ? NT : 1][4];

    __device__ __forceinline__ static void zero(AccTiles& acc, AccUpTiles& acc_up) {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    acc[i][j][e] = 0.0f;
                    if constexpr (kDual) acc_up[i][j][e] = 0.0f;
                }
    }

    /// Multiplies the stage at `sa` (A's tile, then B's, then the up weight's) into the
    /// accumulators.
    __device__ __forceinline__ static void stage_mma(const u16* sa, AccTiles& acc, AccUpTiles& acc_up,
                                                     int warp_m, int warp_n, int lane) {
        const u16* sb = sa + TileA::kElems;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            u32 bf[NT][2];
            load_b_frags(bf, sb, kk, warp_n, lane);
            if constexpr (!kDual) {
                // One A fragment live at a time: 12 fragment registers instead of 24, which
                // keeps the kernel within 128 registers (two CTAs per SM) in every layout.
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    u32 af[4];
                    load_a_frag(af, sa, kk, mt, warp_m, lane);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) mma_detail::mma_16816<T>(acc[mt][nt], af, bf[nt]);
                }
            } else {
                // Both products need every A fragment: keep them, and reuse the B registers
                // for the up weight.
                u32 af[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) load_a_frag(af[mt], sa, kk, mt, warp_m, lane);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) mma_detail::mma_16816<T>(acc[mt][nt], af[mt], bf[nt]);
                load_b_frags(bf, sb + TileB::kElems, kk, warp_n, lane);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
                        mma_detail::mma_16816<T>(acc_up[mt][nt], af[mt], bf[nt]);
            }
        }
    }

    /// The k loop over `steps` slices through the STAGES-deep cp.async ring: `load(s, stage)`
    /// issues slice s's copies into `stage`; each slice is multiplied while the next STAGES - 1
    /// are in flight. `GemmMma` and `GemmBsrMma` differ only in what a slice is.
    template <class I, class Load>
    __device__ __forceinline__ static void mainloop(u16* smem, I steps, Load&& load, AccTiles& acc,
                                                    AccUpTiles& acc_up, int warp_m, int warp_n, int lane) {
        // Prologue: the first STAGES - 1 slices in flight, one commit group each.
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < steps) load((I)s, smem + s * kStageElems);
            mma_detail::cp_async_commit();
        }

        for (I kt = 0; kt < steps; ++kt) {
            // Slice kt has landed (at most STAGES - 2 younger groups pending) and every warp is
            // done with the stage that the prefetch below overwrites (read in iteration kt - 1).
            mma_detail::cp_async_wait<STAGES - 2>();
            __syncthreads();
            const I pre = kt + STAGES - 1;
            if (pre < steps) load(pre, smem + (int)(pre % STAGES) * kStageElems);
            mma_detail::cp_async_commit();
            stage_mma(smem + (int)(kt % STAGES) * kStageElems, acc, acc_up, warp_m, warp_n, lane);
        }
        mma_detail::cp_async_wait<0>();
    }

    /// The epilogue: the thread holds C[g][2t..2t+1] and C[g+8][2t..2t+1] of each 16x8 tile;
    /// the rows inside M and the columns before `n_end` are written, pairs as one word where
    /// `pair_ok`.
    template <class P>
    __device__ __forceinline__ static void store_tile(const P& p, AccTiles& acc, const AccUpTiles& acc_up,
                                                      i64 m0, i64 n0, i64 n_end, bool pair_ok,
                                                      int warp_m, int warp_n, int lane) {
        // Two passes (see wgmma_detail::store_tile): the epilogue of every element in place, then
        // the stores, so that no operand load waits behind a store.
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const i64 row = m0 + warp_m * WM + mt * 16 + (lane >> 2) + half * 8;
                if (row >= p.m) continue;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const i64 col = n0 + warp_n * WN + nt * 8 + (lane & 3) * 2 + e;
                        if (col >= n_end) continue;
                        const float up = kDual ? acc_up[kDual ? mt : 0][kDual ? nt : 0][half * 2 + e] : 0.0f;
                        acc[mt][nt][half * 2 + e] = Epi::apply(acc[mt][nt][half * 2 + e], up, row, col, p);
                    }
                }
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const i64 row = m0 + warp_m * WM + mt * 16 + (lane >> 2) + half * 8;
                if (row >= p.m) continue;
                T* out_row = p.c + row * p.ldc;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const i64 col = n0 + warp_n * WN + nt * 8 + (lane & 3) * 2;
                    if (col >= n_end) continue;
                    const float v0 = acc[mt][nt][half * 2];
                    if (col + 1 < n_end) {
                        const float v1 = acc[mt][nt][half * 2 + 1];
                        if (pair_ok) {
                            *reinterpret_cast<u32*>(out_row + col) = pack2<T>(v0, v1);
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
    }

    template <class P>
    __device__ __forceinline__ static void run(const P& p) {
        extern __shared__ __align__(128) unsigned char mlpc_smem[];
        u16* smem = reinterpret_cast<u16*>(mlpc_smem);

        const int tid = (int)threadIdx.x;
        const int lane = tid & 31;
        const int warp = tid >> 5;
        const int warp_m = warp % Cfg::WARPS_M;
        const int warp_n = warp / Cfg::WARPS_M;
        const i64 m0 = (i64)blockIdx.x * BM;
        const i64 n0 = (i64)blockIdx.y * BN;

        const bool vec_a = is_aligned(p.a, 16) && (p.lda % 8 == 0);
        const bool vec_b = is_aligned(p.b, 16) && (p.ldb % 8 == 0);
        const bool vec_bu = kDual && is_aligned(p.b_up, 16) && (p.ldb_up % 8 == 0);

        AccTiles acc;
        AccUpTiles acc_up;
        zero(acc, acc_up);

        mainloop(smem, ceil_div(p.k, (i64)BK),
                 [&](i64 kt, u16* stage) { load_stage(stage, p, m0, n0, kt, vec_a, vec_b, vec_bu, tid); },
                 acc, acc_up, warp_m, warp_n, lane);
        store_tile(p, acc, acc_up, m0, n0, p.n, is_aligned(p.c, 4) && (p.ldc % 2 == 0), warp_m, warp_n, lane);
    }
};

}  // namespace mlpc
