// mlpc kernel templates: elementwise kernels (add, mul, activations, strided copy) over operands of
// rank <= 4 with arbitrary strides.
//
// Shapes are padded at the front to rank 4. Each thread handles VEC = 16 / sizeof(T) consecutive
// output elements (in row-major order of the output shape). How an operand is addressed is a
// compile-time `Access`:
//   Dense   - offset = linear index (a row-major operand of the output's shape);
//   Row     - offset = linear index % shape[3] (a contiguous row vector broadcast over the rows);
//   Strided - offset = sum of index[d] * stride[d] (views such as a transpose; stride 0 broadcasts).
// When no operand is Strided, every pointer is 16-byte aligned, the row length is a multiple of
// VEC (if an operand is Row) and the thread's VEC elements are all inside the output, the thread
// uses one 16-byte load per operand and one 16-byte store; otherwise it falls back to scalar
// accesses with full index arithmetic. Both paths compute the same values.
#pragma once

#include "common.cuh"

namespace mlpc {

enum class Access { Dense, Row, Strided };

/// Run-time description of one elementwise kernel: the output shape (padded to rank 4 with
/// leading 1s) and the strides, in elements, of the output and of every input.
template <class T, int NIN>
struct EwParams {
    typedef T Elem;
    T* out;
    const T* in[NIN];
    i64 shape[4];
    i64 out_stride[4];
    i64 in_stride[NIN][4];
};

/// `x0 + x1`.
struct AddOp {
    static constexpr int kArity = 2;
    __device__ __forceinline__ static float apply(const float (&x)[2]) { return x[0] + x[1]; }
};

/// `x0 * x1`.
struct MulOp {
    static constexpr int kArity = 2;
    __device__ __forceinline__ static float apply(const float (&x)[2]) { return x[0] * x[1]; }
};

/// `x0`: materialises a strided view (e.g. a transpose) as a row-major tensor.
struct CopyOp {
    static constexpr int kArity = 1;
    __device__ __forceinline__ static float apply(const float (&x)[1]) { return x[0]; }
};

/// `act(x0)`.
template <ActKind A>
struct ActOp {
    static constexpr int kArity = 1;
    __device__ __forceinline__ static float apply(const float (&x)[1]) { return activate<A>(x[0]); }
};

namespace ew_detail {

/// 16 bytes at `p` (16-byte aligned) as f32 values.
template <class T>
__device__ __forceinline__ void load16(const T* p, float (&v)[16 / sizeof(T)]) {
    u32 w[4];
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "l"(p));
    if constexpr (sizeof(T) == 4) {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = __uint_as_float(w[e]);
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) unpack2<T>(w[e], v[2 * e], v[2 * e + 1]);
    }
}

/// Stores 16 bytes of values rounded to T at `p` (16-byte aligned).
template <class T>
__device__ __forceinline__ void store16(T* p, const float (&v)[16 / sizeof(T)]) {
    u32 w[4];
    if constexpr (sizeof(T) == 4) {
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = __float_as_uint(v[e]);
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = pack2<T>(v[2 * e], v[2 * e + 1]);
    }
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(w[0]), "r"(w[1]),
                 "r"(w[2]), "r"(w[3])
                 : "memory");
}

template <Access A>
__device__ __forceinline__ i64 offset(i64 i, const i64 (&idx)[4], const i64 (&stride)[4],
                                      i64 row_len) {
    if constexpr (A == Access::Dense) {
        return i;
    } else if constexpr (A == Access::Row) {
        return i % row_len;
    } else {
        return idx[0] * stride[0] + idx[1] * stride[1] + idx[2] * stride[2] + idx[3] * stride[3];
    }
}

}  // namespace ew_detail

/// The elementwise kernel: `out = Op(in...)`, one access mode per operand. Launch with
/// `kThreads` threads and `ceil(numel / (kThreads * kVec))` blocks, no shared memory.
template <class T, class Op, Access OUT, Access... IN>
struct Elementwise {
    static constexpr int NIN = sizeof...(IN);
    static constexpr int kThreads = 256;
    static constexpr int kVec = 16 / sizeof(T);
    static_assert(Op::kArity == NIN, "one access mode per operand");
    static_assert(OUT != Access::Row, "the output cannot be broadcast");
    static constexpr bool kAnyStrided = OUT == Access::Strided || ((IN == Access::Strided) || ...);
    static constexpr bool kAnyRow = ((IN == Access::Row) || ...);

    template <class P>
    __device__ __forceinline__ static void run(const P& p) {
        constexpr Access kIn[NIN] = {IN...};
        const i64 numel = p.shape[0] * p.shape[1] * p.shape[2] * p.shape[3];
        const i64 i0 = ((i64)blockIdx.x * kThreads + threadIdx.x) * kVec;
        if (i0 >= numel) return;
        const i64 row_len = p.shape[3];

        if constexpr (!kAnyStrided) {
            bool vec = i0 + kVec <= numel && is_aligned(p.out, 16);
#pragma unroll
            for (int j = 0; j < NIN; ++j) vec = vec && is_aligned(p.in[j], 16);
            if (kAnyRow) vec = vec && row_len % kVec == 0;
            if (vec) {
                // i0 is a multiple of kVec, so a Row operand's chunk stays inside one row.
                float x[NIN][kVec];
#pragma unroll
                for (int j = 0; j < NIN; ++j) {
                    const i64 off = kIn[j] == Access::Dense ? i0 : i0 % row_len;
                    ew_detail::load16(p.in[j] + off, x[j]);
                }
                float y[kVec];
#pragma unroll
                for (int e = 0; e < kVec; ++e) {
                    float args[NIN];
#pragma unroll
                    for (int j = 0; j < NIN; ++j) args[j] = x[j][e];
                    y[e] = Op::apply(args);
                }
                ew_detail::store16(p.out + i0, y);
                return;
            }
        }

#pragma unroll
        for (int e = 0; e < kVec; ++e) {
            const i64 i = i0 + e;
            if (i >= numel) break;
            i64 idx[4] = {0, 0, 0, 0};
            if constexpr (kAnyStrided) {
                i64 t = i;
                idx[3] = t % p.shape[3];
                t /= p.shape[3];
                idx[2] = t % p.shape[2];
                t /= p.shape[2];
                idx[1] = t % p.shape[1];
                idx[0] = t / p.shape[1];
            }
            float args[NIN];
#pragma unroll
            for (int j = 0; j < NIN; ++j) {
                i64 off;
                if (kIn[j] == Access::Dense) {
                    off = ew_detail::offset<Access::Dense>(i, idx, p.in_stride[j], row_len);
                } else if (kIn[j] == Access::Row) {
                    off = ew_detail::offset<Access::Row>(i, idx, p.in_stride[j], row_len);
                } else {
                    off = ew_detail::offset<Access::Strided>(i, idx, p.in_stride[j], row_len);
                }
                args[j] = load_f32(p.in[j], off);
            }
            const i64 out_off = ew_detail::offset<OUT>(i, idx, p.out_stride, row_len);
            p.out[out_off] = from_f32<T>(Op::apply(args));
        }
    }
};

}  // namespace mlpc
