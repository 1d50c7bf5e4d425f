//! Host tensors: dense, row-major, little-endian bytes of one [`DType`]. Weights, inputs and
//! outputs cross every crate boundary in this form.

use crate::types::DType;
use std::fmt;

#[derive(Clone, PartialEq)]
pub struct HostTensor {
    dtype: DType,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// The shape and byte length of a tensor disagree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tensor data has {actual} bytes, but {dtype}{shape:?} needs {expected}")]
pub struct TensorSizeError {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub expected: usize,
    pub actual: usize,
}

impl HostTensor {
    /// Wraps little-endian row-major bytes.
    pub fn from_bytes(
        dtype: DType,
        shape: Vec<usize>,
        data: Vec<u8>,
    ) -> Result<HostTensor, TensorSizeError> {
        check_size(dtype, &shape, data.len())?;
        Ok(HostTensor { dtype, shape, data })
    }

    /// Rounds each value to `dtype` and stores it. `values.len()` must equal the shape's product.
    pub fn from_f64(
        dtype: DType,
        shape: Vec<usize>,
        values: &[f64],
    ) -> Result<HostTensor, TensorSizeError> {
        let mut data = vec![0u8; values.len() * dtype.size_bytes()];
        dtype.encode_le(values.iter().copied(), &mut data);
        HostTensor::from_bytes(dtype, shape, data)
    }

    pub fn from_f32(
        dtype: DType,
        shape: Vec<usize>,
        values: &[f32],
    ) -> Result<HostTensor, TensorSizeError> {
        let v: Vec<f64> = values.iter().map(|&x| x as f64).collect();
        HostTensor::from_f64(dtype, shape, &v)
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// The bytes, writable in place (their length, and so the dtype and shape, stay).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.data
    }

    /// Element `i` in row-major order, widened to f64 (exactly).
    pub fn get(&self, i: usize) -> f64 {
        match self.dtype {
            DType::F32 => {
                let b = &self.data[i * 4..i * 4 + 4];
                f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64
            }
            DType::F16 => {
                half::f16::from_le_bytes([self.data[2 * i], self.data[2 * i + 1]]).to_f64()
            }
            DType::Bf16 => {
                half::bf16::from_le_bytes([self.data[2 * i], self.data[2 * i + 1]]).to_f64()
            }
        }
    }

    /// Every element widened to f64 (exactly), in row-major order. Large tensors are widened on
    /// every core, each a run of whole elements.
    pub fn to_f64(&self) -> Vec<f64> {
        /// Elements from which the widening uses every core.
        const PARALLEL_ELEMENTS: usize = 1 << 20;
        let n = self.numel();
        let mut out = vec![0f64; n];
        let threads = crate::par::cores_for(n, PARALLEL_ELEMENTS);
        if threads <= 1 {
            self.widen_into(0, &mut out);
            return out;
        }
        let per = n.div_ceil(threads);
        std::thread::scope(|scope| {
            for (i, out) in out.chunks_mut(per).enumerate() {
                scope.spawn(move || self.widen_into(i * per, out));
            }
        });
        out
    }

    /// Elements `start .. start + out.len()` (row-major) widened to f64 (exactly) into `out`:
    /// a run of a tensor read without widening all of it. The run must lie inside the tensor.
    pub fn widen_into(&self, start: usize, out: &mut [f64]) {
        let es = self.dtype.size_bytes();
        let bytes = &self.data[start * es..(start + out.len()) * es];
        let mut out = out.iter_mut();
        self.dtype.for_each_f32(bytes, |x| {
            if let Some(o) = out.next() {
                *o = f64::from(x);
            }
        });
    }

    /// Converts to another element type, rounding to nearest even.
    pub fn cast(&self, dtype: DType) -> HostTensor {
        if dtype == self.dtype {
            return self.clone();
        }
        let mut data = vec![0u8; self.numel() * dtype.size_bytes()];
        self.dtype.recode_le(&self.data, dtype, &mut data);
        HostTensor {
            dtype,
            shape: self.shape.clone(),
            data,
        }
    }

    /// A tensor of `dtype` from `bytes`, little-endian row-major values of `stored` (a copy where
    /// the two are the same type, else a conversion that rounds to nearest even, with no copy of
    /// the bytes in between): for values read from a file in another type.
    pub fn from_le_bytes_as(
        stored: DType,
        shape: Vec<usize>,
        bytes: &[u8],
        dtype: DType,
    ) -> Result<HostTensor, TensorSizeError> {
        HostTensor::from_le_bytes_as_by_chunks(stored, shape, bytes, dtype, usize::MAX, |_| {})
    }

    /// [`HostTensor::from_le_bytes_as`], reading `bytes` a chunk of `chunk_elements` elements
    /// at a time, in order, and calling `read` with each chunk's range of `bytes` once it is
    /// copied out: a reader of a mapped file lets go of the pages it has read, so that the
    /// file's pages and the copy are never both resident whole.
    pub fn from_le_bytes_as_by_chunks(
        stored: DType,
        shape: Vec<usize>,
        bytes: &[u8],
        dtype: DType,
        chunk_elements: usize,
        mut read: impl FnMut(std::ops::Range<usize>),
    ) -> Result<HostTensor, TensorSizeError> {
        check_size(stored, &shape, bytes.len())?;
        let (from, to) = (stored.size_bytes(), dtype.size_bytes());
        let chunk = chunk_elements.max(1);
        // Zeros from the allocator, each page first touched when its values are written.
        let mut data = vec![0u8; bytes.len() / from * to];
        let mut start = 0;
        for (s, d) in bytes
            .chunks(chunk.saturating_mul(from))
            .zip(data.chunks_mut(chunk.saturating_mul(to)))
        {
            if stored == dtype {
                d.copy_from_slice(s);
            } else {
                stored.recode_le(s, dtype, d);
            }
            read(start..start + s.len());
            start += s.len();
        }
        Ok(HostTensor { dtype, shape, data })
    }
}

/// Whether `len` bytes are what `dtype` values of `shape` take.
fn check_size(dtype: DType, shape: &[usize], len: usize) -> Result<(), TensorSizeError> {
    let expected = shape
        .iter()
        .try_fold(dtype.size_bytes(), |a, &d| a.checked_mul(d));
    match expected {
        Some(e) if e == len => Ok(()),
        _ => Err(TensorSizeError {
            dtype,
            shape: shape.to_vec(),
            expected: expected.unwrap_or(usize::MAX),
            actual: len,
        }),
    }
}

impl fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostTensor({}{:?})", self.dtype, self.shape)
    }
}

/// Relative Frobenius error `||a - b|| / ||b||` (absolute when `b` is all zeros). NaN anywhere
/// makes it NaN, so a poisoned output never passes a comparison.
pub fn relative_error(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::NAN;
    }
    let mut num = 0.0;
    let mut den = 0.0;
    for (x, y) in a.iter().zip(b) {
        num += (x - y) * (x - y);
        den += y * y;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// [`relative_error`] with `||b||^2` floored at `b.len()`, i.e. relative to an output of mean
/// square 1 at least. For data of order 1, where a rounding of the terms is the same size however
/// much their sum cancels: the plain relative error of an output near zero blows that rounding up
/// past any tolerance, while a real mistake still moves the result by order 1.
pub fn relative_error_floored(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::NAN;
    }
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(b.len() as f64)).sqrt()
}

/// [`relative_error`] of a backend's output `a` against the reference `b` where the reference
/// itself holds NaN or infinities (NaN and infinities in weights and inputs are data): each such
/// element of `b` must be matched exactly in `a` (NaN by NaN, an infinity by the same one) and is
/// left out of the sums; any other mismatch, and NaN in `a` where `b` is finite (a poisoned
/// output), makes the error NaN (an infinity where `b` is finite makes it infinite). With a
/// finite `b` it is [`relative_error`].
pub fn relative_error_same_specials(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::NAN;
    }
    let mut num = 0.0;
    let mut den = 0.0;
    for (&x, &y) in a.iter().zip(b) {
        if y.is_finite() {
            num += (x - y) * (x - y);
            den += y * y;
        } else if !(x == y || (x.is_nan() && y.is_nan())) {
            return f64::NAN;
        }
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specials_of_the_reference_must_be_matched_exactly() {
        let inf = f64::INFINITY;
        let b = [1.0, f64::NAN, inf, -inf, 2.0];
        assert_eq!(
            relative_error_same_specials(&[1.0, f64::NAN, inf, -inf, 2.0], &b),
            0.0
        );
        let off = relative_error_same_specials(&[1.1, f64::NAN, inf, -inf, 2.0], &b);
        assert!((off - relative_error(&[1.1, 2.0], &[1.0, 2.0])).abs() < 1e-15);
        for wrong in [
            [1.0, 0.0, inf, -inf, 2.0],
            [1.0, f64::NAN, -inf, -inf, 2.0],
            [1.0, f64::NAN, f64::NAN, -inf, 2.0],
            [f64::NAN, f64::NAN, inf, -inf, 2.0],
            [1.0, f64::NAN, inf, -inf, inf],
        ] {
            // NaN, or infinite for an infinity where the reference is finite: never within a
            // tolerance.
            let e = relative_error_same_specials(&wrong, &b);
            assert!(!e.is_finite(), "{wrong:?}: {e}");
        }
        // A finite reference: the plain relative error, poisoned outputs still NaN.
        assert_eq!(
            relative_error_same_specials(&[3.0, 4.5], &[3.0, 4.0]),
            relative_error(&[3.0, 4.5], &[3.0, 4.0])
        );
        assert!(relative_error_same_specials(&[f64::NAN], &[1.0]).is_nan());
        assert!(relative_error_same_specials(&[1.0], &[1.0, 2.0]).is_nan());
    }

    #[test]
    fn the_floored_error_measures_near_zero_outputs_against_order_one() {
        // A single output that cancelled to 1e-3, off by a rounding of 1e-8.
        assert!(relative_error(&[1e-3 + 1e-8], &[1e-3]) > 1e-6);
        assert!(relative_error_floored(&[1e-3 + 1e-8], &[1e-3]) < 1e-7);
        // Large outputs: the same as the plain relative error.
        let (a, b) = ([3.0, 4.0 + 1e-3], [3.0, 4.0]);
        assert_eq!(relative_error_floored(&a, &b), relative_error(&a, &b));
        // A wrong answer stays wrong, and NaN stays NaN.
        assert!(relative_error_floored(&[0.5], &[1e-3]) > 0.4);
        assert!(relative_error_floored(&[f64::NAN], &[1.0]).is_nan());
        assert!(relative_error_floored(&[1.0], &[1.0, 2.0]).is_nan());
    }

    /// Bytes of every dtype: every 16-bit pattern (NaNs, infinities, subnormals) for f16 and
    /// bf16, and for f32 patterns across the range with its specials and extremes.
    fn bit_patterns() -> [(DType, Vec<u8>); 3] {
        let halves: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
        let singles: Vec<u8> = (0..=u32::MAX)
            .step_by(65_521)
            .chain([0x7f80_0000, 0xff80_0001, 1, 0x8000_0000])
            .chain([0x7f7f_ffff, 0x477f_f000])
            .flat_map(|b: u32| b.to_le_bytes())
            .collect();
        [
            (DType::F16, halves.clone()),
            (DType::Bf16, halves),
            (DType::F32, singles),
        ]
    }

    /// `to_f64` is `get` of every element, for every pattern of [`bit_patterns`], and for those
    /// patterns repeated past the size widened on every core (to a length no core count divides
    /// evenly, most likely).
    #[test]
    fn to_f64_is_get_of_every_element() {
        let patterns = bit_patterns().into_iter().flat_map(|(dtype, bytes)| {
            let es = dtype.size_bytes();
            let mut long = bytes.repeat((1 << 20) / (bytes.len() / es) + 2);
            long.truncate(long.len() - 7 * es);
            [(dtype, bytes), (dtype, long)]
        });
        for (dtype, bytes) in patterns {
            let n = bytes.len() / dtype.size_bytes();
            let t = HostTensor::from_bytes(dtype, vec![n], bytes).unwrap();
            let all = t.to_f64();
            assert_eq!(all.len(), n);
            for (i, v) in all.iter().enumerate() {
                assert_eq!(v.to_bits(), t.get(i).to_bits(), "{dtype} element {i}");
            }
        }
    }

    /// `widen_into` is `get` of every element of the run, for runs at every offset of a few
    /// lengths (empty, one element, the whole tensor), every pattern of [`bit_patterns`].
    #[test]
    fn widen_into_is_get_of_each_element_of_the_run() {
        for (dtype, bytes) in bit_patterns() {
            let n = bytes.len() / dtype.size_bytes();
            let t = HostTensor::from_bytes(dtype, vec![n], bytes).unwrap();
            for len in [0, 1, 7, n] {
                for start in (0..=n - len).step_by(997).chain([n - len]) {
                    let mut out = vec![f64::NAN; len];
                    t.widen_into(start, &mut out);
                    for (i, v) in out.iter().enumerate() {
                        assert_eq!(
                            v.to_bits(),
                            t.get(start + i).to_bits(),
                            "{dtype} {start}+{i}"
                        );
                    }
                }
            }
        }
    }

    /// Conversions between every pair of dtypes, by chunks of the recoder and straight from
    /// bytes, are each element rounded on its own: every 16-bit pattern, and f32 patterns
    /// across the range, more elements than a chunk holds.
    #[test]
    fn casts_round_each_element() {
        for (from, bytes) in bit_patterns() {
            let n = bytes.len() / from.size_bytes();
            let t = HostTensor::from_bytes(from, vec![n], bytes.clone()).unwrap();
            for to in DType::ALL {
                let c = t.cast(to);
                assert_eq!((c.dtype(), c.shape()), (to, &[n][..]));
                for i in 0..n {
                    let (got, want) = (c.get(i), to.round(t.get(i)));
                    assert!(
                        got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                        "{from} -> {to}, element {i}: {got:e}, want {want:e}"
                    );
                }
                let direct = HostTensor::from_le_bytes_as(from, vec![n], &bytes, to).unwrap();
                assert_eq!(direct.bytes(), c.bytes(), "{from} -> {to}");
            }
            // By chunks (of a size no recoder chunk divides): the same bytes, every range of
            // the source reported once, in order.
            for to in DType::ALL {
                let whole = HostTensor::from_le_bytes_as(from, vec![n], &bytes, to).unwrap();
                let mut ranges = Vec::new();
                let chunked =
                    HostTensor::from_le_bytes_as_by_chunks(from, vec![n], &bytes, to, 1001, |r| {
                        ranges.push(r)
                    })
                    .unwrap();
                assert_eq!(chunked.bytes(), whole.bytes(), "{from} -> {to} by chunks");
                assert!(ranges.len() > 1);
                let mut at = 0;
                for r in ranges {
                    assert_eq!(r.start, at);
                    assert!(r.len() <= 1001 * from.size_bytes());
                    at = r.end;
                }
                assert_eq!(at, bytes.len());
            }
            // The byte count is checked against the stored type, not the new one.
            let short = &bytes[..bytes.len() - 1];
            let e = HostTensor::from_le_bytes_as(from, vec![n], short, DType::F32).unwrap_err();
            assert_eq!((e.expected, e.actual), (n * from.size_bytes(), short.len()));
        }
    }

    #[test]
    fn roundtrip_and_size_check() {
        let t = HostTensor::from_f64(DType::Bf16, vec![2, 2], &[1.0, -2.0, 0.5, 3.0]).unwrap();
        assert_eq!(t.to_f64(), vec![1.0, -2.0, 0.5, 3.0]);
        assert_eq!(t.cast(DType::F32).to_f64(), vec![1.0, -2.0, 0.5, 3.0]);
        assert!(HostTensor::from_bytes(DType::F32, vec![3], vec![0; 8]).is_err());
    }

    #[test]
    fn nan_never_compares_close() {
        assert!(relative_error(&[f64::NAN, 1.0], &[1.0, 1.0]).is_nan());
        assert!(relative_error(&[1.0, 1.0], &[1.0, 1.0]) == 0.0);
    }
}
