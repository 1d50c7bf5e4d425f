//! Guards: every assumption the generated kernels make about an input, checked before any launch.
//! A violation is a [`GuardError`] naming the tensor and what was expected: never a wrong result,
//! never a crash.

use mlpc_ir::{Bindings, DType, Dim, Guard, Plan};

/// What the runtime knows about a caller's tensor: enough to check it against a guard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMeta {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// In elements.
    pub strides: Vec<usize>,
    /// The device address of element 0.
    pub address: u64,
    /// Bytes of memory from `address` on that the tensor may read (its allocation's length).
    pub bytes: u64,
    /// The ordinal of the device that holds the memory.
    pub device: usize,
}

impl TensorMeta {
    /// What the guards see of `t` once [`crate::Device::upload`] has copied it to device
    /// `device`, known before the copy: row-major, its allocation's length (one byte for an
    /// empty tensor, as the upload allocates) and no address yet (0, which every alignment
    /// passes: the uploaded tensor's address is checked when it runs). So that a tensor the
    /// guards refuse is refused before it takes device memory.
    pub fn of_upload(t: &mlpc_ir::HostTensor, device: usize) -> TensorMeta {
        TensorMeta {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            strides: TensorMeta::contiguous_strides(t.shape()),
            address: 0,
            bytes: t.bytes().len().max(1) as u64,
            device,
        }
    }

    /// Bytes from element 0 to the end of the furthest element `shape` and `strides` reach (0
    /// for an empty shape), or `None` when that overflows.
    pub fn extent_bytes(&self) -> Option<u64> {
        if self.shape.contains(&0) {
            return Some(0);
        }
        let mut last: u64 = 0;
        for (&n, &s) in self.shape.iter().zip(&self.strides) {
            last = last.checked_add((n as u64 - 1).checked_mul(s as u64)?)?;
        }
        last.checked_add(1)?
            .checked_mul(self.dtype.size_bytes() as u64)
    }

    /// Row-major strides for `shape` (saturating where the element count overflows, a shape
    /// no memory holds).
    pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
        let mut s = vec![1usize; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1].saturating_mul(shape[i + 1]);
        }
        s
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    #[error("missing input `{tensor}`: the compiled model expects {expected}")]
    Missing { tensor: String, expected: String },
    #[error("unexpected input `{tensor}`: the compiled model's inputs are {known}")]
    Unknown { tensor: String, known: String },
    #[error("input `{tensor}`: dtype is {actual}, the kernels were specialised for {expected}")]
    DType {
        tensor: String,
        expected: DType,
        actual: DType,
    },
    #[error("input `{tensor}`: shape is {actual:?}, the kernels were specialised for {expected}")]
    Shape {
        tensor: String,
        expected: String,
        actual: Vec<usize>,
    },
    #[error("input `{tensor}`: `{symbol}` = {actual}, but an earlier input bound it to {bound}")]
    Symbol {
        tensor: String,
        symbol: String,
        bound: u64,
        actual: u64,
    },
    #[error(
        "input `{tensor}`: strides are {actual:?} (elements), the kernels were specialised for {expected:?}; \
         pass a contiguous tensor or compile with re-specialisation enabled"
    )]
    Strides {
        tensor: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("input `{tensor}`: `{symbol}` = 0, but a symbolic dim must be at least 1 (shape {actual:?})")]
    Empty {
        tensor: String,
        symbol: String,
        actual: Vec<usize>,
    },
    #[error(
        "input `{tensor}`: shape {shape:?} with strides {strides:?} (elements) reaches {}, but its memory holds {actual} bytes",
        match needed { Some(n) => format!("{n} bytes"), None => "past 2^64 bytes".to_string() }
    )]
    Extent {
        tensor: String,
        shape: Vec<usize>,
        strides: Vec<usize>,
        needed: Option<u64>,
        actual: u64,
    },
    #[error("input `{tensor}`: address {address:#x} is not aligned to {align} bytes, which the kernels' vector loads need")]
    Alignment {
        tensor: String,
        address: u64,
        align: u32,
    },
    #[error(
        "input `{tensor}`: lives on device {actual}, the model was loaded on device {expected}"
    )]
    Device {
        tensor: String,
        expected: usize,
        actual: usize,
    },
}

impl GuardError {
    /// Whether a re-specialisation for the input's layout could lift this error.
    pub fn is_layout(&self) -> bool {
        matches!(
            self,
            GuardError::Strides { .. } | GuardError::Alignment { .. }
        )
    }
}

fn pattern(g: &Guard) -> String {
    let d: Vec<String> = g.shape.iter().map(|d| d.to_string()).collect();
    format!("{}[{}]", g.dtype, d.join(","))
}

/// Refuses the first name of `given` that no guard of `plan` checks ([`GuardError::Unknown`],
/// listing the inputs): what [`check_guards`] checks first, for callers that hold only names
/// (e.g. a file's tensors, before any is read).
pub fn check_input_names<'a>(
    plan: &Plan,
    given: impl IntoIterator<Item = &'a str>,
) -> Result<(), GuardError> {
    match given
        .into_iter()
        .find(|n| !plan.guards.iter().any(|g| g.tensor == *n))
    {
        Some(name) => Err(GuardError::Unknown {
            tensor: name.to_string(),
            known: plan
                .guards
                .iter()
                .map(|g| format!("`{}`", g.tensor))
                .collect::<Vec<_>>()
                .join(", "),
        }),
        None => Ok(()),
    }
}

/// Checks every guard of `plan` against the given tensors and binds the symbolic dims.
/// `device` is the ordinal the model runs on.
pub fn check_guards<'a>(
    plan: &Plan,
    device: usize,
    tensors: impl IntoIterator<Item = (&'a str, &'a TensorMeta)>,
) -> Result<Bindings, GuardError> {
    let tensors: Vec<(&str, &TensorMeta)> = tensors.into_iter().collect();
    check_input_names(plan, tensors.iter().map(|(n, _)| *n))?;
    let mut bindings = Bindings::new();
    for g in &plan.guards {
        // The name is copied into an error only: a run that passes allocates no string here.
        let tensor = || g.tensor.clone();
        let Some((_, t)) = tensors.iter().find(|(n, _)| *n == g.tensor) else {
            return Err(GuardError::Missing {
                tensor: tensor(),
                expected: pattern(g),
            });
        };
        if t.device != device {
            return Err(GuardError::Device {
                tensor: tensor(),
                expected: device,
                actual: t.device,
            });
        }
        if t.dtype != g.dtype {
            return Err(GuardError::DType {
                tensor: tensor(),
                expected: g.dtype,
                actual: t.dtype,
            });
        }
        if t.shape.len() != g.shape.len() {
            return Err(GuardError::Shape {
                tensor: tensor(),
                expected: pattern(g),
                actual: t.shape.clone(),
            });
        }
        for (d, &v) in g.shape.iter().zip(&t.shape) {
            match d {
                Dim::Fixed(n) if *n != v as u64 => {
                    return Err(GuardError::Shape {
                        tensor: tensor(),
                        expected: pattern(g),
                        actual: t.shape.clone(),
                    })
                }
                Dim::Fixed(_) => {}
                Dim::Sym(s) if v == 0 => {
                    return Err(GuardError::Empty {
                        tensor: tensor(),
                        symbol: s.to_string(),
                        actual: t.shape.clone(),
                    })
                }
                Dim::Sym(s) => {
                    if let Err(bound) = bindings.bind(s, v as u64) {
                        return Err(GuardError::Symbol {
                            tensor: tensor(),
                            symbol: s.to_string(),
                            bound,
                            actual: v as u64,
                        });
                    }
                }
            }
        }
        // With the shape bound, the expected strides are concrete. A dim of extent 1 never
        // moves, so its stride is irrelevant.
        // A stride list of another length than the shape is refused, not cut short.
        // A stride that overflows resolving matches no actual one (it shows as 0 in the error).
        let expected =
            |s: &mlpc_ir::Extent| s.resolve(&bindings).and_then(|v| usize::try_from(v).ok());
        let strides_ok = t.strides.len() == t.shape.len()
            && g.strides.len() == t.shape.len()
            && g.strides
                .iter()
                .zip(&t.strides)
                .zip(&t.shape)
                .all(|((e, &a), &n)| n == 1 || expected(e) == Some(a));
        if !strides_ok {
            return Err(GuardError::Strides {
                tensor: tensor(),
                expected: g.strides.iter().map(|e| expected(e).unwrap_or(0)).collect(),
                actual: t.strides.clone(),
            });
        }
        // Every element the shape and strides reach lies in the tensor's memory.
        let needed = t.extent_bytes();
        if needed.is_none_or(|n| n > t.bytes) {
            return Err(GuardError::Extent {
                tensor: tensor(),
                shape: t.shape.clone(),
                strides: t.strides.clone(),
                needed,
                actual: t.bytes,
            });
        }
        if g.align_bytes > 0 && t.address % g.align_bytes as u64 != 0 {
            return Err(GuardError::Alignment {
                tensor: tensor(),
                address: t.address,
                align: g.align_bytes,
            });
        }
    }
    Ok(bindings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlpc_ir::{contiguous_strides, Shape};

    fn plan(shape: Shape) -> Plan {
        Plan {
            name: "p".into(),
            dtype: DType::Bf16,
            buffers: vec![],
            kernels: vec![],
            outputs: vec![],
            guards: vec![Guard {
                tensor: "x".into(),
                dtype: DType::Bf16,
                strides: contiguous_strides(&shape).unwrap(),
                shape,
                align_bytes: 16,
            }],
        }
    }

    fn meta(shape: &[usize]) -> TensorMeta {
        TensorMeta {
            dtype: DType::Bf16,
            shape: shape.to_vec(),
            strides: TensorMeta::contiguous_strides(shape),
            address: 0x1000,
            bytes: 2 * shape.iter().product::<usize>() as u64,
            device: 0,
        }
    }

    fn host(dtype: DType, shape: &[usize]) -> mlpc_ir::HostTensor {
        let n = shape.iter().product::<usize>() * dtype.size_bytes();
        mlpc_ir::HostTensor::from_bytes(dtype, shape.to_vec(), vec![0; n]).unwrap()
    }

    fn sym_plan() -> Plan {
        plan(Shape::from_vec(vec![Dim::sym("T"), Dim::Fixed(768)]))
    }

    #[test]
    fn a_host_tensor_is_checked_as_its_upload_will_be_laid_out() {
        let p = sym_plan();
        let t = host(DType::Bf16, &[3, 768]);
        let m = TensorMeta::of_upload(&t, 0);
        assert_eq!(m.strides, vec![768, 1]);
        assert_eq!(m.bytes, 2 * 3 * 768);
        assert_eq!(check_guards(&p, 0, [("x", &m)]).unwrap().get("T"), Some(3));
        // The name, dtype and shape are refused before the tensor is copied anywhere.
        let f = host(DType::F32, &[3, 768]);
        assert!(matches!(
            check_guards(&p, 0, [("x", &TensorMeta::of_upload(&f, 0))]),
            Err(GuardError::DType { .. })
        ));
        let w = host(DType::Bf16, &[3, 769]);
        assert!(matches!(
            check_guards(&p, 0, [("x", &TensorMeta::of_upload(&w, 0))]),
            Err(GuardError::Shape { .. })
        ));
        // An empty tensor is uploaded into one byte: the guards name its empty dim.
        let e = host(DType::Bf16, &[0, 768]);
        assert_eq!(TensorMeta::of_upload(&e, 0).bytes, 1);
        assert!(matches!(
            check_guards(&p, 0, [("x", &TensorMeta::of_upload(&e, 0))]),
            Err(GuardError::Empty { .. })
        ));
    }

    #[test]
    fn names_alone_are_checked_against_the_guards() {
        let p = sym_plan();
        assert_eq!(check_input_names(&p, ["x"]), Ok(()));
        assert_eq!(check_input_names(&p, std::iter::empty()), Ok(()));
        let e = check_input_names(&p, ["x", "y"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unexpected input `y`: the compiled model's inputs are `x`"
        );
    }

    #[test]
    fn binds_symbols_of_a_good_input() {
        let b = check_guards(&sym_plan(), 0, [("x", &meta(&[5, 768]))]).unwrap();
        assert_eq!(b.get("T"), Some(5));
    }

    #[test]
    fn refuses_a_transposed_view() {
        let mut m = meta(&[4, 768]);
        m.strides = vec![1, 4];
        let e = check_guards(&sym_plan(), 0, [("x", &m)]).unwrap_err();
        assert!(e.is_layout());
        assert!(e.to_string().starts_with(
            "input `x`: strides are [1, 4] (elements), the kernels were specialised for [768, 1]"
        ));
    }

    #[test]
    fn refuses_misaligned_wrong_dtype_wrong_device_and_wrong_shape() {
        let p = sym_plan();
        let mut m = meta(&[4, 768]);
        m.address = 0x1002;
        assert!(matches!(
            check_guards(&p, 0, [("x", &m)]),
            Err(GuardError::Alignment { align: 16, .. })
        ));
        let mut m = meta(&[4, 768]);
        m.dtype = DType::F32;
        assert!(matches!(
            check_guards(&p, 0, [("x", &m)]),
            Err(GuardError::DType { .. })
        ));
        assert!(matches!(
            check_guards(&p, 1, [("x", &meta(&[4, 768]))]),
            Err(GuardError::Device { .. })
        ));
        let e = check_guards(&p, 0, [("x", &meta(&[4, 769]))]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "input `x`: shape is [4, 769], the kernels were specialised for bf16[T,768]"
        );
        assert!(matches!(
            check_guards(&p, 0, [("y", &meta(&[4, 768]))]),
            Err(GuardError::Unknown { .. })
        ));
        assert!(matches!(
            check_guards(&p, 0, []),
            Err(GuardError::Missing { .. })
        ));
    }

    #[test]
    fn a_stride_list_of_another_rank_is_refused() {
        let mut m = meta(&[4, 768]);
        m.strides = vec![768];
        let e = check_guards(&sym_plan(), 0, [("x", &m)]).unwrap_err();
        assert_eq!(
            e,
            GuardError::Strides {
                tensor: "x".into(),
                expected: vec![768, 1],
                actual: vec![768],
            }
        );
    }

    #[test]
    fn size_one_dims_ignore_strides() {
        let mut m = meta(&[1, 768]);
        m.strides = vec![12345, 1];
        assert!(check_guards(&sym_plan(), 0, [("x", &m)]).is_ok());
    }

    /// A shape that claims more rows than the memory holds (`shape` is a public field) is
    /// refused before any grid or tensor map is sized for it.
    #[test]
    fn refuses_a_shape_its_memory_does_not_hold() {
        let mut m = meta(&[4, 768]);
        m.shape = vec![8192, 768];
        let e = check_guards(&sym_plan(), 0, [("x", &m)]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "input `x`: shape [8192, 768] with strides [768, 1] (elements) reaches 12582912 \
             bytes, but its memory holds 6144 bytes"
        );
        assert!(!e.is_layout());
        // One element short, and exactly enough.
        let mut m = meta(&[4, 768]);
        m.bytes -= 1;
        assert!(matches!(
            check_guards(&sym_plan(), 0, [("x", &m)]),
            Err(GuardError::Extent {
                needed: Some(6144),
                actual: 6143,
                ..
            })
        ));
        assert!(check_guards(&sym_plan(), 0, [("x", &meta(&[4, 768]))]).is_ok());
        // A larger allocation (a view of its first rows) is fine.
        let mut m = meta(&[4, 768]);
        m.bytes *= 2;
        assert!(check_guards(&sym_plan(), 0, [("x", &m)]).is_ok());
    }

    #[test]
    fn an_extent_past_2_64_bytes_is_refused() {
        let mut m = meta(&[4, 768]);
        m.shape = vec![1 << 60, 768];
        m.strides = TensorMeta::contiguous_strides(&m.shape);
        let e = check_guards(&sym_plan(), 0, [("x", &m)]).unwrap_err();
        assert!(matches!(e, GuardError::Extent { needed: None, .. }), "{e}");
        assert!(e.to_string().contains("reaches past 2^64 bytes"), "{e}");
    }

    /// An expected stride that overflows (T x 768 past 2^64) matches no stride; it used to
    /// resolve to 0 and let a broadcast batch through.
    #[test]
    fn an_overflowing_expected_stride_matches_nothing() {
        let shape = Shape::from_vec(vec![Dim::sym("B"), Dim::sym("T"), Dim::Fixed(768)]);
        let mut m = meta(&[2, 4, 768]);
        m.shape = vec![2, 1 << 55, 768];
        m.strides = vec![0, 768, 1];
        let e = check_guards(&plan(shape), 0, [("x", &m)]).unwrap_err();
        assert!(matches!(e, GuardError::Strides { .. }), "{e}");
    }

    #[test]
    fn a_zero_symbol_is_named() {
        let e = check_guards(&sym_plan(), 0, [("x", &meta(&[0, 768]))]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "input `x`: `T` = 0, but a symbolic dim must be at least 1 (shape [0, 768])"
        );
    }
}
