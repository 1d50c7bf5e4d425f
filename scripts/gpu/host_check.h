// The host side of the measurement programs in scripts/gpu/ (built with nvcc on a CUDA machine):
// a failed CUDA runtime call prints what failed and exits with status 1.
#pragma once

#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                        \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) {                                                           \
            std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));               \
            std::exit(1);                                                                  \
        }                                                                                  \
    } while (0)
