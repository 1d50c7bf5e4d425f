// Microbenchmark: what the FP64 tensor-core f32 GEMM (`gemm_dmma.cuh`) can reach on this card at
// most, before shared memory and copies: the rate of back-to-back `mma.sync` m16n8k16 f64
// (`DMMA.16x8x16`), the rate of f32 -> f64 conversions (`F2F.F64.F32`), and the two together in
// the kernel's proportions (per 16-deep slice and warp of a 64 x 32 warp tile: 48 conversions, 16
// mmas), against the FFMA pipes (what the FFMA kernel, `gemm_simt.cuh`, and cuBLAS's exact f32
// GEMM run on).
//
// One CTA per SM of WARPS warps; each warp runs ITERS rounds on values in registers that change
// every round (so that nothing is hoisted), and its result goes to memory (so that nothing is
// dropped). Prints one line per kernel: the whole GPU's rate, in TFLOP/s (2 flops a
// multiply-add) or in conversions a cycle per SM at the clock the events imply being unknown, in
// giga-conversions a second.
//
// On a CUDA machine, from the repository root:
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90,code=sm_90 -I kernels-templates \
//       scripts/gpu/dmma_issue.cu -o /tmp/dmma_issue && /tmp/dmma_issue [ITERS]
//
// (`run_all.sh micro` runs it after the wgmma one.) The device part also compiles with NVRTC
// alone (mlpc-codegen's `fp64_tensor` tests compile it, so that it keeps up with the template).
#include "gemm_dmma.cuh"

namespace dmma_issue {

/// Values in [1, 2) from a thread index, different per lane and register.
__device__ __forceinline__ float value(int i) {
    return __int_as_float(0x3F800000 | ((i * 2654435761u) >> 9));
}

/// The next round's value: the lowest mantissa bit flipped (still in [1, 2)).
__device__ __forceinline__ float next(float v) { return __int_as_float(__float_as_int(v) ^ 1); }

/// ACC independent m16n8k16 tiles a round, fragments converted once (the mma rate alone).
template <int ACC>
__device__ __forceinline__ void mma_only(int iters, double* out) {
    double acc[ACC][4];
    double a[8], b[4];
    for (int e = 0; e < 8; ++e) a[e] = value(threadIdx.x * 8 + e);
    for (int e = 0; e < 4; ++e) b[e] = value(threadIdx.x * 4 + e + 1000);
#pragma unroll
    for (int j = 0; j < ACC; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int j = 0; j < ACC; ++j) mlpc::dmma_detail::mma_16816_f64(acc[j], a, b);
    }
    double s = 0.0;
#pragma unroll
    for (int j = 0; j < ACC; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

/// 48 conversions a round (the kernel's per slice), folded into integers (the rate alone).
__device__ __forceinline__ void convert_only(int iters, double* out) {
    float v[48];
#pragma unroll
    for (int e = 0; e < 48; ++e) v[e] = value(threadIdx.x * 48 + e);
    unsigned x = 0;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int e = 0; e < 48; ++e) {
            x ^= (unsigned)__double2loint((double)v[e]) ^ (unsigned)__double2hiint((double)v[e]);
            v[e] = next(v[e]);
        }
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = (double)x;
}

/// The kernel's round: a 64 x 32 warp tile's 16-deep slice from f32 values in registers, 16
/// B and 32 A values converted (4 n8 and 4 m16 tiles' fragments), 16 mmas.
__device__ __forceinline__ void kernel_mix(int iters, double* out) {
    float av[4][8], bv[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 8; ++e) av[i][e] = value(threadIdx.x * 48 + i * 8 + e);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) bv[j][e] = value(threadIdx.x * 48 + 32 + j * 4 + e);
    double acc[4][4][4];
    mlpc::dmma_detail::zero(acc);
    for (int it = 0; it < iters; ++it) {
        double b[4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                b[j][e] = bv[j][e];
                bv[j][e] = next(bv[j][e]);
            }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            double a[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                a[e] = av[i][e];
                av[i][e] = next(av[i][e]);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) mlpc::dmma_detail::mma_16816_f64(acc[i][j], a, b[j]);
        }
    }
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) s += acc[i][j][0] + acc[i][j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

/// 8 independent FFMA chains of 8 a round: the FFMA pipes' rate.
__device__ __forceinline__ void ffma_only(int iters, double* out) {
    float c[64];
    const float a = value(threadIdx.x), b = value(threadIdx.x + 7);
#pragma unroll
    for (int e = 0; e < 64; ++e) c[e] = value(threadIdx.x + e);
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int e = 0; e < 64; ++e) c[e] = fmaf(a, c[e], b);
    }
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < 64; ++e) s += c[e];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

}  // namespace dmma_issue

extern "C" __global__ void __launch_bounds__(256, 1) dmma_issue_mma_x4(int iters, double* out) {
    dmma_issue::mma_only<4>(iters, out);
}
extern "C" __global__ void __launch_bounds__(256, 1) dmma_issue_mma_x16(int iters, double* out) {
    dmma_issue::mma_only<16>(iters, out);
}
extern "C" __global__ void __launch_bounds__(256, 1) dmma_issue_convert(int iters, double* out) {
    dmma_issue::convert_only(iters, out);
}
extern "C" __global__ void __launch_bounds__(256, 1) dmma_issue_kernel_mix(int iters, double* out) {
    dmma_issue::kernel_mix(iters, out);
}
extern "C" __global__ void __launch_bounds__(256, 1) dmma_issue_ffma(int iters, double* out) {
    dmma_issue::ffma_only(iters, out);
}

#ifndef __CUDACC_RTC__
#include "host_check.h"


typedef void (*Entry)(int, double*);

struct Row {
    const char* name;
    Entry entry;
    double work;  // flops (or conversions) per thread and round
    const char* unit;
};

int main(int argc, char** argv) {
    const int iters = argc > 1 ? std::atoi(argv[1]) : 20000;
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount, threads = 256;
    double* out = nullptr;
    CHECK(cudaMalloc(&out, (size_t)sms * threads * sizeof(double)));
    // An m16n8k16 is 2048 multiply-adds of the warp: 128 flops a thread.
    const Row rows[] = {
        {"DMMA.16x8x16, 4 independent tiles a warp", dmma_issue_mma_x4, 4 * 128.0, "TFLOP/s"},
        {"DMMA.16x8x16, 16 independent tiles a warp", dmma_issue_mma_x16, 16 * 128.0, "TFLOP/s"},
        {"F2F.F64.F32, 48 a round", dmma_issue_convert, 48.0, "G conversions/s"},
        {"the kernel's slice: 48 F2F + 16 DMMA a warp", dmma_issue_kernel_mix, 16 * 128.0,
         "TFLOP/s"},
        {"FFMA, 64 independent chains a thread", dmma_issue_ffma, 64 * 2.0, "TFLOP/s"},
    };
    std::printf("%s, %d SMs, one CTA of %d threads per SM, %d rounds\n", prop.name, sms, threads,
                iters);
    std::printf("| kernel | rate |\n|---|---:|\n");
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    for (const Row& r : rows) {
        float best = 1e30f;
        for (int rep = 0; rep < 6; ++rep) {  // the first is the warm-up; the fastest of the rest
            CHECK(cudaEventRecord(start));
            r.entry<<<sms, threads>>>(iters, out);
            CHECK(cudaEventRecord(stop));
            CHECK(cudaEventSynchronize(stop));
            CHECK(cudaGetLastError());
            float ms = 0.0f;
            CHECK(cudaEventElapsedTime(&ms, start, stop));
            if (rep > 0 && ms < best) best = ms;
        }
        const double total = r.work * iters * (double)sms * threads;
        const double scale = r.unit[0] == 'T' ? 1e-12 : 1e-9;
        std::printf("| %s | %.1f %s |\n", r.name, total / (best * 1e-3) * scale, r.unit);
    }
    CHECK(cudaFree(out));
    return 0;
}
#endif
