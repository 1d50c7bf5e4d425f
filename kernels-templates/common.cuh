// mlpc kernel templates: element types, conversions, activations and the epilogue machinery shared
// by every kernel family.
//
// Self-contained on purpose: no CUDA toolkit header is included, so NVRTC alone compiles these
// templates on any machine. The 16-bit float types are storage wrappers around their bit pattern;
// all arithmetic happens in f32, and conversions go through PTX `cvt` (round to nearest even, as
// the reference interpreter rounds).
#pragma once

namespace mlpc {

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

// ---------------------------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------------------------

/// bfloat16 storage: the upper 16 bits of an IEEE f32.
struct bf16 {
    u16 bits;
};

/// IEEE binary16 storage.
struct f16 {
    u16 bits;
};

__device__ __forceinline__ float to_f32(float x) { return x; }

__device__ __forceinline__ float to_f32(bf16 x) { return __uint_as_float(((u32)x.bits) << 16); }

__device__ __forceinline__ float to_f32(f16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}

template <class T>
__device__ __forceinline__ T from_f32(float v);

template <>
__device__ __forceinline__ float from_f32<float>(float v) {
    return v;
}

template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float v) {
    bf16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
    return r;
}

template <>
__device__ __forceinline__ f16 from_f32<f16>(float v) {
    f16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
    return r;
}

/// Two values rounded to a 16-bit type and packed into one 32-bit word, `lo` in the low half (the
/// lower address in memory).
template <class T>
__device__ __forceinline__ u32 pack2(float lo, float hi);

template <>
__device__ __forceinline__ u32 pack2<bf16>(float lo, float hi) {
    u32 r;
    // cvt.rn.bf16x2.f32 d, a, b: a goes to the upper half, b to the lower half.
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

template <>
__device__ __forceinline__ u32 pack2<f16>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/// `max(v, 0)` of both halves of a packed 16-bit pair (`max.bf16x2` / `max.f16x2`: a NaN half
/// becomes 0, as `fmaxf` gives; rounding first, then the maximum, gives the values of the other
/// order, up to the sign of a zero).
template <class T>
__device__ __forceinline__ u32 relu2(u32 w);

template <>
__device__ __forceinline__ u32 relu2<bf16>(u32 w) {
    u32 r;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(w), "r"(0u));
    return r;
}

template <>
__device__ __forceinline__ u32 relu2<f16>(u32 w) {
    u32 r;
    asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(w), "r"(0u));
    return r;
}

/// The two 16-bit values of a packed word, widened to f32.
template <class T>
__device__ __forceinline__ void unpack2(u32 w, float& lo, float& hi) {
    T a, b;
    a.bits = (u16)(w & 0xffffu);
    b.bits = (u16)(w >> 16);
    lo = to_f32(a);
    hi = to_f32(b);
}

/// `unpack2`, with bf16's widening as byte moves and a mask (`prmt`, `lop3`: the integer pipe,
/// where the shift of `to_f32` may become an `IMAD` on the FP32 pipe).
template <class T>
__device__ __forceinline__ void widen_pair(u32 w, float& lo, float& hi) {
    unpack2<T>(w, lo, hi);
}

template <>
__device__ __forceinline__ void widen_pair<bf16>(u32 w, float& lo, float& hi) {
    u32 l, h;
    // Bytes 0, 1 of w to bytes 2, 3; zeros below (selector nibbles 4: bytes of the zero operand).
    asm volatile("prmt.b32 %0, %1, 0, 0x1044;" : "=r"(l) : "r"(w));
    asm volatile("and.b32 %0, %1, 0xffff0000;" : "=r"(h) : "r"(w));
    lo = __uint_as_float(l);
    hi = __uint_as_float(h);
}

/// Loads element `i` of `p` as f32.
template <class T>
__device__ __forceinline__ float load_f32(const T* p, i64 i) {
    return to_f32(p[i]);
}

/// Whether `p` is aligned to `bytes` (a power of two).
__device__ __forceinline__ bool is_aligned(const void* p, u64 bytes) {
    return (((u64)p) & (bytes - 1)) == 0;
}

/// The shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}

// Programmatic dependent launch (sm_90 and later; no-ops before). A kernel whose launch
// description says `early_launch` may be started by the runtime while the kernel before it in
// the stream still runs: it must call `wait_for_predecessors()` before its first read of
// anything but constant weights and before its first global write. Every such kernel also calls
// `launch_dependents()`, which lets the next one start launching once all of its own CTAs have
// started (rather than when they have all finished).

__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/// Waits until the kernels before this one in the stream have finished and their writes are
/// visible. Returns at once when they have (or when the kernel was launched the ordinary way).
__device__ __forceinline__ void wait_for_predecessors() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

template <class T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
    return (a + b - 1) / b;
}

// ---------------------------------------------------------------------------------------------
// Activations (f32), matching mlpc_ir::Activation::eval
// ---------------------------------------------------------------------------------------------

enum class ActKind { Relu, Gelu, GeluTanh, Silu, Sigmoid, Tanh };

template <ActKind A>
__device__ __forceinline__ float activate(float x) {
    if constexpr (A == ActKind::Relu) {
        // fmaxf returns the non-NaN operand, like f64::max in the reference.
        return fmaxf(x, 0.0f);
    } else if constexpr (A == ActKind::Gelu) {
        // x * 0.5 * (1 + erf(x / sqrt 2)), as x * 0.5 * erfc(-x / sqrt 2): no cancellation in
        // the negative tail (1 + erff loses every digit below x = -5).
        return 0.5f * x * erfcf(x * -0.70710678118654752f);
    } else if constexpr (A == ActKind::GeluTanh) {
        // 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), as x / (1 + exp(-2u)): no
        // cancellation in the negative tail (1 + tanhf loses every digit below x = -5).
        const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
        return x / (1.0f + expf(-2.0f * inner));
    } else if constexpr (A == ActKind::Silu) {
        return x / (1.0f + expf(-x));
    } else if constexpr (A == ActKind::Sigmoid) {
        return 1.0f / (1.0f + expf(-x));
    } else {
        static_assert(A == ActKind::Tanh, "unknown activation");
        return tanhf(x);
    }
}

/// `2^x` through the special function unit with denormal results flushed to zero
/// (`ex2.approx.ftz`): one MUFU, without the range fix-up `exp2f` / `__expf` add to keep
/// denormals. For the f16 / bf16 epilogues only, whose outputs cannot hold such values anyway.
/// Callers fold log2(e) into their own constants.
__device__ __forceinline__ float exp2_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/// `1 / x` through the special function unit (`rcp.approx.ftz`): one MUFU, relative error near
/// 2^-23, without the scaling `__fdividef` applies to denominators above 2^126 (callers whose
/// denominators stay far below that only).
__device__ __forceinline__ float rcp_fast(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/// `min(x, y)` and `max(x, y)` that return NaN when either is NaN (`fminf` / `fmaxf` return the
/// other operand).
__device__ __forceinline__ float fmin_nan(float x, float y) {
    float r;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
    return r;
}
__device__ __forceinline__ float fmax_nan(float x, float y) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
    return r;
}

/// The activations in forms for f16 / bf16 outputs: exp and division through the special
/// function unit (`exp2_fast`, `rcp_fast`, `__fdividef`: relative errors near 2^-21), arranged
/// so that both tails stay accurate (no `1 + tanh` or `1 - erf` cancellation), far below the
/// outputs' own rounding (2^-8 for bf16, 2^-11 for f16) and several times cheaper than `tanhf` /
/// `erff`. Few FP32-pipe instructions matter more than few MUFUs here (perf-notes 3m).
/// Constants are pre-multiplied (log2(e) folded in), since the compiler may not reassociate.
/// f32 outputs keep `activate`.
template <ActKind A>
__device__ __forceinline__ float activate_fast(float x) {
    constexpr float kLog2e = 1.4426950408889634f;
    if constexpr (A == ActKind::Gelu) {
        // gelu(x) = x Phi(x) = relu(x) - |x| Phi(-|x|), with the normal tail written through
        // its Mills ratio: Phi(-z) = t P(t) exp(-z^2 / 2), t = 1 / (1 + p z), P of degree 4
        // (fitted for the relative error of t P(t) against Phi(-z) exp(z^2 / 2) over the whole
        // half-line: at most 9.3e-5, so gelu is that accurate in both tails too, down to where
        // exp2_fast flushes). Ten FP32-pipe instructions and two MUFUs: in a Hopper GEMM's
        // epilogue the FP32 pipe's instructions are what costs (docs/perf-notes.md, 3m).
        const float z = fabsf(x);
        const float t = rcp_fast(fmaf(0.3975f, z, 1.0f));
        float q = -0.08479484170675278f;
        q = fmaf(q, t, 0.1480494737625122f);
        q = fmaf(q, t, 0.1183738261461258f);
        q = fmaf(q, t, 0.1597810983657837f);
        q = fmaf(q, t, 0.15856492519378662f);
        // exp(-x^2 / 2) = 2^(-(x k)^2), k = sqrt(log2(e) / 2)
        const float y = x * 0.84932180028801907f;
        const float tail = q * t * exp2_fast(-(y * y));  // Phi(-|x|)
        // -|x|, but -3e38 for x = +inf, so that gelu(inf) is inf, not inf * 0; for x = -inf it
        // stays -inf, and -inf * 0 is NaN, as in the reference (and PyTorch).
        return fmaf(fminf(x, fmaxf(-x, -3.0e38f)), tail, fmaxf(x, 0.0f));
    } else if constexpr (A == ActKind::GeluTanh) {
        // (1 + tanh u) / 2 = 1 / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3):
        // exp(-2u) = 2^(x (k1 + k2 x^2)), k1 = -2 sqrt(2/pi) log2(e), k2 = 0.044715 k1.
        constexpr float k1 = -2.0f * 0.79788456080286536f * kLog2e;
        constexpr float k2 = 0.044715f * k1;
        return __fdividef(x, 1.0f + exp2_fast(x * fmaf(x * x, k2, k1)));
    } else if constexpr (A == ActKind::Silu) {
        return __fdividef(x, 1.0f + exp2_fast(x * -kLog2e));
    } else if constexpr (A == ActKind::Sigmoid) {
        return __fdividef(1.0f, 1.0f + exp2_fast(x * -kLog2e));
    } else if constexpr (A == ActKind::Tanh) {
        // x P(x^2) / Q(x^2), P of degree 3 and Q of degree 2: a minimax fit of tanh(x) / x for
        // relative error over [0, 6] (1.2e-5), x clamped to [-6, 6] (NaN kept; tanh(6) is 1 -
        // 1.2e-5): at most 2.5e-5 relative error over the line as evaluated here. One MUFU, no
        // branch and no select, and few values live: `tanhf`, or the exp form beside a
        // polynomial near zero, kept more of them than the 128 x 192 tiles' epilogues have
        // registers for (both spilled).
        const float xc = fmin_nan(fmax_nan(x, -6.0f), 6.0f);
        const float s = xc * xc;
        float p = -2.54179622e-06f;
        p = fmaf(p, s, 0.00101154251f);
        p = fmaf(p, s, 0.109365657f);
        p = fmaf(p, s, 0.999987662f);
        float q = 0.0153115904f;
        q = fmaf(q, s, 0.442616761f);
        q = fmaf(q, s, 1.0f);
        return xc * p * rcp_fast(q);
    } else {
        return activate<A>(x);
    }
}

template <class T>
struct IsF32 {
    static constexpr bool value = false;
};
template <>
struct IsF32<float> {
    static constexpr bool value = true;
};

// ---------------------------------------------------------------------------------------------
// Epilogue: steps applied to an f32 accumulator element at (row, col) of the [M, N] output, in
// registers, before the store. `P` is the kernel's parameter struct; `p.epi[I]` is the I-th
// epilogue operand.
// ---------------------------------------------------------------------------------------------

/// An epilogue operand: element (r, c) is at `ptr[r * row_stride + c * col_stride]`. A bias has
/// `row_stride == 0`.
template <class T>
struct EpiTensor {
    const T* ptr;
    i64 row_stride;
    i64 col_stride;
};

/// `acc + bias[c]`.
template <int I>
struct Bias {
    template <class P>
    __device__ __forceinline__ static float apply(float v, i64 /*r*/, i64 c, const P& p) {
        return v + load_f32(p.epi[I].ptr, c * p.epi[I].col_stride);
    }
};

/// `acc + t[r, c]` (a residual).
template <int I>
struct AddTensor {
    template <class P>
    __device__ __forceinline__ static float apply(float v, i64 r, i64 c, const P& p) {
        const EpiTensor<typename P::Elem>& t = p.epi[I];
        return v + load_f32(t.ptr, r * t.row_stride + c * t.col_stride);
    }
};

/// `acc * t[r, c]`.
template <int I>
struct MulTensor {
    template <class P>
    __device__ __forceinline__ static float apply(float v, i64 r, i64 c, const P& p) {
        const EpiTensor<typename P::Elem>& t = p.epi[I];
        return v * load_f32(t.ptr, r * t.row_stride + c * t.col_stride);
    }
};

/// `act(acc)`: exact for f32 outputs, `activate_fast` for f16 / bf16 ones.
template <ActKind A>
struct Act {
    template <class P>
    __device__ __forceinline__ static float apply(float v, i64 /*r*/, i64 /*c*/, const P& /*p*/) {
        if constexpr (IsF32<typename P::Elem>::value) {
            return activate<A>(v);
        } else {
            return activate_fast<A>(v);
        }
    }
};

/// Steps applied left to right; `Chain<>` is the identity.
template <class... Steps>
struct Chain;

template <>
struct Chain<> {
    template <class P>
    __device__ __forceinline__ static float apply(float v, i64, i64, const P&) {
        return v;
    }
};

template <class S, class... Rest>
struct Chain<S, Rest...> {
    template <class P>
    __device__ __forceinline__ static float apply(float v, i64 r, i64 c, const P& p) {
        return Chain<Rest...>::apply(S::apply(v, r, c, p), r, c, p);
    }
};

/// A chain whose first step is `Bias<I>` (`kLead`): `Rest` is the chain after it.
template <class C>
struct LeadingBias {
    static constexpr bool kLead = false;
    static constexpr int kIndex = -1;
    using Rest = C;
};

template <int I, class... Steps>
struct LeadingBias<Chain<Bias<I>, Steps...>> {
    static constexpr bool kLead = true;
    static constexpr int kIndex = I;
    using Rest = Chain<Steps...>;
};

/// The epilogue of a plain GEMM: `Out(A @ B)`.
template <class Out>
struct SingleEpilogue {
    static constexpr bool kDual = false;
    template <class P>
    __device__ __forceinline__ static float apply(float acc, float /*up*/, i64 r, i64 c,
                                                  const P& p) {
        return Out::apply(acc, r, c, p);
    }
};

/// `Chain<S, X...>` for `C` = `Chain<X...>`.
template <class S, class C>
struct Prepend;
template <class S, class... X>
struct Prepend<S, Chain<X...>> {
    using type = Chain<S, X...>;
};

/// A chain whose last step is a ReLU (`kRelu`): `Rest` is the chain before it (`C` otherwise).
template <class C>
struct TrailingReluChain {
    static constexpr bool kRelu = false;
    using Rest = C;
};
template <>
struct TrailingReluChain<Chain<Act<ActKind::Relu>>> {
    static constexpr bool kRelu = true;
    using Rest = Chain<>;
};
template <class S, class... Steps>
struct TrailingReluChain<Chain<S, Steps...>> {
    static constexpr bool kRelu = TrailingReluChain<Chain<Steps...>>::kRelu;
    using Rest = typename Prepend<S, typename TrailingReluChain<Chain<Steps...>>::Rest>::type;
};

/// For kernels that round the output in pairs: whether `Epi` is a plain GEMM's epilogue whose
/// chain ends with a ReLU (`kRelu`), applied then to each packed pair (`relu2`), and the
/// epilogue before it (`Rest`; `Epi` itself otherwise).
template <class Epi>
struct TrailingRelu {
    static constexpr bool kRelu = false;
    using Rest = Epi;
};
template <class Out>
struct TrailingRelu<SingleEpilogue<Out>> {
    static constexpr bool kRelu = TrailingReluChain<Out>::kRelu;
    using Rest = SingleEpilogue<typename TrailingReluChain<Out>::Rest>;
};

/// `A` where `C`, else `B`.
template <bool C, class A, class B>
struct PickType {
    using type = A;
};
template <class A, class B>
struct PickType<false, A, B> {
    using type = B;
};

/// Whether `A` and `B` are one type (an enumerator: a `static constexpr` member used in a
/// `static_assert` becomes a global of the PTX).
template <class A, class B>
struct SameType {
    enum { value = 0 };
};
template <class A>
struct SameType<A, A> {
    enum { value = 1 };
};

/// For kernels that start their accumulators at the bias instead of zero: whether `Epi` is a
/// plain GEMM's epilogue whose chain starts with a bias (`kLead`, the operand `kIndex`), and the
/// epilogue that is left (`Rest`; `Epi` itself otherwise). Not for split K, whose partial tiles
/// would each add the bias.
template <class Epi>
struct BiasFirst {
    static constexpr bool kLead = false;
    static constexpr int kIndex = -1;
    using Rest = Epi;
};

template <class Out>
struct BiasFirst<SingleEpilogue<Out>> {
    static constexpr bool kLead = LeadingBias<Out>::kLead;
    static constexpr int kIndex = LeadingBias<Out>::kIndex;
    using Rest = SingleEpilogue<typename LeadingBias<Out>::Rest>;
};

/// `acc = v` for an accumulator register that a wgmma reads next, by an opaque move. Where an
/// accumulator's initial value came straight from an integer instruction (the bf16 widening's
/// `prmt` / `lop3`), ptxas kept the main loop's accumulators in registers of their own and copied
/// them into the wgmma's at the top of every k slice, then serialised every wgmma (C7514); a move
/// or an FP32 instruction as the last writer keeps one set of registers (docs/perf-notes.md, dense
/// variant 3w). The move costs nothing where ptxas can write the value in place.
__device__ __forceinline__ void seed_acc(float& acc, float v) {
    asm volatile("mov.b32 %0, %1;" : "=f"(acc) : "f"(v));
}

/// Starts B accumulator fragments of an m64nNk16 wgmma that share their columns (N / 2 registers
/// a thread each: acc[b][4 i + 2 h + e] is column n0 + 8 i + 2 (lane % 4) + e of both row halves
/// h) at the bias of those columns; columns at or past `n` start at zero. `whole`: the caller
/// knows every column is inside `n` and the bias contiguous and 4-byte aligned, so that one
/// 4-byte load a column pair serves.
template <class T, int N, int B>
__device__ __forceinline__ void bias_fragments(float (&acc)[B][N / 2], const EpiTensor<T>& bias,
                                               i64 n0, i64 n, int lane, bool whole) {
    const int t = lane & 3;
    if (whole) {
        const u32* w = reinterpret_cast<const u32*>(bias.ptr + n0) + t;
#pragma unroll
        for (int i = 0; i < N / 8; ++i) {
            float lo, hi;
            widen_pair<T>(__ldg(w + 4 * i), lo, hi);
#pragma unroll
            for (int b = 0; b < B; ++b) {
                seed_acc(acc[b][4 * i], lo);
                seed_acc(acc[b][4 * i + 1], hi);
                seed_acc(acc[b][4 * i + 2], lo);
                seed_acc(acc[b][4 * i + 3], hi);
            }
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < N / 8; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const i64 col = n0 + 8 * i + 2 * t + e;
            const float v = col < n ? load_f32(bias.ptr, col * bias.col_stride) : 0.0f;
#pragma unroll
            for (int b = 0; b < B; ++b) {
                seed_acc(acc[b][4 * i + e], v);
                seed_acc(acc[b][4 * i + 2 + e], v);
            }
        }
}

/// The epilogue of a dual GEMM: `Out(Gate(A @ Bg) * Up(A @ Bu))`.
template <class Gate, class Up, class Out>
struct DualEpilogue {
    static constexpr bool kDual = true;
    template <class P>
    __device__ __forceinline__ static float apply(float gate, float up, i64 r, i64 c, const P& p) {
        return Out::apply(Gate::apply(gate, r, c, p) * Up::apply(up, r, c, p), r, c, p);
    }
};

// ---------------------------------------------------------------------------------------------
// GEMM parameters, shared by the tensor-core and SIMT families
// ---------------------------------------------------------------------------------------------

/// How a GEMM operand sits in memory. For A (`[M,K]`): `N` is row-major `[M,K]` (k contiguous),
/// `T` is row-major `[K,M]` (m contiguous). For B (`[K,N]`): `N` is row-major `[K,N]` (n
/// contiguous), `T` is row-major `[N,K]` (k contiguous; an nn.Linear weight).
enum class Layout { N, T };

/// Run-time description of one GEMM. `lda`/`ldb`/`ldc` are the row strides (in elements) of the
/// matrices as stored. `b_up` is only read by dual GEMMs. The generated entry fills this struct
/// from literals and kernel arguments; being local and fully inlined, the literals fold into the
/// code as constants.
template <class T, int NEPI>
struct GemmParams {
    typedef T Elem;
    const T* a;
    const T* b;
    const T* b_up;
    T* c;
    i64 m, n, k;
    i64 lda, ldb, ldb_up, ldc;
    EpiTensor<T> epi[NEPI > 0 ? NEPI : 1];
};

}  // namespace mlpc
