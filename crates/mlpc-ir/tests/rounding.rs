//! Narrowing f64 to f16 / bf16 rounds once, to nearest with ties to even: what the model
//! format promises for weights given wider than the model's dtype, and what the reference
//! interpreter's outputs are compared with (the GPU and CPU kernels round their f32 results the
//! same way).

use mlpc_ir::{DType, HostTensor};
use proptest::prelude::*;

/// The neighbours of a 16-bit value `r` (as f64) in `dt`: the next value below and above.
fn neighbours(dt: DType, r: f64) -> (f64, f64) {
    let bits = |x: f64| -> u16 {
        let t = HostTensor::from_f64(dt, vec![1], &[x]).unwrap();
        u16::from_le_bytes([t.bytes()[0], t.bytes()[1]])
    };
    let value = |b: u16| -> f64 {
        HostTensor::from_bytes(dt, vec![1], b.to_le_bytes().to_vec())
            .unwrap()
            .to_f64()[0]
    };
    let b = bits(r);
    // Sign-magnitude: stepping the magnitude moves away from zero.
    let (down, up) = if r > 0.0 || (r == 0.0 && b == 0) {
        (if b == 0 { 0x8001 } else { b - 1 }, b + 1)
    } else {
        (b + 1, if b == 0x8000 { 0x0001 } else { b - 1 })
    };
    (value(down), value(up))
}

/// `r` is `dt`'s rounding of `v` to nearest, ties to the even mantissa.
fn assert_nearest_even(dt: DType, v: f64, r: f64) {
    if r.is_infinite() {
        // IEEE overflow: from half an ulp above the largest finite value on.
        let threshold = match dt {
            DType::F16 => 65520.0,
            _ => (2.0 - 2f64.powi(-8)) * 2f64.powi(127),
        };
        assert!(
            v.abs() >= threshold && r.signum() == v.signum(),
            "{dt}: {v:e} -> {r:e}"
        );
        return;
    }
    let (down, up) = neighbours(dt, r);
    let d = (v - r).abs();
    for n in [down, up] {
        if n.is_finite() {
            let dn = (v - n).abs();
            assert!(d <= dn, "{dt}: {v:e} rounded to {r:e}, but {n:e} is nearer");
            if d == dn {
                let t = HostTensor::from_f64(dt, vec![1], &[r]).unwrap();
                assert_eq!(t.bytes()[0] & 1, 0, "{dt}: tie {v:e} rounded to odd {r:e}");
            }
        }
    }
}

#[test]
fn values_just_above_a_tie_round_up() {
    // Exact f64 sums that f32 would round to the tie (and a second rounding then to even).
    let cases = [
        (
            DType::Bf16,
            1.0 + 2f64.powi(-8) + 2f64.powi(-40),
            1.0 + 2f64.powi(-7),
        ),
        (
            DType::Bf16,
            1.0 + 2f64.powi(-8) + 2f64.powi(-22),
            1.0 + 2f64.powi(-7),
        ),
        (
            DType::F16,
            1.0 + 2f64.powi(-11) + 2f64.powi(-24),
            1.0 + 2f64.powi(-10),
        ),
        (
            DType::F16,
            1.0 + 2f64.powi(-11) + 2f64.powi(-40),
            1.0 + 2f64.powi(-10),
        ),
        // Negative, and a true tie (to even: down).
        (
            DType::Bf16,
            -(1.0 + 2f64.powi(-8) + 2f64.powi(-40)),
            -(1.0 + 2f64.powi(-7)),
        ),
        (DType::Bf16, 1.0 + 2f64.powi(-8), 1.0),
        (DType::F16, 1.0 + 2f64.powi(-11), 1.0),
    ];
    for (dt, v, want) in cases {
        assert_eq!(dt.round(v), want, "{dt}.round({v:e})");
        let t = HostTensor::from_f64(dt, vec![1], &[v]).unwrap();
        assert_eq!(t.to_f64()[0], want, "{dt} from_f64({v:e})");
        let wide = HostTensor::from_f64(DType::F32, vec![1], &[v]).unwrap();
        // The f32 tensor holds v rounded once to f32; its cast rounds that.
        assert_eq!(wide.cast(dt).to_f64()[0], dt.round(wide.to_f64()[0]));
    }
}

#[test]
fn limits_and_specials() {
    for dt in [DType::F16, DType::Bf16] {
        assert!(dt.round(f64::NAN).is_nan());
        assert_eq!(dt.round(f64::INFINITY), f64::INFINITY);
        assert_eq!(dt.round(f64::NEG_INFINITY), f64::NEG_INFINITY);
        assert_eq!(dt.round(1e300), f64::INFINITY);
        assert_eq!(dt.round(-1e300), f64::NEG_INFINITY);
        assert_eq!(dt.round(1e-300), 0.0);
        assert!(dt.round(-1e-300).is_sign_negative());
    }
    // The largest finite values and the overflow thresholds (half an ulp above them).
    assert_eq!(DType::F16.round(65504.0), 65504.0);
    assert_eq!(DType::F16.round(65519.99), 65504.0);
    assert_eq!(DType::F16.round(65520.0), f64::INFINITY);
    let bf16_max = (2.0 - 2f64.powi(-7)) * 2f64.powi(127);
    assert_eq!(DType::Bf16.round(bf16_max), bf16_max);
    assert_eq!(
        DType::Bf16.round((2.0 - 2f64.powi(-8)) * 2f64.powi(127)),
        f64::INFINITY
    );
    assert_eq!(DType::Bf16.round(f32::MAX as f64 * 1.5), f64::INFINITY);
    // Subnormals: f16's smallest is 2^-24; just above half of it rounds up.
    assert_eq!(
        DType::F16.round(2f64.powi(-25) + 2f64.powi(-60)),
        2f64.powi(-24)
    );
    assert_eq!(DType::F16.round(2f64.powi(-25)), 0.0);
    assert_eq!(
        DType::Bf16.round(2f64.powi(-134) + 2f64.powi(-170)),
        2f64.powi(-133)
    );
}

proptest! {
    #[test]
    fn every_value_rounds_to_its_nearest_even_neighbour(
        mantissa in 1u64..(1 << 52),
        exp in -30i32..20,
        neg in any::<bool>(),
    ) {
        let v = (1.0 + mantissa as f64 / (1u64 << 52) as f64) * 2f64.powi(exp);
        let v = if neg { -v } else { v };
        for dt in [DType::F16, DType::Bf16] {
            assert_nearest_even(dt, v, dt.round(v));
        }
    }

    #[test]
    fn near_ties_round_to_the_nearer_side(
        top in 0u32..(1 << 11),
        exp in -14i32..15,
        below in 1u32..40,
        up in any::<bool>(),
    ) {
        // An f16 tie (an 11-bit mantissa and a half) moved by 2^-(12 + below) of its scale.
        let scale = 2f64.powi(exp);
        let tie = (1.0 + (top as f64 + 0.5) / 2048.0) * scale;
        let eps = 2f64.powi(-(12 + below as i32)) * scale;
        let v = if up { tie + eps } else { tie - eps };
        assert_nearest_even(DType::F16, v, DType::F16.round(v));
        let tie = (1.0 + ((top >> 4) as f64 + 0.5) / 128.0) * scale;
        let eps = 2f64.powi(-(8 + below as i32)) * scale;
        let v = if up { tie + eps } else { tie - eps };
        assert_nearest_even(DType::Bf16, v, DType::Bf16.round(v));
    }
}
