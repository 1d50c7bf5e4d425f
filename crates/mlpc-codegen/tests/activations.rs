//! The f16 / bf16 epilogues' gelu and tanh (`activate_fast<ActKind::Gelu>` and
//! `activate_fast<ActKind::Tanh>` in `common.cuh`), transcribed into f32 arithmetic here and held
//! to their stated accuracy against the exact functions: a change of a coefficient or of the
//! formula in the template must change the transcription too.

const TEMPLATE: &str = include_str!("../../../kernels-templates/common.cuh");

/// The template's coefficients: p of t = 1 / (1 + p z), then P(t) from its highest term.
const P: f32 = 0.3975;
const Q: [f32; 5] = [
    -0.084_794_84,
    0.148_049_47,
    0.118_373_83,
    0.159_781_1,
    0.158_564_93,
];
const K: f32 = 0.849_321_8;

/// `ex2.approx.ftz.f32`: results below the smallest normal flush to zero.
fn exp2_ftz(x: f32) -> f32 {
    let y = (x as f64).exp2() as f32;
    if y < f32::MIN_POSITIVE {
        0.0
    } else {
        y
    }
}

/// The template's gelu, operation by operation (`fmaf` as `mul_add`, `rcp.approx` as a
/// correctly rounded division: the hardware's is within one ulp of it).
fn gelu_fast(x: f32) -> f32 {
    let z = x.abs();
    let t = 1.0 / P.mul_add(z, 1.0);
    let mut q = Q[0];
    for c in &Q[1..] {
        q = q.mul_add(t, *c);
    }
    let y = x * K;
    let tail = q * t * exp2_ftz(-(y * y));
    x.min((-x).max(-3.0e38)).mul_add(tail, x.max(0.0))
}

fn gelu_exact(x: f64) -> f64 {
    0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2)
}

#[test]
fn the_transcription_is_the_templates_formula() {
    for line in [
        "const float t = rcp_fast(fmaf(0.3975f, z, 1.0f));",
        "float q = -0.08479484170675278f;",
        "q = fmaf(q, t, 0.1480494737625122f);",
        "q = fmaf(q, t, 0.1183738261461258f);",
        "q = fmaf(q, t, 0.1597810983657837f);",
        "q = fmaf(q, t, 0.15856492519378662f);",
        "const float y = x * 0.84932180028801907f;",
        "const float tail = q * t * exp2_fast(-(y * y));  // Phi(-|x|)",
        "return fmaf(fminf(x, fmaxf(-x, -3.0e38f)), tail, fmaxf(x, 0.0f));",
    ] {
        assert!(
            TEMPLATE.contains(line),
            "common.cuh no longer says `{line}`"
        );
    }
    // The f32 constants above are the template's decimal ones, rounded.
    assert_eq!(Q[0], -0.084_794_841_706_752_78_f64 as f32);
    assert_eq!(Q[4], 0.158_564_925_193_786_62_f64 as f32);
    assert_eq!(K, 0.849_321_800_288_019_1_f64 as f32);
}

#[test]
fn gelu_fast_is_accurate_in_the_middle_and_both_tails() {
    // Relative error against the exact gelu, by range of x; the template's comment promises
    // about 1e-4 everywhere above the flush of exp2 (x > -13), the outputs' own rounding being
    // 2^-9 (bf16) and 2^-12 (f16).
    let mut worst = [0.0f64; 3];
    let n = 200_000;
    for i in 0..=n {
        let x = -13.0 + 26.0 * i as f64 / n as f64;
        let exact = gelu_exact(x);
        if exact == 0.0 {
            continue;
        }
        let got = gelu_fast(x as f32) as f64;
        let rel = (got - exact).abs() / exact.abs();
        let band = if x >= 0.0 {
            0
        } else if x >= -4.0 {
            1
        } else {
            2
        };
        assert!(rel.is_finite(), "gelu_fast({x}) = {got}, exact {exact}");
        worst[band] = worst[band].max(rel);
    }
    for (band, w) in ["x >= 0", "-4 <= x < 0", "-13 < x < -4"].iter().zip(worst) {
        assert!(w < 1.2e-4, "gelu_fast: relative error {w:.3e} for {band}");
    }
    // Near zero the relu - |x| Phi(-|x|) form keeps the same relative accuracy (no cancellation
    // of a computed 1 - t, say).
    for x in [1e-30f32, -1e-30, 1e-8, -1e-8, 1e-5, -1e-5, 1e-3, -1e-3] {
        let rel = (gelu_fast(x) as f64 - gelu_exact(x as f64)).abs() / gelu_exact(x as f64).abs();
        assert!(rel < 1.2e-4, "gelu_fast({x}): relative error {rel:.3e}");
    }
}

#[test]
fn gelu_fast_keeps_the_limits_and_nan() {
    assert_eq!(gelu_fast(f32::INFINITY), f32::INFINITY);
    // -inf * 0.5 * (1 + erf(-inf)): NaN, as the reference computes it.
    assert!(gelu_fast(f32::NEG_INFINITY).is_nan());
    assert!(mlpc_ir::Activation::Gelu.eval(f64::NEG_INFINITY).is_nan());
    assert_eq!(gelu_fast(1e30), 1e30);
    assert_eq!(gelu_fast(-1e30), 0.0);
    assert_eq!(gelu_fast(0.0), 0.0);
    assert!(gelu_fast(f32::NAN).is_nan());
}

/// The template's tanh: x clamped to [-6, 6] (`min.NaN` / `max.NaN` keep a NaN), then
/// x P(x^2) / Q(x^2), highest terms first.
const TANH_P: [f32; 4] = [-2.541_796_2e-6, 0.001_011_542_5, 0.109_365_66, 0.999_987_66];
const TANH_Q: [f32; 3] = [0.015_311_59, 0.442_616_76, 1.0];

fn tanh_fast(x: f32) -> f32 {
    let xc = if x.is_nan() { x } else { x.clamp(-6.0, 6.0) };
    let s = xc * xc;
    let horner = |c: &[f32]| c[1..].iter().fold(c[0], |acc, &k| acc.mul_add(s, k));
    xc * horner(&TANH_P) * (1.0 / horner(&TANH_Q))
}

#[test]
fn the_tanh_transcription_is_the_templates_formula() {
    for line in [
        "const float xc = fmin_nan(fmax_nan(x, -6.0f), 6.0f);",
        "const float s = xc * xc;",
        "float p = -2.54179622e-06f;",
        "p = fmaf(p, s, 0.00101154251f);",
        "p = fmaf(p, s, 0.109365657f);",
        "p = fmaf(p, s, 0.999987662f);",
        "float q = 0.0153115904f;",
        "q = fmaf(q, s, 0.442616761f);",
        "q = fmaf(q, s, 1.0f);",
        "return xc * p * rcp_fast(q);",
        "asm(\"min.NaN.f32 %0, %1, %2;\" : \"=f\"(r) : \"f\"(x), \"f\"(y));",
        "asm(\"max.NaN.f32 %0, %1, %2;\" : \"=f\"(r) : \"f\"(x), \"f\"(y));",
    ] {
        assert!(
            TEMPLATE.contains(line),
            "common.cuh no longer says `{line}`"
        );
    }
    assert_eq!(TANH_P[0], -2.54179622e-06_f64 as f32);
    assert_eq!(TANH_P[3], 0.999987662_f64 as f32);
    assert_eq!(TANH_Q[1], 0.442616761_f64 as f32);
}

#[test]
fn tanh_fast_is_accurate_over_the_line() {
    // The template's comment promises 2.5e-5 relative error everywhere (the outputs' own
    // rounding: 2^-9 for bf16, 2^-12 for f16), near zero too (no 1 - exp cancellation).
    let n = 400_000;
    let mut worst = 0.0f64;
    for i in 0..=n {
        let x = -20.0 + 40.0 * i as f64 / n as f64;
        let x = x as f32;
        if x == 0.0 {
            continue;
        }
        let exact = (x as f64).tanh();
        let rel = (tanh_fast(x) as f64 - exact).abs() / exact.abs();
        assert!(rel.is_finite(), "tanh_fast({x}) = {}", tanh_fast(x));
        worst = worst.max(rel);
    }
    assert!(worst < 2.5e-5, "tanh_fast: relative error {worst:.3e}");
    for x in [
        1e-30f32, -1e-30, 1e-8, -1e-8, 1e-5, -1e-5, 1e-3, -1e-3, 0.5, -0.5,
    ] {
        let exact = (x as f64).tanh();
        let rel = (tanh_fast(x) as f64 - exact).abs() / exact.abs();
        assert!(rel < 2.5e-5, "tanh_fast({x}): relative error {rel:.3e}");
    }
}

#[test]
fn tanh_fast_keeps_the_limits_sign_and_nan() {
    for (x, y) in [
        (f32::INFINITY, 1.0f32),
        (f32::NEG_INFINITY, -1.0),
        (1e30, 1.0),
        (-1e30, -1.0),
    ] {
        let got = tanh_fast(x);
        assert!((got - y).abs() < 2.5e-5, "tanh_fast({x}) = {got}");
        assert!(got.abs() <= 1.0, "tanh_fast({x}) = {got}");
    }
    assert_eq!(tanh_fast(0.0), 0.0);
    assert!(tanh_fast(-0.0).is_sign_negative());
    for i in 1..1000 {
        let x = i as f32 / 100.0;
        assert_eq!(tanh_fast(-x), -tanh_fast(x), "odd at {x}");
    }
    assert!(tanh_fast(f32::NAN).is_nan());
}
