//! Tensor types: element type, shape of fixed or symbolic dimensions, strides.
//!
//! A symbolic dimension (`T`, `batch`) is bound when the compiled model runs; every other dimension is
//! fixed at compile time. Strides are counted in elements and may be products of symbols, so that a
//! view of a tensor whose inner dimension is symbolic can still be described exactly.

use smallvec::SmallVec;
use std::fmt;
use std::sync::Arc;

/// Storage and compute element type of a tensor. Accumulation is always f32 or wider.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    Bf16,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

    /// The name used in model.json, the text form and kernel names.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        }
    }

    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }

    /// Rounds a value to the nearest value representable in this type (round to nearest even,
    /// once: see [`f32_round_to_odd`]).
    /// The unit roundoff: the largest relative error of a rounding to nearest into this type
    /// (half an ulp at 1), for values in its normal range.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            DType::F32 => f64::powi(2.0, -24),
            DType::F16 => f64::powi(2.0, -11),
            DType::Bf16 => f64::powi(2.0, -8),
        }
    }

    pub fn round(self, v: f64) -> f64 {
        match self {
            DType::F32 => v as f32 as f64,
            DType::F16 => half::f16::from_f32(f32_round_to_odd(v)).to_f64(),
            DType::Bf16 => half::bf16::from_f32(f32_round_to_odd(v)).to_f64(),
        }
    }

    /// Calls `f` with each element of `bytes` (little-endian values of this type) as an f32, in
    /// order. Exact: every model dtype converts to f32 without rounding.
    pub fn for_each_f32(self, bytes: &[u8], mut f: impl FnMut(f32)) {
        match self {
            DType::F32 => bytes
                .chunks_exact(4)
                .for_each(|b| f(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            DType::F16 => bytes
                .chunks_exact(2)
                .for_each(|b| f(half::f16::from_le_bytes([b[0], b[1]]).to_f32())),
            DType::Bf16 => bytes
                .chunks_exact(2)
                .for_each(|b| f(half::bf16::from_le_bytes([b[0], b[1]]).to_f32())),
        }
    }

    /// Appends `v` rounded to this type (as [`DType::round`]) as little-endian bytes.
    pub fn push_le(self, v: f64, out: &mut Vec<u8>) {
        let mut bytes = [0u8; 4];
        let n = self.size_bytes();
        self.encode_le(std::iter::once(v), &mut bytes[..n]);
        out.extend_from_slice(&bytes[..n]);
    }

    /// Converts `src`, little-endian values of this type, to `to` (rounding as [`DType::round`]
    /// does) into `dst`, element for element until either runs out; a few thousand elements at a
    /// time, so no wider copy of the whole is ever held.
    pub fn recode_le(self, src: &[u8], to: DType, dst: &mut [u8]) {
        const CHUNK: usize = 4096;
        let mut values = Vec::with_capacity(CHUNK);
        for (s, d) in src
            .chunks(CHUNK * self.size_bytes())
            .zip(dst.chunks_mut(CHUNK * to.size_bytes()))
        {
            values.clear();
            self.for_each_f32(s, |x| values.push(f64::from(x)));
            to.encode_le(values.iter().copied(), d);
        }
    }

    /// Writes `values` rounded to this type (as [`DType::round`]) into `out` as little-endian
    /// bytes, one element after another, until either runs out. The one encoder of stored
    /// values; the type is matched once, not per element.
    #[inline]
    pub fn encode_le(self, values: impl IntoIterator<Item = f64>, out: &mut [u8]) {
        let values = values.into_iter();
        match self {
            DType::F32 => out
                .chunks_exact_mut(4)
                .zip(values)
                .for_each(|(o, v)| o.copy_from_slice(&(v as f32).to_le_bytes())),
            DType::F16 => out.chunks_exact_mut(2).zip(values).for_each(|(o, v)| {
                o.copy_from_slice(&half::f16::from_f32(f32_round_to_odd(v)).to_le_bytes())
            }),
            DType::Bf16 => out.chunks_exact_mut(2).zip(values).for_each(|(o, v)| {
                o.copy_from_slice(&half::bf16::from_f32(f32_round_to_odd(v)).to_le_bytes())
            }),
        }
    }
}

/// `v` as an f32 rounded to odd: truncated toward zero, with the last mantissa bit set where
/// that dropped anything. Rounding this to nearest even in a format of at most 22 significant
/// bits (f16: 11, bf16: 8) gives what rounding `v` itself would: the odd bit stands for
/// everything below f32's precision, so a tie can only be a true tie. Rounding f64 -> f32 ->
/// 16 bits to nearest twice could not: 1 + 2^-8 + 2^-40 became the tie 1 + 2^-8 in f32 and
/// then 1 in bf16, not 1 + 2^-7. (`half`'s own `from_f64` rounds twice or drops the low bits.)
/// NaN stays NaN; beyond f32's range the result is f32::MAX (odd), which rounds to infinity in
/// both 16-bit formats as `v` does.
#[inline]
pub fn f32_round_to_odd(v: f64) -> f32 {
    let f = v as f32;
    if f.is_nan() {
        return f;
    }
    // Without branches on the values (random weights round either way half the time): where the
    // cast rounded away from zero (to infinity too) one step back toward zero, then the odd bit
    // where it was inexact. Neither can carry out of the magnitude, and the step back from a
    // magnitude above |v| >= 0 never passes zero.
    let (fa, va) = ((f as f64).abs(), v.abs());
    let away = (fa > va) as u32;
    let inexact = (fa != va) as u32;
    f32::from_bits((f.to_bits() - away) | inexact)
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A symbol naming a dimension bound at run time.
pub type Symbol = Arc<str>;

/// One dimension of a shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    Fixed(u64),
    Sym(Symbol),
}

impl Dim {
    pub fn sym(name: &str) -> Dim {
        Dim::Sym(Arc::from(name))
    }

    pub fn fixed(self: &Dim) -> Option<u64> {
        match self {
            Dim::Fixed(n) => Some(*n),
            Dim::Sym(_) => None,
        }
    }

    /// The value of this dimension under `bindings`, if it is fixed or bound.
    pub fn resolve(&self, bindings: &Bindings) -> Option<u64> {
        match self {
            Dim::Fixed(n) => Some(*n),
            Dim::Sym(s) => bindings.get(s),
        }
    }
}

impl From<u64> for Dim {
    fn from(n: u64) -> Dim {
        Dim::Fixed(n)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// Whether `s` is a valid symbol name: an ASCII letter or `_`, then letters, digits or `_`.
pub fn is_valid_symbol(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub type Shape = SmallVec<[Dim; 4]>;

/// A product `coeff * sym0 * sym1 * ...` of a constant and symbols: a stride or an element count.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Extent {
    pub coeff: u64,
    /// Sorted, so that equal products compare equal.
    pub syms: SmallVec<[Symbol; 2]>,
}

impl Extent {
    pub fn constant(coeff: u64) -> Extent {
        Extent {
            coeff,
            syms: SmallVec::new(),
        }
    }

    pub fn of_dim(d: &Dim) -> Extent {
        match d {
            Dim::Fixed(n) => Extent::constant(*n),
            Dim::Sym(s) => Extent {
                coeff: 1,
                syms: smallvec::smallvec![s.clone()],
            },
        }
    }

    /// `self * other`, or `None` when the constant part overflows u64.
    pub fn checked_mul(&self, other: &Extent) -> Option<Extent> {
        let coeff = self.coeff.checked_mul(other.coeff)?;
        let mut syms: SmallVec<[Symbol; 2]> =
            self.syms.iter().chain(other.syms.iter()).cloned().collect();
        syms.sort();
        Some(Extent { coeff, syms })
    }

    pub fn as_constant(&self) -> Option<u64> {
        self.syms.is_empty().then_some(self.coeff)
    }

    pub fn resolve(&self, bindings: &Bindings) -> Option<u64> {
        let mut v = self.coeff;
        for s in &self.syms {
            v = v.checked_mul(bindings.get(s)?)?;
        }
        Some(v)
    }
}

impl fmt::Display for Extent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.syms.is_empty() {
            return write!(f, "{}", self.coeff);
        }
        let mut first = true;
        if self.coeff != 1 {
            write!(f, "{}", self.coeff)?;
            first = false;
        }
        for s in &self.syms {
            if !first {
                f.write_str("*")?;
            }
            f.write_str(s)?;
            first = false;
        }
        Ok(())
    }
}

pub type Strides = SmallVec<[Extent; 4]>;

/// The row-major (C-contiguous) strides of `shape`, or `None` if a constant product overflows.
pub fn contiguous_strides(shape: &[Dim]) -> Option<Strides> {
    let mut strides: Strides = SmallVec::from_elem(Extent::constant(1), shape.len());
    let mut acc = Extent::constant(1);
    for i in (0..shape.len()).rev() {
        strides[i] = acc.clone();
        acc = acc.checked_mul(&Extent::of_dim(&shape[i]))?;
    }
    Some(strides)
}

/// Type of a value in the graph: element type, shape and strides (in elements).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
    pub strides: Strides,
}

impl TensorType {
    /// A row-major tensor. Panics only if the constant element count overflows u64, which callers
    /// rule out first with [`TensorType::try_contiguous`] when the shape comes from user input.
    pub fn contiguous(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        Self::try_contiguous(dtype, shape)
            .expect("element count of a contiguous shape overflows u64")
    }

    pub fn try_contiguous(dtype: DType, shape: impl Into<Shape>) -> Option<TensorType> {
        let shape = shape.into();
        let strides = contiguous_strides(&shape)?;
        // The element count must fit too.
        numel_extent(&shape)?;
        Some(TensorType {
            dtype,
            shape,
            strides,
        })
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn is_contiguous(&self) -> bool {
        contiguous_strides(&self.shape).is_some_and(|s| s == self.strides)
    }

    /// Number of elements as a product of a constant and symbols.
    pub fn numel(&self) -> Extent {
        numel_extent(&self.shape).unwrap_or_else(|| Extent::constant(u64::MAX))
    }

    /// Concrete shape under `bindings`; `None` if a symbol is unbound.
    pub fn concrete_shape(&self, bindings: &Bindings) -> Option<Vec<usize>> {
        self.shape
            .iter()
            .map(|d| d.resolve(bindings).map(|v| v as usize))
            .collect()
    }

    pub fn concrete_strides(&self, bindings: &Bindings) -> Option<Vec<usize>> {
        self.strides
            .iter()
            .map(|s| s.resolve(bindings).map(|v| v as usize))
            .collect()
    }

    /// Symbols appearing in the shape, in order of first appearance.
    pub fn symbols(&self) -> Vec<Symbol> {
        let mut out: Vec<Symbol> = Vec::new();
        for d in &self.shape {
            if let Dim::Sym(s) = d {
                if !out.contains(s) {
                    out.push(s.clone());
                }
            }
        }
        out
    }
}

fn numel_extent(shape: &[Dim]) -> Option<Extent> {
    shape.iter().try_fold(Extent::constant(1), |acc, d| {
        acc.checked_mul(&Extent::of_dim(d))
    })
}

/// `bf16[T,768]`, followed by ` strides=[1,768]` when the layout is not row-major.
impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")?;
        if !self.is_contiguous() {
            f.write_str(" strides=[")?;
            for (i, s) in self.strides.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{s}")?;
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

/// Values of symbolic dimensions, bound from the shapes of the inputs at run time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bindings {
    values: Vec<(Symbol, u64)>,
}

impl Bindings {
    pub fn new() -> Bindings {
        Bindings::default()
    }

    pub fn get(&self, sym: &str) -> Option<u64> {
        self.values
            .iter()
            .find(|(s, _)| &**s == sym)
            .map(|(_, v)| *v)
    }

    /// Binds `sym` to `value`; returns the earlier value if it was bound to a different one.
    pub fn bind(&mut self, sym: &Symbol, value: u64) -> Result<(), u64> {
        match self.get(sym) {
            Some(v) if v != value => Err(v),
            Some(_) => Ok(()),
            None => {
                self.values.push((sym.clone(), value));
                Ok(())
            }
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.values.iter().map(|(s, v)| (&**s, *v))
    }
}

impl fmt::Display for Bindings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (s, v)) in self.values.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{s}={v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallvec::smallvec;

    #[test]
    fn contiguous_strides_with_symbols() {
        let t = TensorType::contiguous(
            DType::Bf16,
            smallvec![Dim::sym("B"), Dim::sym("T"), Dim::Fixed(768)] as Shape,
        );
        let s: Vec<String> = t.strides.iter().map(|e| e.to_string()).collect();
        assert_eq!(s, ["768*T", "768", "1"]);
        assert_eq!(t.to_string(), "bf16[B,T,768]");
        assert_eq!(t.numel().to_string(), "768*B*T");
    }

    #[test]
    fn overflowing_shape_is_rejected() {
        let shape: Shape = smallvec![Dim::Fixed(u64::MAX / 2), Dim::Fixed(3)];
        assert!(TensorType::try_contiguous(DType::F32, shape).is_none());
    }

    #[test]
    fn rounding_matches_storage_types() {
        assert_eq!(DType::Bf16.round(1.0 + 1.0 / 512.0), 1.0);
        assert_eq!(DType::F16.round(1.0 + 1.0 / 4096.0), 1.0);
        assert_ne!(DType::F32.round(1.0 + 1.0 / 4096.0), 1.0);
    }

    /// `f32_round_to_odd` against its definition written out with branches: the f32 nearest `v`
    /// toward zero, its last bit set where that is not `v`. On f64 values of every exponent,
    /// and on values a few f64 ulps from f32 values (exact, just above, just below, across
    /// zero, the subnormals and f32::MAX) where the cast rounds either way.
    #[test]
    fn round_to_odd_is_its_definition() {
        fn definition(v: f64) -> f32 {
            let f = v as f32;
            if f.is_nan() || f as f64 == v {
                return f;
            }
            let toward_zero = if (f as f64).abs() > v.abs() {
                f32::from_bits(f.to_bits() - 1)
            } else {
                f
            };
            f32::from_bits(toward_zero.to_bits() | 1)
        }
        let same = |v: f64| {
            let (got, want) = (f32_round_to_odd(v), definition(v));
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{v:e}: {got:e} ({:#x}), want {want:e} ({:#x})",
                got.to_bits(),
                want.to_bits()
            );
        };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut near = vec![0.0f32, f32::MIN_POSITIVE, f32::MAX, 1.0, 1.0 + f32::EPSILON];
        near.extend([1u32, 2, 3, 0x7f_ffff, 0x80_0000, 0x7f7f_fffe].map(f32::from_bits));
        for _ in 0..200_000 {
            let bits = next();
            same(f64::from_bits(bits));
            near.push(f32::from_bits(bits as u32 & 0x7fff_ffff));
        }
        for f in near {
            for sign in [1.0, -1.0] {
                let v = sign * f as f64;
                same(v);
                for k in [1u64, 2, 1 << 28, (1 << 29) - 1, 1 << 29, (1 << 29) + 1] {
                    same(f64::from_bits(v.to_bits().wrapping_add(k)));
                    same(f64::from_bits(v.to_bits().wrapping_sub(k)));
                }
            }
        }
        for v in [
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -0.0,
            f64::MAX,
            -f64::MAX,
            1e-300,
        ] {
            same(v);
        }
    }

    #[test]
    fn conflicting_binding_is_reported() {
        let mut b = Bindings::new();
        let t: Symbol = Arc::from("T");
        assert!(b.bind(&t, 4).is_ok());
        assert!(b.bind(&t, 4).is_ok());
        assert_eq!(b.bind(&t, 5), Err(4));
    }
}
