//! The verifier. It checks every invariant below and reports all violations at once, each naming
//! the node and showing its text form. After the frontend, a violation is a bug in mlpc (a pass
//! broke the graph), not a user error; the frontend reports user errors itself before building.
//!
//! Invariants:
//! 1. **Acyclic**: the graph has a topological order.
//! 2. **Names**: every node has a non-empty name, unique in the graph.
//! 3. **Operands**: a node's operand slots are exactly `0..arity` of its op, one edge each.
//! 4. **Leaves**: an `input` has no operands; a `weight` has no operands and the weights table holds
//!    data of its name, with the node's dtype and shape, stored row-major.
//! 5. **Types**: every non-leaf node's type (dtype, shape, strides) equals the type inferred from its
//!    operands ([`crate::infer()`]); in particular all operands share one dtype.
//! 6. **Dims**: every fixed dim is > 0; every symbolic dim is a valid identifier.
//! 7. **Gemm**: epilogue operand indices lie after the matrix operands and each such operand is
//!    referenced by exactly one epilogue step (checked by inference and arity together).
//! 8. **Outputs**: at least one; names unique; each names a live node.
//! 9. **Sparse GEMM**: the block pattern is valid ([`crate::BlockPattern::check`]: blocks divide
//!    the weight, at least one block kept, kept blocks sorted row-major and inside the grid), the
//!    weight is read as `[N, K]` (layout `t`), and each packed B operand is a row-major
//!    `[kept, rows, cols]` tensor; the product then types as the dense GEMM (checked by inference).

use crate::graph::{Graph, NodeId};
use crate::infer::infer;
use crate::op::Op;
use crate::types::{is_valid_symbol, Dim, TensorType};
use std::collections::BTreeMap;
use std::fmt;

/// One violated invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyError {
    /// The node's name, or `None` for graph-level errors (outputs, cycles).
    pub node: Option<String>,
    /// The node's text form at the time of the error.
    pub text: Option<String>,
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.node, &self.text) {
            (Some(n), Some(t)) => write!(f, "node `{n}`: {}\n    {t}", self.message),
            (Some(n), None) => write!(f, "node `{n}`: {}", self.message),
            _ => write!(f, "{}", self.message),
        }
    }
}

/// All violations found in one graph.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct VerifyErrors {
    pub graph: String,
    pub errors: Vec<VerifyError>,
}

impl fmt::Display for VerifyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "graph {:?} failed verification with {} error(s):",
            self.graph,
            self.errors.len()
        )?;
        for e in &self.errors {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

struct Checker<'g> {
    g: &'g Graph,
    errors: Vec<VerifyError>,
}

impl Checker<'_> {
    fn at(&mut self, id: NodeId, message: impl Into<String>) {
        self.errors.push(VerifyError {
            node: Some(self.g.node(id).name.clone()),
            text: Some(self.g.node_text(id)),
            message: message.into(),
        });
    }

    fn global(&mut self, message: impl Into<String>) {
        self.errors.push(VerifyError {
            node: None,
            text: None,
            message: message.into(),
        });
    }
}

/// Checks every invariant listed in the module documentation.
pub fn verify(g: &Graph) -> Result<(), VerifyErrors> {
    let mut c = Checker {
        g,
        errors: Vec::new(),
    };

    if let Err(cycle) = g.topo_order() {
        let names: Vec<String> = cycle
            .iter()
            .map(|&n| format!("`{}`", g.node(n).name))
            .collect();
        c.global(format!(
            "the graph has a cycle through {}",
            names.join(", ")
        ));
    }

    let mut seen: BTreeMap<&str, NodeId> = BTreeMap::new();
    for id in g.node_ids() {
        let n = g.node(id);
        if n.name.is_empty() {
            c.at(id, "node has an empty name");
        } else if let Some(&first) = seen.get(n.name.as_str()) {
            let _ = first;
            c.at(
                id,
                format!("name `{}` is used by more than one node", n.name),
            );
        } else {
            seen.insert(&n.name, id);
        }
        check_dims(&mut c, id, &n.ty);
        check_node(&mut c, id);
    }

    if g.outputs().is_empty() {
        c.global("the graph has no outputs");
    }
    let mut out_names: Vec<&str> = Vec::new();
    for o in g.outputs() {
        if out_names.contains(&o.name.as_str()) {
            c.global(format!("output name `{}` appears twice", o.name));
        }
        out_names.push(&o.name);
        if !g.contains(o.node) {
            c.global(format!("output `{}` names a removed node", o.name));
        }
    }

    if c.errors.is_empty() {
        Ok(())
    } else {
        Err(VerifyErrors {
            graph: g.name.clone(),
            errors: c.errors,
        })
    }
}

fn check_dims(c: &mut Checker<'_>, id: NodeId, ty: &TensorType) {
    for d in &ty.shape {
        match d {
            Dim::Fixed(0) => c.at(id, "a dimension is 0"),
            Dim::Sym(s) if !is_valid_symbol(s) => {
                c.at(id, format!("`{s}` is not a valid symbolic dimension name"))
            }
            _ => {}
        }
    }
    if ty.strides.len() != ty.shape.len() {
        c.at(
            id,
            format!("{} strides for rank {}", ty.strides.len(), ty.shape.len()),
        );
    }
}

fn check_node(c: &mut Checker<'_>, id: NodeId) {
    let g = c.g;
    let n = g.node(id);
    let slots = g.operand_slots(id);
    let arity = n.op.arity();
    if slots != (0..arity).collect::<Vec<_>>() {
        c.at(
            id,
            format!(
                "operand slots are {slots:?}, but `{}` takes {arity} operand(s)",
                n.op.mnemonic()
            ),
        );
        return;
    }
    match &n.op {
        Op::Input => {}
        Op::Weight => match g.weight(&n.name) {
            None => c.at(id, format!("no weight data named `{}`", n.name)),
            Some(w) => {
                let shape: Vec<Option<u64>> = n.ty.shape.iter().map(Dim::fixed).collect();
                let want: Vec<Option<u64>> = w.shape().iter().map(|&d| Some(d as u64)).collect();
                if w.dtype() != n.ty.dtype || shape != want {
                    c.at(
                        id,
                        format!(
                            "weight data is {}{:?}, node type is {}",
                            w.dtype(),
                            w.shape(),
                            n.ty
                        ),
                    );
                } else if !n.ty.is_contiguous() {
                    c.at(
                        id,
                        "weight data is row-major but the node's strides are not",
                    );
                }
            }
        },
        op => {
            let ops = g.operands(id);
            let tys: Vec<&TensorType> = ops.iter().map(|&o| &g.node(o).ty).collect();
            match infer(op, &tys) {
                Err(m) => c.at(id, m),
                Ok(t) if t != n.ty => {
                    c.at(id, format!("type is {} but the operands give {t}", n.ty))
                }
                Ok(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::Activation;
    use crate::tensor::HostTensor;
    use crate::types::{DType, Shape};
    use smallvec::smallvec;

    fn ty(shape: &[u64]) -> TensorType {
        TensorType::contiguous(
            DType::F32,
            shape.iter().map(|&d| Dim::Fixed(d)).collect::<Shape>(),
        )
    }

    #[test]
    fn reports_every_error_at_once() {
        let mut g = Graph::new("bad");
        let x = g.add_input("x", ty(&[4, 8]));
        let w = g
            .add_weight(
                "w",
                HostTensor::from_f64(DType::F32, vec![8, 3], &[0.0; 24]).unwrap(),
            )
            .unwrap();
        // Wrong type on purpose, and a duplicate name.
        let h = g.add_typed("h", Op::MatMul, &[x, w], ty(&[4, 4]));
        let r = g.add_typed("h", Op::Act(Activation::Relu), &[h], ty(&[4, 4]));
        g.add_output("y", r);
        let errs = verify(&g).unwrap_err();
        assert_eq!(errs.errors.len(), 2, "{errs}");
        assert!(
            errs.to_string()
                .contains("type is f32[4,4] but the operands give f32[4,3]"),
            "{errs}"
        );
        assert!(
            errs.to_string().contains("used by more than one node"),
            "{errs}"
        );
    }

    #[test]
    fn detects_cycles_and_missing_outputs() {
        let mut g = Graph::new("cyc");
        let x = g.add_input("x", ty(&[2]));
        let a = g.add_typed("a", Op::Add, &[x, x], ty(&[2]));
        let b = g.add_typed("b", Op::Act(Activation::Tanh), &[a], ty(&[2]));
        g.set_operands(a, &[x, b]);
        let errs = verify(&g).unwrap_err().to_string();
        assert!(errs.contains("cycle through `a`, `b`"), "{errs}");
        assert!(errs.contains("no outputs"), "{errs}");
    }

    #[test]
    fn accepts_a_linear() {
        let mut g = Graph::new("ok");
        let s: Shape = smallvec![Dim::sym("T"), Dim::Fixed(8)];
        let x = g.add_input("x", TensorType::contiguous(DType::F32, s));
        let w = g
            .add_weight(
                "w",
                HostTensor::from_f64(DType::F32, vec![3, 8], &[0.0; 24]).unwrap(),
            )
            .unwrap();
        let wt = g.add("wt", Op::Transpose, &[w]).unwrap();
        let h = g.add("h", Op::MatMul, &[x, wt]).unwrap();
        g.add_output("y", h);
        verify(&g).unwrap();
        assert_eq!(g.node(wt).ty.to_string(), "f32[8,3] strides=[1,8]");
        assert_eq!(g.node(h).ty.to_string(), "f32[T,3]");
    }
}
