//! `cse`: common subexpression elimination.
//!
//! Rewrites: two nodes with the same op (parameters included), the same operands in the same slots
//! and the same type compute the same value; the later one's users (and outputs) are redirected to
//! the earliest-added one and the later one is removed. `add` and `mul` are commutative, so their
//! operands match in either order. Inputs and weights are never merged (they are distinct data).
//! One sweep in topological order also catches cascades: once two transposes of a weight merge,
//! two matmuls reading them become identical and merge too.
//!
//! After: no two non-leaf nodes are structurally identical. Each removed node's fate is
//! [`Fate::MergedWith`] the node kept.

use crate::pass::{topo, Pass, PassError};
use crate::provenance::{Fate, Provenance};
use mlpc_ir::{Graph, NodeId, Op, TensorType};
use smallvec::SmallVec;
use std::collections::HashMap;

/// Common subexpression elimination.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cse;

#[derive(PartialEq, Eq, Hash)]
struct Key {
    op: Op,
    operands: SmallVec<[NodeId; 4]>,
    ty: TensorType,
}

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn description(&self) -> &'static str {
        "merge structurally identical nodes (same op, same operands), keeping the earliest"
    }

    fn run(&self, g: &mut Graph, prov: &mut Provenance) -> Result<bool, PassError> {
        let mut seen: HashMap<Key, NodeId> = HashMap::new();
        let mut changed = false;
        // Identical nodes become ready together, so the topological order (earliest added first
        // among ready nodes) meets the earliest-added one first.
        for n in topo(g, self.name())? {
            let node = g.node(n);
            if node.op.is_leaf() {
                continue;
            }
            let mut operands = g.operands(n);
            if matches!(node.op, Op::Add | Op::Mul) {
                operands.sort();
            }
            let key = Key {
                op: node.op.clone(),
                operands,
                ty: node.ty.clone(),
            };
            match seen.get(&key) {
                Some(&kept) => {
                    g.replace_all_uses(n, kept);
                    let kept_name = g.node(kept).name.clone();
                    if let Some(removed) = g.remove(n) {
                        prov.record(removed.name, Fate::MergedWith(kept_name));
                    }
                    changed = true;
                }
                None => {
                    seen.insert(key, n);
                }
            }
        }
        Ok(changed)
    }
}
