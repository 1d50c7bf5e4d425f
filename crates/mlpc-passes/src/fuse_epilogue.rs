//! `fuse-epilogue`: elementwise consumers of a GEMM move into its epilogue; gated pairs of GEMMs
//! become one dual GEMM.
//!
//! Rewrites a GEMM (a `matmul` counts as a GEMM with layouts N/N) whose result has exactly one use
//! and is not a graph output, together with that one user:
//! - `act(g)` → epilogue step `act`;
//! - `add(g, b)` with `b` a `[N]` row vector → `bias(b)`;
//! - `add(g, r)` with `r` of g's shape (a residual) → `add(r)`;
//! - `mul(g, r)` with `r` of g's shape → `mul(r)`;
//! - `mul(g, u)` where `u` is another such GEMM with the same A operand and layouts → one dual
//!   GEMM `gate(A Bg) * up(A Bu)`, operands `[A, Bg, Bu, gate extras..., up extras...]`; the gate
//!   is the side whose epilogue has an activation (`act(g) * u`), else the left one. Fusion then
//!   continues after the dual GEMM.
//!
//! Either operand order of `add` and `mul` is accepted. Extra operands are appended to the GEMM's
//! operand list and referenced by exactly one step. An extra operand never depends on the GEMM
//! (checked by reachability), so fusion cannot create a cycle.
//!
//! Fusion never makes the plan worse: each rewrite removes one kernel (two for a dual GEMM) and
//! the store and reload of one intermediate, and adds no work. A result with several users, or
//! that is an output, must be materialised anyway, so it is never fused into a user. Rules are
//! tried in priority order until none applies: activations and adds; dual GEMMs; multiplications
//! whose other operand cannot itself still fuse into a GEMM; then any multiplication. That order
//! keeps `act(x Wg) * (x Wu + b)` from becoming a GEMM with a `mul` step before the up side had
//! its chance to join a dual GEMM.
//!
//! After: no GEMM with a single use (that is not an output) has an activation, a bias or residual
//! add, or a same-shape multiplication as that use. The GEMM node keeps its name; each absorbed
//! node's fate is [`Fate::FusedInto`] the GEMM. Values change only by the roundings fusion
//! removes (the epilogue runs on the unrounded accumulator).

use crate::pass::{cycle_error, Pass, PassError};
use crate::provenance::{Fate, Provenance};
use mlpc_ir::{Dual, Epilogue, EpilogueChain, Gemm, Graph, MatLayout, NodeId, Op, TopoWalk};
use std::collections::BTreeSet;

/// Fuses bias, activations, residuals, products and gated pairs into GEMM epilogues.
#[derive(Clone, Copy, Debug, Default)]
pub struct FuseEpilogue;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stage {
    /// Activations, bias adds and residual adds.
    ActAdd,
    /// Two GEMMs meeting in a `mul`.
    Dual,
    /// A `mul` whose other operand cannot still fuse into a GEMM of its own.
    MulSettled,
    /// Any `mul`.
    MulAny,
}

const STAGES: [Stage; 4] = [Stage::ActAdd, Stage::Dual, Stage::MulSettled, Stage::MulAny];

/// The node's op as a GEMM: a `gemm` as is, a `matmul` as a GEMM with layouts N/N.
fn as_gemm(g: &Graph, n: NodeId) -> Option<Gemm> {
    match &g.node(n).op {
        Op::Gemm(gm) => Some(gm.clone()),
        Op::MatMul => Some(Gemm {
            a: MatLayout::N,
            b: MatLayout::N,
            dual: None,
            epilogue: EpilogueChain::new(),
        }),
        // A block-sparse GEMM's epilogue stays as `lower-block-sparse` made it.
        Op::Input
        | Op::Weight
        | Op::Transpose
        | Op::Add
        | Op::Mul
        | Op::Act(_)
        | Op::SparseGemm(_) => None,
    }
}

/// If `n` is a GEMM whose value is used exactly once and is not an output: that one user and the
/// slot it reads `n` in.
fn single_user(g: &Graph, n: NodeId) -> Option<(NodeId, usize)> {
    if as_gemm(g, n).is_none() || g.is_output(n) {
        return None;
    }
    match g.users(n)[..] {
        [only] => Some(only),
        _ => None,
    }
}

/// Whether `from` depends on `target`, the node `walk` returned last (target is reachable
/// backwards over operands). Nodes the walk has passed come before `target` in topological order,
/// so the search stops at them.
fn depends_on(g: &Graph, walk: &TopoWalk, from: NodeId, target: NodeId) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from];
    while let Some(n) = stack.pop() {
        if n == target {
            return true;
        }
        if !walk.passed(n) && seen.insert(n) {
            stack.extend(g.operands(n));
        }
    }
    false
}

/// Whether `v` is an elementwise node that may still be fused into a GEMM producing it.
fn may_still_fuse(g: &Graph, v: NodeId) -> bool {
    matches!(g.node(v).op, Op::Act(_) | Op::Add | Op::Mul)
        && g.operands(v)
            .into_iter()
            .any(|o| single_user(g, o).is_some_and(|(u, _)| u == v))
}

/// Whether a user of `n` is an activation, an add or a product: a node a rewrite at `n` may
/// fuse.
fn has_elementwise_user(g: &Graph, n: NodeId) -> bool {
    g.users(n)
        .into_iter()
        .any(|(u, _)| matches!(g.node(u).op, Op::Act(_) | Op::Add | Op::Mul))
}

/// Shifts the operand index of every step by `by`.
fn shifted(chain: &EpilogueChain, by: usize) -> EpilogueChain {
    chain
        .iter()
        .map(|s| match *s {
            Epilogue::Bias { operand } => Epilogue::Bias {
                operand: operand + by,
            },
            Epilogue::Add { operand } => Epilogue::Add {
                operand: operand + by,
            },
            Epilogue::Mul { operand } => Epilogue::Mul {
                operand: operand + by,
            },
            Epilogue::Act(a) => Epilogue::Act(a),
        })
        .collect()
}

/// Makes `gemm` (whose op becomes `op` with `operands`) replace its user `user`, which is removed.
fn absorb(
    g: &mut Graph,
    prov: &mut Provenance,
    gemm: NodeId,
    op: Gemm,
    operands: &[NodeId],
    user: NodeId,
) {
    g.node_mut(gemm).op = Op::Gemm(op);
    g.set_operands(gemm, operands);
    g.replace_all_uses(user, gemm);
    let into = g.node(gemm).name.clone();
    if let Some(node) = g.remove(user) {
        prov.record(node.name, Fate::FusedInto(into));
    }
}

/// Appends one step (with its extra operand, if any) to `gemm`'s epilogue and absorbs `user`.
fn append_step(
    g: &mut Graph,
    prov: &mut Provenance,
    gemm: NodeId,
    user: NodeId,
    step: impl FnOnce(usize) -> Epilogue,
    extra: Option<NodeId>,
) {
    let Some(mut gm) = as_gemm(g, gemm) else {
        return;
    };
    let mut ops = g.operands(gemm);
    if let Some(v) = extra {
        ops.push(v);
    }
    gm.epilogue.push(step(ops.len() - 1));
    absorb(g, prov, gemm, gm, &ops, user);
}

/// Tries the dual-GEMM rewrite for `p` whose single user `mul` reads `q` in its other slot.
fn try_dual(g: &mut Graph, prov: &mut Provenance, p: NodeId, q: NodeId, mul: NodeId) -> bool {
    let (Some(gp), Some(gq)) = (as_gemm(g, p), as_gemm(g, q)) else {
        return false;
    };
    if p == q || single_user(g, q).map(|(u, _)| u) != Some(mul) {
        return false;
    }
    let (op_p, op_q) = (g.operands(p), g.operands(q));
    let compatible = gp.dual.is_none()
        && gq.dual.is_none()
        && gp.a == gq.a
        && gp.b == gq.b
        && op_p[0] == op_q[0]
        && g.node(op_p[1]).ty.shape == g.node(op_q[1]).ty.shape;
    if !compatible {
        return false;
    }
    let has_act = |gm: &Gemm| gm.epilogue.iter().any(|s| matches!(s, Epilogue::Act(_)));
    let (gate, up, gg, gu, og, ou) = if has_act(&gq) && !has_act(&gp) {
        (q, p, gq, gp, op_q, op_p)
    } else {
        (p, q, gp, gq, op_p, op_q)
    };
    // Extras (operands after the two matrices) of each side, in order.
    let extras_gate = &og[2..];
    let extras_up = &ou[2..];
    let mut operands = vec![og[0], og[1], ou[1]];
    operands.extend_from_slice(extras_gate);
    operands.extend_from_slice(extras_up);
    let fused = Gemm {
        a: gg.a,
        b: gg.b,
        dual: Some(Dual {
            // Gate extras move from index 2.. to 3..; up extras go after them.
            gate: shifted(&gg.epilogue, 1),
            up: shifted(&gu.epilogue, 1 + extras_gate.len()),
        }),
        epilogue: EpilogueChain::new(),
    };
    absorb(g, prov, gate, fused, &operands, mul);
    let into = g.node(gate).name.clone();
    if let Some(node) = g.remove(up) {
        prov.record(node.name, Fate::FusedInto(into));
    }
    true
}

/// Applies the rewrites of `stage` in topological order: every one there is for
/// [`Stage::ActAdd`] and [`Stage::Dual`], only the first for the others. Returns whether it
/// rewrote anything.
///
/// Rules are tried in priority order, each from the start of the graph's current topological
/// order, until none applies. After an activation or an add, a walk need not start over: the
/// nodes before the GEMM keep their place, and none of them can fuse now (the only node whose
/// user changed is the add's other operand, whose user is now a GEMM). So the walk goes on at the
/// GEMM, which comes again at once, or after its new operands.
///
/// Dual GEMMs are all made in one walk, as if each were followed by the activations and adds it
/// lets fuse (the caller then fuses those, and tries the stages again from the first): no dual
/// rewrite, nor any activation or add it lets fuse, makes or unmakes another. Each rewrite owns
/// its `mul` and two GEMMs (each GEMM's only user is that `mul`); the dual GEMM it leaves takes
/// no part in another dual rewrite; the nodes whose user changes (the `mul`'s users, the extra
/// operand of an add fused after it) now read a GEMM, which no dual rewrite looks at; and the
/// shared A operand has two users, so no rewrite absorbs it (one that replaces it, the `mul` of an
/// earlier pair, replaces it in both GEMMs). A gated stack then takes a constant number of walks
/// instead of one a layer. Where the later GEMM of a pair becomes the dual one, the rewrite
/// removes the node the walk stands on, which the walk then skips.
///
/// A product of one GEMM may let an activation or an add fuse again, may make a dual GEMM, and
/// may let another product's other operand settle (it read the product, now it reads a GEMM):
/// each of those happens at a user of the GEMM that is an activation, an add or a product (the
/// rewrite changes the users of the GEMM, of the product's other operand, which now reads the
/// GEMM in place of the product, and of the product's users, which now read the GEMM; it adds no
/// path between two nodes that had none). After any product of [`Stage::MulAny`] (it may settle
/// a product earlier in the walk) the caller starts over. After a settled product, the
/// activations and adds it lets fuse are fused at once, as the next round's first stage would
/// (they are all at the GEMM: an add whose other operand is a GEMM could not have fused into
/// that GEMM before either). If the GEMM then still has such a user, the caller starts over;
/// else the walk goes on at the GEMM, every node it passed still rejected by every stage. A deep
/// stack of `act((x W) * r)` layers then takes a constant number of walks instead of one a
/// layer.
fn fuse_stage(g: &mut Graph, prov: &mut Provenance, stage: Stage) -> Result<bool, PassError> {
    let mut walk = TopoWalk::new(g);
    let mut changed = false;
    while let Some(n) = walk.next(g) {
        if !fuse_at(g, prov, &walk, n, stage) {
            continue;
        }
        changed = true;
        match stage {
            Stage::ActAdd | Stage::Dual => {}
            Stage::MulSettled => {
                // The activations and adds the product lets fuse, all at `n`: what the
                // `ActAdd` stage of the next round would do first.
                while fuse_at(g, prov, &walk, n, Stage::ActAdd) {}
                if has_elementwise_user(g, n) {
                    return Ok(true);
                }
            }
            Stage::MulAny => return Ok(true),
        }
        walk.revisit(g, n);
    }
    match walk.unfinished(g)[..] {
        [] => Ok(changed),
        ref cycle => Err(cycle_error(g, "fuse-epilogue", cycle)),
    }
}

/// Applies the rewrite of `stage` at `n`, the node `walk` returned last, if there is one;
/// returns whether it did.
fn fuse_at(g: &mut Graph, prov: &mut Provenance, walk: &TopoWalk, n: NodeId, stage: Stage) -> bool {
    let Some((user, slot)) = single_user(g, n) else {
        return false;
    };
    if g.node(user).ty.shape != g.node(n).ty.shape {
        // The GEMM's result is the broadcast side of an add: not an epilogue.
        return false;
    }
    let other = g.operands(user).get(1 - slot.min(1)).copied();
    match (&g.node(user).op, stage) {
        (Op::Act(a), Stage::ActAdd) => {
            let a = *a;
            append_step(g, prov, n, user, |_| Epilogue::Act(a), None);
            true
        }
        (Op::Add, Stage::ActAdd) => {
            let Some(v) = other else { return false };
            if depends_on(g, walk, v, n) {
                return false;
            }
            let step: fn(usize) -> Epilogue = if g.node(v).ty.shape == g.node(n).ty.shape {
                |operand| Epilogue::Add { operand }
            } else {
                |operand| Epilogue::Bias { operand }
            };
            append_step(g, prov, n, user, step, Some(v));
            true
        }
        (Op::Mul, Stage::Dual) => other.is_some_and(|v| try_dual(g, prov, n, v, user)),
        (Op::Mul, Stage::MulSettled | Stage::MulAny) => {
            let Some(v) = other else { return false };
            if depends_on(g, walk, v, n) || (stage == Stage::MulSettled && may_still_fuse(g, v)) {
                return false;
            }
            append_step(
                g,
                prov,
                n,
                user,
                |operand| Epilogue::Mul { operand },
                Some(v),
            );
            true
        }
        _ => false,
    }
}

impl Pass for FuseEpilogue {
    fn name(&self) -> &'static str {
        "fuse-epilogue"
    }

    fn description(&self) -> &'static str {
        "fuse bias, activations, residual adds, products and gated pairs into GEMM epilogues"
    }

    fn run(&self, g: &mut Graph, prov: &mut Provenance) -> Result<bool, PassError> {
        let mut changed = false;
        'fixpoint: loop {
            for stage in STAGES {
                // `fuse_stage` leaves no activation or add to fuse, nor a dual GEMM to make:
                // the next stage follows.
                if fuse_stage(g, prov, stage)? {
                    changed = true;
                    if stage != Stage::ActAdd {
                        continue 'fixpoint;
                    }
                }
            }
            return Ok(changed);
        }
    }
}
