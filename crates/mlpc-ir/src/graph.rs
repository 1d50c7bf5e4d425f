//! The graph: a petgraph of [`Node`]s whose edges run from producer to consumer and carry the
//! operand slot, plus the named outputs and the table of constant weights.

use crate::infer::infer;
use crate::op::Op;
use crate::tensor::HostTensor;
use crate::types::TensorType;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use smallvec::SmallVec;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

/// Identifies a node; stable across removals of other nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub(crate) NodeIndex<u32>);

impl NodeId {
    pub fn index(self) -> usize {
        self.0.index()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Unique within the graph. For inputs and weights, the name the user gave them.
    pub name: String,
    pub op: Op,
    pub ty: TensorType,
}

/// A named result of the graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    pub name: String,
    pub node: NodeId,
}

/// Building a node failed: its operands do not fit the op.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node `{node}` ({op}): {message}")]
pub struct BuildError {
    pub node: String,
    pub op: &'static str,
    pub message: String,
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub name: String,
    g: StableDiGraph<Node, usize, u32>,
    outputs: Vec<Output>,
    weights: BTreeMap<String, Arc<HostTensor>>,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            ..Graph::default()
        }
    }

    /// Adds a model input of the given type.
    pub fn add_input(&mut self, name: impl Into<String>, ty: TensorType) -> NodeId {
        NodeId(self.g.add_node(Node {
            name: name.into(),
            op: Op::Input,
            ty,
        }))
    }

    /// Adds a constant weight; its type is row-major in the tensor's dtype and shape.
    pub fn add_weight(
        &mut self,
        name: impl Into<String>,
        data: HostTensor,
    ) -> Result<NodeId, BuildError> {
        let name = name.into();
        let shape: crate::types::Shape = data
            .shape()
            .iter()
            .map(|&d| crate::types::Dim::Fixed(d as u64))
            .collect();
        let ty = TensorType::try_contiguous(data.dtype(), shape).ok_or_else(|| BuildError {
            node: name.clone(),
            op: "weight",
            message: "element count overflows".into(),
        })?;
        self.weights.insert(name.clone(), Arc::new(data));
        Ok(NodeId(self.g.add_node(Node {
            name,
            op: Op::Weight,
            ty,
        })))
    }

    /// Adds a compute node, inferring its type from its operands.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        op: Op,
        operands: &[NodeId],
    ) -> Result<NodeId, BuildError> {
        let name = name.into();
        let tys: Vec<&TensorType> = operands.iter().map(|&o| &self.node(o).ty).collect();
        let ty = infer(&op, &tys).map_err(|message| BuildError {
            node: name.clone(),
            op: op.mnemonic(),
            message,
        })?;
        Ok(self.add_typed(name, op, operands, ty))
    }

    /// Adds a node with a given type, unchecked: the verifier judges it later.
    pub fn add_typed(
        &mut self,
        name: impl Into<String>,
        op: Op,
        operands: &[NodeId],
        ty: TensorType,
    ) -> NodeId {
        let id = NodeId(self.g.add_node(Node {
            name: name.into(),
            op,
            ty,
        }));
        for (slot, &o) in operands.iter().enumerate() {
            self.g.add_edge(o.0, id.0, slot);
        }
        id
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.g[id.0]
    }

    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.g[id.0]
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.g.contains_node(id.0)
    }

    /// All live nodes in insertion order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.g.node_indices().map(NodeId)
    }

    pub fn len(&self) -> usize {
        self.g.node_count()
    }

    pub fn is_empty(&self) -> bool {
        self.g.node_count() == 0
    }

    /// The operands of `id`, ordered by slot.
    pub fn operands(&self, id: NodeId) -> SmallVec<[NodeId; 4]> {
        let mut edges: SmallVec<[(usize, NodeId); 4]> = self
            .g
            .edges_directed(id.0, Direction::Incoming)
            .map(|e| (*e.weight(), NodeId(e.source())))
            .collect();
        edges.sort();
        edges.into_iter().map(|(_, n)| n).collect()
    }

    /// The slots of the operand edges of `id`, sorted (the verifier checks they are `0..n`).
    pub fn operand_slots(&self, id: NodeId) -> Vec<usize> {
        let mut s: Vec<usize> = self
            .g
            .edges_directed(id.0, Direction::Incoming)
            .map(|e| *e.weight())
            .collect();
        s.sort();
        s
    }

    /// The nodes that use `id`, with the slot, ordered by user then slot.
    pub fn users(&self, id: NodeId) -> Vec<(NodeId, usize)> {
        let mut u: Vec<(NodeId, usize)> = self
            .g
            .edges_directed(id.0, Direction::Outgoing)
            .map(|e| (NodeId(e.target()), *e.weight()))
            .collect();
        u.sort();
        u
    }

    /// Whether the value of `id` is a graph output.
    pub fn is_output(&self, id: NodeId) -> bool {
        self.outputs.iter().any(|o| o.node == id)
    }

    /// Replaces the operands of `id` (all slots).
    pub fn set_operands(&mut self, id: NodeId, operands: &[NodeId]) {
        let old: Vec<_> = self
            .g
            .edges_directed(id.0, Direction::Incoming)
            .map(|e| e.id())
            .collect();
        for e in old {
            self.g.remove_edge(e);
        }
        for (slot, &o) in operands.iter().enumerate() {
            self.g.add_edge(o.0, id.0, slot);
        }
    }

    /// Makes every user of `old` (and every output naming it) use `new` instead.
    pub fn replace_all_uses(&mut self, old: NodeId, new: NodeId) {
        let uses: Vec<_> = self
            .g
            .edges_directed(old.0, Direction::Outgoing)
            .map(|e| (e.id(), e.target(), *e.weight()))
            .collect();
        for (e, target, slot) in uses {
            self.g.remove_edge(e);
            self.g.add_edge(new.0, target, slot);
        }
        for o in &mut self.outputs {
            if o.node == old {
                o.node = new;
            }
        }
    }

    /// Removes a node and its edges; weights it named stay in the table until
    /// [`Graph::prune_weights`].
    pub fn remove(&mut self, id: NodeId) -> Option<Node> {
        self.g.remove_node(id.0)
    }

    /// Drops weight data that no weight node names any more.
    pub fn prune_weights(&mut self) {
        let live: std::collections::BTreeSet<String> = self
            .g
            .node_weights()
            .filter(|n| n.op == Op::Weight)
            .map(|n| n.name.clone())
            .collect();
        self.weights.retain(|k, _| live.contains(k));
    }

    pub fn add_output(&mut self, name: impl Into<String>, node: NodeId) {
        self.outputs.push(Output {
            name: name.into(),
            node,
        });
    }

    pub fn outputs(&self) -> &[Output] {
        &self.outputs
    }

    pub fn inputs(&self) -> Vec<NodeId> {
        self.node_ids()
            .filter(|&n| self.node(n).op == Op::Input)
            .collect()
    }

    pub fn find(&self, name: &str) -> Option<NodeId> {
        self.node_ids().find(|&n| self.node(n).name == name)
    }

    pub fn weight(&self, name: &str) -> Option<&Arc<HostTensor>> {
        self.weights.get(name)
    }

    pub fn weights(&self) -> &BTreeMap<String, Arc<HostTensor>> {
        &self.weights
    }

    /// The data of weight `name`, writable in place: `None` when the graph has no weight of
    /// that name, or when anyone else (another graph, a clone of this one, the caller who built
    /// it) still holds the same data, which must then stay as it is.
    pub fn weight_mut(&mut self, name: &str) -> Option<&mut HostTensor> {
        self.weights.get_mut(name).and_then(Arc::get_mut)
    }

    /// Stores (or replaces) weight data under `name`, for passes that repack weights.
    pub fn set_weight(&mut self, name: impl Into<String>, data: HostTensor) {
        self.weights.insert(name.into(), Arc::new(data));
    }

    /// Stores (or replaces) weight data under `name`, shared with whoever else holds it.
    pub fn set_weight_shared(&mut self, name: impl Into<String>, data: Arc<HostTensor>) {
        self.weights.insert(name.into(), data);
    }

    /// A node name not used yet, derived from `base`.
    pub fn fresh_name(&self, base: &str) -> String {
        if self.find(base).is_none() {
            return base.to_string();
        }
        (1..)
            .map(|i| format!("{base}.{i}"))
            .find(|n| self.find(n).is_none())
            .unwrap_or_default()
    }

    /// Nodes in a deterministic topological order: among ready nodes, the earliest added first.
    /// Returns the nodes on a cycle if there is one.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, Vec<NodeId>> {
        let mut walk = TopoWalk::new(self);
        let mut order = Vec::with_capacity(self.len());
        while let Some(n) = walk.next(self) {
            order.push(n);
        }
        if order.len() == self.len() {
            Ok(order)
        } else {
            Err(walk.unfinished(self))
        }
    }

    /// The one-line text form of a node, as in [`Graph`]'s `Display`.
    pub fn node_text(&self, id: NodeId) -> String {
        crate::print::node_line(self, id)
    }
}

/// [`Graph::topo_order`] one node at a time, for a pass that rewrites the graph as it walks it.
///
/// A node's users are released only when the walk moves past it, so between two steps the caller
/// may rewrite the node it was just given. The walk keeps, for every node not passed yet, the
/// number of its operand edges from nodes not passed yet; a rewrite must leave those counts as
/// they are: it may move edges from one node not passed yet to another, remove nodes not passed
/// yet, and change the operands of the node just given, which it then hands to
/// [`TopoWalk::revisit`]. If the nodes passed so far still start the rewritten graph's
/// `topo_order` (for example when the rewrite changes nothing they read or use), the walk goes on
/// exactly as that order does.
#[derive(Clone, Debug)]
pub struct TopoWalk {
    /// Nodes not passed yet that wait for operands: how many operand edges are still to come.
    waiting: HashMap<NodeId, usize>,
    /// Nodes whose operands have all been passed; the earliest added comes first.
    ready: BinaryHeap<Reverse<NodeId>>,
    passed: HashSet<NodeId>,
    /// The node returned last, whose users are released by the next step.
    current: Option<NodeId>,
}

impl TopoWalk {
    pub fn new(g: &Graph) -> TopoWalk {
        let mut walk = TopoWalk {
            waiting: HashMap::new(),
            ready: BinaryHeap::new(),
            passed: HashSet::new(),
            current: None,
        };
        for n in g.node_ids() {
            match g.g.edges_directed(n.0, Direction::Incoming).count() {
                0 => walk.ready.push(Reverse(n)),
                k => {
                    walk.waiting.insert(n, k);
                }
            }
        }
        walk
    }

    /// Passes the node returned last (releasing its users) and returns the next one; `None` when
    /// every node has been passed, or the rest lies on or after a cycle.
    pub fn next(&mut self, g: &Graph) -> Option<NodeId> {
        if let Some(n) = self.current.take() {
            self.passed.insert(n);
            for e in g.g.edges_directed(n.0, Direction::Outgoing) {
                let t = NodeId(e.target());
                if let Some(k) = self.waiting.get_mut(&t) {
                    *k -= 1;
                    if *k == 0 {
                        self.waiting.remove(&t);
                        self.ready.push(Reverse(t));
                    }
                }
            }
        }
        while let Some(Reverse(n)) = self.ready.pop() {
            if g.contains(n) {
                self.current = Some(n);
                return Some(n);
            }
        }
        None
    }

    /// The node returned last has new operands: it comes again once they have all been passed
    /// (next, if they already have: it is still the earliest ready node).
    pub fn revisit(&mut self, g: &Graph, n: NodeId) {
        debug_assert_eq!(
            self.current,
            Some(n),
            "only the node returned last can be revisited"
        );
        self.current = None;
        let to_come =
            g.g.edges_directed(n.0, Direction::Incoming)
                .filter(|e| !self.passed.contains(&NodeId(e.source())))
                .count();
        match to_come {
            0 => self.ready.push(Reverse(n)),
            k => {
                self.waiting.insert(n, k);
            }
        }
    }

    /// Whether the walk has moved past `n`: every node `n` depends on has been passed too.
    pub fn passed(&self, n: NodeId) -> bool {
        self.passed.contains(&n)
    }

    /// The nodes of `g` the walk has not reached, in insertion order: after the walk ended, the
    /// nodes on a cycle and those after one.
    pub fn unfinished(&self, g: &Graph) -> Vec<NodeId> {
        g.node_ids()
            .filter(|&n| !self.passed(n) && self.current != Some(n))
            .collect()
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::print::write_graph(self, f)
    }
}
