//! Provenance: what became of each node of the source graph as the passes rewrote it.
//!
//! Every node name the pipeline has seen has a [`Fate`]. A fate that names another node (`FusedInto`,
//! `MergedWith`, ...) names a node of the graph at the time it was recorded; following those names
//! ([`Provenance::targets`]) ends at the nodes of the optimised graph that now compute the value.
//! The plan lowering uses this for each kernel's `covers` list and `--explain` for its table.

use mlpc_ir::Graph;
use std::collections::BTreeMap;
use std::fmt;

/// What became of one node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Fate {
    /// Still a node of the graph, under its own name: a kernel once lowered, unless it is an input,
    /// a weight or a view.
    Live,
    /// A transpose removed by giving the operands of these nodes (GEMMs) a transposed layout.
    FoldedIntoStrides(Vec<String>),
    /// A transpose of a transpose: equal to this node, which its users now read directly.
    Cancelled(String),
    /// Computed inside this node (a GEMM epilogue, or the second half of a dual GEMM).
    FusedInto(String),
    /// Not reachable from any output; removed by dce.
    Removed,
    /// Structurally identical to this earlier node; its users now use that node (cse).
    MergedWith(String),
    /// A weight replaced by these packed block-sparse weights (`lower-block-sparse`; more than
    /// one where GEMMs read it in layouts that pack differently, `x @ w` and `h @ w^T`).
    PackedAs(Vec<String>),
}

impl fmt::Display for Fate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fate::Live => f.write_str("live"),
            Fate::FoldedIntoStrides(users) => {
                write!(f, "folded into strides of {}", users.join(", "))
            }
            Fate::Cancelled(x) => write!(f, "cancelled with another transpose (users read {x})"),
            Fate::FusedInto(n) => write!(f, "fused into {n}"),
            Fate::Removed => f.write_str("removed (dead)"),
            Fate::MergedWith(n) => write!(f, "merged with {n} (cse)"),
            Fate::PackedAs(n) => write!(f, "packed block-sparse as {}", n.join(", ")),
        }
    }
}

/// The fate of every node name the pipeline has seen, plus the source graph's node order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Provenance {
    /// Names of the source graph's nodes in its topological order.
    original: Vec<String>,
    fates: BTreeMap<String, Fate>,
    /// Weights selected for block sparsity that some reader still reads dense, and why.
    stays_dense: BTreeMap<String, String>,
    /// Each packed weight's dense source (`lower-block-sparse`), whether or not the source
    /// stays.
    packed_from: BTreeMap<String, String>,
    /// Packed weights of a gated pair that hold more blocks than their own weight keeps (the
    /// union of the pair's two patterns), with what each side keeps.
    unions: BTreeMap<String, String>,
}

impl Provenance {
    /// Every node of `g` is [`Fate::Live`]; `g` is the source graph whose nodes are reported on.
    pub fn new(g: &Graph) -> Provenance {
        let order: Vec<_> = g.topo_order().unwrap_or_else(|_| g.node_ids().collect());
        let original: Vec<String> = order.iter().map(|&n| g.node(n).name.clone()).collect();
        let fates = original.iter().map(|n| (n.clone(), Fate::Live)).collect();
        Provenance {
            original,
            fates,
            stays_dense: BTreeMap::new(),
            packed_from: BTreeMap::new(),
            unions: BTreeMap::new(),
        }
    }

    /// Names of the source graph's nodes, in its topological order.
    pub fn originals(&self) -> &[String] {
        &self.original
    }

    pub fn fate(&self, name: &str) -> Option<&Fate> {
        self.fates.get(name)
    }

    /// Records the fate of `name` (a node the pass removed or changed the role of).
    pub fn record(&mut self, name: impl Into<String>, fate: Fate) {
        self.fates.insert(name.into(), fate);
    }

    /// Records why the selected weight `weight` stays dense for some reader (`lower-block-sparse`);
    /// the first reason recorded for a weight is kept.
    pub fn record_stays_dense(&mut self, weight: impl Into<String>, why: impl Into<String>) {
        self.stays_dense
            .entry(weight.into())
            .or_insert_with(|| why.into());
    }

    /// Records that `packed` is the weight `source` packed block-sparse (`lower-block-sparse`).
    pub fn record_packed(&mut self, packed: impl Into<String>, source: impl Into<String>) {
        self.packed_from.insert(packed.into(), source.into());
    }

    /// Records that the packed weight `packed` holds the union of a gated pair's two patterns,
    /// more blocks than its own weight keeps; `note` says what each side keeps
    /// (`lower-block-sparse`).
    pub fn record_union(&mut self, packed: impl Into<String>, note: impl Into<String>) {
        self.unions.insert(packed.into(), note.into());
    }

    /// What a packed weight that holds a gated pair's union keeps of its own, when it holds more.
    pub fn union_note(&self, packed: &str) -> Option<&str> {
        self.unions.get(packed).map(String::as_str)
    }

    /// The dense weight the packed weight `packed` was made from.
    pub fn packed_from(&self, packed: &str) -> Option<&str> {
        self.packed_from.get(packed).map(String::as_str)
    }

    /// The weights selected for block sparsity that stay dense, with why, by name.
    pub fn stays_dense(&self) -> &BTreeMap<String, String> {
        &self.stays_dense
    }

    /// Registers a node that a pass created; it starts [`Fate::Live`].
    pub fn created(&mut self, name: impl Into<String>) {
        self.fates.entry(name.into()).or_insert(Fate::Live);
    }

    /// The live nodes that compute (or, for a folded transpose, absorb) the value of `name`,
    /// following fused/merged/folded links; empty when it was removed or cancelled.
    pub fn targets(&self, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.collect_targets(name, &mut out, 0);
        out
    }

    fn collect_targets(&self, name: &str, out: &mut Vec<String>, depth: usize) {
        // Every link points at a node that existed when it was recorded; a chain cannot be longer
        // than the number of names, so this bound only guards against a malformed record.
        if depth > self.fates.len() {
            return;
        }
        match self.fates.get(name) {
            None | Some(Fate::Live) => {
                if !out.iter().any(|o| o == name) {
                    out.push(name.to_string());
                }
            }
            Some(Fate::FoldedIntoStrides(users)) | Some(Fate::PackedAs(users)) => {
                for u in users {
                    self.collect_targets(u, out, depth + 1);
                }
            }
            Some(Fate::FusedInto(n)) | Some(Fate::MergedWith(n)) => {
                self.collect_targets(n, out, depth + 1)
            }
            Some(Fate::Removed) | Some(Fate::Cancelled(_)) => {}
        }
    }

    /// The source nodes whose value the live node `live` computes, in source order.
    pub fn covered_by(&self, live: &str) -> Vec<String> {
        self.original
            .iter()
            .filter(|n| self.targets(n).iter().any(|t| t == live))
            .cloned()
            .collect()
    }

    /// [`Provenance::covered_by`] of every live node that computes some source node, by name.
    pub fn coverage(&self) -> BTreeMap<String, Vec<String>> {
        let mut covers: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for n in &self.original {
            for t in self.targets(n) {
                covers.entry(t).or_default().push(n.clone());
            }
        }
        covers
    }
}
