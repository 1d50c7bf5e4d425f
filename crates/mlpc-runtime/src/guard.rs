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
    /// The ordinal of the device that holds the memory.
    pub device: usize,
}

impl TensorMeta {
    /// Row-major strides for `shape`.
    pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
        let mut s = vec![1; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * shape[i + 1];
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

/// Checks every guard of `plan` against the given tensors and binds the symbolic dims.
/// `device` is the ordinal the model runs on.
pub fn check_guards<'a>(
    plan: &Plan,
    device: usize,
    tensors: impl IntoIterator<Item = (&'a str, &'a TensorMeta)>,
) -> Result<Bindings, GuardError> {
    let tensors: Vec<(&str, &TensorMeta)> = tensors.into_iter().collect();
    for (name, _) in &tensors {
        if !plan.guards.iter().any(|g| g.tensor == *name) {
            let known: Vec<String> = plan
                .guards
                .iter()
                .map(|g| format!("`{}`", g.tensor))
                .collect();
            return Err(GuardError::Unknown {
                tensor: name.to_string(),
                known: known.join(", "),
            });
        }
    }
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
                Dim::Sym(_) if v == 0 => {
                    return Err(GuardError::Shape {
                        tensor: tensor(),
                        expected: pattern(g),
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
        let expected = |s: &mlpc_ir::Extent| s.resolve(&bindings).unwrap_or(0) as usize;
        let strides_ok = t.strides.len() == t.shape.len()
            && g.strides.len() == t.shape.len()
            && g.strides
                .iter()
                .zip(&t.strides)
                .zip(&t.shape)
                .all(|((e, &a), &n)| n == 1 || expected(e) == a);
        if !strides_ok {
            return Err(GuardError::Strides {
                tensor: tensor(),
                expected: g.strides.iter().map(expected).collect(),
                actual: t.strides.clone(),
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
            device: 0,
        }
    }

    fn sym_plan() -> Plan {
        plan(Shape::from_vec(vec![Dim::sym("T"), Dim::Fixed(768)]))
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
}
