// mlpc kernel templates: the weight-streaming GEMM of gemv.cuh over a block-sparse weight, for a
// small number of rows M (decode-time token counts).
//
//   C[m, n] = Epi(sum over kept blocks (r, c) with r = n / BR of
//                 A[m, c*BC .. c*BC+BC] . W_blk[n % BR, :])
//   C[m, n] = Out(Gate(...) * Up(...))     (dual: the gate and up weights packed on one pattern,
//                                           their blocks at the same places, read together)
//
// At small M a block-sparse GEMM is bound by reading its kept blocks once. In the packed layout
// ([kept, BR, BC], each block row-major, sorted by block row then block column) the kept blocks of
// one block row are one contiguous run of bytes, so the decomposition of GemvMma carries over with
// the block row's kept blocks in place of the weight rows' k range:
//   - a CTA owns one block row: BR = 16 RT output columns, RT tiles of 16 weight rows;
//   - its steps are the row's kept blocks cut into 32-wide k steps (BC / 32 a block), grouped
//     into chunks of UNROLL consecutive steps (UNROLL a multiple of BC / 32, so that a chunk is
//     whole blocks and a step's place in its block is a constant), chunk c going to warp
//     c % WARPS (split K inside the CTA);
//   - per step a lane loads 16 bytes of each of its weight rows from the block and, of each of
//     its tokens, the 16 bytes of A at the same k of the block's column (column * BC + the step's
//     offset in the block + 8 t): the fragments, the `mma.sync.m16n8k16`, the reduction over the
//     warps in a fixed order and the epilogue are GemvMma's (see gemv.cuh for the k permutation
//     inside a step, which both operands share);
//   - a block row without kept blocks has no steps: its outputs are the epilogue of zero.
// The kept-block lists are compile-time data of the generated module (`Blocks::begin(r)`: the
// first kept block of block row r, r = 0 .. block rows; `Blocks::col(i)`: the block column of
// kept block i). `Blocks::chunk(q)`: where the kernel's weight buffer holds 16-byte chunk q of a
// packed block. A module whose tiled entry reads the blocks rearranged (`Relayout`, the Hopper
// kernel's wide block copies) hands these entries the same rearranged buffer, and `chunk` is then
// the inverse of that rearrangement; otherwise the identity. The rearrangement moves whole
// 16-byte chunks within a block, so every load here is still one chunk.
//
// Grid `(block rows, 1, 1)`, `kThreads` threads, no dynamic shared memory; any M (passes of
// 8 MG tokens) and any alignment of A (bounds-checked scalar loads) are correct.
#pragma once

#include "gemv.cuh"

namespace mlpc {

template <class T, int BR, int BC, class Cfg, class Epi, class Blocks>
struct GemvBsrMma {
    static constexpr int MG = Cfg::MG, RT = Cfg::RT, WARPS = Cfg::WARPS, U = Cfg::UNROLL;
    static constexpr int kThreads = Cfg::kThreads;
    static constexpr int kSmemBytes = 0;
    /// 32-wide k steps of one block.
    static constexpr int kBlockSteps = BC / 32;
    static constexpr int kBlockElems = BR * BC;
    static constexpr bool kDual = Epi::kDual;
    static_assert(Cfg::kRows == BR && BR % 16 == 0, "a CTA owns one block row of 16-row tiles");
    static_assert(BC % 32 == 0, "a block is whole 32-wide k steps");
    static_assert(U % kBlockSteps == 0, "a chunk is whole blocks");
    static_assert(Cfg::KS == 1 && Cfg::PRE == 0, "split K inside the CTA only, no prefetch");

    template <class P>
    __device__ __forceinline__ static void run(const P& p) {
        using gemv_detail::load16;
        __shared__ float red[WARPS * Cfg::kSlice];
        __shared__ float red_up[kDual ? WARPS * Cfg::kSlice : 1];

        const int tid = (int)threadIdx.x;
        const int warp = tid / 32, lane = tid % 32;
        const int g = lane / 4, t = lane % 4;
        const int row = (int)blockIdx.x;
        const i64 n0 = (i64)row * BR;
        const bool vec_a = is_aligned(p.a, 16) && (p.lda % 8 == 0);
        const bool vec_b = is_aligned(p.b, 16);
        const bool vec_bu = kDual && is_aligned(p.b_up, 16);
        const int first_blk = Blocks::begin(row);
        const int steps = (Blocks::begin(row + 1) - first_blk) * kBlockSteps;
        const int chunks = ceil_div(steps, U);
        // Where this lane's 16 bytes of weight row 16 rt + 8 h + g at step s of a block start
        // (elements from the block's start): packed chunk ((16 rt + 8 h + g) BC + 32 s + 8 t) / 8
        // through `Blocks::chunk`. Once per thread, in registers.
        int woff[kBlockSteps][RT][2];
#pragma unroll
        for (int s = 0; s < kBlockSteps; ++s)
#pragma unroll
            for (int rt = 0; rt < RT; ++rt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int q = ((16 * rt + 8 * h + g) * BC + 32 * s + 8 * t) / 8;
                    woff[s][rt][h] = 8 * Blocks::chunk(q);
                }
        launch_dependents();

        for (i64 m0 = 0; m0 < p.m; m0 += Cfg::kMaxM) {
            float acc[RT][MG][4];
            float acc_up[kDual ? RT : 1][kDual ? MG : 1][4];
            gemv_detail::zero_acc<Cfg, kDual>(acc, acc_up);

            for (int c = warp; c < chunks; c += WARPS) {
                // Weight words: step u, tile rt, half h (row 16 rt + 8 h + g of the block).
                u32 w[U][RT][2][4];
                u32 wu[kDual ? U : 1][kDual ? RT : 1][2][4];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int q = c * U + u;
                    const i64 at = (i64)(first_blk + q / kBlockSteps) * kBlockElems;
#pragma unroll
                    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const int off = woff[u % kBlockSteps][rt][h];
                            load16<T, true>(w[u][rt][h], p.b + at + off, 0, 8, q < steps, vec_b);
                            if constexpr (kDual) {
                                load16<T, true>(wu[u][rt][h], p.b_up + at + off, 0, 8, q < steps,
                                                vec_bu);
                            }
                        }
                }
                // The first chunk's weights are in flight while the kernel before finishes.
                if (m0 == 0 && c == warp) wait_for_predecessors();
                // The k in A of each step of the chunk (-1 past the row's steps).
                i64 ka[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int q = c * U + u;
                    ka[u] = q < steps ? (i64)Blocks::col(first_blk + q / kBlockSteps) * BC +
                                            32 * (u % kBlockSteps) + 8 * t
                                      : -1;
                }
                // Activation fragments, batched as GemvMma batches them (every load of the chunk
                // before its first mma where they fit in a few registers).
                constexpr bool kBatchA = U * MG <= 4;
                u32 a[kBatchA ? U : 1][kBatchA ? MG : 1][4];
                if constexpr (kBatchA) {
#pragma unroll
                    for (int u = 0; u < U; ++u)
#pragma unroll
                        for (int mg = 0; mg < MG; ++mg) {
                            const i64 m = m0 + 8 * mg + g;
                            if (m0 + 8 * mg < p.m) {
                                load16<T, false>(a[u][mg], p.a + m * p.lda, ka[u], p.k,
                                                 m < p.m && ka[u] >= 0, vec_a);
                            }
                        }
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
#pragma unroll
                    for (int mg = 0; mg < MG; ++mg) {
                        if (m0 + 8 * mg >= p.m) break;
                        const i64 m = m0 + 8 * mg + g;
                        u32(&act)[4] = a[kBatchA ? u : 0][kBatchA ? mg : 0];
                        if constexpr (!kBatchA) {
                            load16<T, false>(act, p.a + m * p.lda, ka[u], p.k,
                                             m < p.m && ka[u] >= 0, vec_a);
                        }
#pragma unroll
                        for (int rt = 0; rt < RT; ++rt) {
                            gemv_detail::mma_tile<T, kDual>(
                                acc[rt][mg], acc_up[kDual ? rt : 0][kDual ? mg : 0], w[u][rt],
                                wu[kDual ? u : 0][kDual ? rt : 0], act);
                        }
                    }
                }
            }

            // A warp without chunks (a block row with few or no kept blocks) still waits before
            // the stores; for the others this returns at once.
            wait_for_predecessors();
#pragma unroll
            for (int mg = 0; mg < MG; ++mg) {
                if (m0 + 8 * mg >= p.m) break;
                gemv_detail::store_slice<Cfg, kDual>(red, red_up, acc, acc_up, mg, warp, g, t);
                __syncthreads();
                gemv_detail::finish<T, Cfg, Epi>(red, red_up, m0 + 8 * mg, n0, p, tid);
                __syncthreads();
            }
        }
    }
};

}  // namespace mlpc
