//! Vector math in f32 lanes: the activations and the conversions between f32 and the 16-bit
//! storage types, all as plain LLVM IR (no calls into a math library).
//!
//! Accuracy, relative unless the value is tiny: `exp` about 2 ulp (Cephes' polynomial after range
//! reduction by ln 2; +inf above ln(f32::MAX), subnormal results kept); sigmoid and silu through
//! e^-|x|, so that their negative side never meets an overflow; `tanh` below 1e-7 (odd Taylor
//! polynomial under |x| < 0.4, then `1 - 2 / (exp(2|x|) + 1)`); GELU through `erfc` (relative
//! error below 1.2e-7) and the tanh GELU as `x / (1 + exp(-2y))`, so that neither cancels for
//! negative x. Measured on [-12, 12] against the f64 definitions (error over `max(|f(x)|,
//! 1e-3)`): gelu 1.4e-6, gelu_tanh 9e-7, silu, sigmoid and tanh below 1.5e-7; the test
//! `activations_are_accurate_per_element` holds every activation under 2e-6, and
//! `activations_at_the_ends_of_the_f32_line` the infinities, NaN and the limits. bf16 and f16
//! stores round to nearest even, NaN stays NaN.

use super::{Cg, R};
use inkwell::values::VectorValue;
use inkwell::{FloatPredicate, IntPredicate};
use mlpc_ir::{Activation, DType};

impl<'ctx> Cg<'ctx> {
    fn add(&self, a: VectorValue<'ctx>, b: VectorValue<'ctx>) -> R<VectorValue<'ctx>> {
        Ok(self.b.build_float_add(a, b, "add")?)
    }

    fn mul(&self, a: VectorValue<'ctx>, b: VectorValue<'ctx>) -> R<VectorValue<'ctx>> {
        Ok(self.b.build_float_mul(a, b, "mul")?)
    }

    /// `a * b + c` with constant `b` and `c`.
    fn fma_c(&self, a: VectorValue<'ctx>, b: f32, c: f32) -> R<VectorValue<'ctx>> {
        self.fma(a, self.splat_f(b), self.splat_f(c))
    }

    /// Horner evaluation of `c[0] + c[1] x + c[2] x^2 + ...`.
    fn poly(&self, x: VectorValue<'ctx>, c: &[f32]) -> R<VectorValue<'ctx>> {
        let mut acc = self.splat_f(c[c.len() - 1]);
        for &k in c[..c.len() - 1].iter().rev() {
            acc = self.fma(acc, x, self.splat_f(k))?;
        }
        Ok(acc)
    }

    fn select_lt(
        &self,
        a: VectorValue<'ctx>,
        b: VectorValue<'ctx>,
        t: VectorValue<'ctx>,
        f: VectorValue<'ctx>,
    ) -> R<VectorValue<'ctx>> {
        let c = self
            .b
            .build_float_compare(FloatPredicate::OLT, a, b, "lt")?;
        Ok(self.b.build_select(c, t, f, "sel")?.into_vector_value())
    }

    fn unary(&self, name: &str, x: VectorValue<'ctx>) -> R<VectorValue<'ctx>> {
        let f = self.intrinsic(name, &[self.vf.into()])?;
        Ok(self.call(f, &[x.into()])?.into_vector_value())
    }

    fn copysign(&self, mag: VectorValue<'ctx>, sign: VectorValue<'ctx>) -> R<VectorValue<'ctx>> {
        let f = self.intrinsic("llvm.copysign", &[self.vf.into()])?;
        Ok(self
            .call(f, &[mag.into(), sign.into()])?
            .into_vector_value())
    }

    fn bits(&self, x: VectorValue<'ctx>) -> R<VectorValue<'ctx>> {
        Ok(self
            .b
            .build_bit_cast(x, self.vi32, "bits")?
            .into_vector_value())
    }

    pub(crate) fn as_float(&self, x: VectorValue<'ctx>) -> R<VectorValue<'ctx>> {
        Ok(self
            .b
            .build_bit_cast(x, self.vf, "float")?
            .into_vector_value())
    }

    /// `e^x`; NaN stays NaN, +inf above ln(f32::MAX) (so that `1 / (1 + e^-x)` and
    /// `x / (1 + e^-x)` reach 0 for every negative x, not a tiny value times a huge x), 0 (or the
    /// smallest subnormal) below -104, subnormal results kept between. The scale 2^n is applied
    /// as 2^(n >> 1) 2^(n - (n >> 1)), both halves normal numbers over that whole range.
    pub(crate) fn exp(&self, x: VectorValue<'ctx>) -> R<VectorValue<'ctx>> {
        // ln(f32::MAX) = 88.72284; e^x rounds to 0 below -103.98.
        const HI: f32 = 88.722_84;
        const LO: f32 = -104.0;
        let hi = self.splat_f(HI);
        let lo = self.splat_f(LO);
        let xin = x;
        let x = self.select_lt(hi, x, hi, x)?;
        let x = self.select_lt(x, lo, lo, x)?;
        let n = self.unary("llvm.floor", self.fma_c(x, std::f32::consts::LOG2_E, 0.5)?)?;
        let r = self.fma(n, self.splat_f(-0.693_359_4), x)?;
        let r = self.fma(n, self.splat_f(2.121_944_4e-4), r)?;
        let p = self.poly(
            r,
            &[
                0.5,
                1.666_666_5e-1,
                4.166_579_6e-2,
                8.333_452e-3,
                1.398_2e-3,
                1.987_569_1e-4,
            ],
        )?;
        let r2 = self.mul(r, r)?;
        let y = self.fma(p, r2, r)?;
        let y = self.add(y, self.splat_f(1.0))?;
        // n in [-150, 128]: halves in [-75, 64], each 2^half a normal number.
        let ni = self.b.build_float_to_signed_int(n, self.vi32, "n")?;
        let n1 = self
            .b
            .build_right_shift(ni, self.splat_i32(1), true, "n1")?;
        let n2 = self.b.build_int_sub(ni, n1, "n2")?;
        let scale = |k, name| -> R<VectorValue<'ctx>> {
            let e = self.b.build_int_add(k, self.splat_i32(127), name)?;
            let e = self.b.build_left_shift(e, self.splat_i32(23), name)?;
            self.as_float(e)
        };
        let y = self.mul(self.mul(y, scale(n1, "e1")?)?, scale(n2, "e2")?)?;
        let y = self.select_lt(xin, lo, self.splat_f(0.0), y)?;
        self.select_lt(hi, xin, self.splat_f(f32::INFINITY), y)
    }

    /// `1 / (1 + e^-x)` as `e^x / (1 + e^x)` for negative x: e^-|x| never overflows, so the
    /// small values of the negative side (and silu's `x * sigmoid(x)` there) keep their size.
    fn sigmoid(&self, x: VectorValue<'ctx>) -> R<VectorValue<'ctx>> {
        let ax = self.unary("llvm.fabs", x)?;
        let e = self.exp(self.b.build_float_neg(ax, "neg")?)?;
        let d = self.add(e, self.splat_f(1.0))?;
        let s = self.b.build_float_div(self.splat_f(1.0), d, "sig")?;
        self.select_lt(x, self.splat_f(0.0), self.mul(e, s)?, s)
    }

    fn tanh(&self, x: VectorValue<'ctx>) -> R<VectorValue<'ctx>> {
        let ax = self.unary("llvm.fabs", x)?;
        // Small |x|: x + x^3 (c3 + c5 x^2 + ...), the Taylor series of tanh.
        let x2 = self.mul(x, x)?;
        let p = self.poly(
            x2,
            &[
                -1.0 / 3.0,
                2.0 / 15.0,
                -17.0 / 315.0,
                62.0 / 2835.0,
                -1382.0 / 155_925.0,
            ],
        )?;
        let x3 = self.mul(x2, x)?;
        let small = self.fma(x3, p, x)?;
        // Otherwise 1 - 2 / (e^{2|x|} + 1) with the sign of x.
        let e = self.exp(self.add(ax, ax)?)?;
        let d = self.add(e, self.splat_f(1.0))?;
        let q = self.b.build_float_div(self.splat_f(2.0), d, "q")?;
        let big = self.b.build_float_sub(self.splat_f(1.0), q, "t")?;
        let big = self.copysign(big, x)?;
        self.select_lt(ax, self.splat_f(0.4), small, big)
    }

    /// `erfc(u)` with a relative error below 1.2e-7 for every u (the Chebyshev fit of Numerical
    /// Recipes' `erfcc`: `t exp(-z^2 + P(t))`, `t = 1 / (1 + z/2)`, `z = |u|`; `2 - erfc(z)` for
    /// negative u). Relative accuracy in the tail is what keeps `x * erfc(..)` accurate for
    /// negative x, where `1 + erf` would cancel.
    fn erfc(&self, u: VectorValue<'ctx>) -> R<VectorValue<'ctx>> {
        let z = self.unary("llvm.fabs", u)?;
        let d = self.fma_c(z, 0.5, 1.0)?;
        let t = self.b.build_float_div(self.splat_f(1.0), d, "t")?;
        let p = self.poly(
            t,
            &[
                -1.265_512_2,
                1.000_023_7,
                0.374_091_96,
                0.096_784_18,
                -0.186_288_06,
                0.278_868_07,
                -1.135_204,
                1.488_515_9,
                -0.822_152_25,
                0.170_872_77,
            ],
        )?;
        let z2 = self.b.build_float_neg(self.mul(z, z)?, "nz2")?;
        let r = self.mul(t, self.exp(self.add(z2, p)?)?)?;
        let neg = self.b.build_float_sub(self.splat_f(2.0), r, "2-r")?;
        self.select_lt(u, self.splat_f(0.0), neg, r)
    }

    /// `act(x)` in f32 lanes, as [`Activation::eval`] defines it.
    pub(crate) fn activation(&self, a: Activation, x: VectorValue<'ctx>) -> R<VectorValue<'ctx>> {
        let half = self.splat_f(0.5);
        match a {
            Activation::Relu => {
                // NaN gives 0, as `f64::max(x, 0)` does.
                let zero = self.splat_f(0.0);
                let pos = self
                    .b
                    .build_float_compare(FloatPredicate::OGT, x, zero, "pos")?;
                Ok(self
                    .b
                    .build_select(pos, x, zero, "relu")?
                    .into_vector_value())
            }
            Activation::Sigmoid => self.sigmoid(x),
            Activation::Silu => self.mul(x, self.sigmoid(x)?),
            Activation::Tanh => self.tanh(x),
            Activation::GeluTanh => {
                // 0.5 x (1 + tanh y) = x / (1 + e^{-2y}): no cancellation for negative x.
                let c = (2.0 / std::f64::consts::PI).sqrt() as f32;
                let x2 = self.mul(x, x)?;
                let m2y = self.fma_c(x2, -2.0 * 0.044_715 * c, -2.0 * c)?;
                let e = self.exp(self.mul(x, m2y)?)?;
                let d = self.add(e, self.splat_f(1.0))?;
                Ok(self.b.build_float_div(x, d, "gelu_tanh")?)
            }
            Activation::Gelu => {
                // 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x erfc(-x / sqrt 2).
                let u = self.mul(x, self.splat_f(-std::f32::consts::FRAC_1_SQRT_2))?;
                let e = self.erfc(u)?;
                self.mul(self.mul(half, x)?, e)
            }
        }
    }

    /// Widens `<lanes x i16>` bf16/f16 bits (or passes f32 through) to f32 lanes.
    pub(crate) fn raw_to_f32(&self, raw: VectorValue<'ctx>, dt: DType) -> R<VectorValue<'ctx>> {
        let b = &self.b;
        match dt {
            DType::F32 => Ok(raw),
            DType::Bf16 => {
                let w = b.build_int_z_extend(raw, self.vi32, "w")?;
                let s = b.build_left_shift(w, self.splat_i32(16), "s")?;
                self.as_float(s)
            }
            DType::F16 => {
                // Exponent and mantissa shifted into f32 position, rescaled by 2^112 (which
                // handles subnormals too); Inf and NaN get the all-ones exponent back.
                let w = b.build_int_z_extend(raw, self.vi32, "w")?;
                let em = b.build_and(w, self.splat_i32(0x7fff), "em")?;
                let sign = b.build_and(w, self.splat_i32(0x8000), "sign")?;
                let sign = b.build_left_shift(sign, self.splat_i32(16), "sign32")?;
                let sh = b.build_left_shift(em, self.splat_i32(13), "sh")?;
                let f = self.mul(
                    self.as_float(sh)?,
                    self.as_float(self.splat_i32(0x7780_0000))?,
                )?;
                let fb = self.bits(f)?;
                let inf =
                    b.build_int_compare(IntPredicate::UGE, em, self.splat_i32(0x7c00), "inf")?;
                let fixed = b.build_or(fb, self.splat_i32(0x7f80_0000), "infnan")?;
                let fb = b.build_select(inf, fixed, fb, "fb")?.into_vector_value();
                let out = b.build_or(fb, sign, "signed")?;
                self.as_float(out)
            }
        }
    }

    /// Rounds f32 lanes to `dt` (nearest even) and returns its storage lanes.
    pub(crate) fn f32_to_raw(&self, v: VectorValue<'ctx>, dt: DType) -> R<VectorValue<'ctx>> {
        let b = &self.b;
        match dt {
            DType::F32 => Ok(v),
            DType::Bf16 => {
                let u = self.bits(v)?;
                let hi = b.build_right_shift(u, self.splat_i32(16), false, "hi")?;
                let lsb = b.build_and(hi, self.splat_i32(1), "lsb")?;
                let bias = b.build_int_add(lsb, self.splat_i32(0x7fff), "bias")?;
                let r = b.build_int_add(u, bias, "r")?;
                let r = b.build_right_shift(r, self.splat_i32(16), false, "rne")?;
                let qnan = b.build_or(hi, self.splat_i32(0x40), "qnan")?;
                let nan = b.build_float_compare(FloatPredicate::UNO, v, v, "nan")?;
                let r = b.build_select(nan, qnan, r, "bf")?.into_vector_value();
                Ok(b.build_int_truncate(r, self.vi16, "bf16")?)
            }
            DType::F16 => {
                let u = self.bits(v)?;
                let sign = b.build_and(u, self.splat_i32(0x8000_0000), "sign")?;
                let a = b.build_xor(u, sign, "abs")?;
                // Overflow: Inf, or a quiet NaN for NaN.
                let is_nan = b.build_int_compare(
                    IntPredicate::UGT,
                    a,
                    self.splat_i32(0x7f80_0000),
                    "isnan",
                )?;
                let special = b
                    .build_select(
                        is_nan,
                        self.splat_i32(0x7e00),
                        self.splat_i32(0x7c00),
                        "special",
                    )?
                    .into_vector_value();
                let too_big =
                    b.build_int_compare(IntPredicate::UGE, a, self.splat_i32(143 << 23), "big")?;
                // Subnormal results: let the FPU round by adding a magic number.
                let magic = self.splat_i32(126 << 23);
                let sub = self.add(self.as_float(a)?, self.as_float(magic)?)?;
                let sub = b.build_int_sub(self.bits(sub)?, magic, "sub")?;
                let tiny =
                    b.build_int_compare(IntPredicate::ULT, a, self.splat_i32(113 << 23), "tiny")?;
                // Normal results: rebias the exponent and round the 13 dropped bits to even.
                let odd = b.build_right_shift(a, self.splat_i32(13), false, "m")?;
                let odd = b.build_and(odd, self.splat_i32(1), "odd")?;
                let rebias = self.splat_i32(((15i32 - 127) << 23) as u32 + 0xfff);
                let n = b.build_int_add(a, rebias, "n")?;
                let n = b.build_int_add(n, odd, "n.odd")?;
                let n = b.build_right_shift(n, self.splat_i32(13), false, "n.sh")?;
                let r = b.build_select(tiny, sub, n, "r")?.into_vector_value();
                let r = b
                    .build_select(too_big, special, r, "r2")?
                    .into_vector_value();
                let s16 = b.build_right_shift(sign, self.splat_i32(16), false, "s16")?;
                let r = b.build_or(r, s16, "h")?;
                Ok(b.build_int_truncate(r, self.vi16, "f16")?)
            }
        }
    }
}
