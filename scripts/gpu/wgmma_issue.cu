// Microbenchmark: how fast one SM issues back-to-back `wgmma.mma_async` m64nNk16 of a given N,
// the shape the block-sparse kernel issues per kept block (N = the block height: m64n32k16 for
// 32 x 32 blocks), against the wide shapes the dense kernels issue (N = 128 / 256).
//
// Each CTA (one per SM) fills shared memory with non-zero bf16 values, then every consumer
// warpgroup (WG of them, as the block-sparse kernel's two) runs ITERS slices; a slice is, for
// each of its K16 k16 steps, NB wgmmas of m64nNk16 into NB accumulators (NB x N / 2 registers
// a thread: the block-sparse kernel's G block rows), then a commit and a wait that leaves one
// group in flight; the `Mode` rows end their slices as the kernel's consumers do instead (every
// slice drained, its A fragments loaded again, a random subset of its blocks kept behind a
// branch each). A comes from registers (`ldmatrix`, the RS form of `wgmma_detail::MmaRs`, what
// the kernel runs for 16 / 32 / 64-row blocks) or from shared memory (the descriptor form,
// `wgmma_detail::Mma`). B is K-major with the atom of a BK-wide slice (64:
// 128-byte rows, 32: 64-byte rows, as a 32 x 32 block's).
//
// The ROWS_LOOPED_* rows (`Mode`) ask whether a consumer without branches on the mask, A from
// shared memory, runs the kept blocks faster than the branch-per-block form: the same random
// 32 x 32 blocks as RANDOM_HALF_16 / RANDOM_QUARTER_16 (the kernel's windows, p = 1/2 and 1/4),
// but in chunks of C block columns (C = 8 and 4) whose A sits in shared memory, each block row
// a run-time loop over its kept columns (two wgmmas an iteration, A and B through descriptors),
// one drain a chunk; and the C = 8 loops with A loaded into registers per column instead.
// (Measured 2026-12-02: 1.16x / 1.48x the branch-per-block rate at p = 1/2 / 1/4 here, yet
// 24-36 % slower built into the kernel, where the copy engine shares the shared memory that A
// is read from: docs/perf-notes.md, block-sparse variants 24 and 25.)
//
// Prints one line per configuration: the useful TFLOP/s of the whole GPU (2 x 64 x N x 16 per
// kept wgmma), the nanoseconds one SM takes per wgmma and per slice (its warpgroups' slices run
// at the same time; a slice of the ROWS_LOOPED_* rows is 64 of K, two block columns, as one of
// RANDOM_HALF_16's, a chunk C / 2 of them), and the rate relative to one m64n256k16 (the
// descriptor form) per k16 step from the same number of warpgroups, timed first. What the numbers answer: how much of the tensor
// pipe the kernel can keep busy with N-wide blocks at all (docs/perf-notes.md, block-sparse
// "Next steps").
//
// On a CUDA machine, from the repository root:
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -diag-suppress 1886 \
//       -I kernels-templates scripts/gpu/wgmma_issue.cu -o /tmp/wgmma_issue && /tmp/wgmma_issue [ITERS]
//
// The device part also compiles with NVRTC alone (mlpc-codegen's `nvrtc_bsr_wgmma` test compiles
// it, so that it keeps up with the templates).
#include "gemm_bsr_wgmma.cuh"

namespace wgmma_issue {

using mlpc::bf16;
using mlpc::u32;
using mlpc::u64;

/// A non-zero bf16 pair in [0.5, 1) from a word index (a hash: the tensor pipe's power, and so
/// its clock, depends on the data).
__device__ __forceinline__ u32 pair_of(u32 i) {
    u32 h = i * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (0x3F00u | (h & 0x7Fu)) | ((0x3F00u | ((h >> 8) & 0x7Fu)) << 16);
}

/// How a slice ends (the block-sparse kernel's consumer runs DRAIN_RELOAD: it waits for its
/// slice's wgmmas before releasing the stage, and loads the next slice's A fragments after):
/// IN_FLIGHT: commit, then wait leaving one group in flight; the A fragments loaded once.
/// DRAIN: commit, wait for every wgmma; the A fragments loaded once.
/// DRAIN_RELOAD: DRAIN, and every slice loads its A fragments again (`ldmatrix`) first.
/// PAIR_RELOAD: two fragment sets in turn, each slice loading its set while the other set's
/// slice is in flight (wait leaving one group in flight).
/// RANDOM_HALF / RANDOM_QUARTER: DRAIN_RELOAD over slices that keep each of the NB blocks with
/// probability 1/2 or 1/4 (the same pseudo-random mask for every warpgroup and SM, `kept`), the
/// wgmmas of a block behind a branch on its mask bit, block by block as the kernel issues them
/// (`GemmBsrWgmma::each_kept_step`). RANDOM_HALF_ONCE: the RANDOM_HALF slices with A loaded once
/// and one slice in flight (the branches without the reload).
enum Mode {
    IN_FLIGHT = 0,
    DRAIN = 1,
    DRAIN_RELOAD = 2,
    PAIR_RELOAD = 3,
    RANDOM_HALF = 4,
    RANDOM_QUARTER = 5,
    RANDOM_HALF_ONCE = 6,
    RANDOM_HALF_16 = 7,
    RANDOM_QUARTER_16 = 8,
    RANDOM_HALF_BRX = 9,
    RANDOM_QUARTER_BRX = 10,
    ROWS_LOOPED_HALF = 11,
    ROWS_LOOPED_QUARTER = 12,
    ROWS_LOOPED_HALF_C4 = 13,
    ROWS_LOOPED_QUARTER_C4 = 14,
    ROWS_LOOPED_RS_HALF = 15,
    ROWS_LOOPED_RS_QUARTER = 16
};
/// RANDOM_HALF_BRX / RANDOM_QUARTER_BRX: the RANDOM_HALF / RANDOM_QUARTER slices with one
/// `brx.idx` per nibble of the mask to a straight-line sequence of its kept blocks
/// (`brx_nibble`) instead of a branch per block.
/// RANDOM_HALF_16 / RANDOM_QUARTER_16: the kernel's window layout, 16 positions a slice (NB = 8
/// blocks x 2 block columns of 32), position w * 8 + b two wgmmas (the k16 steps 2w, 2w + 1) into
/// accumulator b, each kept with probability 1/2 or 1/4: twice the bits tested and the stages
/// of RANDOM_HALF / RANDOM_QUARTER for the same expected work.
/// ROWS_LOOPED_HALF / ROWS_LOOPED_QUARTER (C = 8), ROWS_LOOPED_HALF_C4 / ROWS_LOOPED_QUARTER_C4
/// (C = 4): a consumer without a branch on a mask bit. A chunk is C block columns of 32 x 32
/// blocks (N = 32, BK = 32, NB = 8 block rows), its A (64 WG rows x C * 32, the activation tile)
/// and its blocks in shared memory; each block kept with probability 1/2 or 1/4 (`rows_kept`: the
/// RANDOM_HALF_16 / RANDOM_QUARTER_16 patterns, the same expected work per block column). For
/// each block row r (unrolled: acc[r] a static register array) a run-time loop over row r's kept
/// columns, their count and indices packed in one word read from shared memory (`run`); an
/// iteration is column c's two wgmmas m64n32k16 into acc[r], A through its descriptor (k16 steps
/// 2c and 2c + 1 of the chunk), B the kept block's. At the chunk's end, commit and wait for all
/// (the kernel's drain before it releases a stage), then the next chunk. The question: can a
/// consumer without branches on the mask, A from shared memory, run the kept blocks faster than
/// the branch-per-block form (RANDOM_HALF_16 / RANDOM_QUARTER_16, the same patterns)?
/// ROWS_LOOPED_RS_HALF / ROWS_LOOPED_RS_QUARTER: the C = 8 loops with A from registers instead,
/// each iteration loading column c's fragments (`ldmatrix`) into one of two sets in turn, then
/// its wgmmas as a group of their own and a wait leaving that group in flight (the other set's
/// wgmmas are done before it is loaded again).
__host__ __device__ constexpr bool rows_looped(int mode) {
    return mode >= ROWS_LOOPED_HALF && mode <= ROWS_LOOPED_RS_QUARTER;
}
/// ROWS_LOOPED_*: the block columns of a chunk, C.
__host__ __device__ constexpr int chunk_columns(int mode) {
    return mode == ROWS_LOOPED_HALF_C4 || mode == ROWS_LOOPED_QUARTER_C4 ? 4 : 8;
}
__host__ __device__ constexpr bool kernel_layout(int mode) {
    return mode == RANDOM_HALF_16 || mode == RANDOM_QUARTER_16;
}
__host__ __device__ constexpr bool quarter(int mode) {
    return mode == RANDOM_QUARTER || mode == RANDOM_QUARTER_16 || mode == RANDOM_QUARTER_BRX ||
           mode == ROWS_LOOPED_QUARTER || mode == ROWS_LOOPED_QUARTER_C4 ||
           mode == ROWS_LOOPED_RS_QUARTER;
}

/// Whether slice `it` keeps block `b` under `mode`'s probability (1 for the other modes).
__host__ __device__ inline bool kept(int mode, int it, int b) {
    if (mode < RANDOM_HALF) return true;
    u32 h = (u32)(it * (kernel_layout(mode) || rows_looped(mode) ? 16 : 8) + b) * 2654435761u;
    h ^= h >> 16;
    h *= 2246822519u;
    h ^= h >> 13;
    return (h & 255u) < (quarter(mode) ? 64u : 128u);
}

/// ROWS_LOOPED_*: the chunks' patterns, chunk ch taking pattern ch % kPatterns (a table in shared
/// memory built once, as the kernel's step lists are built before it runs).
constexpr int kPatterns = 512;

/// ROWS_LOOPED_*: whether chunk `ch` keeps block (row r, column c): position (c % 2) * 8 + r of
/// the RANDOM_HALF_16 / RANDOM_QUARTER_16 slice (ch % kPatterns) * C / 2 + c / 2 (a chunk of C
/// block columns is C / 2 of those slices, the same expected work a column).
__host__ __device__ inline bool rows_kept(int mode, int ch, int c, int r) {
    return kept(mode, (ch % kPatterns) * (chunk_columns(mode) / 2) + c / 2, (c % 2) * 8 + r);
}

/// Shared memory of one configuration, 1024-aligned: NB blocks of N x BK (B), then the A slice of
/// 64 WG rows x BK (read by the descriptor form, and by `ldmatrix` for the register form).
/// ROWS_LOOPED_*: a chunk of C block columns: NB x C block slots (slot r * C + c: block row r,
/// column c), then A, 64 WG rows x C * BK (C of the A slices above, one a block column), then
/// the kPatterns x NB row words (`run`).
template <int N, int NB, int BK, int WG, int MODE = IN_FLIGHT>
struct Layout {
    static constexpr int kCols = rows_looped(MODE) ? chunk_columns(MODE) : 1;
    static constexpr u32 kBlockBytes = N * BK * 2;
    static constexpr u32 kBBytes = NB * kCols * kBlockBytes;
    static constexpr u32 kABytes = 64 * WG * kCols * BK * 2;
    static constexpr u32 kTableBytes = rows_looped(MODE) ? kPatterns * NB * 4 : 0;
    static constexpr u32 kBytes = kBBytes + kABytes + kTableBytes + 1024;
};

/// Four words of shared memory at `addr` (16-aligned).
__device__ __forceinline__ void ld_shared_x4(u32* v, u32 addr) {
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(addr)
                 : "memory");
}

// BRX BEGIN (written by scripts/gpu/wgmma_issue_brx.py; do not edit by hand)
/// The kept blocks of nibble `nib` (blocks 4n .. 4n + 3 of a slice: `a0` .. `a3` their
/// accumulators, `d[i][j]` block i's descriptor at k16 step j) through one `brx.idx`.
__device__ __forceinline__ void brx_nibble(float (&a0)[16], float (&a1)[16], float (&a2)[16],
                                           float (&a3)[16], const u32 (&f)[4][4],
                                           const u64 (&d)[4][4], u32 nib) {
    asm volatile(
        "{\n"
        "$ts: .branchtargets $c0, $c1, $c2, $c3, $c4, $c5, $c6, $c7, $c8, $c9, $c10, $c11, $c12, $c13, $c14, $c15;\n"
        "brx.idx.uni %96, $ts;\n"
        "$c0:\n"
        "bra.uni $done;\n"
        "$c1:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%64, %65, %66, %67}, %80, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%68, %69, %70, %71}, %81, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%72, %73, %74, %75}, %82, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%76, %77, %78, %79}, %83, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$c2:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%64, %65, %66, %67}, %84, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%68, %69, %70, %71}, %85, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%72, %73, %74, %75}, %86, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%76, %77, %78, %79}, %87, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$c3:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%64, %65, %66, %67}, %80, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%68, %69, %70, %71}, %81, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%72, %73, %74, %75}, %82, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%76, %77, %78, %79}, %83, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%64, %65, %66, %67}, %84, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%68, %69, %70, %71}, %85, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%72, %73, %74, %75}, %86, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%76, %77, %78, %79}, %87, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$c4:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%64, %65, %66, %67}, %88, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%68, %69, %70, %71}, %89, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%72, %73, %74, %75}, %90, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%76, %77, %78, %79}, %91, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$c5:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%64, %65, %66, %67}, %80, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%68, %69, %70, %71}, %81, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%72, %73, %74, %75}, %82, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%76, %77, %78, %79}, %83, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%64, %65, %66, %67}, %88, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%68, %69, %70, %71}, %89, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%72, %73, %74, %75}, %90, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%76, %77, %78, %79}, %91, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$c6:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%64, %65, %66, %67}, %84, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%68, %69, %70, %71}, %85, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%72, %73, %74, %75}, %86, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%76, %77, %78, %79}, %87, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%64, %65, %66, %67}, %88, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%68, %69, %70, %71}, %89, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%72, %73, %74, %75}, %90, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%76, %77, %78, %79}, %91, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$c7:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%64, %65, %66, %67}, %80, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%68, %69, %70, %71}, %81, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%72, %73, %74, %75}, %82, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%76, %77, %78, %79}, %83, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%64, %65, %66, %67}, %84, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%68, %69, %70, %71}, %85, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%72, %73, %74, %75}, %86, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%76, %77, %78, %79}, %87, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%64, %65, %66, %67}, %88, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%68, %69, %70, %71}, %89, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%72, %73, %74, %75}, %90, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%76, %77, %78, %79}, %91, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$c8:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %92, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%68, %69, %70, %71}, %93, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%72, %73, %74, %75}, %94, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%76, %77, %78, %79}, %95, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$c9:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%64, %65, %66, %67}, %80, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%68, %69, %70, %71}, %81, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%72, %73, %74, %75}, %82, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%76, %77, %78, %79}, %83, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %92, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%68, %69, %70, %71}, %93, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%72, %73, %74, %75}, %94, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%76, %77, %78, %79}, %95, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$c10:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%64, %65, %66, %67}, %84, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%68, %69, %70, %71}, %85, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%72, %73, %74, %75}, %86, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%76, %77, %78, %79}, %87, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %92, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%68, %69, %70, %71}, %93, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%72, %73, %74, %75}, %94, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%76, %77, %78, %79}, %95, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$c11:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%64, %65, %66, %67}, %80, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%68, %69, %70, %71}, %81, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%72, %73, %74, %75}, %82, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%76, %77, %78, %79}, %83, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%64, %65, %66, %67}, %84, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%68, %69, %70, %71}, %85, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%72, %73, %74, %75}, %86, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%76, %77, %78, %79}, %87, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %92, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%68, %69, %70, %71}, %93, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%72, %73, %74, %75}, %94, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%76, %77, %78, %79}, %95, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$c12:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%64, %65, %66, %67}, %88, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%68, %69, %70, %71}, %89, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%72, %73, %74, %75}, %90, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%76, %77, %78, %79}, %91, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %92, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%68, %69, %70, %71}, %93, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%72, %73, %74, %75}, %94, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%76, %77, %78, %79}, %95, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$c13:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%64, %65, %66, %67}, %80, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%68, %69, %70, %71}, %81, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%72, %73, %74, %75}, %82, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%76, %77, %78, %79}, %83, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%64, %65, %66, %67}, %88, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%68, %69, %70, %71}, %89, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%72, %73, %74, %75}, %90, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%76, %77, %78, %79}, %91, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %92, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%68, %69, %70, %71}, %93, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%72, %73, %74, %75}, %94, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%76, %77, %78, %79}, %95, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$c14:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%64, %65, %66, %67}, %84, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%68, %69, %70, %71}, %85, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%72, %73, %74, %75}, %86, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%76, %77, %78, %79}, %87, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%64, %65, %66, %67}, %88, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%68, %69, %70, %71}, %89, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%72, %73, %74, %75}, %90, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%76, %77, %78, %79}, %91, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %92, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%68, %69, %70, %71}, %93, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%72, %73, %74, %75}, %94, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%76, %77, %78, %79}, %95, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$c15:\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%64, %65, %66, %67}, %80, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%68, %69, %70, %71}, %81, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%72, %73, %74, %75}, %82, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%76, %77, %78, %79}, %83, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%64, %65, %66, %67}, %84, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%68, %69, %70, %71}, %85, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%72, %73, %74, %75}, %86, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%76, %77, %78, %79}, %87, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%64, %65, %66, %67}, %88, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%68, %69, %70, %71}, %89, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%72, %73, %74, %75}, %90, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%76, %77, %78, %79}, %91, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %92, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%68, %69, %70, %71}, %93, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%72, %73, %74, %75}, %94, 1, 1, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%76, %77, %78, %79}, %95, 1, 1, 1, 0;\n"
        "bra.uni $done;\n"
        "$done:\n"
        "}\n"
        : "+f"(a0[0]), "+f"(a0[1]), "+f"(a0[2]), "+f"(a0[3]), "+f"(a0[4]), "+f"(a0[5]), "+f"(a0[6]), "+f"(a0[7]), "+f"(a0[8]), "+f"(a0[9]), "+f"(a0[10]), "+f"(a0[11]), "+f"(a0[12]), "+f"(a0[13]), "+f"(a0[14]), "+f"(a0[15]), "+f"(a1[0]), "+f"(a1[1]), "+f"(a1[2]), "+f"(a1[3]), "+f"(a1[4]), "+f"(a1[5]), "+f"(a1[6]), "+f"(a1[7]), "+f"(a1[8]), "+f"(a1[9]), "+f"(a1[10]), "+f"(a1[11]), "+f"(a1[12]), "+f"(a1[13]), "+f"(a1[14]), "+f"(a1[15]), "+f"(a2[0]), "+f"(a2[1]), "+f"(a2[2]), "+f"(a2[3]), "+f"(a2[4]), "+f"(a2[5]), "+f"(a2[6]), "+f"(a2[7]), "+f"(a2[8]), "+f"(a2[9]), "+f"(a2[10]), "+f"(a2[11]), "+f"(a2[12]), "+f"(a2[13]), "+f"(a2[14]), "+f"(a2[15]), "+f"(a3[0]), "+f"(a3[1]), "+f"(a3[2]), "+f"(a3[3]), "+f"(a3[4]), "+f"(a3[5]), "+f"(a3[6]), "+f"(a3[7]), "+f"(a3[8]), "+f"(a3[9]), "+f"(a3[10]), "+f"(a3[11]), "+f"(a3[12]), "+f"(a3[13]), "+f"(a3[14]), "+f"(a3[15])
        : "r"(f[0][0]), "r"(f[0][1]), "r"(f[0][2]), "r"(f[0][3]), "r"(f[1][0]), "r"(f[1][1]), "r"(f[1][2]), "r"(f[1][3]), "r"(f[2][0]), "r"(f[2][1]), "r"(f[2][2]), "r"(f[2][3]), "r"(f[3][0]), "r"(f[3][1]), "r"(f[3][2]), "r"(f[3][3]), "l"(d[0][0]), "l"(d[0][1]), "l"(d[0][2]), "l"(d[0][3]), "l"(d[1][0]), "l"(d[1][1]), "l"(d[1][2]), "l"(d[1][3]), "l"(d[2][0]), "l"(d[2][1]), "l"(d[2][2]), "l"(d[2][3]), "l"(d[3][0]), "l"(d[3][1]), "l"(d[3][2]), "l"(d[3][3]), "r"(nib));
}
// BRX END

template <int N, int NB, int BK, int WG, bool RS, int MODE = IN_FLIGHT>
__device__ __forceinline__ void run(int iters, float* out) {
    typedef Layout<N, NB, BK, WG, MODE> L;
    constexpr int SW = mlpc::bsr_wgmma::SliceAtom<BK>::SW;
    constexpr int K16 = BK / 16;
    extern __shared__ unsigned char smem_raw[];
    const u32 base = ((u32)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const int tid = (int)threadIdx.x;
    for (u32 w = (u32)tid; w < (L::kBBytes + L::kABytes) / 4; w += blockDim.x) {
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(base + 4 * w), "r"(pair_of(w + 977u * blockIdx.x)));
    }
    if constexpr (rows_looped(MODE)) {
        // The row words of every pattern: word (pattern, r) = row r's kept columns in increasing
        // order, 3 bits each from bit 4, their count in bits 0-3.
        constexpr int C = chunk_columns(MODE);
        for (int i = tid; i < kPatterns * NB; i += (int)blockDim.x) {
            u32 n = 0, cols = 0;
            for (int c = 0; c < C; ++c) {
                if (rows_kept(MODE, i / NB, c, i % NB)) cols |= (u32)c << (3 * n++);
            }
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(base + L::kBBytes + L::kABytes + 4 * i),
                         "r"(n | cols << 4));
        }
    }
    mlpc::wgmma_detail::fence_proxy_async();
    __syncthreads();

    const int wg = tid / 128, q = (tid / 32) % 4, lane = tid % 32;
    const u32 sb = base, sa = base + L::kBBytes;
    float acc[NB][N / 2];
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int e = 0; e < N / 2; ++e) acc[b][e] = 0.0f;
    u32 frag[K16][4], frag2[K16][4];
    auto load = [&](u32(&f)[K16][4]) {
#pragma unroll
        for (int j = 0; j < K16; ++j) {
            mlpc::bsr_wgmma::ldsm_x4(f[j], mlpc::bsr_wgmma::ldsm_a_addr<64 * WG, BK>(sa, wg, q, lane, j));
        }
    };
    if constexpr (RS && !rows_looped(MODE)) load(frag);
    // The descriptors' low words: block b's k16 step j, and this warpgroup's A rows at step j.
    const u32 b_lo = mlpc::bsr_wgmma::desc_lo(sb);
    const u32 a_lo = mlpc::bsr_wgmma::desc_lo(sa + (u32)wg * 64u * 2u * SW);
    // The accumulators pinned where the kernel pins them (after the commit and the wait).
    auto pin = [&]() {
#pragma unroll
        for (int b = 0; b < NB; ++b) mlpc::wgmma_detail::fence_regs(acc[b]);
    };
    // Block b's descriptor at k16 step j.
    auto b_desc = [&](int b, int j) {
        return mlpc::bsr_wgmma::desc_of<SW>(
            b_lo + ((b * L::kBlockBytes + mlpc::bsr_wgmma::kstep_offset<N, BK>(j)) >> 4));
    };
    auto slice = [&](u32(&f)[K16][4]) {
        mlpc::wgmma_detail::fence();
#pragma unroll
        for (int j = 0; j < K16; ++j) {
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                if constexpr (RS) {
                    mlpc::wgmma_detail::MmaRs<bf16, N>::run(acc[b], f[j], b_desc(b, j));
                } else {
                    const u64 ad = mlpc::bsr_wgmma::desc_of<SW>(
                        a_lo + (mlpc::bsr_wgmma::kstep_offset<64 * WG, BK>(j) >> 4));
                    mlpc::wgmma_detail::Mma<bf16, N>::run(acc[b], ad, b_desc(b, j));
                }
            }
        }
        mlpc::wgmma_detail::commit();
        pin();
    };
    if constexpr (rows_looped(MODE)) {
        // Chunks of C block columns, the rows looped over their kept columns (no branch on a mask
        // bit): A is 64 WG rows x C * BK in atoms of SW = BK (64-byte rows, 64B swizzle: the
        // file's A slice at BK = 32 repeated C times, the kernel's A layout for pairs), column c
        // being its k16 steps 2c and 2c + 1, and the descriptor of step k that of the chunk's
        // start advanced by `kstep_offset` (atom column k / 2, (k % 2) * 32 bytes into its rows:
        // what the kernel adds along K). B (block slots) has the same atom. A chunk is C / 2
        // slices of the host's count.
        constexpr int C = chunk_columns(MODE);
        constexpr int CK = C * BK;
        static_assert(N == 32 && NB == 8 && BK == 32 && SW == 32 && WG == 2 && C % 2 == 0 && C <= 8,
                      "rows looped: 32 x 32 blocks, 8 block rows, two warpgroups, C even and <= 8");
        static_assert(L::kBBytes % 1024 == 0 && L::kBlockBytes % 512 == 0 && (64 * WG * 64) % 512 == 0,
                      "A, its atom columns and the block slots start on 64B swizzle periods");
        const u32 table = base + L::kBBytes + L::kABytes;
        // This warpgroup's A rows; its index through a shuffle from lane 0, which ptxas knows to
        // be warp-uniform (a uniform register, as CUTLASS's `canonical_warp_group_idx`): the
        // descriptors are then built on the uniform datapath, not moved to it per wgmma.
        const int wgu = __shfl_sync(0xffffffffu, wg, 0);
        const u32 ca_lo = mlpc::bsr_wgmma::desc_lo(sa + (u32)wgu * 64u * 2u * SW);
        const int chunks = iters / (C / 2);
        for (int ch = 0; ch < chunks; ++ch) {
            u32 rw[NB];
            const u32 t = table + (u32)(ch % kPatterns) * (NB * 4);
            ld_shared_x4(rw, t);
            ld_shared_x4(rw + 4, t + 16);
            mlpc::wgmma_detail::fence();
#pragma unroll
            for (int r = 0; r < NB; ++r) {
                const int n = (int)(rw[r] & 15u);
                u32 cols = rw[r] >> 4;
                // Column c's kept block of row r: slot r * C + c.
                const u32 rb_lo = b_lo + ((u32)(r * C) * L::kBlockBytes >> 4);
                if constexpr (RS) {
                    // Two fragment sets in turn, a group and a wait leaving one group in flight
                    // per column: the set loaded was read by the group before the one in flight.
                    u32 f[2][2][4];
                    auto step = [&](u32(&fs)[2][4], int c) {
#pragma unroll
                        for (int j = 0; j < 2; ++j) {
                            mlpc::bsr_wgmma::ldsm_x4(
                                fs[j], mlpc::bsr_wgmma::ldsm_a_addr<64 * WG, CK, SW>(sa, wg, q, lane,
                                                                                     2 * c + j));
                        }
                        mlpc::wgmma_detail::fence();
#pragma unroll
                        for (int j = 0; j < 2; ++j) {
                            mlpc::wgmma_detail::MmaRs<bf16, N>::run(
                                acc[r], fs[j],
                                mlpc::bsr_wgmma::desc_of<SW>(
                                    rb_lo + (((u32)c * L::kBlockBytes +
                                              mlpc::bsr_wgmma::kstep_offset<N, BK>(j)) >> 4)));
                        }
                        mlpc::wgmma_detail::commit();
                        mlpc::wgmma_detail::wait<1>();
                    };
                    int i = 0;
#pragma unroll 1
                    for (; i + 1 < n; i += 2) {
                        step(f[0], (int)(cols & 7u));
                        step(f[1], (int)((cols >> 3) & 7u));
                        cols >>= 6;
                    }
                    // An odd count: the last column in set 0, whose group the next row's first
                    // load must not overtake.
                    if (i < n) {
                        step(f[0], (int)(cols & 7u));
                        mlpc::wgmma_detail::wait<0>();
                    }
                } else {
#pragma unroll 1
                    for (int i = 0; i < n; ++i) {
                        const int c = (int)(cols & 7u);
                        cols >>= 3;
#pragma unroll
                        for (int j = 0; j < 2; ++j) {
                            const u64 ad = mlpc::bsr_wgmma::desc_of<SW>(
                                ca_lo + (mlpc::bsr_wgmma::kstep_offset<64 * WG, CK, SW>(2 * c + j) >> 4));
                            const u64 bd = mlpc::bsr_wgmma::desc_of<SW>(
                                rb_lo + (((u32)c * L::kBlockBytes +
                                          mlpc::bsr_wgmma::kstep_offset<N, BK>(j)) >> 4));
                            mlpc::wgmma_detail::Mma<bf16, N>::run(acc[r], ad, bd);
                        }
                    }
                }
            }
            mlpc::wgmma_detail::commit();
            pin();
            mlpc::wgmma_detail::wait<0>();
            pin();
        }
    } else if constexpr (MODE >= RANDOM_HALF) {
        // Slices keeping a random subset of their positions: NB blocks of K16 steps, or the
        // kernel's 16 positions of two steps; issued by a branch per position, or by one
        // `brx.idx` per nibble.
        constexpr bool kBrx = MODE == RANDOM_HALF_BRX || MODE == RANDOM_QUARTER_BRX;
        constexpr int kPositions = kernel_layout(MODE) ? 16 : NB;
        static_assert(RS && (!kBrx || (NB == 8 && K16 == 4 && N == 32)) &&
                          (!kernel_layout(MODE) || (NB == 8 && K16 == 4)),
                      "random slices: A from registers; brx and the kernel's layout: 8 blocks of 4 steps");
        for (int it = 0; it < iters; ++it) {
            u32 mask = 0;
#pragma unroll
            for (int p = 0; p < kPositions; ++p) mask |= kept(MODE, it, p) ? 1u << p : 0u;
            if constexpr (MODE != RANDOM_HALF_ONCE) load(frag);
            mlpc::wgmma_detail::fence();
            if constexpr (kBrx) {
#pragma unroll
                for (int n = 0; n < 2; ++n) {
                    u64 d[4][4];
#pragma unroll
                    for (int i = 0; i < 4; ++i)
#pragma unroll
                        for (int j = 0; j < 4; ++j) d[i][j] = b_desc(4 * n + i, j);
                    brx_nibble(acc[4 * n], acc[4 * n + 1], acc[4 * n + 2], acc[4 * n + 3], frag, d,
                               (mask >> (4 * n)) & 15u);
                }
            } else {
                // Position p: block p % NB, k16 steps from (p / NB) * kSteps.
                constexpr int kSteps = kernel_layout(MODE) ? 2 : K16;
#pragma unroll
                for (int p = 0; p < kPositions; ++p) {
                    if (((mask >> p) & 1u) == 0) continue;
#pragma unroll
                    for (int j = (p / NB) * kSteps; j < (p / NB + 1) * kSteps; ++j) {
                        mlpc::wgmma_detail::MmaRs<bf16, N>::run(acc[p % NB], frag[j], b_desc(p % NB, j));
                    }
                }
            }
            mlpc::wgmma_detail::commit();
            pin();
            if constexpr (MODE == RANDOM_HALF_ONCE) {
                mlpc::wgmma_detail::wait<1>();
            } else {
                mlpc::wgmma_detail::wait<0>();
            }
            pin();
            mlpc::bsr_wgmma::fence_frag(frag);
        }
    } else if constexpr (MODE == PAIR_RELOAD) {
        for (int it = 0; it < iters; it += 2) {
            load(frag);
            slice(frag);
            mlpc::wgmma_detail::wait<1>();
            pin();
            mlpc::bsr_wgmma::fence_frag(frag2);
            load(frag2);
            slice(frag2);
            mlpc::wgmma_detail::wait<1>();
            pin();
            mlpc::bsr_wgmma::fence_frag(frag);
        }
    } else {
        for (int it = 0; it < iters; ++it) {
            if constexpr (MODE == DRAIN_RELOAD) load(frag);
            slice(frag);
            if constexpr (MODE == IN_FLIGHT) {
                mlpc::wgmma_detail::wait<1>();
            } else {
                mlpc::wgmma_detail::wait<0>();
            }
            if constexpr (RS) mlpc::bsr_wgmma::fence_frag(frag);
        }
    }
    mlpc::wgmma_detail::wait<0>();
    float sum = 0.0f;
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int e = 0; e < N / 2; ++e) sum += acc[b][e];
    out[blockIdx.x * blockDim.x + tid] = sum;
}

}  // namespace wgmma_issue

// One entry per configuration: wgmma_issue_<rs|ss>_n<N>_x<NB>_bk<BK>_wg<WG>. Both forms for the
// block heights the register form has (16, 32, 64), the descriptor form for the wide shapes.
#define WGMMA_ISSUE_ENTRY(FORM, RS, N, NB, BK, WG)                                         \
    WGMMA_ISSUE_ENTRY_M(FORM, RS, N, NB, BK, WG, 0)
#define WGMMA_ISSUE_ENTRY_M(FORM, RS, N, NB, BK, WG, MODE)                                 \
    extern "C" __global__ void __launch_bounds__(128 * WG, 1)                               \
        wgmma_issue_##FORM##_n##N##_x##NB##_bk##BK##_wg##WG##_m##MODE(int iters, float* out) { \
        wgmma_issue::run<N, NB, BK, WG, RS, MODE>(iters, out);                              \
    }
// (The descriptor form of m64n32k16 x 8 at bk 64 is left out: ptxas serialises its wgmmas.)
#define WGMMA_ISSUE_CONFIGS(SS, RS)                                                        \
    SS(256, 1, 64, 1) SS(128, 2, 64, 1) SS(64, 4, 64, 1) RS(64, 4, 64, 1) RS(32, 8, 64, 1) \
    RS(32, 8, 32, 1)                                                                       \
    SS(256, 1, 64, 2) SS(128, 2, 64, 2) SS(64, 4, 64, 2) RS(64, 4, 64, 2) RS(32, 8, 64, 2) \
    SS(32, 8, 32, 2) RS(32, 8, 32, 2) RS(32, 4, 32, 2) RS(32, 2, 32, 2) RS(32, 1, 32, 2)   \
    RS(16, 8, 32, 2)
// The block-sparse consumer's slice endings (`Mode`), for the register form with two
// warpgroups: 4 / 2 / 1 blocks a k16 step of a 64-wide window are the 16 / 8 / 4 wgmmas a slice
// the kernel issues at density 0.5 / 0.25 / about 0.1. (PAIR_RELOAD with one block a step is
// left out: ptxas serialises its wgmmas, C7515.)
#define WGMMA_ISSUE_MODES(M)                                                               \
    M(32, 4, 64, 2, 1) M(32, 4, 64, 2, 2) M(32, 4, 64, 2, 3) M(32, 2, 64, 2, 0)            \
    M(32, 2, 64, 2, 1) M(32, 2, 64, 2, 2) M(32, 2, 64, 2, 3) M(32, 1, 64, 2, 0)            \
    M(32, 1, 64, 2, 1) M(32, 1, 64, 2, 2) M(32, 8, 64, 2, 4) M(32, 8, 64, 2, 5)              \
    M(32, 8, 64, 2, 6) M(32, 8, 64, 2, 7) M(32, 8, 64, 2, 8) M(32, 8, 64, 2, 9)              \
    M(32, 8, 64, 2, 10)
// The consumers without branches on the mask (`ROWS_LOOPED_*`): 32 x 32 blocks, 8 block rows, two
// warpgroups; A through descriptors in chunks of 8 and 4 block columns, A from registers in
// chunks of 8.
#define WGMMA_ISSUE_ROWS(SS, RS)                                                           \
    SS(32, 8, 32, 2, 11) SS(32, 8, 32, 2, 12) SS(32, 8, 32, 2, 13) SS(32, 8, 32, 2, 14)      \
    RS(32, 8, 32, 2, 15) RS(32, 8, 32, 2, 16)
#define WGMMA_ISSUE_SS(N, NB, BK, WG) WGMMA_ISSUE_ENTRY(ss, false, N, NB, BK, WG)
#define WGMMA_ISSUE_RS(N, NB, BK, WG) WGMMA_ISSUE_ENTRY(rs, true, N, NB, BK, WG)
#define WGMMA_ISSUE_SS_M(N, NB, BK, WG, MODE) WGMMA_ISSUE_ENTRY_M(ss, false, N, NB, BK, WG, MODE)
#define WGMMA_ISSUE_RS_M(N, NB, BK, WG, MODE) WGMMA_ISSUE_ENTRY_M(rs, true, N, NB, BK, WG, MODE)
WGMMA_ISSUE_CONFIGS(WGMMA_ISSUE_SS, WGMMA_ISSUE_RS)
WGMMA_ISSUE_MODES(WGMMA_ISSUE_RS_M)
WGMMA_ISSUE_ROWS(WGMMA_ISSUE_SS_M, WGMMA_ISSUE_RS_M)

#ifndef __CUDACC_RTC__
#include "host_check.h"


typedef void (*Entry)(int, float*);

struct Config {
    const char* name;
    Entry entry;
    int n, nb, bk, wg;
    bool rs;
    unsigned smem;
    int mode;
};

static float time_ms(const Config& c, int sms, int iters, float* out) {
    CHECK(cudaFuncSetAttribute((const void*)c.entry, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)c.smem));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    float best = 1e30f;
    for (int rep = 0; rep < 6; ++rep) {  // the first is the warm-up; the fastest of the rest
        CHECK(cudaEventRecord(start));
        c.entry<<<sms, 128 * c.wg, c.smem>>>(iters, out);
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        CHECK(cudaGetLastError());
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (rep > 0 && ms < best) best = ms;
    }
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    return best;
}

int main(int argc, char** argv) {
    const int iters = argc > 1 ? std::atoi(argv[1]) : 20000;
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    float* out = nullptr;
    CHECK(cudaMalloc(&out, (size_t)sms * 256 * sizeof(float)));
#define WGMMA_ISSUE_ROW_M(FORM, RS, N, NB, BK, WG, MODE)                                      \
    {#FORM " m64n" #N "k16 x" #NB ", bk " #BK ", " #WG " wg" MODE_NAME_##MODE,               \
     wgmma_issue_##FORM##_n##N##_x##NB##_bk##BK##_wg##WG##_m##MODE, N, NB, BK, WG, RS,       \
     wgmma_issue::Layout<N, NB, BK, WG, MODE>::kBytes, MODE},
#define MODE_NAME_0 ""
#define MODE_NAME_1 ", drain each slice"
#define MODE_NAME_2 ", drain and reload A each slice"
#define MODE_NAME_3 ", reload A into two sets in turn, one slice in flight"
#define MODE_NAME_4 ", each block kept with p = 1/2, drain and reload A each slice"
#define MODE_NAME_5 ", each block kept with p = 1/4, drain and reload A each slice"
#define MODE_NAME_6 ", each block kept with p = 1/2, A loaded once, one slice in flight"
#define MODE_NAME_7 ", 16 positions of 2 wgmmas (the kernel's windows), each kept with p = 1/2, drain and reload"
#define MODE_NAME_8 ", 16 positions of 2 wgmmas (the kernel's windows), each kept with p = 1/4, drain and reload"
#define MODE_NAME_9 ", each block kept with p = 1/2, one brx.idx a nibble, drain and reload"
#define MODE_NAME_10 ", each block kept with p = 1/4, one brx.idx a nibble, drain and reload"
#define MODE_NAME_11 ", rows looped over kept columns, chunks of 8 columns, p = 1/2, drain each chunk"
#define MODE_NAME_12 ", rows looped over kept columns, chunks of 8 columns, p = 1/4, drain each chunk"
#define MODE_NAME_13 ", rows looped over kept columns, chunks of 4 columns, p = 1/2, drain each chunk"
#define MODE_NAME_14 ", rows looped over kept columns, chunks of 4 columns, p = 1/4, drain each chunk"
#define MODE_NAME_15 ", rows looped over kept columns, chunks of 8 columns, p = 1/2, A loaded per column"
#define MODE_NAME_16 ", rows looped over kept columns, chunks of 8 columns, p = 1/4, A loaded per column"
#define WGMMA_ISSUE_ROW_SS(N, NB, BK, WG) WGMMA_ISSUE_ROW_M(ss, false, N, NB, BK, WG, 0)
#define WGMMA_ISSUE_ROW_RS(N, NB, BK, WG) WGMMA_ISSUE_ROW_M(rs, true, N, NB, BK, WG, 0)
#define WGMMA_ISSUE_ROW_SS_M(N, NB, BK, WG, MODE) WGMMA_ISSUE_ROW_M(ss, false, N, NB, BK, WG, MODE)
#define WGMMA_ISSUE_ROW_RS_M(N, NB, BK, WG, MODE) WGMMA_ISSUE_ROW_M(rs, true, N, NB, BK, WG, MODE)
    const Config configs[] = {WGMMA_ISSUE_CONFIGS(WGMMA_ISSUE_ROW_SS, WGMMA_ISSUE_ROW_RS)
                                  WGMMA_ISSUE_MODES(WGMMA_ISSUE_ROW_RS_M)
                                      WGMMA_ISSUE_ROWS(WGMMA_ISSUE_ROW_SS_M, WGMMA_ISSUE_ROW_RS_M)};
    std::printf("%s, %d SMs, %d slices per warpgroup, one CTA per SM\n", prop.name, sms, iters);
    std::printf("| form, shape x per k16 step, slice k, warpgroups | TFLOP/s | ns per wgmma per SM | "
                "ns per slice | vs one m64n256k16 per step |\n|---|---:|---:|---:|---:|\n");
    // The reference of each warpgroup count: one m64n256k16 (descriptor form) per k16 step.
    double ref[3] = {0, 0, 0};
    for (const Config& c : configs) {
        const float ms = time_ms(c, sms, iters, out);
        // The wgmmas of a warpgroup's kept blocks over its slices (all of them but in the random
        // modes). (The kernel's layout: 16 positions of two k16 steps each. Rows looped: chunks
        // of C block columns of two k16 steps, C / 2 slices each, whole chunks only.)
        const bool layout = wgmma_issue::kernel_layout(c.mode);
        const int positions = layout ? 16 : c.nb;
        int slices = iters;
        long kept_wgmmas = 0;
        if (wgmma_issue::rows_looped(c.mode)) {
            const int cols = wgmma_issue::chunk_columns(c.mode);
            const int chunks = iters / (cols / 2);
            slices = chunks * (cols / 2);
            for (int ch = 0; ch < chunks; ++ch)
                for (int col = 0; col < cols; ++col)
                    for (int r = 0; r < c.nb; ++r)
                        kept_wgmmas += wgmma_issue::rows_kept(c.mode, ch, col, r) ? c.bk / 16 : 0;
        } else {
            for (int it = 0; it < iters; ++it)
                for (int b = 0; b < positions; ++b)
                    kept_wgmmas += wgmma_issue::kept(c.mode, it, b) ? (layout ? 2 : c.bk / 16) : 0;
        }
        const double wgmmas = (double)sms * c.wg * kept_wgmmas;
        const double flops = wgmmas * 2.0 * 64 * c.n * 16;
        const double tflops = flops / (ms * 1e-3) / 1e12;
        const double ns = ms * 1e6 / (wgmmas / sms);
        if (c.n == 256) ref[c.wg] = tflops;
        std::printf("| %s | %.1f | %.2f | %.1f | %.2f |\n", c.name, tflops, ns, ms * 1e6 / slices,
                    tflops / ref[c.wg]);
    }
    CHECK(cudaFree(out));
    return 0;
}
#endif
