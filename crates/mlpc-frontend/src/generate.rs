//! Deterministic pseudo-random tensors: generated weights (for models without a weights file) and
//! random inputs (for tests, benchmarks and `mlpc run` without an input file).
//!
//! Every tensor has its own random stream, derived from the seed and the tensor's name alone, so
//! adding, removing or reordering other tensors never changes it. The stream is PCG-64 seeded
//! through splitmix64 from `seed` and the FNV-1a hash of the name; uniform values take the top 53
//! bits of each draw. All of this is spelled out here (no library-defined seeding or sampling), so
//! the values stay the same across dependency upgrades.

use crate::error::{FrontendError, RandomInputError};
use mlpc_ir::{DType, Dim, Graph, HostTensor};
use rand_core::RngCore;
use rand_pcg::Pcg64;
use std::collections::BTreeMap;

/// The most elements one generated tensor (weight or random input) may have: 2^28, 1 GiB of f32.
pub const MAX_GENERATED_ELEMENTS: u64 = 1 << 28;

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

struct Stream(Pcg64);

impl Stream {
    fn new(seed: u64, name: &str) -> Stream {
        let mut s = seed ^ fnv1a(name).rotate_left(17);
        let w = [
            splitmix64(&mut s),
            splitmix64(&mut s),
            splitmix64(&mut s),
            splitmix64(&mut s),
        ];
        let state = (w[0] as u128) << 64 | w[1] as u128;
        let stream = (w[2] as u128) << 64 | w[3] as u128;
        Stream(Pcg64::new(state, stream))
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The element count of `shape`, if it is at most [`MAX_GENERATED_ELEMENTS`].
pub(crate) fn checked_numel(shape: &[u64]) -> Option<u64> {
    shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= MAX_GENERATED_ELEMENTS)
}

/// Why a tensor could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    #[error("it has more than {MAX_GENERATED_ELEMENTS} elements")]
    TooLarge,
    #[error("its {bytes} bytes do not fit in memory")]
    NoMemory { bytes: u64 },
}

/// Elements one task generates: even, so that a pair of normal values never straddles two.
const CHUNK: usize = 1 << 18;

/// A tensor of `shape` whose bytes `fill(stream, out)` writes, element after element, from a
/// stream that has drawn one value per element before them (`stream` for the first element).
/// Chunks of [`CHUNK`] elements are filled in parallel, each from its own copy of the stream
/// advanced to its first element: the same values as one pass over the tensor, in less time.
fn tensor(
    dtype: DType,
    shape: &[u64],
    stream: &Stream,
    fill: impl Fn(&mut Stream, &mut [u8]) + Sync,
) -> Result<HostTensor, GenError> {
    use rayon::prelude::*;
    let n = checked_numel(shape).ok_or(GenError::TooLarge)? as usize;
    let es = dtype.size_bytes();
    let mut data = zeroed_bytes(n * es)?;
    data.par_chunks_mut(CHUNK * es)
        .enumerate()
        .for_each(|(i, out)| {
            let mut s = Stream(stream.0.clone());
            s.0.advance((i * CHUNK) as u128);
            fill(&mut s, out);
        });
    let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    // The bytes are the shape's by construction.
    HostTensor::from_bytes(dtype, shape, data).map_err(|_| GenError::TooLarge)
}

/// `bytes` zero bytes, asked of the allocator already zeroed: the operating system maps large
/// zeroed allocations lazily, so pages are neither cleared twice nor touched before they are
/// written (or at all, if nothing writes them).
fn zeroed_bytes(bytes: usize) -> Result<Vec<u8>, GenError> {
    if bytes == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(bytes).map_err(|_| GenError::TooLarge)?;
    // SAFETY: `layout` has a non-zero size. A non-null pointer from `alloc_zeroed` with the
    // layout of `bytes` u8 values is valid for `bytes` initialised (zero) bytes, and the vector
    // frees it with the same layout (capacity `bytes`, alignment 1).
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout);
        if ptr.is_null() {
            return Err(GenError::NoMemory {
                bytes: bytes as u64,
            });
        }
        Ok(Vec::from_raw_parts(ptr, bytes, bytes))
    }
}

/// A tensor of zeros whose pages nothing touches until read ([`zeroed_bytes`]): the stand-in
/// for a weight whose values are not wanted ([`crate::load_model_zeroed`]).
pub(crate) fn zeros(dtype: DType, shape: &[usize]) -> Result<HostTensor, GenError> {
    let bytes = shape
        .iter()
        .try_fold(dtype.size_bytes(), |a, &d| a.checked_mul(d))
        .ok_or(GenError::TooLarge)?;
    // The bytes are the shape's by construction.
    HostTensor::from_bytes(dtype, shape.to_vec(), zeroed_bytes(bytes)?)
        .map_err(|_| GenError::TooLarge)
}

/// Values uniform in `[-bound, bound)` as nn.Linear initialises (`bound = 1/sqrt(in)`), rounded to
/// `dtype`. An error if the shape has more than [`MAX_GENERATED_ELEMENTS`] elements or its bytes
/// cannot be allocated.
pub fn uniform_tensor(
    seed: u64,
    name: &str,
    shape: &[u64],
    bound: f64,
    dtype: DType,
) -> Result<HostTensor, GenError> {
    tensor(dtype, shape, &Stream::new(seed, name), |s, out| {
        dtype.encode_le(
            std::iter::repeat_with(|| (2.0 * s.unit() - 1.0) * bound),
            out,
        )
    })
}

/// Standard normal values (Box-Muller: two draws give two values), rounded to `dtype`.
pub fn normal_tensor(
    seed: u64,
    name: &str,
    shape: &[u64],
    dtype: DType,
) -> Result<HostTensor, GenError> {
    tensor(dtype, shape, &Stream::new(seed, name), |s, out| {
        dtype.encode_le(normals(s), out)
    })
}

/// Standard normal values from `s`: each pair of draws gives two (its cosine and sine values), so
/// a pair's second value is the element after its first, or unused where the tensor ends.
fn normals(s: &mut Stream) -> impl Iterator<Item = f64> + '_ {
    let mut sin = None;
    std::iter::repeat_with(move || {
        if let Some(v) = sin.take() {
            return v;
        }
        // 1 - u lies in (0, 1], so the logarithm is finite.
        let r = (-2.0 * (1.0 - s.unit()).ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * s.unit();
        sin = Some(r * theta.sin());
        r * theta.cos()
    })
}

/// Random standard-normal inputs for every input of `graph`, each in its declared dtype and shape
/// with symbolic dims taken from `bindings` (`[("T", 128)]`). Deterministic in `seed` and each
/// input's name. A binding of a symbol no input has is an error ([`check_bound_symbols`]).
pub fn random_inputs(
    graph: &Graph,
    bindings: &[(&str, u64)],
    seed: u64,
) -> Result<BTreeMap<String, HostTensor>, FrontendError> {
    check_bound_symbols(graph, bindings)?;
    let mut bound: BTreeMap<&str, u64> = BTreeMap::new();
    for &(sym, v) in bindings {
        if let Some(&first) = bound.get(sym) {
            if first != v {
                return Err(FrontendError::RandomInput {
                    input: graph
                        .inputs()
                        .first()
                        .map(|&i| graph.node(i).name.clone())
                        .unwrap_or_default(),
                    error: RandomInputError::Conflict {
                        symbol: sym.to_string(),
                        first,
                        second: v,
                    },
                });
            }
        }
        bound.insert(sym, v);
    }
    let mut out = BTreeMap::new();
    for id in graph.inputs() {
        let node = graph.node(id);
        let fail = |error| FrontendError::RandomInput {
            input: node.name.clone(),
            error,
        };
        let mut shape = Vec::with_capacity(node.ty.rank());
        for d in &node.ty.shape {
            match d {
                Dim::Fixed(n) => shape.push(*n),
                Dim::Sym(s) => match bound.get(&**s) {
                    Some(0) => {
                        return Err(fail(RandomInputError::Zero {
                            symbol: s.to_string(),
                        }))
                    }
                    Some(&v) => shape.push(v),
                    None => {
                        let names: Vec<String> = bound.keys().map(|k| format!("`{k}`")).collect();
                        return Err(fail(RandomInputError::Unbound {
                            symbol: s.to_string(),
                            bound: if names.is_empty() {
                                "none".into()
                            } else {
                                names.join(", ")
                            },
                        }));
                    }
                },
            }
        }
        let t = normal_tensor(seed, &node.name, &shape, node.ty.dtype).map_err(|e| {
            fail(match e {
                GenError::TooLarge => RandomInputError::TooLarge {
                    shape: shape.clone(),
                    limit: MAX_GENERATED_ELEMENTS,
                },
                GenError::NoMemory { bytes } => RandomInputError::NoMemory {
                    shape: shape.clone(),
                    bytes,
                },
            })
        })?;
        out.insert(node.name.clone(), t);
    }
    Ok(out)
}

/// Refuses a binding of a symbol that no input of `graph` has (a misspelt name would otherwise
/// be ignored whenever the real symbols are bound too), a binding to 0, and two bindings of one
/// symbol to different sizes.
pub fn check_bound_symbols(graph: &Graph, bindings: &[(&str, u64)]) -> Result<(), FrontendError> {
    for (i, &(symbol, value)) in bindings.iter().enumerate() {
        if value == 0 {
            return Err(FrontendError::Binding(RandomInputError::Zero {
                symbol: symbol.to_string(),
            }));
        }
        if let Some(&(_, first)) = bindings[..i]
            .iter()
            .find(|&&(s, v)| s == symbol && v != value)
        {
            return Err(FrontendError::Binding(RandomInputError::Conflict {
                symbol: symbol.to_string(),
                first,
                second: value,
            }));
        }
    }
    let symbols: std::collections::BTreeSet<&str> = graph
        .inputs()
        .into_iter()
        .flat_map(|id| graph.node(id).ty.shape.iter())
        .filter_map(|d| match d {
            Dim::Sym(s) => Some(&**s),
            Dim::Fixed(_) => None,
        })
        .collect();
    match bindings.iter().find(|(s, _)| !symbols.contains(s)) {
        None => Ok(()),
        Some((symbol, _)) => Err(FrontendError::UnknownSymbol {
            symbol: symbol.to_string(),
            symbols: if symbols.is_empty() {
                "none".into()
            } else {
                symbols.into_iter().collect::<Vec<_>>().join(", ")
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first values of two streams, as generated before the chunks (seed 0, f32).
    const FIRST_UNIFORM: [f64; 3] = [-0.5225648283958435, 0.5214705467224121, 0.21971751749515533];
    const FIRST_NORMAL: [f64; 3] = [-2.479792356491089, -1.5594501495361328, 1.7938746213912964];

    #[test]
    fn streams_depend_on_seed_and_name_only() {
        let a = uniform_tensor(7, "fc1.weight", &[4, 8], 0.5, DType::F32).unwrap();
        let b = uniform_tensor(7, "fc1.weight", &[4, 8], 0.5, DType::F32).unwrap();
        let c = uniform_tensor(7, "fc2.weight", &[4, 8], 0.5, DType::F32).unwrap();
        let d = uniform_tensor(8, "fc1.weight", &[4, 8], 0.5, DType::F32).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
        assert!(a.to_f64().iter().all(|v| (-0.5..0.5).contains(v)));
    }

    /// The values in chunks are those of one pass over the stream, across chunk borders, with
    /// odd lengths, and in every dtype; and stay what they were (the first values pinned).
    #[test]
    fn chunked_generation_is_one_stream() {
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            for n in [1, 3, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 3] {
                let shape = [n as u64];
                let mut s = Stream::new(5, "w");
                let mut want = Vec::new();
                for _ in 0..n {
                    dtype.push_le((2.0 * s.unit() - 1.0) * 0.25, &mut want);
                }
                let got = uniform_tensor(5, "w", &shape, 0.25, dtype).unwrap();
                assert!(got.bytes() == want, "uniform {dtype:?} {n}");

                let mut s = Stream::new(5, "x");
                let mut want = Vec::new();
                while want.len() < n * dtype.size_bytes() {
                    let r = (-2.0 * (1.0 - s.unit()).ln()).sqrt();
                    let theta = 2.0 * std::f64::consts::PI * s.unit();
                    dtype.push_le(r * theta.cos(), &mut want);
                    dtype.push_le(r * theta.sin(), &mut want);
                }
                want.truncate(n * dtype.size_bytes());
                let got = normal_tensor(5, "x", &shape, dtype).unwrap();
                assert!(got.bytes() == want, "normal {dtype:?} {n}");
            }
        }
        let first = uniform_tensor(0, "fc1.weight", &[3], 1.0, DType::F32).unwrap();
        let normal = normal_tensor(0, "x", &[3], DType::F32).unwrap();
        assert_eq!(
            (first.to_f64(), normal.to_f64()),
            (FIRST_UNIFORM.to_vec(), FIRST_NORMAL.to_vec())
        );
    }

    #[test]
    fn normal_values_look_normal() {
        let t = normal_tensor(1, "x", &[4096], DType::F32).unwrap();
        let v = t.to_f64();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.1, "mean {mean}");
        assert!((var - 1.0).abs() < 0.1, "variance {var}");
    }

    #[test]
    fn oversized_tensors_are_refused() {
        assert!(matches!(
            uniform_tensor(0, "w", &[1 << 20, 1 << 20], 1.0, DType::F32),
            Err(GenError::TooLarge)
        ));
        assert!(matches!(
            uniform_tensor(0, "w", &[u64::MAX, 2], 1.0, DType::F32),
            Err(GenError::TooLarge)
        ));
    }
}
