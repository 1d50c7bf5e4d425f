//! `--explain`: what became of every source node, in the spirit of a profiler trace.
//!
//! One row per node of the source graph (in its topological order): its op and type, and which
//! kernel computes it, or how it disappeared (folded into strides, fused into an epilogue, removed
//! as dead, merged by cse). Then the kernel count of an unfused executor (one kernel per op that is
//! neither a leaf nor a view) against the plan's, the bytes of intermediates each stores, and the
//! plan's kernels in launch order. A weight packed block-sparse reports its blocks and its dense
//! against packed bytes, and a summary line totals them. The text is deterministic: no times, no
//! addresses.

use crate::lower_block_sparse::{packed_weights, PackedWeight};
use crate::plan::{intermediate_bytes, unfused_intermediate_bytes, unfused_kernel_count};
use crate::provenance::{Fate, Provenance};
use mlpc_ir::{Graph, Op, Plan};
use std::collections::BTreeMap;
use std::fmt::Write;

/// The optimised graph and its plan, looked up by node name.
struct ByName<'a> {
    optimized: &'a Graph,
    /// The ops of the optimised graph's nodes.
    ops: BTreeMap<&'a str, &'a Op>,
    /// For each source node, the kernels whose `covers` lists it, in launch order.
    kernels: BTreeMap<&'a str, Vec<&'a str>>,
}

impl<'a> ByName<'a> {
    fn new(optimized: &'a Graph, plan: &'a Plan) -> ByName<'a> {
        let ops = optimized
            .node_ids()
            .map(|n| (optimized.node(n).name.as_str(), &optimized.node(n).op))
            .collect();
        let mut kernels: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for k in &plan.kernels {
            for c in &k.covers {
                let names = kernels.entry(c.as_str()).or_default();
                if names.last() != Some(&k.name.as_str()) {
                    names.push(k.name.as_str());
                }
            }
        }
        ByName {
            optimized,
            ops,
            kernels,
        }
    }

    /// Kernels whose `covers` lists `node`, joined with ", ".
    fn kernels_covering(&self, node: &str) -> String {
        match self.kernels.get(node) {
            Some(names) => names.join(", "),
            None => "no kernel".into(),
        }
    }
}

/// What became of the source node `name` (whose source op is `op`).
fn describe(by_name: &ByName, prov: &Provenance, name: &str, op: &Op) -> String {
    let k = || by_name.kernels_covering(name);
    match prov.fate(name).unwrap_or(&Fate::Live) {
        Fate::Removed => "removed (dead)".into(),
        Fate::MergedWith(m) => format!("merged with {m} (cse); computed by {}", k()),
        Fate::Cancelled(x) => format!("cancelled with another transpose; users read {x}"),
        Fate::FoldedIntoStrides(_) => format!("folded into strides of {}", k()),
        Fate::PackedAs(names) => {
            let packed = packed_weights(by_name.optimized);
            let each: Vec<String> = names
                .iter()
                .map(|p| match packed.iter().find(|w| &w.name == p) {
                    Some(w) => format!("{p} ({})", packed_summary(w, prov)),
                    None => p.clone(),
                })
                .collect();
            format!("packed block-sparse as {}", each.join(" and "))
        }
        Fate::FusedInto(_) if matches!(op, Op::MatMul | Op::Gemm(_) | Op::SparseGemm(_)) => {
            format!("second GEMM of dual kernel {}", k())
        }
        Fate::FusedInto(_) => format!("fused into epilogue of {}", k()),
        Fate::Live => match by_name.ops.get(name).copied().unwrap_or(op) {
            Op::Input => "input buffer (guarded)".into(),
            Op::Weight if prov.stays_dense().contains_key(name) => {
                "weight buffer (selected for block sparsity, read dense: see below)".into()
            }
            Op::Weight => "weight buffer".into(),
            Op::Transpose => {
                let by = k();
                if by == "no kernel" {
                    "view (read through strides)".into()
                } else {
                    format!("view, materialised by {by}")
                }
            }
            Op::MatMul | Op::Add | Op::Mul | Op::Act(_) | Op::Gemm(_) | Op::SparseGemm(_) => {
                format!("kernel {}", k())
            }
        },
    }
}

/// `blocks 32x32, kept 1024/4096 (25.0%), 8388608 -> 2097152 bytes + 2178 index bytes`, and
/// for a gated pair's union what each side keeps of its own.
fn packed_summary(w: &PackedWeight, prov: &Provenance) -> String {
    let p = &w.pattern;
    let union = prov
        .union_note(&w.name)
        .map(|n| format!("; {n}"))
        .unwrap_or_default();
    format!(
        "blocks {}x{}, kept {}/{} ({:.1}%), {} -> {} bytes + {} index bytes{union}",
        p.block[0],
        p.block[1],
        p.kept.len(),
        p.total_blocks(),
        100.0 * p.density(),
        w.dense_bytes,
        w.packed_bytes,
        w.index_bytes
    )
}

/// The `--explain` report for `original` optimised into `optimized` and lowered to `plan`.
pub fn explain(original: &Graph, optimized: &Graph, plan: &Plan, prov: &Provenance) -> String {
    let order: Vec<_> = original
        .topo_order()
        .unwrap_or_else(|_| original.node_ids().collect());
    let by_name = ByName::new(optimized, plan);
    let rows: Vec<[String; 4]> = order
        .iter()
        .map(|&n| {
            let node = original.node(n);
            [
                node.name.clone(),
                node.op.mnemonic().to_string(),
                node.ty.to_string(),
                describe(&by_name, prov, &node.name, &node.op),
            ]
        })
        .collect();
    let header = [
        "node".to_string(),
        "op".into(),
        "type".into(),
        "becomes".into(),
    ];
    let mut widths = [0usize; 3];
    for r in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(cell.len());
        }
    }
    let mut s = String::new();
    let _ = writeln!(s, "explain {:?}", original.name);
    for r in std::iter::once(&header).chain(&rows) {
        let _ = writeln!(
            s,
            "  {:<w0$}  {:<w1$}  {:<w2$}  {}",
            r[0],
            r[1],
            r[2],
            r[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
    }

    let before = unfused_intermediate_bytes(original);
    let after = intermediate_bytes(plan);
    let _ = writeln!(
        s,
        "kernels: {} unfused (one per op), {} planned",
        unfused_kernel_count(original),
        plan.kernels.len()
    );
    let _ = writeln!(
        s,
        "intermediate bytes: {before} unfused, {after} planned, {} removed",
        before.minus(&after)
    );
    let packed = packed_weights(optimized);
    if !packed.is_empty() {
        // A source weight packed more than once (for each layout or pairing it is read in)
        // counts its dense bytes once.
        // (A packed weight whose source is not recorded counts as a source of its own.)
        let mut by_source: BTreeMap<&str, u64> = BTreeMap::new();
        for w in &packed {
            let source = prov.packed_from(&w.name).unwrap_or(&w.name);
            by_source.insert(source, w.dense_bytes);
        }
        let sources: Vec<u64> = by_source.into_values().collect();
        let dense: u64 = sources.iter().sum();
        let kept: u64 = packed.iter().map(|w| w.packed_bytes).sum();
        let index: u64 = packed.iter().map(|w| w.index_bytes).sum();
        let count = if sources.len() == packed.len() {
            format!("{} packed", packed.len())
        } else {
            format!(
                "{} packed as {} (once for each way they are read)",
                sources.len(),
                packed.len()
            )
        };
        let _ = writeln!(
            s,
            "block-sparse weights: {count}, {dense} bytes dense, {kept} packed + {index} index bytes"
        );
        for w in &packed {
            let _ = writeln!(s, "  {}: {}", w.name, packed_summary(w, prov));
        }
    }
    let dense = prov.stays_dense();
    if !dense.is_empty() {
        let _ = writeln!(
            s,
            "selected for block sparsity but read dense: {}",
            dense.len()
        );
        for (w, why) in dense {
            let _ = writeln!(s, "  {w}: {why}");
        }
    }
    let _ = writeln!(s, "launch order:");
    for (i, k) in plan.kernels.iter().enumerate() {
        let args: Vec<&str> = k
            .args
            .iter()
            .map(|&a| plan.buffers.get(a).map_or("?", |b| b.name.as_str()))
            .collect();
        let out = plan
            .buffers
            .get(k.out)
            .map_or_else(|| "?".to_string(), |b| format!("{}: {}", b.name, b.ty));
        let _ = writeln!(
            s,
            "  {}. {}({}) -> {}  covers {}",
            i + 1,
            k.name,
            args.join(", "),
            out,
            k.covers.join(", ")
        );
    }
    s
}
