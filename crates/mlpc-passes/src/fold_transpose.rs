//! `fold-transpose`: transposes become operand layouts; matmuls become GEMMs.
//!
//! A `transpose` only swaps strides (nn.Linear's `aten::t`), so no kernel should ever run for one.
//! Rewrites, in order:
//! 1. **Chains cancel**: `transpose(transpose(x))` is `x`; its users read `x` directly.
//! 2. **Every `matmul` becomes a `gemm`** with an empty epilogue. A right operand
//!    `transpose(w)` of a row-major matrix `w` becomes layout `T` reading `w` (the nn.Linear
//!    weight, untouched); a left operand `transpose(x)` of a row-major matrix `x` (a model input,
//!    say) becomes layout `T` reading `x`. Other operands keep layout `N`.
//! 3. A transpose left without users (and not an output) is removed; its fate is
//!    [`Fate::FoldedIntoStrides`] of the GEMMs that absorbed it.
//!
//! After: no `matmul` remains; no operand of a GEMM is a transpose, except the left operand when
//! it is a transpose of a tensor of rank > 2 (a GEMM's transposed A must be a matrix); no transpose
//! reads a transpose. A transpose that other ops use stays: it is still a view, which elementwise
//! kernels read through strides. Values are unchanged bit for bit.

use crate::pass::{topo, Pass, PassError};
use crate::provenance::{Fate, Provenance};
use mlpc_ir::{Gemm, Graph, MatLayout, NodeId, Op};
use std::collections::BTreeMap;

/// Folds transposes into GEMM operand layouts.
#[derive(Clone, Copy, Debug, Default)]
pub struct FoldTranspose;

/// If `v` is a transpose of a row-major matrix, that matrix.
fn transposed_matrix(g: &Graph, v: NodeId) -> Option<NodeId> {
    if g.node(v).op != Op::Transpose {
        return None;
    }
    let x = *g.operands(v).first()?;
    let t = &g.node(x).ty;
    (t.rank() == 2 && t.is_contiguous()).then_some(x)
}

/// Rewrites `transpose(transpose(x))` to `x`. Returns whether anything changed.
fn cancel_chains(g: &mut Graph, prov: &mut Provenance) -> Result<bool, PassError> {
    let mut changed = false;
    for n in topo(g, "fold-transpose")? {
        if !g.contains(n) || g.node(n).op != Op::Transpose {
            continue;
        }
        let Some(&inner) = g.operands(n).first() else {
            continue;
        };
        if g.node(inner).op != Op::Transpose {
            continue;
        }
        let Some(&base) = g.operands(inner).first() else {
            continue;
        };
        let base_name = g.node(base).name.clone();
        g.replace_all_uses(n, base);
        if let Some(node) = g.remove(n) {
            prov.record(node.name, Fate::Cancelled(base_name.clone()));
        }
        if g.users(inner).is_empty() && !g.is_output(inner) {
            if let Some(node) = g.remove(inner) {
                prov.record(node.name, Fate::Cancelled(base_name));
            }
        }
        changed = true;
    }
    Ok(changed)
}

impl Pass for FoldTranspose {
    fn name(&self) -> &'static str {
        "fold-transpose"
    }

    fn description(&self) -> &'static str {
        "fold transposes into GEMM operand layouts (zero kernels); every matmul becomes a gemm"
    }

    fn run(&self, g: &mut Graph, prov: &mut Provenance) -> Result<bool, PassError> {
        let mut changed = cancel_chains(g, prov)?;
        // Transpose -> the GEMMs that now read its operand with a transposed layout.
        let mut folded: BTreeMap<NodeId, Vec<String>> = BTreeMap::new();
        for n in topo(g, self.name())? {
            if g.node(n).op != Op::MatMul {
                continue;
            }
            let ops = g.operands(n);
            let (mut a, mut b) = (ops[0], ops[1]);
            let (mut a_layout, mut b_layout) = (MatLayout::N, MatLayout::N);
            let name = g.node(n).name.clone();
            if let Some(x) = transposed_matrix(g, a) {
                folded.entry(a).or_default().push(name.clone());
                (a, a_layout) = (x, MatLayout::T);
            }
            if let Some(w) = transposed_matrix(g, b) {
                let users = folded.entry(b).or_default();
                if !users.contains(&name) {
                    users.push(name.clone());
                }
                (b, b_layout) = (w, MatLayout::T);
            }
            g.node_mut(n).op = Op::Gemm(Gemm {
                a: a_layout,
                b: b_layout,
                dual: None,
                epilogue: Default::default(),
            });
            g.set_operands(n, &[a, b]);
            changed = true;
        }
        for (t, gemms) in folded {
            if g.users(t).is_empty() && !g.is_output(t) {
                if let Some(node) = g.remove(t) {
                    prov.record(node.name, Fate::FoldedIntoStrides(gemms));
                }
            }
        }
        Ok(changed)
    }
}
