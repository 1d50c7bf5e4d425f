//! `lower-block-sparse`: GEMMs reading a block-sparse weight become sparse GEMMs with the weight
//! packed to its kept blocks.
//!
//! Configured with the same [`SparseWeight`]s as `prune-block-sparse`, and run after
//! `fuse-epilogue` (a sparse GEMM fuses nothing more). For every `gemm` whose B operand is a
//! selected weight node, read directly (after `fold-transpose` an nn.Linear weight is B in
//! layout `t`; a weight used as stored `[K, N]`, layout `n`, works too):
//! - the pattern is the set of blocks of the weight that are not all zero (after pruning, exactly
//!   the kept blocks that hold data), expressed over the logical `[N, K]` weight: for layout `n`
//!   the stored block `[rows, cols]` becomes `[cols, rows]` and the grid is transposed;
//! - the weight is packed at compile time into a new weight `<name>.bsr` of shape
//!   `[kept, rows, cols]` (see [`mlpc_ir::SparseGemm`]); the node becomes a `sparse_gemm` with the
//!   same A operand, layouts, epilogue and epilogue operands, reading `<name>.bsr`;
//! - a dual GEMM is lowered when both its gate and up weights are selected with the same block
//!   shape: both are packed to the union of their two patterns (a block kept by either), so one
//!   list of kept blocks drives both products; where the union holds more blocks than a side
//!   keeps, the packed weights say so ([`Provenance::union_note`]: `--explain` shows it). Otherwise it stays dense, computing the pruned
//!   weights exactly.
//! - a GEMM whose weight is entirely zero stays dense (a sparse GEMM keeps at least one block).
//!
//! A selected weight that some reader still reads dense (an all-zero weight, half of a dual GEMM
//! whose other weight is not selected or has another block shape, a reader that is not a GEMM's
//! B operand, an output) is recorded with why ([`Provenance::stays_dense`]): `--explain` lists
//! them and the CLI warns, so that a model is never reported block-sparse where it is not.
//!
//! Several GEMMs reading one weight with one pattern in one layout share one packed weight (a
//! weight read as `w` and as `w^T` is packed once for each, even where the patterns agree). A
//! dense weight left without users is removed; its fate is [`Fate::PackedAs`] the packed weight.
//!
//! After: no `gemm` reads a selected weight in a way the rules above lower. Values are unchanged:
//! a dropped block is zero in the pruned weight, and contributes nothing in the sparse GEMM.

use crate::pass::{topo, Pass, PassError};
use crate::provenance::{Fate, Provenance};
use crate::prune_block_sparse::{block_grid, kept_blocks, SparseWeight};
use mlpc_ir::{BlockPattern, Gemm, Graph, MatLayout, NodeId, Op, SparseGemm};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Lowers GEMMs with block-sparse weights to sparse GEMMs.
#[derive(Clone, Debug, Default)]
pub struct LowerBlockSparse {
    specs: Vec<SparseWeight>,
}

impl LowerBlockSparse {
    pub fn new(specs: Vec<SparseWeight>) -> LowerBlockSparse {
        LowerBlockSparse { specs }
    }

    pub fn specs(&self) -> &[SparseWeight] {
        &self.specs
    }
}

/// The pattern of the selected weight node `w` read in layout `layout`, over the logical
/// `[N, K]` weight; `None` when `w` is not a selected weight.
fn weight_pattern(
    g: &Graph,
    specs: &BTreeMap<&str, &SparseWeight>,
    w: NodeId,
    layout: MatLayout,
) -> Result<Option<BlockPattern>, PassError> {
    let node = g.node(w);
    let (Op::Weight, Some(spec)) = (&node.op, specs.get(node.name.as_str())) else {
        return Ok(None);
    };
    let err = |message: String| PassError::Sparsity {
        weight: spec.weight.clone(),
        message,
    };
    let Some(data) = g.weight(&node.name) else {
        return Err(err("the weight node has no data".to_string()));
    };
    let (_, cols) = block_grid(data.shape(), spec.block).map_err(err)?;
    let stored = kept_blocks(data, spec.block, None).map_err(err)?;
    let [out, inp] = [data.shape()[0] as u64, data.shape()[1] as u64];
    let [br, bc] = spec.block.map(|d| d as u32);
    let mut kept: Vec<(u32, u32)> = stored
        .iter()
        .map(|&b| ((b / cols) as u32, (b % cols) as u32))
        .collect();
    let pattern = match layout {
        MatLayout::T => BlockPattern {
            block: [br, bc],
            out,
            inp,
            kept,
        },
        MatLayout::N => {
            // Stored [K, N]: the logical [N, K] weight is its transpose.
            kept.iter_mut().for_each(|(r, c)| std::mem::swap(r, c));
            kept.sort_unstable();
            BlockPattern {
                block: [bc, br],
                out: inp,
                inp: out,
                kept,
            }
        }
    };
    Ok(Some(pattern))
}

/// The union of two patterns over the same weight shape and block.
fn union(a: &BlockPattern, b: &BlockPattern) -> Option<BlockPattern> {
    if (a.block, a.out, a.inp) != (b.block, b.out, b.inp) {
        return None;
    }
    let kept: BTreeSet<(u32, u32)> = a.kept.iter().chain(&b.kept).copied().collect();
    Some(BlockPattern {
        kept: kept.into_iter().collect(),
        ..a.clone()
    })
}

impl Pass for LowerBlockSparse {
    fn name(&self) -> &'static str {
        "lower-block-sparse"
    }

    fn description(&self) -> &'static str {
        "turn GEMMs with block-sparse weights into sparse GEMMs reading weights packed to their kept blocks"
    }

    fn run(&self, g: &mut Graph, prov: &mut Provenance) -> Result<bool, PassError> {
        let specs: BTreeMap<&str, &SparseWeight> =
            self.specs.iter().map(|s| (s.weight.as_str(), s)).collect();
        // (weight name, pattern, whether the weight is read transposed (layout N: `x @ w`),
        // packed weight node), in creation order. The layout is part of the key: a square weight
        // with a symmetric pattern read both as `w` and as `w^T` packs differently for each.
        let mut packed: Vec<(String, Arc<BlockPattern>, bool, NodeId)> = Vec::new();
        let mut sources: BTreeSet<NodeId> = BTreeSet::new();
        let mut changed = false;
        for n in topo(g, self.name())? {
            let Op::Gemm(gm) = &g.node(n).op else {
                continue;
            };
            let gm = gm.clone();
            let ops = g.operands(n);
            let gemm_name = g.node(n).name.clone();
            let gate = weight_pattern(g, &specs, ops[1], gm.b)?;
            let gate_selected = gate.is_some();
            let up = match gm.dual {
                Some(_) => Some(weight_pattern(g, &specs, ops[2], gm.b)?),
                None => None,
            };
            // For a gated pair packed to its union: each side's own kept blocks, where the union
            // holds more than one of them.
            let mut own: Option<[usize; 2]> = None;
            let pattern = match (gate, up) {
                (Some(p), None) => p,
                (Some(p), Some(Some(u))) => match union(&p, &u) {
                    Some(both) => {
                        if both.kept.len() > p.kept.len().min(u.kept.len()) {
                            own = Some([p.kept.len(), u.kept.len()]);
                        }
                        both
                    }
                    None => {
                        let why = format!(
                            "dual GEMM `{gemm_name}` reads `{}` (blocks {}x{}) and `{}` \
                             (blocks {}x{}): both weights of a dual GEMM need the same block",
                            g.node(ops[1]).name,
                            p.block[0],
                            p.block[1],
                            g.node(ops[2]).name,
                            u.block[0],
                            u.block[1]
                        );
                        for &w in &ops[1..3] {
                            prov.record_stays_dense(g.node(w).name.clone(), why.clone());
                        }
                        continue;
                    }
                },
                // One half of a dual GEMM selected: the other is not.
                (Some(_), Some(None)) | (None, Some(Some(_))) => {
                    let (sel, other) = match gate_selected {
                        true => (ops[1], ops[2]),
                        false => (ops[2], ops[1]),
                    };
                    prov.record_stays_dense(
                        g.node(sel).name.clone(),
                        format!(
                            "dual GEMM `{gemm_name}` reads it with `{}`, which `sparsity` does \
                             not select: both weights of a dual GEMM must be selected",
                            g.node(other).name
                        ),
                    );
                    continue;
                }
                (None, None | Some(None)) => continue,
            };
            if pattern.kept.is_empty() {
                for &w in &ops[1..gm.matrix_operands()] {
                    prov.record_stays_dense(
                        g.node(w).name.clone(),
                        format!(
                            "no block of it holds data after pruning, so GEMM `{gemm_name}` \
                             stays dense and computes zeros (a block-sparse GEMM keeps at least \
                             one block; a higher density keeps some)"
                        ),
                    );
                }
                continue;
            }
            let pattern = Arc::new(pattern);
            let mut new_ops = ops.clone();
            for slot in 1..gm.matrix_operands() {
                let w = ops[slot];
                let name = g.node(w).name.clone();
                let transposed = gm.b == MatLayout::N;
                let known = packed
                    .iter()
                    .find(|(src, p, t, _)| *src == name && *p == pattern && *t == transposed)
                    .map(|&(_, _, _, node)| node);
                let node = match known {
                    Some(p) => p,
                    None => {
                        // Borrowed: the pattern packs from the graph's own copy.
                        let data = g.weight(&name).ok_or_else(|| PassError::Sparsity {
                            weight: name.clone(),
                            message: "the weight node has no data".to_string(),
                        })?;
                        let bsr =
                            pattern
                                .pack(data, transposed)
                                .ok_or_else(|| PassError::Sparsity {
                                    weight: name.clone(),
                                    message: format!(
                                        "{}{:?} does not pack to blocks {}x{} of [{}, {}]",
                                        data.dtype(),
                                        data.shape(),
                                        pattern.block[0],
                                        pattern.block[1],
                                        pattern.out,
                                        pattern.inp
                                    ),
                                })?;
                        let bsr_name = g.fresh_name(&format!("{name}.bsr"));
                        let p = g.add_weight(bsr_name.clone(), bsr).map_err(|e| {
                            PassError::Sparsity {
                                weight: name.clone(),
                                message: e.to_string(),
                            }
                        })?;
                        prov.record_packed(bsr_name.clone(), name.clone());
                        if let Some([kg, ku]) = own {
                            prov.record_union(
                                bsr_name.clone(),
                                format!(
                                    "the union of the gated pair's patterns: `{}` keeps {kg} \
                                     blocks, `{}` {ku}",
                                    g.node(ops[1]).name,
                                    g.node(ops[2]).name
                                ),
                            );
                        }
                        prov.created(bsr_name);
                        packed.push((name.clone(), pattern.clone(), transposed, p));
                        p
                    }
                };
                new_ops[slot] = node;
                sources.insert(w);
            }
            g.node_mut(n).op = Op::SparseGemm(SparseGemm {
                gemm: Gemm {
                    b: MatLayout::T,
                    ..gm
                },
                pattern,
            });
            g.set_operands(n, &new_ops);
            changed = true;
        }
        // Selected weights some other reader still reads dense.
        for spec in &self.specs {
            let Some(w) = g.find(&spec.weight).filter(|&w| g.node(w).op == Op::Weight) else {
                continue;
            };
            let packed_too = sources.contains(&w);
            let reader = g.users(w).into_iter().find_map(|(u, _)| {
                let node = g.node(u);
                (!matches!(node.op, Op::SparseGemm(_)))
                    .then(|| format!("`{}` ({})", node.name, node.op.mnemonic()))
            });
            let why = match (reader, packed_too) {
                (Some(r), true) => format!(
                    "{r} reads it too, and only a GEMM's weight operand becomes block-sparse: \
                     the dense weight stays beside the packed one"
                ),
                (Some(r), false) => format!(
                    "{r} reads it, and only a GEMM's weight operand (B) becomes block-sparse"
                ),
                (None, _) if g.is_output(w) => {
                    "it is an output of the graph, so its dense data stays".to_string()
                }
                (None, _) => continue,
            };
            prov.record_stays_dense(spec.weight.clone(), why);
        }
        // Dense weights that only the lowered GEMMs read are gone.
        for w in sources {
            if g.users(w).is_empty() && !g.is_output(w) {
                let name = g.node(w).name.clone();
                let into: Vec<String> = packed
                    .iter()
                    .filter(|(src, _, _, _)| *src == name)
                    .map(|&(_, _, _, p)| g.node(p).name.clone())
                    .collect();
                if into.is_empty() {
                    continue;
                }
                if let Some(node) = g.remove(w) {
                    prov.record(node.name, Fate::PackedAs(into));
                }
            }
        }
        g.prune_weights();
        Ok(changed)
    }
}

/// A packed block-sparse weight of an optimised graph, and what it saves.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedWeight {
    /// The packed weight's name (`<weight>.bsr`).
    pub name: String,
    pub pattern: Arc<BlockPattern>,
    /// Bytes of the dense `[N, K]` weight.
    pub dense_bytes: u64,
    /// Bytes of the kept blocks.
    pub packed_bytes: u64,
    /// Bytes of the index arrays a kernel needs beside them: one offset per block row plus one,
    /// and one block column per kept block (compressed sparse rows), each 16 bits where every
    /// index fits, else 32 ([`BlockPattern::index_bytes`]).
    pub index_bytes: u64,
}

/// Every packed weight read by a sparse GEMM of `g`, once each, in topological order.
pub fn packed_weights(g: &Graph) -> Vec<PackedWeight> {
    let mut out: Vec<PackedWeight> = Vec::new();
    let order = g.topo_order().unwrap_or_else(|_| g.node_ids().collect());
    for n in order {
        let Op::SparseGemm(s) = &g.node(n).op else {
            continue;
        };
        let ops = g.operands(n);
        for &w in ops.iter().take(s.gemm.matrix_operands()).skip(1) {
            let node = g.node(w);
            if out.iter().any(|p| p.name == node.name) {
                continue;
            }
            let es = node.ty.dtype.size_bytes() as u64;
            let p = &s.pattern;
            out.push(PackedWeight {
                name: node.name.clone(),
                pattern: p.clone(),
                dense_bytes: p.out.saturating_mul(p.inp).saturating_mul(es),
                packed_bytes: (p.kept.len() as u64).saturating_mul(p.block_elems()) * es,
                index_bytes: p.index_bytes(),
            });
        }
    }
    out
}
