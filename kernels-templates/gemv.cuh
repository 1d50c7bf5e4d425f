// mlpc kernel templates: weight-streaming GEMMs for a small number of rows M (decode-time token
// counts), with the parameter struct and epilogue chain of the tiled families.
//
//   C[m, n] = Epi(sum_k A[m, k] * W[n, k])     A row-major [M, K], W = B stored [N, K] (layout T,
//                                              an nn.Linear weight), C row-major [M, N]
//   C[m, n] = Out(Gate(A W^T) * Up(A Wu^T))    (dual: gate and up rows of the same n together)
//
// At small M a GEMM is bound by reading its weights once, so the decomposition is built around
// the weight stream: every weight element is loaded exactly once, with 16-byte loads that skip
// L1, several per lane in flight; the few rows of A are read through L1 and reused from registers.
//
// Work decomposition (GemvConfig<MG, RT, WARPS, UNROLL, KS, PRE>):
//   - the KS CTAs (blockIdx.x = b, blockIdx.y = 0 .. KS-1) of a cluster own the ROWS = 16 RT
//     output columns n in [b ROWS, (b + 1) ROWS), i.e. weight rows;
//   - k is cut into 32-wide steps, grouped into chunks of UNROLL consecutive steps; chunk c goes to
//     CTA (c / WARPS) % KS of the cluster and to its warp c % WARPS (split-K inside the CTA and
//     across the cluster, so that a small N still gives every warp of the machine work, and more
//     rows per CTA, which read the activations from L2 fewer times, do not shrink the grid). A
//     warp first issues the weight loads of its whole chunk, then (up to 16 tokens) all its
//     activation loads, then multiplies. With PRE > 0, a CTA's first warp asks L2 for the CTA's
//     next PRE rounds of weight rows (a round: the k range of its warps' j-th chunks) as soon as
//     it starts (bulk prefetch, no registers; for small weights, whose time is latency);
//   - the rows of A are taken in passes of MAXM = 8 MG (a single pass when M <= MAXM, which is what
//     the runtime arranges), each pass in groups of 8 rows ("tokens"). Groups past M are skipped;
//   - each warp accumulates the partial sums of its rows x tokens in f32 registers; then, token
//     group by token group, the warps write them to shared memory and the CTA sums them in a
//     fixed warp order (deterministic), applies the epilogue and stores: one output element per
//     thread, consecutive threads on consecutive n. With KS > 1 (sm_90 on) each CTA first sums
//     its warps into its own shared array; after a cluster barrier, CTA r of the cluster takes
//     the r-th share of the outputs and adds the KS CTAs' sums, read through distributed shared
//     memory in rank order (deterministic too); a second cluster barrier keeps every CTA's array
//     alive until its peers have read it.
// f16 / bf16: `mma.sync.m16n8k16` computes W A^T: 16 weight rows are the 16x16 "A" operand and 8
// tokens the 16x8 "B" operand. A dot product may visit k in any order, so k is permuted inside
// each 32-wide step such that each lane's fragments are one 16-byte load of a weight row and one
// of an A row: lane (g = lane / 4, t = lane % 4) loads k = 8t .. 8t+7 (words 0..3) of weight rows
// g and g + 8 and of token g; mma j (0, 1) takes words 2j, 2j + 1 as the fragment elements of
// logical k (2t, 2t+1) and (2t+8, 2t+9) (see gemm_mma.cuh for the fragment layouts). So mma j
// covers physical k {8t + 4j .. 8t + 4j + 3 : t = 0..3}, and the two together all 32.
// f32 (exact, FFMA): lane (r = lane / 8, q = lane % 8) loads k = 4q .. 4q+3 of weight rows
// r, r + 4, r + 8, r + 12 of each 16-row tile and of every token; the 8 lanes of a row group then
// combine their partial sums with a shuffle reduce-scatter that leaves token q of a group in lane q.
//
// Early launch (sm_90 on; `Launch::early_launch`): the runtime may start these kernels while
// the kernel before them still runs. Each warp issues its first chunk's weight loads (constant
// data), then waits for the kernel before (`wait_for_predecessors`, griddepcontrol.wait) before
// it loads activations or writes; every CTA lets the next kernel launch as soon as it has
// started (`launch_dependents`). The weight stream of one kernel thus overlaps the tail of the
// one before, and its launch latency is hidden.
//
// Everything outside the matrices reads as zero (rows n >= N, tokens m >= M, k >= K), and loads
// fall back to bounds-checked scalars when an operand is not aligned for 16-byte vectors, so any
// M, N, K and any base alignment is correct.
#pragma once

#include "common.cuh"

namespace mlpc {

/// Configuration of a weight-streaming GEMM: MG groups of 8 tokens per pass, RT tiles of 16
/// weight rows per CTA, WARPS warps splitting K, UNROLL 32-wide k steps per chunk, KS CTAs per
/// cluster splitting K further (the entry then carries `__cluster_dims__(1, KS, 1)` and its grid's
/// y is KS), PRE rounds of weight rows asked of L2 when a CTA starts (sm_90 on).
template <int MG_, int RT_, int WARPS_, int UNROLL_, int KS_ = 1, int PRE_ = 0>
struct GemvConfig {
    static constexpr int MG = MG_, RT = RT_, WARPS = WARPS_, UNROLL = UNROLL_, KS = KS_;
    static constexpr int PRE = PRE_;
    static constexpr int kThreads = WARPS * 32;
    /// Output columns (weight rows) per CTA.
    static constexpr int kRows = 16 * RT;
    /// Tokens (rows of A) per pass.
    static constexpr int kMaxM = 8 * MG;
    /// Floats between two tokens of one warp's slice of the reduction buffer: 4 (mod 16), so
    /// that a warp's fragment stores hit 32 distinct banks.
    static constexpr int kPitch = kRows + 4;
    /// Floats of one warp's slice (8 tokens).
    static constexpr int kSlice = 8 * kPitch;
    static_assert(MG >= 1 && RT >= 1 && WARPS >= 1 && UNROLL >= 1 && KS >= 1,
                  "empty configuration");
};

namespace gemv_detail {

__device__ __forceinline__ u32 bits_of(float x) { return __float_as_uint(x); }
__device__ __forceinline__ u32 bits_of(bf16 x) { return x.bits; }
__device__ __forceinline__ u32 bits_of(f16 x) { return x.bits; }

/// 16 bytes of a k-contiguous row from element `k` on, as four 32-bit words (one f32, or two
/// 16-bit values with the lower k in the low half, per word). Elements at or past `kend`, and all
/// of them when `!ok`, read as zero. `vec`: the matrix allows 16-byte loads (16-byte aligned base,
/// row stride a multiple of 16 bytes). STREAM: a weight, read once (do not allocate in L1, and
/// let L2 fetch the whole 128-byte line from memory: the CTA's other lanes read the rest of it).
template <class T, bool STREAM>
__device__ __forceinline__ void load16(u32 (&v)[4], const T* row, i64 k, i64 kend, bool ok,
                                       bool vec) {
    constexpr int E = 16 / (int)sizeof(T);
    constexpr int PER_WORD = 4 / (int)sizeof(T);
    if (ok && vec && k + E <= kend) {
        const T* ptr = row + k;
        if constexpr (STREAM) {
            asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                : "l"(ptr));
        } else {
            // The activations: written by the kernel before, so read only after
            // `wait_for_predecessors()` (volatile, and a memory clobber, keep the compiler from
            // hoisting the load above it) and through the coherent path.
            asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                         : "l"(ptr)
                         : "memory");
        }
    } else {
#pragma unroll
        for (int w = 0; w < 4; ++w) v[w] = 0u;
        if (ok) {
#pragma unroll
            for (int e = 0; e < E; ++e) {
                if (k + e < kend) {
                    v[e / PER_WORD] |= bits_of(row[k + e]) << ((32 / PER_WORD) * (e % PER_WORD));
                }
            }
        }
    }
}

/// Asks L2 to fetch `bytes` (a multiple of 16, from a 16-byte aligned address): a hint, with
/// no register to fill and nothing to wait for.
__device__ __forceinline__ void prefetch_l2(const void* ptr, u32 bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(ptr), "r"(bytes) : "memory");
#else
    __trap();  // codegen prefetches from sm_90 on only
#endif
}

/// Cfg::PRE > 0: lane r of the calling warp asks L2 for weight row n0 + r (and r + 32, ...) of
/// this CTA's rounds 1 .. PRE, round j being the k range its WARPS warps load together in their
/// j-th chunks. Rows past N, the part past K and unaligned matrices are skipped.
template <class T, class Cfg>
__device__ __forceinline__ void prefetch_rounds(const T* b, i64 ldb, bool vec, i64 n0, i64 n_end,
                                                i64 k_end, int rank, int lane) {
    if (!vec) return;
    const i64 per_round = (i64)Cfg::WARPS * Cfg::UNROLL * 32;
    for (int r = lane; r < Cfg::kRows; r += 32) {
        const i64 n = n0 + r;
        if (n >= n_end) return;
#pragma unroll
        for (int j = 1; j <= Cfg::PRE; ++j) {
            const i64 k0 = ((i64)j * Cfg::KS + rank) * per_round;
            const i64 elems = min(per_round, k_end - k0);
            if (elems <= 0) break;
            const u32 bytes = (u32)(elems * (i64)sizeof(T)) / 16u * 16u;
            if (bytes > 0) prefetch_l2(b + n * ldb + k0, bytes);
        }
    }
}

/// d += a * b for one m16n8k16 tile (fragments as in gemm_mma.cuh).
template <class T>
__device__ __forceinline__ void mma(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                    u32 b1);

template <>
__device__ __forceinline__ void mma<bf16>(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                          u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma<f16>(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                         u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// The sums over the warps' slices of item `i` of a token group (weight row i % kRows, token
/// i / kRows), in warp order: `s`, and `su` for a dual GEMM.
template <class Cfg, bool kDual>
__device__ __forceinline__ void warp_sums(const float* red, const float* red_up, int i, float& s,
                                          float& su) {
    const int row = i % Cfg::kRows, tok = i / Cfg::kRows;
    s = 0.0f;
    su = 0.0f;
#pragma unroll
    for (int w = 0; w < Cfg::WARPS; ++w) {
        s += red[w * Cfg::kSlice + tok * Cfg::kPitch + row];
        if constexpr (kDual) su += red_up[w * Cfg::kSlice + tok * Cfg::kPitch + row];
    }
}

/// Sums the warps' slices of one token group (tokens m_base .. m_base + 7) in warp order,
/// applies the epilogue and stores. Thread i takes weight row i % ROWS of token i / ROWS.
template <class T, class Cfg, class Epi, class P>
__device__ __forceinline__ void finish(const float* red, const float* red_up, i64 m_base, i64 n0,
                                       const P& p, int tid) {
#pragma unroll
    for (int i = tid; i < Cfg::kRows * 8; i += Cfg::kThreads) {
        const int row = i % Cfg::kRows, tok = i / Cfg::kRows;
        const i64 m = m_base + tok, n = n0 + row;
        if (m >= p.m || n >= p.n) continue;
        float s, su;
        warp_sums<Cfg, Epi::kDual>(red, red_up, i, s, su);
        p.c[m * p.ldc + n] = from_f32<T>(Epi::apply(s, su, m, n, p));
    }
}

/// Barrier over every thread of the cluster; writes to shared memory before it are visible to
/// the cluster's reads after it.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "barrier.cluster.arrive.release.aligned;\n"
        "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
    __trap();  // codegen splits K across CTAs from sm_90 on only
#endif
}

/// The float at `local`'s offset in the shared memory of the cluster's CTA `rank`.
__device__ __forceinline__ float load_peer(const float* local, int rank) {
    float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const u32 at = smem_addr(local);
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(at), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
#else
    __trap();
#endif
    return v;
}

/// KS > 1: sums this CTA's warps' slices of one token group into `part[tok * kRows + row]`
/// (and `part_up`), in warp order.
template <class Cfg, bool kDual>
__device__ __forceinline__ void sum_warps(const float* red, const float* red_up, float* part,
                                          float* part_up, int tid) {
    for (int i = tid; i < Cfg::kRows * 8; i += Cfg::kThreads) {
        float s, su;
        warp_sums<Cfg, kDual>(red, red_up, i, s, su);
        part[i] = s;
        if constexpr (kDual) part_up[i] = su;
    }
}

/// KS > 1, after a cluster barrier: CTA `rank` of the cluster finishes outputs
/// [rank * share, (rank + 1) * share) of the token group (item i: weight row i % kRows, token
/// i / kRows), adding the KS CTAs' `part` arrays in rank order.
template <class T, class Cfg, class Epi, class P>
__device__ __forceinline__ void finish_cluster(const float* part, const float* part_up, int rank,
                                               i64 m_base, i64 n0, const P& p, int tid) {
    constexpr int kItems = Cfg::kRows * 8, kShare = ceil_div(kItems, Cfg::KS);
    const int end = min(kItems, (rank + 1) * kShare);
    for (int i = rank * kShare + tid; i < end; i += Cfg::kThreads) {
        const int row = i % Cfg::kRows, tok = i / Cfg::kRows;
        const i64 m = m_base + tok, n = n0 + row;
        if (m >= p.m || n >= p.n) continue;
        float s = 0.0f, su = 0.0f;
#pragma unroll
        for (int q = 0; q < Cfg::KS; ++q) {
            s += load_peer(part + i, q);
            if constexpr (Epi::kDual) su += load_peer(part_up + i, q);
        }
        p.c[m * p.ldc + n] = from_f32<T>(Epi::apply(s, su, m, n, p));
    }
}

/// f32 dot product of 4 weight words with 4 A words (both f32 bit patterns).
__device__ __forceinline__ float dot4(const u32 (&w)[4], const u32 (&a)[4], float acc) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc = fmaf(__uint_as_float(w[e]), __uint_as_float(a[e]), acc);
    return acc;
}

/// Reduce-scatter over the 8 lanes of a row group (lanes differing in bits 0..2): on entry
/// v[i] is this lane's partial sum of token i; on exit v[0] is the group's total of token
/// `q = lane % 8`. Lanes pair up across bit 2, then 1, then 0; at each level a lane keeps the
/// half of its tokens selected by its own bit and sends the other half to its partner.
__device__ __forceinline__ float reduce_scatter8(float (&v)[8], int q) {
    const bool b2 = (q & 4) != 0, b1 = (q & 2) != 0, b0 = (q & 1) != 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float keep = b2 ? v[i + 4] : v[i], send = b2 ? v[i] : v[i + 4];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float keep = b1 ? v[i + 2] : v[i], send = b1 ? v[i] : v[i + 2];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
    }
    const float keep = b0 ? v[1] : v[0], send = b0 ? v[0] : v[1];
    return keep + __shfl_xor_sync(0xffffffffu, send, 1);
}

/// Zeroes a warp's accumulators of one pass (and the up ones for a dual GEMM).
template <class Cfg, bool kDual, class Acc, class AccUp>
__device__ __forceinline__ void zero_acc(Acc& acc, AccUp& acc_up) {
#pragma unroll
    for (int rt = 0; rt < Cfg::RT; ++rt)
#pragma unroll
        for (int mg = 0; mg < Cfg::MG; ++mg)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                acc[rt][mg][e] = 0.0f;
                if constexpr (kDual) acc_up[rt][mg][e] = 0.0f;
            }
}

/// The mmas of one 32-wide step for one 16-row weight tile and one group of 8 tokens: `w[h]`
/// the lane's words of weight rows g + 8 h, `act` its words of token g (the k permutation of the
/// file's comment), into `acc`; a dual GEMM's up weight `wu` alike into `acc_up`, each of the
/// two k halves for both weights before the next.
template <class T, bool kDual>
__device__ __forceinline__ void mma_tile(float (&acc)[4], float (&acc_up)[4], const u32 (&w)[2][4],
                                         const u32 (&wu)[2][4], const u32 (&act)[4]) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        mma<T>(acc, w[0][2 * j], w[1][2 * j], w[0][2 * j + 1], w[1][2 * j + 1], act[2 * j],
               act[2 * j + 1]);
        if constexpr (kDual) {
            mma<T>(acc_up, wu[0][2 * j], wu[1][2 * j], wu[0][2 * j + 1], wu[1][2 * j + 1],
                   act[2 * j], act[2 * j + 1]);
        }
    }
}

/// A warp's accumulators of token group `mg` into its slice of the reduction buffers (and the
/// up ones for a dual GEMM): fragment of tile rt: c0, c1 = row 16 rt + g, tokens 2t, 2t+1;
/// c2, c3 = row + 8.
template <class Cfg, bool kDual, class Acc, class AccUp>
__device__ __forceinline__ void store_slice(float* red, float* red_up, const Acc& acc,
                                            const AccUp& acc_up, int mg, int warp, int g, int t) {
    float* r = red + warp * Cfg::kSlice;
    float* ru = red_up + (kDual ? warp * Cfg::kSlice : 0);
#pragma unroll
    for (int rt = 0; rt < Cfg::RT; ++rt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int at = (2 * t + (e & 1)) * Cfg::kPitch + 16 * rt + g + 8 * (e >> 1);
            r[at] = acc[rt][mg][e];
            if constexpr (kDual) ru[at] = acc_up[rt][mg][e];
        }
}

}  // namespace gemv_detail

/// The weight-streaming GEMM on tensor cores (T = f16 or bf16). Launch with `kThreads` threads,
/// grid `(ceil(N / kRows), KS, 1)` in clusters of `(1, KS, 1)`, no dynamic shared memory.
template <class T, class Cfg, class Epi>
struct GemvMma {
    static constexpr bool kDual = Epi::kDual;
    static constexpr int MG = Cfg::MG, RT = Cfg::RT, WARPS = Cfg::WARPS, U = Cfg::UNROLL;
    static constexpr int KS = Cfg::KS;
    static constexpr int kThreads = Cfg::kThreads;
    static constexpr int kSmemBytes = 0;

    template <class P>
    __device__ __forceinline__ static void run(const P& p) {
        using gemv_detail::load16;
        __shared__ float red[WARPS * Cfg::kSlice];
        __shared__ float red_up[kDual ? WARPS * Cfg::kSlice : 1];
        __shared__ float part[KS > 1 ? Cfg::kRows * 8 : 1];
        __shared__ float part_up[KS > 1 && kDual ? Cfg::kRows * 8 : 1];

        const int tid = (int)threadIdx.x;
        const int warp = tid / 32, lane = tid % 32;
        const int g = lane / 4, t = lane % 4;
        const i64 n0 = (i64)blockIdx.x * Cfg::kRows;
        // This CTA's rank in its cluster, and this warp's first chunk and chunk stride.
        const int rank = KS > 1 ? (int)blockIdx.y : 0;
        const i64 first = (i64)rank * WARPS + warp, stride = (i64)WARPS * KS;
        const bool vec_a = is_aligned(p.a, 16) && (p.lda % 8 == 0);
        const bool vec_b = is_aligned(p.b, 16) && (p.ldb % 8 == 0);
        const bool vec_bu = kDual && is_aligned(p.b_up, 16) && (p.ldb_up % 8 == 0);
        const i64 chunks = ceil_div(ceil_div(p.k, (i64)32), (i64)U);
        launch_dependents();
        // The weights are constant: asked of L2 before the wait for the kernel before.
        if constexpr (Cfg::PRE > 0) {
            if (warp == 0) {
                gemv_detail::prefetch_rounds<T, Cfg>(p.b, p.ldb, vec_b, n0, p.n, p.k, rank, lane);
                if constexpr (kDual) {
                    gemv_detail::prefetch_rounds<T, Cfg>(p.b_up, p.ldb_up, vec_bu, n0, p.n, p.k,
                                                         rank, lane);
                }
            }
        }

        for (i64 m0 = 0; m0 < p.m; m0 += Cfg::kMaxM) {
            float acc[RT][MG][4];
            float acc_up[kDual ? RT : 1][kDual ? MG : 1][4];
            gemv_detail::zero_acc<Cfg, kDual>(acc, acc_up);

            for (i64 c = first; c < chunks; c += stride) {
                // Weight words: step u, tile rt, half h (row 16 rt + 8 h + g).
                u32 w[U][RT][2][4];
                u32 wu[kDual ? U : 1][kDual ? RT : 1][2][4];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const i64 k = (c * U + u) * 32 + 8 * t;
#pragma unroll
                    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const i64 n = n0 + 16 * rt + 8 * h + g;
                            load16<T, true>(w[u][rt][h], p.b + n * p.ldb, k, p.k, n < p.n, vec_b);
                            if constexpr (kDual) {
                                load16<T, true>(wu[u][rt][h], p.b_up + n * p.ldb_up, k, p.k,
                                                n < p.n, vec_bu);
                            }
                        }
                }
                // The first chunk's weights are in flight while the kernel before finishes.
                if (m0 == 0 && c == first) wait_for_predecessors();
                // Activation fragments: every load of the chunk is issued before its first mma
                // when they fit in a few registers (up to 16 tokens; A loads and mmas are ordered
                // asm statements, so a load placed after an mma waits for it, and with it for the
                // weights: one L2 round trip per step and token group in a row instead of one per
                // chunk). Larger passes load each fragment just before its mmas (all of them at
                // once spilled).
                constexpr bool kBatchA = U * MG <= 4;
                u32 a[kBatchA ? U : 1][kBatchA ? MG : 1][4];
                if constexpr (kBatchA) {
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        const i64 k = (c * U + u) * 32 + 8 * t;
#pragma unroll
                        for (int mg = 0; mg < MG; ++mg) {
                            const i64 m = m0 + 8 * mg + g;
                            if (m0 + 8 * mg < p.m) {
                                load16<T, false>(a[u][mg], p.a + m * p.lda, k, p.k, m < p.m,
                                                 vec_a);
                            }
                        }
                    }
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const i64 k = (c * U + u) * 32 + 8 * t;
#pragma unroll
                    for (int mg = 0; mg < MG; ++mg) {
                        if (m0 + 8 * mg >= p.m) break;
                        const i64 m = m0 + 8 * mg + g;
                        u32(&act)[4] = a[kBatchA ? u : 0][kBatchA ? mg : 0];
                        if constexpr (!kBatchA) {
                            load16<T, false>(act, p.a + m * p.lda, k, p.k, m < p.m, vec_a);
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

            // A warp without chunks (K shorter than the warps' steps) still waits before the
            // stores; for the others this returns at once.
            wait_for_predecessors();
#pragma unroll
            for (int mg = 0; mg < MG; ++mg) {
                if (m0 + 8 * mg >= p.m) break;
                gemv_detail::store_slice<Cfg, kDual>(red, red_up, acc, acc_up, mg, warp, g, t);
                __syncthreads();
                if constexpr (KS == 1) {
                    gemv_detail::finish<T, Cfg, Epi>(red, red_up, m0 + 8 * mg, n0, p, tid);
                } else {
                    gemv_detail::sum_warps<Cfg, kDual>(red, red_up, part, part_up, tid);
                    gemv_detail::cluster_sync();
                    gemv_detail::finish_cluster<T, Cfg, Epi>(part, part_up, rank, m0 + 8 * mg,
                                                             n0, p, tid);
                    gemv_detail::cluster_sync();
                }
                __syncthreads();
            }
        }
    }
};

/// The weight-streaming GEMM on the FFMA pipes, in exact f32. Launch like `GemvMma`.
template <class Cfg, class Epi>
struct GemvSimt {
    static constexpr bool kDual = Epi::kDual;
    static constexpr int MG = Cfg::MG, RT = Cfg::RT, WARPS = Cfg::WARPS, U = Cfg::UNROLL;
    static constexpr int kThreads = Cfg::kThreads;
    static constexpr int kSmemBytes = 0;
    static_assert(Cfg::KS == 1 && Cfg::PRE == 0,
                  "the f32 entries split K inside the CTA only, and do not prefetch");

    template <class P>
    __device__ __forceinline__ static void run(const P& p) {
        using gemv_detail::dot4;
        using gemv_detail::load16;
        __shared__ float red[WARPS * Cfg::kSlice];
        __shared__ float red_up[kDual ? WARPS * Cfg::kSlice : 1];

        const int tid = (int)threadIdx.x;
        const int warp = tid / 32, lane = tid % 32;
        const int r = lane / 8, q = lane % 8;
        const i64 n0 = (i64)blockIdx.x * Cfg::kRows;
        const bool vec_a = is_aligned(p.a, 16) && (p.lda % 4 == 0);
        const bool vec_b = is_aligned(p.b, 16) && (p.ldb % 4 == 0);
        const bool vec_bu = kDual && is_aligned(p.b_up, 16) && (p.ldb_up % 4 == 0);
        const i64 chunks = ceil_div(ceil_div(p.k, (i64)32), (i64)U);
        launch_dependents();

        for (i64 m0 = 0; m0 < p.m; m0 += Cfg::kMaxM) {
            // acc[rt][j][token]: weight row 16 rt + r + 4 j.
            float acc[RT][4][8 * MG];
            float acc_up[kDual ? RT : 1][4][kDual ? 8 * MG : 1];
#pragma unroll
            for (int rt = 0; rt < RT; ++rt)
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int i = 0; i < 8 * MG; ++i) {
                        acc[rt][j][i] = 0.0f;
                        if constexpr (kDual) acc_up[rt][j][i] = 0.0f;
                    }

            for (i64 c = warp; c < chunks; c += WARPS) {
                u32 w[U][RT][4][4];
                u32 wu[kDual ? U : 1][kDual ? RT : 1][4][4];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const i64 k = (c * U + u) * 32 + 4 * q;
#pragma unroll
                    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            const i64 n = n0 + 16 * rt + r + 4 * j;
                            load16<float, true>(w[u][rt][j], p.b + n * p.ldb, k, p.k, n < p.n,
                                                vec_b);
                            if constexpr (kDual) {
                                load16<float, true>(wu[u][rt][j], p.b_up + n * p.ldb_up, k, p.k,
                                                    n < p.n, vec_bu);
                            }
                        }
                }
                if (m0 == 0 && c == warp) wait_for_predecessors();
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const i64 k = (c * U + u) * 32 + 4 * q;
#pragma unroll
                    for (int mg = 0; mg < MG; ++mg) {
                        if (m0 + 8 * mg >= p.m) break;
#pragma unroll
                        for (int tok = 0; tok < 8; ++tok) {
                            const i64 m = m0 + 8 * mg + tok;
                            u32 a[4];
                            load16<float, false>(a, p.a + m * p.lda, k, p.k, m < p.m, vec_a);
#pragma unroll
                            for (int rt = 0; rt < RT; ++rt)
#pragma unroll
                                for (int j = 0; j < 4; ++j) {
                                    float& s = acc[rt][j][8 * mg + tok];
                                    s = dot4(w[u][rt][j], a, s);
                                    if constexpr (kDual) {
                                        float& su = acc_up[rt][j][8 * mg + tok];
                                        su = dot4(wu[u][rt][j], a, su);
                                    }
                                }
                        }
                    }
                }
            }

            wait_for_predecessors();
#pragma unroll
            for (int mg = 0; mg < MG; ++mg) {
                if (m0 + 8 * mg >= p.m) break;
                float* rs = red + warp * Cfg::kSlice;
                float* rus = red_up + (kDual ? warp * Cfg::kSlice : 0);
#pragma unroll
                for (int rt = 0; rt < RT; ++rt)
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const int at = q * Cfg::kPitch + 16 * rt + r + 4 * j;
                        float v[8];
#pragma unroll
                        for (int i = 0; i < 8; ++i) v[i] = acc[rt][j][8 * mg + i];
                        rs[at] = gemv_detail::reduce_scatter8(v, q);
                        if constexpr (kDual) {
#pragma unroll
                            for (int i = 0; i < 8; ++i) v[i] = acc_up[rt][j][8 * mg + i];
                            rus[at] = gemv_detail::reduce_scatter8(v, q);
                        }
                    }
                __syncthreads();
                gemv_detail::finish<float, Cfg, Epi>(red, red_up, m0 + 8 * mg, n0, p, tid);
                __syncthreads();
            }
        }
    }
};

}  // namespace mlpc
