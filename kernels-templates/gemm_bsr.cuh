// mlpc kernel templates: GEMM with a block-sparse weight (BSR), on tensor cores for f16 / bf16
// (`GemmBsrMma`), for f32 on the FP64 tensor cores (`GemmBsrDmma`, sm_90: the default where it
// applies) or on the FFMA pipes (`GemmBsrSimt`), with the same compile-time epilogues as the
// dense families.
//
//   C[m, n] = Epi(sum over kept blocks (r, c) with r = n / BR of  A[m, c*BC .. c*BC+BC] . W_blk[n % BR, :])
//
// The weight W is the logical [N, K] matrix (an nn.Linear weight as stored), cut into BR x BC
// blocks; only the kept blocks are stored, packed as [kept, BR, BC] (each block row-major, k
// contiguous), sorted row-major by (block row, block col). The kept-block lists are compressed
// sparse rows known at compile time: `row_ptr[r] .. row_ptr[r + 1]` index the kept blocks of block
// row r, and `col_idx[i]` is the block column of kept block i. The generated entry emits both as
// `__device__ const int` arrays.
//
// Structure of one CTA: a BM x BN tile of C inside one block row of W (output columns
// r*BR + s*BN .. + BN, s < ceil(BR / BN)); ceil(M / BM) row tiles by N / BR * ceil(BR / BN)
// column tiles, a row tile's column tiles consecutive in launch order (`bsr_row_tile`). The
// k loop walks the kept blocks of block row r, each in ceil(BC / BK) slices of BK: a slice loads
// A[m0 .., c*BC + j*BK ..] and the matching BN x BK piece of the packed block, both zero-filled
// past the block (and past M), so blocks of any shape are exact. The shared-memory stages, the
// cp.async pipeline, the fragment loads and mma.sync are those of `GemmMma` (gemm_mma.cuh) with a
// k-contiguous ("t") B tile; the SIMT path reuses `GemmSimt`'s slice loaders and 4x4 thread
// blocking. A block row with no kept block runs no slice: its outputs are the epilogue applied to
// zero. Columns outside the CTA's block row are never written.
#pragma once

#include "gemm_dmma.cuh"
#include "gemm_mma.cuh"
#include "gemm_simt.cuh"

/// The element type of the block-index tables read through the parameters: `int`, or
/// `unsigned short` where the generated kernel defines it so (at most 65535 kept blocks and block
/// columns: half the tables' bytes in the kernel image).
#ifndef MLPC_BSR_IDX
#define MLPC_BSR_IDX int
#endif

namespace mlpc {

/// The row tile of this block of a `Grid::RowTiles` launch, `[column tiles, r, ceil(row tiles /
/// r)]` (its column tile is `blockIdx.x`). Blocks start in launch order (`blockIdx.x`
/// fastest), so a row tile's column tiles start together: the blocks resident at once share
/// their bands of A (read from DRAM about once) and re-read the packed weight, which the L2
/// keeps. With `blockIdx.x` the row tile, a wave covered every row tile of a few column tiles
/// and read A from DRAM again for every wave of column tiles (docs/perf-notes.md, block-sparse
/// variant 29: the f32 GEMM at d = 0.25 5 % faster this way). Both indices stay special
/// registers, which the kernels re-read where they need them (a division here made the
/// tightest ones spill).
__device__ __forceinline__ i64 bsr_row_tile() {
    return (i64)blockIdx.y + (i64)blockIdx.z * gridDim.y;
}

/// Run-time description of a BSR GEMM: the dense GEMM parameters (`b` and `b_up` point at the
/// packed blocks; `ldb` is unused) and the kept-block lists.
template <class T, int NEPI>
struct BsrParams : GemmParams<T, NEPI> {
    /// `block rows + 1` offsets into `col_idx`.
    const MLPC_BSR_IDX* row_ptr;
    /// Block column of each kept block.
    const MLPC_BSR_IDX* col_idx;
};

/// The tensor-core BSR GEMM. `T` is `bf16` or `f16`; `LA` the layout of A; `BR` x `BC` the block;
/// `Cfg` an `MmaConfig` whose BN is the CTA's share of a block row. Launch with `kThreads` threads,
/// a `Grid::RowTiles` grid over `ceil(M / BM)` row tiles and `N / BR * kNSub` column tiles
/// (`bsr_row_tile`) and `kSmemBytes` bytes of dynamic shared memory.
template <class T, Layout LA, int BR, int BC, class Cfg, class Epi>
struct GemmBsrMma {
    typedef GemmMma<T, LA, Layout::T, Cfg, Epi> Dense;
    static constexpr bool kDual = Epi::kDual;
    static constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK;
    static constexpr int kThreads = Cfg::kThreads;
    /// CTAs per block row, and k slices per block.
    static constexpr int kNSub = ceil_div(BR, BN);
    static constexpr int kKSub = ceil_div(BC, BK);
    typedef typename Dense::TileA TileA;
    typedef typename Dense::TileB TileB;
    static constexpr int kSmemBytes = Dense::kSmemBytes;
    /// Every 8-element chunk of a block row starts 16-byte aligned (given an aligned base).
    static constexpr bool kVecBlocks = BC % 8 == 0;

    /// Loads slice `ks` of kept block `blk` (block column `bcol`) into `stage`; `nb0` is the CTA's
    /// first row inside the block.
    template <class P>
    __device__ __forceinline__ static void load_stage(u16* stage, const P& p, i64 m0, int nb0,
                                                      int blk, int bcol, int ks, bool vec_a,
                                                      bool vec_b, bool vec_bu, int tid) {
        using mma_detail::load_tile;
        const i64 kb = (i64)bcol * BC;
        const i64 k0 = kb + (i64)ks * BK;
        const i64 kend = kb + BC;
        u16* sa = stage;
        u16* sb = stage + TileA::kElems;
        if constexpr (LA == Layout::N) {
            load_tile<T, BM, BK, kThreads>(sa, p.a, p.lda, m0, k0, p.m, kend, vec_a, tid);
        } else {
            load_tile<T, BK, BM, kThreads>(sa, p.a, p.lda, k0, m0, kend, p.m, vec_a, tid);
        }
        const i64 off = (i64)blk * (BR * BC);
        load_tile<T, BN, BK, kThreads>(sb, p.b + off, BC, nb0, (i64)ks * BK, BR, BC, vec_b, tid);
        if constexpr (kDual) {
            load_tile<T, BN, BK, kThreads>(sb + TileB::kElems, p.b_up + off, BC, nb0,
                                           (i64)ks * BK, BR, BC, vec_bu, tid);
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
        const i64 m0 = bsr_row_tile() * BM;
        if (m0 >= p.m) return;  // past the row tiles, in the last layer of the grid
        const int brow = (int)blockIdx.x / kNSub;
        const int nb0 = ((int)blockIdx.x % kNSub) * BN;
        const i64 n0 = (i64)brow * BR + nb0;
        const i64 n_end = (i64)brow * BR + BR < p.n ? (i64)brow * BR + BR : p.n;

        const bool vec_a = kVecBlocks && is_aligned(p.a, 16) && (p.lda % 8 == 0);
        const bool vec_b = kVecBlocks && is_aligned(p.b, 16);
        const bool vec_bu = kDual && kVecBlocks && is_aligned(p.b_up, 16);

        typename Dense::AccTiles acc;
        typename Dense::AccUpTiles acc_up;
        Dense::zero(acc, acc_up);

        const int first = p.row_ptr[brow];
        const int steps = (p.row_ptr[brow + 1] - first) * kKSub;
        auto load = [&](int s, u16* stage) {
            const int blk = first + s / kKSub;
            load_stage(stage, p, m0, nb0, blk, p.col_idx[blk], s % kKSub, vec_a, vec_b, vec_bu, tid);
        };
        Dense::mainloop(smem, steps, load, acc, acc_up, warp_m, warp_n, lane);
        // The epilogue, inside the block row. Pairs are stored as one word when they are
        // word-aligned (a block row of odd height starts at odd columns).
        Dense::store_tile(p, acc, acc_up, m0, n0, n_end, is_aligned(p.c, 4) && (p.ldc % 2 == 0) && (n0 % 2 == 0),
                          warp_m, warp_n, lane);
    }
};

/// The SIMT BSR GEMM (exact f32 FFMA; f16 / bf16 operands are widened on load). `Cfg` a
/// `SimtConfig` whose BN is the CTA's share of a block row. Launch with `kThreads` threads, a
/// `Grid::RowTiles` grid over `ceil(M / BM)` row tiles and `N / BR * kNSub` column tiles and
/// `kSmemBytes` bytes of dynamic shared memory.
template <class T, Layout LA, int BR, int BC, class Cfg, class Epi>
struct GemmBsrSimt {
    static constexpr bool kDual = Epi::kDual;
    static constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, TM = Cfg::TM, TN = Cfg::TN;
    static constexpr int kThreads = Cfg::kThreads;
    static constexpr int kNSub = ceil_div(BR, BN);
    static constexpr int kKSub = ceil_div(BC, BK);
    typedef simt_detail::ThreadTile<BM, BN, BK, TM, TN, kDual> Tile;
    static constexpr int kSmemBytes = 2 * Tile::kBufFloats * 4;
    /// Every 4-element chunk of a block row starts vector-aligned (given an aligned base).
    static constexpr bool kVecBlocks = BC % 4 == 0;

    typedef simt_detail::SliceLoader<T, BK, BM, kThreads, LA == Layout::N> LoaderA;
    typedef simt_detail::SliceLoader<T, BK, BN, kThreads, true> LoaderB;

    template <class P>
    __device__ __forceinline__ static void run(const P& p) {
        extern __shared__ __align__(128) unsigned char mlpc_smem[];
        float* smem = reinterpret_cast<float*>(mlpc_smem);

        const int tid = (int)threadIdx.x;
        const int tx = tid % Cfg::TX;
        const int ty = tid / Cfg::TX;
        const i64 m0 = bsr_row_tile() * BM;
        if (m0 >= p.m) return;  // past the row tiles, in the last layer of the grid
        const int brow = (int)blockIdx.x / kNSub;
        const int nb0 = ((int)blockIdx.x % kNSub) * BN;
        const i64 n0 = (i64)brow * BR + nb0;
        const i64 n_end = (i64)brow * BR + BR < p.n ? (i64)brow * BR + BR : p.n;

        constexpr u64 kVecBytes = 4 * sizeof(T);
        const bool vec_a = kVecBlocks && is_aligned(p.a, kVecBytes) && (p.lda % 4 == 0);
        const bool vec_b = kVecBlocks && is_aligned(p.b, kVecBytes);
        const bool vec_bu = kDual && kVecBlocks && is_aligned(p.b_up, kVecBytes);

        Tile tile;
        tile.zero();

        const int first = p.row_ptr[brow];
        const int steps = (p.row_ptr[brow + 1] - first) * kKSub;

        LoaderA la;
        LoaderB lb;
        LoaderB lbu;
        auto fetch = [&](int s) {
            const int blk = first + s / kKSub;
            const int ks = s % kKSub;
            const i64 kb = (i64)p.col_idx[blk] * BC;
            la.fetch(p.a, p.lda, kb + (i64)ks * BK, m0, kb + BC, p.m, vec_a, tid);
            const i64 off = (i64)blk * (BR * BC);
            lb.fetch(p.b + off, BC, (i64)ks * BK, nb0, BC, BR, vec_b, tid);
            if constexpr (kDual) lbu.fetch(p.b_up + off, BC, (i64)ks * BK, nb0, BC, BR, vec_bu, tid);
        };
        auto store = [&](float* s) {
            la.store(s, tid);
            lb.store(s + BK * BM, tid);
            if constexpr (kDual) lbu.store(s + BK * BM + BK * BN, tid);
        };
        tile.run(smem, steps, tx, ty, fetch, store);
        // The epilogue, inside the block row.
        tile.template store_tile<T, Epi>(p, m0, n0, n_end, tx, ty);
    }
};

/// The f32 BSR GEMM on the FP64 tensor cores (products exact, sums in f64: see gemm_dmma.cuh):
/// `GemmBsrSimt`'s grid, threads and tile with `Cfg` (a `SimtConfig` whose BN, 16 or 32, is
/// every warp's width; the warps split the BM rows), the k loop over the block row's kept blocks
/// in 16-deep slices through a STAGES-deep cp.async ring of [BM][16] A and [BN][16] block
/// slices, zero past the block, past M and past the block's rows. Inputs the 16-byte copies
/// cannot take (A's row stride not a multiple of 4 elements, a base not 16-byte aligned) run
/// `GemmBsrSimt` with the same launch, as does every input on a target before sm_90. Block
/// widths are multiples of 4, heights of 8.
template <class T, Layout LA, int BR, int BC, class Cfg, class Epi, int STAGES>
struct GemmBsrDmma {
    typedef GemmBsrSimt<T, LA, BR, BC, Cfg, Epi> Fallback;
    static_assert(sizeof(T) == 4, "the FP64 tensor-core GEMM takes f32 operands");
    static_assert(LA == Layout::N && !Epi::kDual, "A k-contiguous, plain GEMMs only");
    static_assert(BC % 4 == 0 && BR % 8 == 0, "blocks of whole 16-byte chunks and m16n8 tiles");
    static constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = 16;
    static constexpr int kThreads = Cfg::kThreads;
    static constexpr int kWarps = kThreads / 32;
    static constexpr int WM = BM / kWarps;
    static constexpr int FM = WM / 16, FN = BN / 8;
    static_assert(kThreads % 32 == 0 && BM % (16 * kWarps) == 0, "warps of whole m16 tiles");
    static_assert(BN % 8 == 0 && BN <= 32, "one warp spans the tile's columns");
    static_assert(STAGES >= 2, "at least double buffering");
    static constexpr int kNSub = Fallback::kNSub;
    static constexpr int kKSub = ceil_div(BC, BK);
    static constexpr int kStageFloats = (BM + BN) * BK;
    static constexpr int kRingBytes = STAGES * kStageFloats * 4;
    static constexpr int kSmemBytes =
        kRingBytes > Fallback::kSmemBytes ? kRingBytes : Fallback::kSmemBytes;

    /// Copies slice `ks` of kept block `blk` (block column `bcol`) and its A piece into the
    /// stage at `stage_addr`, A first; `nb0` is the CTA's first row of the block. Zero past the
    /// block's width, past M and past the block's rows.
    template <class P>
    __device__ __forceinline__ static void load(const P& p, u32 stage_addr, i64 m0, int nb0,
                                                int blk, int bcol, int ks, int tid) {
        const int k0 = ks * BK;
        dmma_detail::copy_slice<BM, kThreads>(stage_addr, p.a + (i64)bcol * BC + k0, p.lda, m0,
                                              p.m, 0, BC - k0, tid);
        dmma_detail::copy_slice<BN, kThreads>(stage_addr + BM * BK * 4,
                                              p.b + (i64)blk * (BR * BC) + k0, BC, nb0, BR, 0,
                                              BC - k0, tid);
    }

    template <class P>
    __device__ __forceinline__ static void run(const P& p) {
        const bool copies = p.lda % 4 == 0 && is_aligned(p.a, 16) && is_aligned(p.b, 16);
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
        const int wm = warp * WM;
        const i64 m0 = bsr_row_tile() * BM;
        if (m0 >= p.m) return;  // past the row tiles, in the last layer of the grid
        const int brow = (int)blockIdx.x / kNSub;
        const int nb0 = ((int)blockIdx.x % kNSub) * BN;
        const i64 n0 = (i64)brow * BR + nb0;
        const i64 n_end = (i64)brow * BR + BR < p.n ? (i64)brow * BR + BR : p.n;

        double acc[FM][FN][4];
        dmma_detail::zero(acc);

        const int first = p.row_ptr[brow];
        const int steps = (p.row_ptr[brow + 1] - first) * kKSub;
        dmma_detail::ring<STAGES>(
            (i64)steps,
            [&](i64 s, int stage) {
                const int blk = first + (int)s / kKSub;
                load(p, smem0 + (u32)(stage * kStageFloats * 4), m0, nb0, blk, p.col_idx[blk],
                     (int)s % kKSub, tid);
            },
            [&](int stage) {
                const float* sa = smem + stage * kStageFloats;
                dmma_detail::slice(sa, sa + BM * BK, wm, 0, g, t, acc);
            });

        // Only the block row's columns: up to n_end.
        const bool pairs = p.ldc % 2 == 0 && n0 % 2 == 0 && is_aligned(p.c, 8);
        dmma_detail::store<T, Epi>(acc, acc, p, m0 + wm, n0, n_end, pairs, g, t);
    }
};

}  // namespace mlpc
