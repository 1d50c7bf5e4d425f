//! Checking run-time inputs against the graph's inputs and binding symbolic dimensions. Every
//! executor (interpreter, CPU, CUDA) starts here, so a wrong input gets the same message
//! everywhere.

use crate::graph::Graph;
use crate::types::{Bindings, DType, Dim};

/// An input tensor does not fit the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("missing input `{name}`: the model expects {expected}")]
    Missing { name: String, expected: String },
    #[error("unexpected input `{name}`: the model's inputs are {known}")]
    Unknown { name: String, known: String },
    #[error("input `{name}` has dtype {actual}, the model expects {expected}")]
    DType {
        name: String,
        expected: DType,
        actual: DType,
    },
    #[error("input `{name}` has shape {actual:?}, the model expects {expected} (rank {rank})")]
    Rank {
        name: String,
        expected: String,
        rank: usize,
        actual: Vec<usize>,
    },
    #[error("input `{name}` has shape {actual:?}: dim {axis} must be {expected}")]
    Dim {
        name: String,
        axis: usize,
        expected: String,
        actual: Vec<usize>,
    },
    #[error("input `{name}` binds `{sym}` = {value}, but `{first}` already bound it to {bound}")]
    Conflict {
        name: String,
        sym: String,
        value: u64,
        first: String,
        bound: u64,
    },
}

/// Refuses the first name of `given` that is no input of the graph
/// ([`InputError::Unknown`], listing the inputs).
pub fn check_input_names<'a>(
    g: &Graph,
    given: impl IntoIterator<Item = &'a str>,
) -> Result<(), InputError> {
    let inputs = g.inputs();
    let names: Vec<&str> = inputs.iter().map(|&i| g.node(i).name.as_str()).collect();
    match given.into_iter().find(|n| !names.contains(n)) {
        Some(n) => Err(InputError::Unknown {
            name: n.to_string(),
            known: names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", "),
        }),
        None => Ok(()),
    }
}

/// Checks the inputs named and shaped by `lookup` (name → dtype and shape) against the graph's
/// inputs, and binds every symbolic dimension. `given` lists the names the caller supplied, so that
/// unknown names are refused too.
pub fn bind_inputs<'a>(
    g: &Graph,
    given: impl IntoIterator<Item = &'a str>,
    lookup: impl Fn(&str) -> Option<(DType, Vec<usize>)>,
) -> Result<Bindings, InputError> {
    check_input_names(g, given)?;
    let inputs = g.inputs();
    let mut b = Bindings::new();
    let mut binder: Vec<(String, String)> = Vec::new();
    for &i in &inputs {
        let node = g.node(i);
        let name = node.name.clone();
        let Some((dtype, shape)) = lookup(&name) else {
            return Err(InputError::Missing {
                name,
                expected: node.ty.to_string(),
            });
        };
        if dtype != node.ty.dtype {
            return Err(InputError::DType {
                name,
                expected: node.ty.dtype,
                actual: dtype,
            });
        }
        if shape.len() != node.ty.rank() {
            return Err(InputError::Rank {
                name,
                expected: node.ty.to_string(),
                rank: node.ty.rank(),
                actual: shape,
            });
        }
        for (axis, (d, &v)) in node.ty.shape.iter().zip(&shape).enumerate() {
            match d {
                Dim::Fixed(n) if *n != v as u64 => {
                    return Err(InputError::Dim {
                        name,
                        axis,
                        expected: n.to_string(),
                        actual: shape.clone(),
                    })
                }
                Dim::Fixed(_) => {}
                Dim::Sym(s) => {
                    if v == 0 {
                        return Err(InputError::Dim {
                            name,
                            axis,
                            expected: format!("{s} >= 1"),
                            actual: shape.clone(),
                        });
                    }
                    if let Err(bound) = b.bind(s, v as u64) {
                        let first = binder
                            .iter()
                            .find(|(sym, _)| sym == &**s)
                            .map(|(_, t)| t.clone())
                            .unwrap_or_default();
                        return Err(InputError::Conflict {
                            name,
                            sym: s.to_string(),
                            value: v as u64,
                            first,
                            bound,
                        });
                    }
                    if !binder.iter().any(|(sym, _)| sym == &**s) {
                        binder.push((s.to_string(), name.clone()));
                    }
                }
            }
        }
    }
    Ok(b)
}
