//! `dce`: dead code elimination.
//!
//! Rewrites: removes every node from which no graph output can be reached, then drops the data of
//! weights no node names any more ([`Graph::prune_weights`]). Model inputs are kept even when
//! unused: they are the model's interface, and callers still pass them.
//!
//! After: every node other than an input reaches an output; the weights table holds exactly the
//! weights of live weight nodes. Each removed node's fate is [`Fate::Removed`].

use crate::pass::{topo, Pass, PassError};
use crate::provenance::{Fate, Provenance};
use mlpc_ir::{Graph, NodeId, Op};
use std::collections::BTreeSet;

/// Dead code elimination.
#[derive(Clone, Copy, Debug, Default)]
pub struct Dce;

/// The nodes from which an output can be reached.
pub(crate) fn live_nodes(g: &Graph) -> BTreeSet<NodeId> {
    let mut live = BTreeSet::new();
    let mut stack: Vec<NodeId> = g.outputs().iter().map(|o| o.node).collect();
    while let Some(n) = stack.pop() {
        if g.contains(n) && live.insert(n) {
            stack.extend(g.operands(n));
        }
    }
    live
}

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn description(&self) -> &'static str {
        "remove nodes that no output depends on, and the weights only they used"
    }

    fn run(&self, g: &mut Graph, prov: &mut Provenance) -> Result<bool, PassError> {
        let live = live_nodes(g);
        // Remove users before their operands, so the printed order of fates is stable.
        let order = topo(g, self.name())?;
        let mut changed = false;
        for &n in order.iter().rev() {
            if live.contains(&n) || g.node(n).op == Op::Input {
                continue;
            }
            if let Some(node) = g.remove(n) {
                prov.record(node.name, Fate::Removed);
                changed = true;
            }
        }
        let before = g.weights().len();
        g.prune_weights();
        Ok(changed || g.weights().len() != before)
    }
}
