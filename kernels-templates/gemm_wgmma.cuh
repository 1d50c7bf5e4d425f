// mlpc kernel templates: the Hopper GEMM for f16 / bf16 (sm_90a only): `wgmma.mma_async` from
// warpgroups, both operands read from shared memory through matrix descriptors, f32 accumulation,
// and the compile-time epilogue chain of common.cuh.
//
//   C[m, n] = Epi(sum_k A[m, k] * B[k, n])            (plain)
//   C[m, n] = Out(Gate(A @ Bg) * Up(A @ Bu))[m, n]     (dual: two accumulators per thread)
//
// Operands: A is row-major [M, K] (`Layout::N`, k contiguous) and B is row-major [N, K]
// (`Layout::T`, an nn.Linear weight, k contiguous): both "K-major", which is what wgmma reads for
// 16-bit types without a transpose (imm-trans-a = imm-trans-b = 0). Other layouts use GemmMma.
//
// CTA: BM / 64 consumer warpgroups (128 threads each); warpgroup w owns rows [64w, 64w + 64) of the
// BM x BN tile and the whole BN width, computed with `wgmma.mma_async.m64nBNk16` (BN = 64, 128 or
// 256). Every thread both loads and computes (no producer warp yet).
//
// Shared memory (one stage; STAGES stages in a ring, the ring base aligned to 1024 bytes):
//   [A tile: BM rows x 64 k][B tile: BN rows x 64 k][Bu tile (dual): BN rows x 64 k]
// Each tile is K-major with the 128-byte swizzle: row r (an m or n index) is 128 bytes (64 16-bit
// k values) at byte r * 128 of the tile, and its 16-byte chunk c (k = 8c .. 8c + 7) is stored at
// chunk position c ^ (r % 8):
//
//   byte_offset(r, k) = r * 128 + (((k / 8) ^ (r % 8)) * 16) + (k % 8) * 2
//
// Every tile starts on a 1024-byte boundary (tile sizes are multiples of 1024), so this equals the
// hardware's 128B swizzle, which XORs address bits [4, 7) with bits [7, 10) of the byte address
// (PTX ISA, "Shared Memory Matrix Layout": K-major, 128B swizzling, canonical layout
// Swizzle<3,4,3> o ((8, m), (T, 2k)) : ((8T, SBO), (1, T)) with T = 8 16-bit elements).
//
// Matrix descriptors (PTX ISA, "Matrix Descriptor Format"), one 64-bit value per operand:
//   bits  0-13  start address >> 4   (shared-window byte address)
//   bits 16-29  leading byte offset >> 4 = 1   (unused by K-major swizzled layouts; "assumed 1")
//   bits 32-45  stride byte offset >> 4 = 64   (1024 bytes from one group of 8 rows to the next)
//   bits 49-51  base offset = 0                (atoms start on 1024-byte boundaries)
//   bits 62-63  layout type = 1                (128-byte swizzle)
// A wgmma k16 step j (0..3) of the 64-wide slice reads k = 16j .. 16j + 15, the chunks 2j and
// 2j + 1 of each row: its descriptor is the slice's with the start address advanced by 32j bytes
// (+2j in the encoded field). The hardware applies the XOR to the full computed address, whose
// bits [7, 10) still hold r % 8, so the k-advanced descriptor reads the chunks written above.
// Warpgroup w's A descriptor starts at A + w * 64 * 128 bytes (a multiple of 1024).
//
// Accumulators of m64nNk16 with f32 (PTX ISA figure "WGMMA .m64nNk16 register fragment layout
// for accumulator matrix D"; CUTLASS CLayout_64xN): with q = warp index in the warpgroup,
// g = lane / 4, t = lane % 4, register d[4i + 2h + e] (i < N/8, h, e in {0, 1}) holds
//   D[16q + g + 8h][8i + 2t + e]
// i.e. the mma.sync m16n8 C fragment repeated over n in steps of 8, one 16-row band per warp.
//
// Pipeline (STAGES >= 3; prefetch distance STAGES - 2 slices):
//   prologue: slices 0 .. STAGES - 3 in flight, one cp.async group each.
//   iteration kt:
//     cp.async.wait_group(STAGES - 3)  -> this thread's copies of slice kt have landed
//     fence.proxy.async.shared::cta    -> ...and are visible to the async proxy (wgmma reads)
//     __syncthreads                    -> every thread's copies of slice kt; and every warpgroup
//                                         finished slice kt - 2 (its wait_group(1) of kt - 1)
//     wgmma.fence; 4 x wgmma (x2 dual); wgmma.commit_group
//     cp.async slice kt + STAGES - 2 into the stage of slice kt - 2; commit (possibly empty)
//     wgmma.wait_group(1)              -> slice kt - 1's wgmmas are complete; kt may still run
// so the tensor cores have the next slice queued while the threads cross the barrier.
//
// Loads: 16-byte cp.async with zero-fill for operands with a 16-byte aligned base and a row
// stride that is a multiple of 8 elements (decided at run time, uniformly); plain bounds-checked
// loads and st.shared otherwise, into the same swizzled positions. Elements outside the matrix
// read as zero, so any M, N, K is correct.
#pragma once

#include "common.cuh"
#include "gemm_mma.cuh"

namespace mlpc {

/// A BM x BN tile per CTA with BM / 64 warpgroups and STAGES shared-memory stages of 64-deep k
/// slices.
template <int BM_, int BN_, int STAGES_>
struct WgmmaConfig {
    static constexpr int BM = BM_, BN = BN_, BK = 64, STAGES = STAGES_;
    static constexpr int kWarpgroups = BM / 64;
    static constexpr int kThreads = kWarpgroups * 128;
    static_assert(BM % 64 == 0 && BM >= 64 && BM <= 256, "BM must be 64, 128, 192 or 256");
    static_assert(BN == 64 || BN == 128 || BN == 192 || BN == 256,
                  "BN must be 64, 128, 192 or 256");
    static_assert(STAGES >= 3, "the ring needs a stage in flight, one computing, one draining");
};

/// A CUDA tensor map (`CUtensorMap`): 128 opaque bytes encoded on the host by
/// `cuTensorMapEncodeTiled`, passed by value as a `const __grid_constant__` kernel parameter.
struct alignas(128) TensorMap {
    unsigned long long opaque[16];
};

namespace wgmma_detail {

/// Byte offset of the 16-byte chunk `c` (k = 8c .. 8c + 7) of row `r` in a 128B-swizzled,
/// K-major tile (see the file comment).
__device__ __forceinline__ u32 chunk_offset(int r, int c) {
    return (u32)(r * 128 + ((c ^ (r & 7)) << 4));
}

/// The descriptor of a K-major, 128B-swizzled operand starting at shared address `addr` (1024-byte
/// aligned, or advanced from such an address by a k step).
__device__ __forceinline__ u64 make_desc(u32 addr) {
    return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) |
           ((u64)1 << 62);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/// Orders this thread's generic-proxy writes to shared memory (cp.async, st.shared) before later
/// async-proxy reads (wgmma).
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/// Named barrier `id` (1..15) for `threads` threads: `named_arrive` counts this warp in without
/// waiting, `named_sync` counts it in and waits until `threads` threads have arrived.
template <int THREADS>
__device__ __forceinline__ void named_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}

template <int THREADS>
__device__ __forceinline__ void named_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}

/// Pins the accumulator registers at this point of the program: the compiler may not move their
/// reads or writes across it (they are written by in-flight wgmmas until the wait).
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// (g[0..64), u[0..64)) += A * B for m64n256k16 over two stacked B tiles of 128 rows:
// the first 128 columns of the product go to g, the other 128 to u.
#define MLPC_WGMMA_PAIR_M64N256K16(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
        "}, %128, %129, 1, 1, 1, 0, 0;\n" \
        : "+f"(g[0]), "+f"(g[1]), "+f"(g[2]), "+f"(g[3]), "+f"(g[4]), "+f"(g[5]), "+f"(g[6]), "+f"(g[7]), "+f"(g[8]), "+f"(g[9]), "+f"(g[10]), "+f"(g[11]), "+f"(g[12]), "+f"(g[13]), "+f"(g[14]), "+f"(g[15]), "+f"(g[16]), "+f"(g[17]), "+f"(g[18]), "+f"(g[19]), "+f"(g[20]), "+f"(g[21]), "+f"(g[22]), "+f"(g[23]), "+f"(g[24]), "+f"(g[25]), "+f"(g[26]), "+f"(g[27]), "+f"(g[28]), "+f"(g[29]), "+f"(g[30]), "+f"(g[31]), "+f"(g[32]), "+f"(g[33]), "+f"(g[34]), "+f"(g[35]), "+f"(g[36]), "+f"(g[37]), "+f"(g[38]), "+f"(g[39]), "+f"(g[40]), "+f"(g[41]), "+f"(g[42]), "+f"(g[43]), "+f"(g[44]), "+f"(g[45]), "+f"(g[46]), "+f"(g[47]), "+f"(g[48]), "+f"(g[49]), "+f"(g[50]), "+f"(g[51]), "+f"(g[52]), "+f"(g[53]), "+f"(g[54]), "+f"(g[55]), "+f"(g[56]), "+f"(g[57]), "+f"(g[58]), "+f"(g[59]), "+f"(g[60]), "+f"(g[61]), "+f"(g[62]), "+f"(g[63]), "+f"(u[0]), "+f"(u[1]), "+f"(u[2]), "+f"(u[3]), "+f"(u[4]), "+f"(u[5]), "+f"(u[6]), "+f"(u[7]), "+f"(u[8]), "+f"(u[9]), "+f"(u[10]), "+f"(u[11]), "+f"(u[12]), "+f"(u[13]), "+f"(u[14]), "+f"(u[15]), "+f"(u[16]), "+f"(u[17]), "+f"(u[18]), "+f"(u[19]), "+f"(u[20]), "+f"(u[21]), "+f"(u[22]), "+f"(u[23]), "+f"(u[24]), "+f"(u[25]), "+f"(u[26]), "+f"(u[27]), "+f"(u[28]), "+f"(u[29]), "+f"(u[30]), "+f"(u[31]), "+f"(u[32]), "+f"(u[33]), "+f"(u[34]), "+f"(u[35]), "+f"(u[36]), "+f"(u[37]), "+f"(u[38]), "+f"(u[39]), "+f"(u[40]), "+f"(u[41]), "+f"(u[42]), "+f"(u[43]), "+f"(u[44]), "+f"(u[45]), "+f"(u[46]), "+f"(u[47]), "+f"(u[48]), "+f"(u[49]), "+f"(u[50]), "+f"(u[51]), "+f"(u[52]), "+f"(u[53]), "+f"(u[54]), "+f"(u[55]), "+f"(u[56]), "+f"(u[57]), "+f"(u[58]), "+f"(u[59]), "+f"(u[60]), "+f"(u[61]), "+f"(u[62]), "+f"(u[63]) \
        : "l"(a), "l"(b))

// (g[0..48), u[0..48)) += A * B for m64n192k16 over two stacked B tiles of 96 rows:
// the first 96 columns of the product go to g, the other 96 to u.
#define MLPC_WGMMA_PAIR_M64N192K16(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n192k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95" \
        "}, %96, %97, 1, 1, 1, 0, 0;\n" \
        : "+f"(g[0]), "+f"(g[1]), "+f"(g[2]), "+f"(g[3]), "+f"(g[4]), "+f"(g[5]), "+f"(g[6]), "+f"(g[7]), "+f"(g[8]), "+f"(g[9]), "+f"(g[10]), "+f"(g[11]), "+f"(g[12]), "+f"(g[13]), "+f"(g[14]), "+f"(g[15]), "+f"(g[16]), "+f"(g[17]), "+f"(g[18]), "+f"(g[19]), "+f"(g[20]), "+f"(g[21]), "+f"(g[22]), "+f"(g[23]), "+f"(g[24]), "+f"(g[25]), "+f"(g[26]), "+f"(g[27]), "+f"(g[28]), "+f"(g[29]), "+f"(g[30]), "+f"(g[31]), "+f"(g[32]), "+f"(g[33]), "+f"(g[34]), "+f"(g[35]), "+f"(g[36]), "+f"(g[37]), "+f"(g[38]), "+f"(g[39]), "+f"(g[40]), "+f"(g[41]), "+f"(g[42]), "+f"(g[43]), "+f"(g[44]), "+f"(g[45]), "+f"(g[46]), "+f"(g[47]), "+f"(u[0]), "+f"(u[1]), "+f"(u[2]), "+f"(u[3]), "+f"(u[4]), "+f"(u[5]), "+f"(u[6]), "+f"(u[7]), "+f"(u[8]), "+f"(u[9]), "+f"(u[10]), "+f"(u[11]), "+f"(u[12]), "+f"(u[13]), "+f"(u[14]), "+f"(u[15]), "+f"(u[16]), "+f"(u[17]), "+f"(u[18]), "+f"(u[19]), "+f"(u[20]), "+f"(u[21]), "+f"(u[22]), "+f"(u[23]), "+f"(u[24]), "+f"(u[25]), "+f"(u[26]), "+f"(u[27]), "+f"(u[28]), "+f"(u[29]), "+f"(u[30]), "+f"(u[31]), "+f"(u[32]), "+f"(u[33]), "+f"(u[34]), "+f"(u[35]), "+f"(u[36]), "+f"(u[37]), "+f"(u[38]), "+f"(u[39]), "+f"(u[40]), "+f"(u[41]), "+f"(u[42]), "+f"(u[43]), "+f"(u[44]), "+f"(u[45]), "+f"(u[46]), "+f"(u[47]) \
        : "l"(a), "l"(b))

// (g[0..32), u[0..32)) += A * B for m64n128k16 over two stacked B tiles of 64 rows:
// the first 64 columns of the product go to g, the other 64 to u.
#define MLPC_WGMMA_PAIR_M64N128K16(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
        "}, %64, %65, 1, 1, 1, 0, 0;\n" \
        : "+f"(g[0]), "+f"(g[1]), "+f"(g[2]), "+f"(g[3]), "+f"(g[4]), "+f"(g[5]), "+f"(g[6]), "+f"(g[7]), "+f"(g[8]), "+f"(g[9]), "+f"(g[10]), "+f"(g[11]), "+f"(g[12]), "+f"(g[13]), "+f"(g[14]), "+f"(g[15]), "+f"(g[16]), "+f"(g[17]), "+f"(g[18]), "+f"(g[19]), "+f"(g[20]), "+f"(g[21]), "+f"(g[22]), "+f"(g[23]), "+f"(g[24]), "+f"(g[25]), "+f"(g[26]), "+f"(g[27]), "+f"(g[28]), "+f"(g[29]), "+f"(g[30]), "+f"(g[31]), "+f"(u[0]), "+f"(u[1]), "+f"(u[2]), "+f"(u[3]), "+f"(u[4]), "+f"(u[5]), "+f"(u[6]), "+f"(u[7]), "+f"(u[8]), "+f"(u[9]), "+f"(u[10]), "+f"(u[11]), "+f"(u[12]), "+f"(u[13]), "+f"(u[14]), "+f"(u[15]), "+f"(u[16]), "+f"(u[17]), "+f"(u[18]), "+f"(u[19]), "+f"(u[20]), "+f"(u[21]), "+f"(u[22]), "+f"(u[23]), "+f"(u[24]), "+f"(u[25]), "+f"(u[26]), "+f"(u[27]), "+f"(u[28]), "+f"(u[29]), "+f"(u[30]), "+f"(u[31]) \
        : "l"(a), "l"(b))

/// A dual GEMM's gate and up products of one k16 step as one m64n(2 BN)k16 wgmma: the up tile
/// lies right after the gate tile in the stage (BN rows of 128 bytes each, 8-row groups 1024
/// bytes apart), so one descriptor reads both as a 2 BN-row B operand, and the accumulator
/// registers of its first BN columns are the gate's, of the others the up's (A is read once).
template <class T, int BN>
struct MmaPair;

#define MLPC_WGMMA_PAIR(BN, CT, TY, SHAPE) \
    template <> \
    struct MmaPair<CT, BN> { \
        __device__ __forceinline__ static void run(float (&g)[BN / 2], float (&u)[BN / 2], u64 a, \
                                                   u64 b) { \
            MLPC_WGMMA_PAIR_##SHAPE(TY); \
        } \
    };
MLPC_WGMMA_PAIR(128, bf16, "bf16", M64N256K16)
MLPC_WGMMA_PAIR(128, f16, "f16", M64N256K16)
MLPC_WGMMA_PAIR(96, bf16, "bf16", M64N192K16)
MLPC_WGMMA_PAIR(96, f16, "f16", M64N192K16)
MLPC_WGMMA_PAIR(64, bf16, "bf16", M64N128K16)
MLPC_WGMMA_PAIR(64, f16, "f16", M64N128K16)

// The wgmma wrappers of both Hopper kernels (this file's and gemm_bsr_wgmma.cuh's): one
// m64nNk16 step for every N a tile width or a block height may take. TY is the PTX type name of
// A and B; the accumulators are f32.

// d[0..4) += A * B for m64n8k16.
#define MLPC_WGMMA_N8(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n8k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3" \
        "}, %4, %5, 1, 1, 1, 0, 0;\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) \
        : "l"(a), "l"(b))

// d[0..8) += A * B for m64n16k16.
#define MLPC_WGMMA_N16(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7" \
        "}, %8, %9, 1, 1, 1, 0, 0;\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
        : "l"(a), "l"(b))

// d[0..12) += A * B for m64n24k16.
#define MLPC_WGMMA_N24(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n24k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11" \
        "}, %12, %13, 1, 1, 1, 0, 0;\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]) \
        : "l"(a), "l"(b))

// d[0..16) += A * B for m64n32k16.
#define MLPC_WGMMA_N32(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" \
        "}, %16, %17, 1, 1, 1, 0, 0;\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
        : "l"(a), "l"(b))

// d[0..24) += A * B for m64n48k16.
#define MLPC_WGMMA_N48(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n48k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23" \
        "}, %24, %25, 1, 1, 1, 0, 0;\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]) \
        : "l"(a), "l"(b))

// d[0..32) += A * B for m64n64k16.
#define MLPC_WGMMA_N64(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
        "}, %32, %33, 1, 1, 1, 0, 0;\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
        : "l"(a), "l"(b))

// d[0..48) += A * B for m64n96k16.
#define MLPC_WGMMA_N96(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n96k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" \
        "}, %48, %49, 1, 1, 1, 0, 0;\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]) \
        : "l"(a), "l"(b))

// d[0..64) += A * B for m64n128k16.
#define MLPC_WGMMA_N128(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
        "}, %64, %65, 1, 1, 1, 0, 0;\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
        : "l"(a), "l"(b))

// d[0..96) += A * B for m64n192k16.
#define MLPC_WGMMA_N192(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n192k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95" \
        "}, %96, %97, 1, 1, 1, 0, 0;\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]) \
        : "l"(a), "l"(b))

// d[0..128) += A * B for m64n256k16.
#define MLPC_WGMMA_N256(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
        "}, %128, %129, 1, 1, 1, 0, 0;\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
        : "l"(a), "l"(b))

/// `d += A * B` for one m64nNk16 step, A and B through descriptors.
template <class T, int N>
struct Mma;

#define MLPC_WGMMA_MMA(N, CT, TY) \
    template <> \
    struct Mma<CT, N> { \
        __device__ __forceinline__ static void run(float (&d)[N / 2], u64 a, u64 b) { \
            MLPC_WGMMA_N##N(TY); \
        } \
    };
MLPC_WGMMA_MMA(8, bf16, "bf16")
MLPC_WGMMA_MMA(8, f16, "f16")
MLPC_WGMMA_MMA(16, bf16, "bf16")
MLPC_WGMMA_MMA(16, f16, "f16")
MLPC_WGMMA_MMA(24, bf16, "bf16")
MLPC_WGMMA_MMA(24, f16, "f16")
MLPC_WGMMA_MMA(32, bf16, "bf16")
MLPC_WGMMA_MMA(32, f16, "f16")
MLPC_WGMMA_MMA(48, bf16, "bf16")
MLPC_WGMMA_MMA(48, f16, "f16")
MLPC_WGMMA_MMA(64, bf16, "bf16")
MLPC_WGMMA_MMA(64, f16, "f16")
MLPC_WGMMA_MMA(96, bf16, "bf16")
MLPC_WGMMA_MMA(96, f16, "f16")
MLPC_WGMMA_MMA(128, bf16, "bf16")
MLPC_WGMMA_MMA(128, f16, "f16")
MLPC_WGMMA_MMA(192, bf16, "bf16")
MLPC_WGMMA_MMA(192, f16, "f16")
MLPC_WGMMA_MMA(256, bf16, "bf16")
MLPC_WGMMA_MMA(256, f16, "f16")

/// `d += A * B` for one m64nNk16 step, A from registers (the warp's fragment), B through a
/// descriptor. The block heights a grouped kernel with A_REGS may have.
template <class T, int N>
struct MmaRs;

#define MLPC_WGMMA_RS_N16(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7" \
        "}, {%8, %9, %10, %11}, %12, 1, 1, 1, 0;\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))

#define MLPC_WGMMA_RS_N32(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" \
        "}, {%16, %17, %18, %19}, %20, 1, 1, 1, 0;\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))

#define MLPC_WGMMA_RS_N64(TY) \
    asm volatile( \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
        "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))

#define MLPC_WGMMA_MMA_RS(N, CT, TY) \
    template <> \
    struct MmaRs<CT, N> { \
        __device__ __forceinline__ static void run(float (&d)[N / 2], const u32 (&a)[4], u64 b) { \
            MLPC_WGMMA_RS_N##N(TY); \
        } \
    };
MLPC_WGMMA_MMA_RS(16, bf16, "bf16")
MLPC_WGMMA_MMA_RS(16, f16, "f16")
MLPC_WGMMA_MMA_RS(32, bf16, "bf16")
MLPC_WGMMA_MMA_RS(32, f16, "f16")
MLPC_WGMMA_MMA_RS(64, bf16, "bf16")
MLPC_WGMMA_MMA_RS(64, f16, "f16")

#undef MLPC_WGMMA_N8
#undef MLPC_WGMMA_N16
#undef MLPC_WGMMA_N24
#undef MLPC_WGMMA_N32
#undef MLPC_WGMMA_N48
#undef MLPC_WGMMA_N64
#undef MLPC_WGMMA_N96
#undef MLPC_WGMMA_N128
#undef MLPC_WGMMA_N192
#undef MLPC_WGMMA_N256
#undef MLPC_WGMMA_RS_N16
#undef MLPC_WGMMA_RS_N32
#undef MLPC_WGMMA_RS_N64
#undef MLPC_WGMMA_MMA
#undef MLPC_WGMMA_MMA_RS


/// Initialises the mbarrier at shared address `bar` for `count` arrivals per phase.
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

/// Makes the initialised barriers visible to the async proxy (the copy engine completes on them).
__device__ __forceinline__ void mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/// One arrival that also announces `bytes` more bytes of transactions for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/// A word of shared memory, written and read in program order with the barrier operations
/// around it (a value published before an mbarrier arrival, read after the matching wait).
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ u32 ld_shared_u32(u32 addr) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

/// Waits until the phase of parity `parity` of the barrier has completed (a fresh barrier is in
/// phase 0: waiting for parity 1 returns at once, for parity 0 blocks until phase 0 completes).
/// Default semantics, acquire at CTA scope, also for the empty barriers the peer CTA of a cluster
/// arrives on: the producer that waits there reads nothing the peer wrote, it only issues a copy
/// over a stage whose readers have finished (see `mbar_arrive_cluster`).
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done = 0;
    do {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

/// Copy engine: the box of `map` at element coordinates (x = k, y = row) into shared memory at
/// `dst`, completing `box bytes` of transactions on the barrier `bar`. Elements outside the
/// tensor are written as zero.
__device__ __forceinline__ void tma_load_2d(u32 dst, const TensorMap& map, int x, int y, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<u64>(&map)), "r"(x), "r"(y), "r"(bar)
        : "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const TensorMap& map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(&map)) : "memory");
}

/// `tma_load_2d` into the shared memory of every CTA of the cluster whose bit is set in
/// `cta_mask`: the box lands at offset `dst` of each, and its bytes complete on the barrier at
/// offset `bar` of each.
__device__ __forceinline__ void tma_load_2d_multicast(u32 dst, const TensorMap& map, int x, int y,
                                                      u32 bar, u16 cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
        "l"(reinterpret_cast<u64>(&map)), "r"(x), "r"(y), "r"(bar), "h"(cta_mask)
        : "memory");
}

/// This CTA's rank in its cluster.
__device__ __forceinline__ u32 cluster_ctarank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

/// A barrier over every thread of every CTA of the cluster (each warp converged): what each
/// wrote to shared memory, or initialised, before it is visible to all after it.
__device__ __forceinline__ void cluster_sync() {
    asm volatile(
        "barrier.cluster.arrive.release.aligned;\n"
        "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

/// One arrival on the barrier at shared address `bar` of the cluster's CTA `cta` (the same offset
/// in its shared memory), with the default semantics (release at CTA scope). What it announces
/// is that this CTA's wgmmas have finished reading a stage (`wgmma.wait_group` returned before
/// it), not data for the peer to read: a release at cluster scope would add a memory barrier
/// (MEMBAR) before every arrival, which ncu showed stalling the consumer warps (2026-11-30:
/// 44 % of their stalls, the 4096^2 GEMM 0.43 -> 0.51 ms with clusters).
__device__ __forceinline__ void mbar_arrive_cluster(u32 bar, u32 cta) {
    asm volatile(
        "{\n"
        ".reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
        "}\n" ::"r"(bar), "r"(cta)
        : "memory");
}

/// Copy engine, the other way: the box of `map` at element coordinates (x = column, y = row)
/// from shared memory at `src`, in this thread's bulk group (`bulk_commit`). Elements outside the
/// tensor are not written.
__device__ __forceinline__ void tma_store_2d(const TensorMap& map, int x, int y, u32 src) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
            reinterpret_cast<u64>(&map)),
        "r"(x), "r"(y), "r"(src)
        : "memory");
}

__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

/// Waits until at most N of this thread's bulk groups have not finished reading their shared
/// memory (the buffers of the others may be written again).
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

/// Waits until every bulk group of this thread is complete (its writes done).
__device__ __forceinline__ void bulk_wait_all() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

/// Four 8 x 8 matrices of 16-bit values from the warp's registers into shared memory: lane l
/// gives the address of row l % 8 of matrix l / 8 and holds, in `r[j]`, its two values of row
/// l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix j (the accumulator fragment's layout).
__device__ __forceinline__ void stmatrix_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

/// Register budget handover between warpgroups (sm_90a): the producer gives registers up, the
/// consumers take them.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/// Copies rows [row0, row0 + ROWS) x k [k0, k0 + 64) of a row-major matrix (`rows` x `k`, row
/// stride `ld`, k contiguous) into the swizzled tile at shared address `dst`, zero-filling
/// everything outside the matrix. Thread `tid` copies chunk c = tid % 8 of the rows
/// tid / 8 + p * (THREADS / 8), p = 0, 1, ...: eight consecutive threads cover one 128-byte row
/// segment, and since THREADS / 8 is a multiple of 8 every row of a thread has the same swizzle
/// (r % 8), so one shared address and one global pointer per thread, stepped by constants, cover
/// all its chunks. `vec`: the base is 16-byte aligned and `ld` a multiple of 8, so each chunk is
/// one 16-byte cp.async (a chunk straddling k copies fewer bytes and zero-fills the rest).
template <class T, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(u32 dst, const T* g, i64 ld, i64 row0, i64 k0, i64 rows,
                                          i64 k, bool vec, int tid) {
    constexpr int kRowsPerPass = THREADS / 8;
    constexpr int kPasses = ceil_div(ROWS, kRowsPerPass);
    static_assert(kRowsPerPass % 8 == 0, "every pass must keep the rows' swizzle phase");
    const int r0 = tid >> 3;
    const int c = tid & 7;
    const u32 s0 = dst + chunk_offset(r0, c);
    const i64 gk = k0 + c * 8;
    const i64 gr0 = row0 + r0;
    if (vec) {
        const int kbytes = gk < k ? (k - gk >= 8 ? 16 : (int)(k - gk) * 2) : 0;
        const T* src0 = g + gr0 * ld + gk;
#pragma unroll
        for (int pass = 0; pass < kPasses; ++pass) {
            const int r = r0 + pass * kRowsPerPass;
            if (ROWS % kRowsPerPass != 0 && r >= ROWS) break;
            const int bytes = gr0 + pass * kRowsPerPass < rows ? kbytes : 0;
            // A chunk that reads nothing still needs a valid address.
            const T* src = bytes > 0 ? src0 + (i64)pass * kRowsPerPass * ld : g;
            mma_detail::cp_async_16(s0 + pass * kRowsPerPass * 128, src, bytes);
        }
    } else {
#pragma unroll
        for (int pass = 0; pass < kPasses; ++pass) {
            const int r = r0 + pass * kRowsPerPass;
            if (ROWS % kRowsPerPass != 0 && r >= ROWS) break;
            const i64 gr = gr0 + pass * kRowsPerPass;
            const bool row_in = gr < rows;
            const T* src = g + (row_in ? gr * ld : 0);
            u32 w[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const i64 c0 = gk + 2 * e;
                const u32 lo = (row_in && c0 < k) ? src[c0].bits : 0u;
                const u32 hi = (row_in && c0 + 1 < k) ? src[c0 + 1].bits : 0u;
                w[e] = lo | (hi << 16);
            }
            mma_detail::st_shared_v4(s0 + pass * kRowsPerPass * 128, w[0], w[1], w[2], w[3]);
        }
    }
}

/// The first pass of `store_tile`: the epilogue chain of every element in place in `acc`; with
/// `kChecked` only for the rows and columns inside the output.
template <bool kChecked, class T, int BN, bool kDual, class Epi, class P, int NACC, int NUP>
__device__ __forceinline__ void epilogue_pass(float (&acc)[NACC], const float (&acc_up)[NUP],
                                              i64 rbase, i64 cbase, const P& p) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const i64 row = rbase + h * 8;
        if (kChecked && row >= p.m) continue;
#pragma unroll
        for (int i = 0; i < BN / 8; ++i) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const i64 col = cbase + i * 8 + e;
                const int r = 4 * i + 2 * h + e;
                if (!kChecked || col < p.n) {
                    const float up = kDual ? acc_up[kDual ? r : 0] : 0.0f;
                    acc[r] = Epi::apply(acc[r], up, row, col, p);
                }
            }
        }
    }
}

/// The stores of column groups I0 .. I1 - 1 of a lane's two rows (`rbase`, `rbase` + 8), group i
/// at columns `cbase` + 8i, + 1 in registers 4i + 2h, + 1 of row half h (the wgmma accumulator
/// layout): pairs as one word when `kPairs`, and with `kChecked` only the rows and columns inside
/// the output. `pair(r)` is registers r, r + 1 packed; `one(r)` register r as T.
template <bool kChecked, bool kPairs, int I0, int I1, class T, class P, class Pair, class One>
__device__ __forceinline__ void store_groups(i64 rbase, i64 cbase, const P& p, Pair&& pair,
                                             One&& one) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const i64 row = rbase + h * 8;
        if (kChecked && row >= p.m) continue;
        T* out_row = p.c + row * p.ldc;
#pragma unroll
        for (int i = I0; i < I1; ++i) {
            const i64 col = cbase + i * 8;
            if (kChecked && col >= p.n) continue;
            const int r = 4 * i + 2 * h;
            if (!kChecked || col + 1 < p.n) {
                if (kPairs) {
                    *reinterpret_cast<u32*>(out_row + col) = pair(r);
                } else {
                    out_row[col] = one(r);
                    out_row[col + 1] = one(r + 1);
                }
            } else {
                out_row[col] = one(r);
            }
        }
    }
}

/// Stores a row's 16 columns held by a quad as pairs (lane t: columns 2t, 2t + 1 in `p0` and
/// 8 + 2t, 9 + 2t in `p1`) as one 8-byte store per lane (lane t: columns 4t .. 4t + 3), so that
/// the quad writes the row's whole 32-byte sector in one instruction instead of halves of it in
/// two. `out` is the row at the first of the 16 columns, 8-byte aligned; every lane of the warp
/// must take part.
template <class T>
__device__ __forceinline__ void store_sector(T* out, u32 p0, u32 p1) {
    const int lane = (int)(threadIdx.x & 31);
    const int t = lane & 3;
    const int lo_src = (lane & ~3) | ((2 * t) & 3);
    const int hi_src = (lane & ~3) | ((2 * t + 1) & 3);
    const u32 lo0 = __shfl_sync(0xffffffffu, p0, lo_src);
    const u32 lo1 = __shfl_sync(0xffffffffu, p1, lo_src);
    const u32 hi0 = __shfl_sync(0xffffffffu, p0, hi_src);
    const u32 hi1 = __shfl_sync(0xffffffffu, p1, hi_src);
    *reinterpret_cast<uint2*>(out + 4 * t) = make_uint2(t < 2 ? lo0 : lo1, t < 2 ? hi0 : hi1);
}

/// `store_groups` for groups wholly inside the output with 8-byte aligned rows: each pair of
/// neighbouring groups as whole sectors (`store_sector`).
template <int I0, int I1, class T, class P, class Pair>
__device__ __forceinline__ void store_groups_sectors(i64 rbase, i64 cbase, const P& p,
                                                     Pair&& pair) {
    static_assert((I1 - I0) % 2 == 0, "whole 16-column groups");
    // cbase is the quad's column 2t; the groups start 2t columns before it.
    const i64 c0 = cbase - (threadIdx.x & 3) * 2;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        T* out_row = p.c + (rbase + h * 8) * p.ldc + c0;
#pragma unroll
        for (int i = I0; i < I1; i += 2) {
            const int r = 4 * i + 2 * h;
            store_sector<T>(out_row + i * 8, pair(r), pair(r + 4));
        }
    }
}

/// The epilogue of one warpgroup's 64 x BN accumulator tile whose first output row is `row0` and
/// first column `n0`: d[4i + 2h + e] is C[row0 + 16q + g + 8h][n0 + 8i + 2t + e] (q = warp in the
/// warpgroup, g = lane / 4, t = lane % 4; `wtid` = thread index in the warpgroup). Applies the
/// epilogue chain and stores bf16 / f16 pairs; rows past M and columns past N are not written.
///
/// Two passes: first every element's epilogue (its operand loads: bias, residual) in place in
/// `acc`, then every store. Interleaved, each operand load would wait behind the stores before
/// it (the compiler cannot prove that the output does not alias the operands), so each element
/// would pay a full load latency in turn; split, the loads of a whole tile are in flight at once.
/// A tile wholly inside the output (the common case) takes both passes without bounds checks
/// (`kChecked = false`), so that no load hides behind a predicate.
template <class T, int BN, bool kDual, class Epi, class P, int NACC, int NUP>
__device__ __forceinline__ void store_tile(float (&acc)[NACC], const float (&acc_up)[NUP],
                                           i64 row0, i64 n0, int wtid, const P& p) {
    const int lane = wtid & 31;
    const int q = wtid >> 5;
    const i64 rbase = row0 + q * 16 + (lane >> 2);
    const i64 cbase = n0 + (lane & 3) * 2;
    const bool pair_ok = is_aligned(p.c, 4) && (p.ldc % 2 == 0);
    auto pair = [&](int r) { return pack2<T>(acc[r], acc[r + 1]); };
    auto one = [&](int r) { return from_f32<T>(acc[r]); };
    constexpr int kGroups = BN / 8;
    if (row0 + 64 <= p.m && n0 + BN <= p.n) {
        epilogue_pass<false, T, BN, kDual, Epi>(acc, acc_up, rbase, cbase, p);
        if constexpr (BN % 16 == 0) {
            if (is_aligned(p.c, 8) && p.ldc % 4 == 0 && n0 % 4 == 0) {
                store_groups_sectors<0, kGroups, T>(rbase, cbase, p, pair);
                return;
            }
        }
        if (pair_ok) {
            store_groups<false, true, 0, kGroups, T>(rbase, cbase, p, pair, one);
            return;
        }
    } else {
        epilogue_pass<true, T, BN, kDual, Epi>(acc, acc_up, rbase, cbase, p);
    }
    if (pair_ok) {
        store_groups<true, true, 0, kGroups, T>(rbase, cbase, p, pair, one);
    } else {
        store_groups<true, false, 0, kGroups, T>(rbase, cbase, p, pair, one);
    }
}

/// Bytes of one staging buffer of `store_tile_tma`: 64 rows x 64 columns of 16-bit values.
constexpr int kStagingBufferBytes = 64 * 64 * 2;

/// The stores of one 64 x 64 chunk of a consumer warpgroup's 64-row band by the copy engine, at
/// row `row0` and column `col0` of the output (`wtid`: the warpgroup's thread). `pair(i, h)` is
/// the lane's two packed values of column group i (< 8) and row half h of the chunk in the wgmma
/// accumulator layout (acc[4 g + 2 h], acc[4 g + 2 h + 1] of column group g). They go into one
/// of the warpgroup's kBuffers (2 or 1) staging buffers at `staging` (`stmatrix`, rows of 128
/// bytes with the 128-byte swizzle: 16-byte chunk c of row r at position c ^ (r % 8), the layout
/// of `map_c`'s box, 64 x 64), then the warpgroup's first thread issues one `tma_store_2d` of the
/// chunk. The copy engine clips rows past M and columns past N. `chunk` counts the warpgroup's
/// chunks over the whole kernel and picks the buffer: before a buffer is written again, the
/// store that read it kBuffers chunks before has finished reading (`bulk_wait_read<kBuffers -
/// 1>`, then the warpgroup's named barrier `bar`); with two, the other buffer's store may still
/// run under the next chunk's writes. The warpgroup's first thread must `bulk_wait_all` before
/// the kernel ends.
template <int kBuffers = 2, class Pair>
__device__ __forceinline__ void store_chunk_tma(const TensorMap& map_c, i64 row0, i64 col0,
                                                int wtid, u32 staging, int bar, u32& chunk,
                                                Pair&& pair) {
    const int lane = wtid & 31;
    const int q = wtid >> 5;
    // Lane l addresses row r = 16 q + 8 h + l % 8 of matrix j = l / 8 (h = j % 2; column group
    // i + j / 2): every row of a lane has r % 8 = l % 8.
    const int j = lane >> 3;
    const u32 row_addr = (u32)((16 * q + 8 * (j & 1) + (lane & 7)) * 128);
    const int swz = lane & 7;
    static_assert(kBuffers == 1 || kBuffers == 2, "one or two staging buffers");
    const u32 buf = staging + (kBuffers == 2 ? (chunk & 1u) * kStagingBufferBytes : 0u);
    if (wtid == 0) bulk_wait_read<kBuffers - 1>();
    named_sync<128>(bar);
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
        const u32 addr = buf + row_addr + (u32)((((i + (j >> 1)) ^ swz)) << 4);
        stmatrix_x4(addr, pair(i, 0), pair(i, 1), pair(i + 1, 0), pair(i + 1, 1));
    }
    fence_proxy_async();
    named_sync<128>(bar);
    if (wtid == 0) {
        tma_store_2d(map_c, (int)col0, (int)row0, buf);
        bulk_commit();
    }
    ++chunk;
}

/// The epilogue of `store_tile` with the stores by the copy engine: the epilogue chain in place
/// in `acc` (`epilogue_pass`), then each 64-column chunk of the 64 x BN band by
/// `store_chunk_tma` (its comment has the buffer protocol; `staging`, `bar` and `chunk` are its).
/// A band of 96 columns (a dual GEMM's 96-wide ping-pong tile) stores its last 32 from
/// registers: the output's 64-wide box would also write the next tile's first 32.
template <class T, int BN, bool kDual, class Epi, class P, int NACC, int NUP>
__device__ __forceinline__ void store_tile_tma(float (&acc)[NACC], const float (&acc_up)[NUP],
                                               i64 row0, i64 n0, int wtid, const P& p,
                                               const TensorMap& map_c, u32 staging, int bar,
                                               u32& chunk) {
    static_assert(BN % 32 == 0, "whole 64-column chunks and at most a 32-column tail");
    const int lane = wtid & 31;
    const int q = wtid >> 5;
    const i64 rbase = row0 + q * 16 + (lane >> 2);
    const i64 cbase = n0 + (lane & 3) * 2;
    // A trailing ReLU runs on the packed pairs (`relu2`: one instruction a pair, not one an
    // element; docs/perf-notes.md, dense variant 3x).
    constexpr bool kPackedRelu = TrailingRelu<Epi>::kRelu;
    using Before = typename PickType<kPackedRelu, typename TrailingRelu<Epi>::Rest, Epi>::type;
    const bool whole = row0 + 64 <= p.m && n0 + BN <= p.n;
    if (whole) {
        epilogue_pass<false, T, BN, kDual, Before>(acc, acc_up, rbase, cbase, p);
    } else {
        epilogue_pass<true, T, BN, kDual, Before>(acc, acc_up, rbase, cbase, p);
    }
    auto packed = [&](int r) {
        const u32 w = pack2<T>(acc[r], acc[r + 1]);
        return kPackedRelu ? relu2<T>(w) : w;
    };
#pragma unroll
    for (int c = 0; c < BN / 64; ++c) {
        if (n0 + 64 * c >= p.n) break;
        // Column group i of the chunk is the band's column group 8 c + i.
        store_chunk_tma(map_c, row0, n0 + 64 * c, wtid, staging, bar, chunk,
                        [&](int i, int h) { return packed(4 * (8 * c + i) + 2 * h); });
    }
    if constexpr (BN % 64 != 0) {
        // The tail's column groups: whole sectors inside the output (the output's rows are
        // 16-byte multiples apart, as its tensor map needs), else pairs and single values.
        constexpr int kFirst = BN / 64 * 8;
        if (whole) {
            store_groups_sectors<kFirst, BN / 8, T>(rbase, cbase, p, packed);
        } else {
            store_groups<true, true, kFirst, BN / 8, T>(
                rbase, cbase, p, packed,
                [&](int r) { return from_f32<T>(kPackedRelu ? fmaxf(acc[r], 0.0f) : acc[r]); });
        }
    }
}

/// Split K (`WgmmaTmaConfig::kSplitK`): the fixed part of the workspace, one counter per
/// (tile, consumer warpgroup) of a launch; the partial tiles follow it. Every counter is zero
/// between launches (the runtime allocates the workspace zeroed, and the warpgroup that finds a
/// tile's count complete sets it back to zero), so kernels of one stream may share a workspace.
constexpr int kSplitCounters = 4096;

/// A named barrier of `THREADS` threads that also reduces a predicate: true in every thread when
/// it was true in any (`bar.red.or.pred`).
template <int THREADS>
__device__ __forceinline__ bool named_sync_or(int id, bool v) {
    u32 r;
    asm volatile(
        "{\n\t.reg .pred p, q;\n\tsetp.ne.u32 q, %1, 0;\n\tbar.red.or.pred p, %2, %3, q;\n\t"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(r)
        : "r"((u32)v), "r"(id), "n"(THREADS)
        : "memory");
    return r != 0;
}

/// Four f32 values from shared address `addr` (16-byte aligned), in program order with the other
/// volatile asm (after a `cp.async` wait).
__device__ __forceinline__ float4 ld_shared_f4(u32 addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

/// `d[i .. i + 4] = v` when `set`, else `+= v`.
template <int N>
__device__ __forceinline__ void add4(float (&d)[N], int i, float4 v, bool set) {
    d[i] = set ? v.x : d[i] + v.x;
    d[i + 1] = set ? v.y : d[i + 1] + v.y;
    d[i + 2] = set ? v.z : d[i + 2] + v.z;
    d[i + 3] = set ? v.w : d[i + 3] + v.w;
}

/// The split-K exchange of one consumer warpgroup (`wtid`: its thread) for its `NB` 64-row bands
/// `band0 ..` of a tile, after its main loop over split `q` of `splits`: `acc` (and `acc_up`)
/// hold the sums over that split's k slices. The warpgroup stores them to the partial tile of
/// its work item (`own`, a slot of `floats` values; band b at b x 64 x BN x (1 or 2), each
/// thread's values as float4 columns of 128 threads, so that every store and load is one
/// coalesced 2 KB row), then its first thread counts the item in on `counter`. The warpgroup
/// that counts a tile's last split in reads every split's partial tile (`first`: split 0's slot;
/// the slots of a tile are consecutive) through shared memory at `smem` (the warpgroup's
/// `NB x 64 x BN` f32 values, twice for a dual GEMM, free for it) and adds them in split order
/// into `acc`, so the sum does not depend on which split finished last, sets the counter back to
/// zero and returns true: it runs the epilogue. The others return false. `bar`: a named barrier
/// of the warpgroup.
template <int BN, bool kDual, int NB, int NACC, int NUP>
__device__ __forceinline__ bool split_exchange(float (&acc)[NB][NACC], float (&acc_up)[NB][NUP],
                                               float* own, const float* first, i64 splits,
                                               i64 floats, int band0, u32* counter, int wtid,
                                               int bar, u32 smem) {
    constexpr int kBandFloats = 64 * BN * (kDual ? 2 : 1);
    constexpr int kChunks = NACC / 4;
    static_assert(NACC % 4 == 0, "float4 columns");
    const int off = wtid * 4;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
        float* dst = own + (i64)(band0 + b) * kBandFloats + off;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
            __stcg(reinterpret_cast<float4*>(dst + c * 512),
                   make_float4(acc[b][4 * c], acc[b][4 * c + 1], acc[b][4 * c + 2],
                               acc[b][4 * c + 3]));
            if constexpr (kDual) {
                __stcg(reinterpret_cast<float4*>(dst + NACC * 128 + c * 512),
                       make_float4(acc_up[b][4 * c], acc_up[b][4 * c + 1], acc_up[b][4 * c + 2],
                                   acc_up[b][4 * c + 3]));
            }
        }
    }
    // Every thread's partial values are visible device-wide before the first thread counts the
    // item in; the warpgroup that completes the count sees every split's (threadFenceReduction).
    __threadfence();
    named_sync<128>(bar);
    bool last = false;
    if (wtid == 0) {
        last = atomicAdd(counter, 1u) == (u32)(splits - 1);
        if (last) {
            *counter = 0u;
            __threadfence();
        }
    }
    if (!named_sync_or<128>(bar, last)) return false;
    // Split by split: this thread's float4 columns copied into shared memory without passing
    // through registers (cp.async, all in flight at once), then added from there, so that
    // nothing but the accumulators stays live (the loads straight into registers spilled).
    // Each thread reads back only what it copied, so no barrier is needed.
    constexpr int kCols = NB * kChunks;
    // This thread's float4 column j (the up accumulators' after the gate's) in shared memory.
    auto at = [&](int j) { return smem + (u32)((j * 128 + wtid) * 16); };
    // Split 0 sets the sums, the others add to them.
    auto take = [&](const float* split, bool set) {
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            const float* src = split + (i64)(band0 + b) * kBandFloats + off;
#pragma unroll
            for (int c = 0; c < kChunks; ++c) {
                mma_detail::cp_async_16(at(b * kChunks + c), src + c * 512, 16);
                if constexpr (kDual) {
                    mma_detail::cp_async_16(at(kCols + b * kChunks + c), src + NACC * 128 + c * 512,
                                            16);
                }
            }
        }
        mma_detail::cp_async_commit();
        mma_detail::cp_async_wait<0>();
#pragma unroll
        for (int b = 0; b < NB; ++b) {
#pragma unroll
            for (int c = 0; c < kChunks; ++c) {
                add4(acc[b], 4 * c, ld_shared_f4(at(b * kChunks + c)), set);
                if constexpr (kDual) {
                    add4(acc_up[b], 4 * c, ld_shared_f4(at(kCols + b * kChunks + c)), set);
                }
            }
        }
        // The next split's copies overwrite what these adds read.
        asm volatile("" ::: "memory");
    };
    take(first, true);
#pragma unroll 1
    for (i64 s = 1; s < splits; ++s) take(first + s * floats, false);
    return true;
}

}  // namespace wgmma_detail

/// The Hopper GEMM. `T` is `bf16` or `f16`; `LA` must be `Layout::N` and `LB` `Layout::T`; `Cfg` a
/// `WgmmaConfig`; `Epi` a `SingleEpilogue` or `DualEpilogue`. Launch with `kThreads` threads,
/// grid `(ceil(M / BM), ceil(N / BN))` and `kSmemBytes` bytes of dynamic shared memory; compile
/// for sm_90a.
template <class T, Layout LA, Layout LB, class Cfg, class Epi>
struct GemmWgmma {
    static_assert(LA == Layout::N && LB == Layout::T,
                  "the wgmma path reads both operands K-major: A [M, K] and B [N, K] row-major");
    static constexpr bool kDual = Epi::kDual;
    static constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
    static constexpr int kThreads = Cfg::kThreads;
    static constexpr int kTileABytes = BM * BK * 2;
    static constexpr int kTileBBytes = BN * BK * 2;
    static constexpr int kStageBytes = kTileABytes + kTileBBytes * (kDual ? 2 : 1);
    /// The ring plus 1024 bytes to align its base to the swizzle pattern.
    static constexpr int kSmemBytes = STAGES * kStageBytes + 1024;
    /// Accumulator registers per thread and product.
    static constexpr int kAcc = BN / 2;
    static_assert(kTileABytes % 1024 == 0 && kTileBBytes % 1024 == 0,
                  "every tile must start on a 1024-byte swizzle boundary");

    /// Loads the 64-deep slice `kt` of A and B (and Bu) into the stage at shared address `stage`.
    template <class P>
    __device__ __forceinline__ static void load_stage(u32 stage, const P& p, i64 m0, i64 n0,
                                                      i64 kt, bool vec_a, bool vec_b,
                                                      bool vec_bu, int tid) {
        using wgmma_detail::load_tile;
        const i64 k0 = kt * BK;
        load_tile<T, BM, kThreads>(stage, p.a, p.lda, m0, k0, p.m, p.k, vec_a, tid);
        load_tile<T, BN, kThreads>(stage + kTileABytes, p.b, p.ldb, n0, k0, p.n, p.k, vec_b, tid);
        if constexpr (kDual) {
            load_tile<T, BN, kThreads>(stage + kTileABytes + kTileBBytes, p.b_up, p.ldb_up, n0, k0,
                                       p.n, p.k, vec_bu, tid);
        }
    }

    template <class P>
    __device__ __forceinline__ static void run(const P& p) {
        using namespace wgmma_detail;
        extern __shared__ __align__(1024) unsigned char mlpc_smem[];
        const u32 ring = (smem_addr(mlpc_smem) + 1023u) & ~1023u;

        const int tid = (int)threadIdx.x;
        const int wg = tid >> 7;
        const i64 m0 = (i64)blockIdx.x * BM;
        const i64 n0 = (i64)blockIdx.y * BN;

        const bool vec_a = is_aligned(p.a, 16) && (p.lda % 8 == 0);
        const bool vec_b = is_aligned(p.b, 16) && (p.ldb % 8 == 0);
        const bool vec_bu = kDual && is_aligned(p.b_up, 16) && (p.ldb_up % 8 == 0);

        float acc[kAcc];
        float acc_up[kDual ? kAcc : 1];
#pragma unroll
        for (int i = 0; i < kAcc; ++i) {
            acc[i] = 0.0f;
            if constexpr (kDual) acc_up[i] = 0.0f;
        }

        const i64 ktiles = ceil_div(p.k, (i64)BK);

        // Prologue: slices 0 .. STAGES - 3 in flight, one commit group each.
#pragma unroll
        for (int s = 0; s < STAGES - 2; ++s) {
            if (s < ktiles) {
                load_stage(ring + s * kStageBytes, p, m0, n0, s, vec_a, vec_b, vec_bu, tid);
            }
            mma_detail::cp_async_commit();
        }

        int read_stage = 0;
        int write_stage = STAGES - 2;
        for (i64 kt = 0; kt < ktiles; ++kt) {
            mma_detail::cp_async_wait<STAGES - 3>();
            fence_proxy_async();
            __syncthreads();

            const u32 sa = ring + read_stage * kStageBytes;
            const u64 da = make_desc(sa + wg * (64 * 128));
            const u64 db = make_desc(sa + kTileABytes);
            const u64 dbu = make_desc(sa + kTileABytes + kTileBBytes);
            fence_regs(acc);
            if constexpr (kDual) fence_regs(acc_up);
            fence();
#pragma unroll
            for (int j = 0; j < BK / 16; ++j) {
                // k step j: 32 bytes further along every row, +2 in the encoded start address.
                Mma<T, BN>::run(acc, da + 2 * j, db + 2 * j);
                if constexpr (kDual) Mma<T, BN>::run(acc_up, da + 2 * j, dbu + 2 * j);
            }
            commit();
            fence_regs(acc);
            if constexpr (kDual) fence_regs(acc_up);

            // The stage of slice kt - 2: every warpgroup finished it before the barrier above.
            const i64 pre = kt + STAGES - 2;
            if (pre < ktiles) {
                load_stage(ring + write_stage * kStageBytes, p, m0, n0, pre, vec_a, vec_b, vec_bu,
                           tid);
            }
            mma_detail::cp_async_commit();
            read_stage = read_stage + 1 == STAGES ? 0 : read_stage + 1;
            write_stage = write_stage + 1 == STAGES ? 0 : write_stage + 1;

            wait<1>();
            fence_regs(acc);
            if constexpr (kDual) fence_regs(acc_up);
        }
        wait<0>();
        fence_regs(acc);
        if constexpr (kDual) fence_regs(acc_up);
        mma_detail::cp_async_wait<0>();

        // Epilogue: d[4i + 2h + e] is C[16q + g + 8h][8i + 2t + e] of the warpgroup's 64 rows.
        store_tile<T, BN, kDual, Epi>(acc, acc_up, m0 + wg * 64, n0, tid & 127, p);
    }
};

/// A `GemmWgmmaTma` configuration: BM x BN tiles, STAGES shared-memory stages of 64-deep k
/// slices, tiles visited in groups of GROUP_M row tiles, CTAS CTAs per SM.
///
/// - CTAS = 1: BM / 64 consumer warpgroups (one 64-row band of the tile each; with BM = 256 two,
///   each computing two bands: two m64nBNk16 per k16 step on one B slice) and a producer
///   warpgroup; `setmaxnreg` moves registers from the producer (40) to the consumers (232).
/// - CTAS = 1, PINGPONG: two consumer warpgroups, each computing whole tiles (every 64-row band)
///   and taking the CTA's tiles in turn, and a producer warpgroup with the register handover:
///   one warpgroup's epilogue runs while the other's wgmmas keep the tensor cores busy. A
///   warpgroup then holds the accumulators of every band (both of them for a dual GEMM, whose
///   ping-pong tiles are therefore 64 or 96 wide).
/// - CTAS = 2: one consumer warpgroup computing every 64-row band of the tile and a producer warp
///   (no register handover: `__launch_bounds__(kThreads, 2)` leaves each thread 200 registers),
///   half the shared memory each: one CTA's epilogue runs while the other's wgmmas keep the
///   tensor cores busy.
template <int BM_, int BN_, int STAGES_, int GROUP_M_, int CTAS_ = 1, bool PINGPONG_ = false,
          int CLUSTER_ = 1, bool SHARE_B_ = false, bool TMA_STORE_ = false, bool SPLIT_K_ = false>
struct WgmmaTmaConfig {
    static constexpr int BM = BM_, BN = BN_, BK = 64, STAGES = STAGES_, GROUP_M = GROUP_M_;
    static constexpr int CTAS = CTAS_;
    static constexpr bool kPingpong = PINGPONG_;
    /// CTAs of a cluster: 2 takes neighbouring column tiles of one row tile, each CTA copying
    /// half of the A tile into both (TMA multicast); with SHARE_B, neighbouring row tiles of one
    /// column tile, each CTA copying half of the B tile (and Bu) into both.
    static constexpr int CLUSTER = CLUSTER_;
    static constexpr bool kShareB = SHARE_B_;
    /// The epilogue stores through shared memory and the copy engine (`store_tile_tma`; the
    /// output's tensor map `map_c`) instead of from registers (`store_tile`).
    static constexpr bool kTmaStore = TMA_STORE_;
    /// The k slices of a tile may be split over several CTAs when the grid has at least two CTAs
    /// per tile (the runtime's rule, mlpc-codegen's `SplitK`): partial tiles in a workspace,
    /// summed by the last CTA of each tile (`split_exchange`).
    static constexpr bool kSplitK = SPLIT_K_;
    /// Consumer warpgroups: two with one CTA per SM (a 256-row tile gives each two 64-row
    /// bands), one for a CTA's whole tile with two CTAs per SM.
    static constexpr int kConsumers = kPingpong ? 2 : (CTAS == 1 ? (BM >= 128 ? 2 : 1) : 1);
    /// 64-row bands per consumer warpgroup.
    static constexpr int kBands = kPingpong ? BM / 64 : BM / 64 / kConsumers;
    static constexpr int kProducerThreads = CTAS == 1 ? 128 : 32;
    static constexpr int kThreads = kConsumers * 128 + kProducerThreads;
    static constexpr bool kHandover = CTAS == 1;
    static constexpr int kProducerRegs = 40;
    static constexpr int kConsumerRegs = 232;
    static_assert(CTAS == 1 || CTAS == 2, "one or two CTAs per SM");
    static_assert(!kPingpong || CTAS == 1, "the ping-pong schedule runs one CTA per SM");
    static_assert(CLUSTER == 1 || (CLUSTER == 2 && CTAS == 1 && BM >= 128),
                  "clusters of two CTAs, one per SM, each copying half of the A rows");
    static_assert(!kShareB || CLUSTER == 2, "sharing B takes clusters of two");
    static_assert(!kSplitK || CLUSTER == 1, "split K takes CTAs without clusters");
    static_assert(BM == 64 || BM == 128 || BM == 256, "BM must be 64, 128 or 256");
    static_assert(BM != 256 || (CTAS == 1 && !kPingpong),
                  "256-row tiles: two consumer warpgroups of 128 rows on one tile, one CTA per SM");
    static_assert(BN == 64 || BN == 128 || BN == 192 || BN == 256 || BN == 96,
                  "BN must be 64, 128, 192 or 256 (a TMA box has at most 256 rows), or 96 for a "
                  "dual GEMM's gate and up as one m64n192k16");
    static_assert(STAGES >= 2, "the ring needs a stage loading while one computes");
    static_assert(!kTmaStore || BN % 32 == 0,
                  "TMA stores take whole 64-column chunks and a 32-column tail from registers");
    static_assert(GROUP_M >= 1, "tile groups hold at least one row of tiles");
    static_assert(!kHandover || kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536,
                  "the register handover must fit the register file");
};

/// The Hopper GEMM with the copy engine: persistent, warp-specialised, TMA-fed.
///
/// - Operands: as `GemmWgmma` (A `[M, K]`, B `[N, K]`, both k-contiguous), read through tensor
///   maps encoded by the runtime (mlpc-codegen's `Param::TensorMap`): box 64 (k) x BM rows for A,
///   64 x BN for B (and Bu), 128-byte swizzle, zero fill outside the tensor. The copy engine
///   writes exactly the swizzled layout described at the top of this file (each tile starts on a
///   1024-byte boundary), so the descriptors are `GemmWgmma`'s.
/// - Threads: the consumer warpgroups first, then the producer (a warpgroup, or one warp with two
///   CTAs per SM; see `WgmmaTmaConfig`). One producer thread walks the same (tile, k slice)
///   sequence as the consumers and, per slice, waits for the stage's `empty` barrier, announces
///   the stage's bytes on its `full` barrier and issues the two (three) TMA copies. Consumers,
///   per slice: wait on `full`, issue the wgmmas of their bands (a dual GEMM with BN <= 128: one
///   m64n(2 BN)k16 per k16 step over the stacked gate and up tiles, `MmaPair`, so that A is read
///   once), commit, wait until the previous
///   slice's wgmmas are done and arrive on that slice's `empty` barrier (every consumer thread
///   that reads the stage arrives; the barrier counts them all). No CTA-wide barrier after the
///   set-up.
/// - Ping-pong (`Cfg::kPingpong`): the CTA's j-th tile belongs to consumer warpgroup j % 2, which
///   computes all of it. The producer still fills the ring in tile order, so each warpgroup
///   steps over the other's slices (its slice counter jumps by one tile's slices) and a stage's
///   `empty` barrier counts the 128 threads of one warpgroup. The main loops take turns, in tile
///   order, through two named barriers (warpgroup w waits on barrier 1 + w before its main loop;
///   the other arrives on it after its own): the tensor cores serve one warpgroup at a time while
///   the other runs its epilogue, and, what correctness needs, a warpgroup only waits on a
///   stage's `full` barrier once every earlier slice has been waited for. An mbarrier wait names
///   a phase by its parity only, so a wait for slice s must not start before the phase of slice
///   s - STAGES in the same stage has completed, or it would pass on that older phase.
/// - Persistent: the grid is at most CTAS CTAs per SM; CTA b computes tiles b, b + gridDim.x, ...
///   in a grouped order (GROUP_M row tiles, then the next column; see `tile_of`), so that the
///   CTAs running at the same time share A and B tiles in L2. While the consumers run one tile's
///   epilogue, the producer already fills the ring with the next tile's slices.
/// - Clusters (`Cfg::CLUSTER` = 2, an autotune candidate): the two CTAs of a cluster take the
///   neighbouring column tiles 2c and 2c + 1 of one row tile (a phantom column tile past N when
///   the count is odd: zero-filled loads, no stores) and walk the same slices in the same order.
///   Each producer copies its half of the A tile (64 rows) into both CTAs (multicast, mask 0b11)
///   and its own B tile; a stage's `full` barrier still expects the whole stage. With
///   `Cfg::kShareB` the roles swap: the two CTAs take neighbouring row tiles 2r and 2r + 1 of one
///   column tile (a phantom row tile past M when the count is odd), each copies its half of the
///   B tile (and Bu) into both and its own A tile. A stage may be
///   refilled only when both CTAs' consumers are done with it: each consumer thread arrives on
///   its own `empty` barrier and one lane per consumer warp on the peer's (`mbar_arrive_cluster`:
///   CTA-scope semantics, as the arrival hands over no data), so `empty` counts the local
///   threads plus the peer's warps. Cluster barriers after the set-up (before any copy) and
///   before exit (no CTA leaves while its peer can still arrive on its barriers).
/// - Epilogue: `store_tile` from the accumulators (the same as `GemmWgmma`), or with
///   `Cfg::kTmaStore` `store_tile_tma`: through two staging buffers per consumer warpgroup (after
///   the ring) and the copy engine (the output's tensor map `map_c`, box 64 x 64), so that the
///   global writes run while the warpgroup goes on to its next tile.
/// - Split K (`Cfg::kSplitK`, a second entry of deep GEMMs): a grid of at least two CTAs per tile
///   gives each CTA one work item, a range of one tile's k slices; partial tiles meet in the
///   workspace (`split_exchange`), and the CTA that completes a tile's count runs the epilogue.
/// Launch with `kThreads` threads, `kSmemBytes` of dynamic shared memory, a 1-D grid of
/// min(tiles, CTAS x SMs) CTAs (with clusters: CLUSTER x min(cluster tiles, SMs / CLUSTER); with
/// split K, tiles x splits where that is at most the CTAs the device holds); compile for sm_90a.
template <class T, class Cfg, class Epi>
struct GemmWgmmaTma {
    static constexpr bool kDual = Epi::kDual;
    /// A plain GEMM whose epilogue chain starts with a bias starts its accumulators at the bias
    /// (`bias_fragments`) and applies the rest of the chain in its epilogue (`EpiAfterInit`).
    /// Not with split K: each partial tile would add the bias.
    static constexpr bool kBiasInit = BiasFirst<Epi>::kLead && !Cfg::kSplitK;
    using EpiAfterInit = typename PickType<kBiasInit, typename BiasFirst<Epi>::Rest, Epi>::type;
    static constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
    static constexpr int kConsumers = Cfg::kConsumers;
    static constexpr int kBands = Cfg::kBands;
    static constexpr int kThreads = Cfg::kThreads;
    static constexpr int kTileABytes = BM * BK * 2;
    static constexpr int kTileBBytes = BN * BK * 2;
    static constexpr int kStageBytes = kTileABytes + kTileBBytes * (kDual ? 2 : 1);
    /// With TMA stores, two staging buffers per consumer warpgroup after the ring.
    static constexpr int kStagingBytes =
        Cfg::kTmaStore ? kConsumers * 2 * wgmma_detail::kStagingBufferBytes : 0;
    /// The ring, the staging buffers, 1024 bytes to align the ring's base to the swizzle pattern,
    /// and the barriers.
    static constexpr int kSmemBytes = STAGES * kStageBytes + kStagingBytes + 1024 + 2 * STAGES * 8;
    static constexpr int kAcc = BN / 2;
    static_assert(kTileABytes % 1024 == 0 && kTileBBytes % 1024 == 0,
                  "every tile must start on a 1024-byte swizzle boundary");
    static_assert(!Cfg::kSplitK || (i64)BM * BN * 4 * (kDual ? 2 : 1) <= STAGES * kStageBytes,
                  "split K sums the partial tiles through the ring: a tile's f32 values fit it");
    static_assert(kBands * kAcc * (kDual ? 2 : 1) <= 192,
                  "a consumer warpgroup's accumulators (both of a dual GEMM, every band it owns) "
                  "fit its registers");

    /// Row tile and column tile of linear tile `t`: tiles are taken GROUP_M row tiles at a time,
    /// column by column inside a group.
    __device__ __forceinline__ static void tile_of(i64 t, i64 tiles_m, i64 tiles_n, i64& tm,
                                                   i64& tn) {
        const i64 per_group = (i64)Cfg::GROUP_M * tiles_n;
        const i64 first = t / per_group * Cfg::GROUP_M;
        const i64 rows = tiles_m - first < Cfg::GROUP_M ? tiles_m - first : Cfg::GROUP_M;
        const i64 r = t % per_group;
        tm = first + r % rows;
        tn = r / rows;
    }

    template <class P>
    __device__ __forceinline__ static void run(const P& p, const TensorMap& map_a,
                                               const TensorMap& map_b, const TensorMap& map_bu,
                                               const TensorMap& map_c,
                                               unsigned char* workspace = nullptr) {
        using namespace wgmma_detail;
        constexpr int CLUSTER = Cfg::CLUSTER;
        // Which operand a cluster's CTAs share, and the rows of it each copies (into every CTA
        // of the cluster): A with neighbouring column tiles, B (and Bu) with neighbouring row
        // tiles.
        constexpr bool kShareB = Cfg::kShareB;
        constexpr bool kShareA = CLUSTER > 1 && !kShareB;
        constexpr int kARows = kShareA ? BM / CLUSTER : BM;
        constexpr int kBRows = kShareB ? BN / CLUSTER : BN;
        // Consumer threads of one CTA that read a stage, and the peer's warps that release it.
        constexpr int kReaders = Cfg::kPingpong ? 128 : kConsumers * 128;
        constexpr int kPeerWarps = CLUSTER > 1 ? kReaders / 32 : 0;
        extern __shared__ __align__(1024) unsigned char mlpc_smem[];
        const u32 ring = (smem_addr(mlpc_smem) + 1023u) & ~1023u;
        const u32 staging = ring + STAGES * kStageBytes;
        const u32 full = staging + kStagingBytes;
        const u32 empty = full + STAGES * 8;

        const int tid = (int)threadIdx.x;
        // The warpgroup index through a shuffle from lane 0: the compiler then knows it is the
        // same in every lane, so the stage, ring addresses and matrix descriptors derived from it
        // live in uniform registers (no per-lane address arithmetic and no R2UR moves before
        // each wgmma).
        const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
        constexpr int kProducer = kConsumers * 128;
        const u32 rank = CLUSTER > 1 ? cluster_ctarank() : 0u;
        if (tid == kProducer) {
#pragma unroll
            for (int s = 0; s < STAGES; ++s) {
                mbar_init(full + 8 * s, 1);
                mbar_init(empty + 8 * s, kReaders + kPeerWarps);
            }
            mbar_fence_init();
        }
        if constexpr (CLUSTER > 1) {
            cluster_sync();
        } else {
            __syncthreads();
        }

        // Tile counts in 32 bits (zero-extended): the high words are then known zeros, not
        // values the consumers keep live beside their accumulators.
        const i64 tiles_m = (i64)(u32)ceil_div(p.m, (i64)BM);
        const i64 tiles_n = (i64)(u32)ceil_div(p.n, (i64)BN);
        // Cluster tiles: a row tile and CLUSTER neighbouring column tiles (sharing B: a column
        // tile and CLUSTER neighbouring row tiles).
        const i64 tiles_mc = kShareB ? ceil_div(tiles_m, (i64)CLUSTER) : tiles_m;
        const i64 tiles_nc = kShareA ? ceil_div(tiles_n, (i64)CLUSTER) : tiles_n;
        const i64 tiles = (i64)((u32)tiles_mc * (u32)tiles_nc);
        const i64 ktiles = ceil_div(p.k, (i64)BK);
        // Split K: a grid of at least two CTAs per tile (the runtime sizes it so only when every
        // CTA is to take one work item) splits each tile's k slices into gridDim.x / tiles
        // consecutive work items; otherwise a work item is a whole tile.
        const i64 splits = Cfg::kSplitK && (i64)gridDim.x >= 2 * tiles &&
                                   (i64)gridDim.x <= kSplitCounters
                               ? (i64)gridDim.x / tiles
                               : 1;
        const i64 items = tiles * splits;
        // The first k slice of split q (in 32 bits: at most 4096 items, and 64-bit divisions
        // next to live accumulators spilled them), and the k slices of work item w. Without split
        // K, the kernel's arithmetic as before it.
        auto k_begin = [&](i64 q) -> i64 {
            if constexpr (Cfg::kSplitK) {
                return (i64)((u32)q * (u32)ktiles / (u32)splits);
            } else {
                return q * ktiles;
            }
        };
        auto item_slices = [&](i64 w) -> i64 {
            if constexpr (Cfg::kSplitK) {
                const i64 q = (i64)((u32)w % (u32)splits);
                return k_begin(q + 1) - k_begin(q);
            } else {
                return ktiles;
            }
        };
        // This CTA's cluster and the cluster count (blockIdx.x and gridDim.x without clusters)
        // are read where they are used, as the kernel without clusters always did.
#define MLPC_CID ((i64)blockIdx.x / CLUSTER)
#define MLPC_CLUSTERS ((i64)gridDim.x / CLUSTER)

        if (tid >= kProducer) {
            if constexpr (Cfg::kHandover) setmaxnreg_dec<Cfg::kProducerRegs>();
            if (tid == kProducer) {
                tma_prefetch_map(map_a);
                tma_prefetch_map(map_b);
                if constexpr (kDual) tma_prefetch_map(map_bu);
                int stage = 0;
                u32 phase = 0;
                for (i64 w = MLPC_CID; w < items; w += MLPC_CLUSTERS) {
                    const i64 t = splits > 1 ? (i64)((u32)w / (u32)splits) : w;
                    const i64 q = w - t * splits;
                    i64 tm, tn;
                    tile_of(t, tiles_mc, tiles_nc, tm, tn);
                    const int m0 = (int)((kShareB ? tm * CLUSTER + rank : tm) * BM);
                    const int n0 = (int)((kShareA ? tn * CLUSTER + rank : tn) * BN);
                    for (i64 kt = k_begin(q); kt < k_begin(q + 1); ++kt) {
                        mbar_wait(empty + 8 * stage, phase ^ 1);
                        const u32 bar = full + 8 * stage;
                        const u32 sa = ring + stage * kStageBytes;
                        mbar_arrive_expect_tx(bar, kStageBytes);
                        const int k0 = (int)(kt * BK);
                        constexpr u16 kAll = (u16)((1u << CLUSTER) - 1);
                        if constexpr (kShareA) {
                            tma_load_2d_multicast(sa + rank * (kARows * 128), map_a, k0,
                                                  m0 + (int)rank * kARows, bar, kAll);
                        } else {
                            tma_load_2d(sa, map_a, k0, m0, bar);
                        }
                        if constexpr (kShareB) {
                            const u32 sb = sa + kTileABytes + rank * (kBRows * 128);
                            const int n1 = n0 + (int)rank * kBRows;
                            tma_load_2d_multicast(sb, map_b, k0, n1, bar, kAll);
                            if constexpr (kDual) {
                                tma_load_2d_multicast(sb + kTileBBytes, map_bu, k0, n1, bar, kAll);
                            }
                        } else {
                            tma_load_2d(sa + kTileABytes, map_b, k0, n0, bar);
                            if constexpr (kDual) {
                                tma_load_2d(sa + kTileABytes + kTileBBytes, map_bu, k0, n0, bar);
                            }
                        }
                        if (++stage == STAGES) {
                            stage = 0;
                            phase ^= 1;
                        }
                    }
                }
            }
            if constexpr (CLUSTER > 1) {
                // Every thread of the cluster meets at the end (see below).
                __syncwarp();
                cluster_sync();
            }
            return;
        }

        if constexpr (Cfg::kHandover) setmaxnreg_inc<Cfg::kConsumerRegs>();
        const int lane = tid & 31;
        // Done with stage `s`: this thread's arrival, and with a cluster one per warp on the
        // peer's barrier (its producer multicasts into this CTA's stage too).
        auto release = [&](int s) {
            mbar_arrive(empty + 8 * s);
            if constexpr (CLUSTER > 1) {
                if (lane == 0) mbar_arrive_cluster(empty + 8 * s, rank ^ 1u);
            }
        };
        // Consumer warpgroup `wg` owns the bands band0 .. band0 + kBands of 64 rows: its share
        // of each tile, or (ping-pong) every band of its own tiles.
        const int band0 = Cfg::kPingpong ? 0 : wg * kBands;
        const i64 first = MLPC_CID + (Cfg::kPingpong ? (i64)wg * MLPC_CLUSTERS : 0);
        const i64 step = MLPC_CLUSTERS * (Cfg::kPingpong ? 2 : 1);
        float acc[kBands][kAcc];
        float acc_up[kBands][kDual ? kAcc : 1];
        // TMA stores: this warpgroup's staging buffers and chunk count (`store_tile_tma`).
        const u32 my_staging = staging + (u32)wg * (2 * wgmma_detail::kStagingBufferBytes);
        u32 chunk = 0;
        // The ring position of this warpgroup's next slice: the producer's sequence is every
        // slice of the CTA's work items in order, so a ping-pong warpgroup starts wg items in.
        i64 slice = Cfg::kPingpong ? (i64)wg * item_slices(MLPC_CID) : 0;
        for (i64 w = first; w < items; w += step) {
            const i64 t = splits > 1 ? (i64)((u32)w / (u32)splits) : w;
            const i64 q = w - t * splits;
            const i64 k_lo = k_begin(q), k_hi = k_begin(q + 1);
            i64 tm, tn;
            tile_of(t, tiles_mc, tiles_nc, tm, tn);
            if constexpr (kShareB) tm = tm * CLUSTER + rank;
            if constexpr (kShareA) tn = tn * CLUSTER + rank;
            if constexpr (kBiasInit) {
                const auto& bias = p.epi[BiasFirst<Epi>::kIndex];
                bias_fragments<T, BN, kBands>(
                    acc, bias, tn * BN, p.n, tid & 31,
                    (tn + 1) * BN <= p.n && bias.col_stride == 1 && is_aligned(bias.ptr, 4));
            } else {
#pragma unroll
                for (int i = 0; i < kAcc; ++i) {
#pragma unroll
                    for (int b = 0; b < kBands; ++b) {
                        acc[b][i] = 0.0f;
                        if constexpr (kDual) acc_up[b][i] = 0.0f;
                    }
                }
            }
            int stage = (int)(slice % STAGES);
            u32 phase = (u32)((slice / STAGES) & 1);
            int prev = -1;
            // Ping-pong: the other warpgroup's previous tile has left its main loop.
            if (Cfg::kPingpong && w != MLPC_CID) named_sync<256>(1 + wg);
            for (i64 kt = k_lo; kt < k_hi; ++kt) {
                mbar_wait(full + 8 * stage, phase);
                const u32 sa = ring + stage * kStageBytes;
                const u64 db = make_desc(sa + kTileABytes);
                const u64 dbu = make_desc(sa + kTileABytes + kTileBBytes);
#pragma unroll
                for (int b = 0; b < kBands; ++b) {
                    fence_regs(acc[b]);
                    if constexpr (kDual) fence_regs(acc_up[b]);
                }
                fence();
#pragma unroll
                for (int j = 0; j < BK / 16; ++j) {
#pragma unroll
                    for (int b = 0; b < kBands; ++b) {
                        const u64 da = make_desc(sa + (band0 + b) * (64 * 128));
                        if constexpr (kDual && (BN == 64 || BN == 96 || BN == 128)) {
                            // Gate and up as one wgmma over the two stacked tiles: A read once.
                            MmaPair<T, BN>::run(acc[b], acc_up[b], da + 2 * j, db + 2 * j);
                        } else {
                            Mma<T, BN>::run(acc[b], da + 2 * j, db + 2 * j);
                            if constexpr (kDual) Mma<T, BN>::run(acc_up[b], da + 2 * j, dbu + 2 * j);
                        }
                    }
                }
                commit();
#pragma unroll
                for (int b = 0; b < kBands; ++b) {
                    fence_regs(acc[b]);
                    if constexpr (kDual) fence_regs(acc_up[b]);
                }
                // The previous slice's wgmmas are complete: its stage may be refilled.
                wait<1>();
#pragma unroll
                for (int b = 0; b < kBands; ++b) {
                    fence_regs(acc[b]);
                    if constexpr (kDual) fence_regs(acc_up[b]);
                }
                if (prev >= 0) release(prev);
                prev = stage;
                if (++stage == STAGES) {
                    stage = 0;
                    phase ^= 1;
                }
            }
            // Ping-pong: every wgmma of this tile is issued; hand the tensor cores to the other
            // warpgroup, if it has a next tile.
            if (Cfg::kPingpong && w + MLPC_CLUSTERS < items) named_arrive<256>(2 - wg);
            wait<0>();
#pragma unroll
            for (int b = 0; b < kBands; ++b) {
                fence_regs(acc[b]);
                if constexpr (kDual) fence_regs(acc_up[b]);
            }
            if (prev >= 0) release(prev);
            // The ring position of this warpgroup's next item: past this one's slices and, with
            // ping-pong, the other warpgroup's next item's.
            if constexpr (Cfg::kSplitK) {
                slice += (k_hi - k_lo) + (Cfg::kPingpong ? item_slices(w + MLPC_CLUSTERS) : 0);
            } else {
                slice += ktiles * (Cfg::kPingpong ? 2 : 1);
            }
            // Split K: only the warpgroup that completes a tile's splits runs its epilogue, on
            // the sum of every split (counters per tile and consumer warpgroup, then the partial
            // tiles, one per work item, in the workspace).
            if constexpr (Cfg::kSplitK) {
                if (splits > 1) {
                    // A split grid gives each CTA one work item, so the ring is free once every
                    // consumer warpgroup is past its main loop: the exchange's shared memory,
                    // one part per warpgroup.
                    if constexpr (!Cfg::kPingpong && kConsumers > 1) {
                        named_sync<kConsumers * 128>(7);
                    }
                    constexpr i64 kFloats = (i64)BM * BN * (kDual ? 2 : 1);
                    float* parts = reinterpret_cast<float*>(workspace + 4 * kSplitCounters);
                    u32* counter = reinterpret_cast<u32*>(workspace) + t * (BM / 64 / kBands) +
                                   band0 / kBands;
                    if (!split_exchange<BN, kDual>(acc, acc_up, parts + w * kFloats,
                                                   parts + (w - q) * kFloats, splits, kFloats,
                                                   band0, counter, tid & 127, 5 + wg,
                                                   ring + (u32)(band0 * 64 * BN * 4 *
                                                                (kDual ? 2 : 1)))) {
                        continue;
                    }
                }
            }
            // A phantom tile (past N with an odd column-tile count, or sharing B past M with an
            // odd row-tile count) stores nothing.
            if (CLUSTER > 1 && (tn * BN >= p.n || tm * BM >= p.m)) continue;
#pragma unroll
            for (int b = 0; b < kBands; ++b) {
                const i64 m0 = tm * BM + (band0 + b) * 64;
                if constexpr (Cfg::kTmaStore) {
                    store_tile_tma<T, BN, kDual, EpiAfterInit>(acc[b], acc_up[b], m0, tn * BN,
                                                               tid & 127, p, map_c, my_staging,
                                                               3 + wg, chunk);
                } else {
                    store_tile<T, BN, kDual, EpiAfterInit>(acc[b], acc_up[b], m0, tn * BN,
                                                           tid & 127, p);
                }
            }
        }
        // The copy engine may still read the staging buffers and write the output.
        if constexpr (Cfg::kTmaStore) {
            if ((tid & 127) == 0) bulk_wait_all();
        }
        if constexpr (CLUSTER > 1) {
            // No CTA leaves while its peer can still arrive on its `empty` barriers.
            cluster_sync();
        }
#undef MLPC_CID
#undef MLPC_CLUSTERS
    }
};

}  // namespace mlpc
