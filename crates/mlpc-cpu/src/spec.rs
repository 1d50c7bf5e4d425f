//! What each plan kernel asks of the code generator, decided once at compile time and independent
//! of LLVM: the kernel family (GEMM, elementwise, transpose), the role and element type of each
//! operand slot, and the epilogue steps. Run-time sizes are not part of a spec; they come from the
//! buffer shapes under the symbol bindings of each run.
//!
//! Memory model: every buffer of a plan is dense and row-major in its own shape (inputs and weights
//! arrive as [`mlpc_ir::HostTensor`]s, which are). Views exist only as GEMM operand layouts and as
//! `transpose` kernels that materialise them.

use crate::{CpuError, Tiling};
use mlpc_ir::{
    Activation, BlockPattern, BufferId, DType, Epilogue, Gemm, Kernel, MatLayout, Op, Plan,
};
use std::sync::Arc;

/// One step of a fused epilogue, with the operand slot it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// `acc + v[n]`.
    Bias(usize),
    /// `acc + v[m, n]`.
    Add(usize),
    /// `acc * v[m, n]`.
    Mul(usize),
    Act(Activation),
}

impl Step {
    fn of(e: &Epilogue) -> Step {
        match *e {
            Epilogue::Bias { operand } => Step::Bias(operand),
            Epilogue::Add { operand } => Step::Add(operand),
            Epilogue::Mul { operand } => Step::Mul(operand),
            Epilogue::Act(a) => Step::Act(a),
        }
    }
}

/// `epi(A @ B)`, or `epi(gate(A @ Bg) * up(A @ Bu))` when `dual`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct GemmSpec {
    pub a: MatLayout,
    pub b: MatLayout,
    pub dual: bool,
    /// For a sparse GEMM: the block pattern of its packed weights (`b` is then `T`). The B panels
    /// hold only the k ranges of kept blocks, listed in an index buffer (see [`crate::pack`]).
    pub sparse: Option<Arc<BlockPattern>>,
    pub gate: Vec<Step>,
    pub up: Vec<Step>,
    pub epi: Vec<Step>,
    /// The stored type of an f16 / bf16 A operand, which each run widens to f32 (exactly) before
    /// the tiles run: the micro-kernel then broadcasts every A element straight from memory into
    /// its multiply-adds, where a 16-bit one would take a load, a broadcast and a shift of its
    /// own (a third of the f32 speed lost on llama's MLP). The spec's A dtype is then f32.
    pub widen_a: Option<DType>,
    /// Whether the micro-kernel reads f32 panels of f16 / bf16 B operands ([`panels_widened`]);
    /// else they keep B's dtype and it widens each vector as it loads it. Where 16-bit weights
    /// meet f32 panels, the plan's kernel is the [`Spec::narrowed`] one and this one runs on
    /// panels each task widens (`exec`).
    pub wide_b: bool,
    /// With 16-bit panels (not `wide_b`): the micro-kernel also stores every panel vector it
    /// widens, as f32, at the same element of a second set of panels (one base per B operand,
    /// after the index in the buffers): a task's first rows widen its panels for the rest
    /// ([`Spec::widening`]).
    pub store_wide: bool,
    /// bf16 A times bf16 B by the host's bf16 dot product ([`crate::Tiling::bf16_dot`]): the
    /// micro-kernel steps k two at a time, broadcasts A's pair `A[m, k .. k + 2]` as one 32-bit
    /// lane and reads panels that hold rows `k` and `k + 1` interleaved column by column
    /// ([`crate::pack::pair_rows`]). A keeps its dtype (no [`widen_a`](Self::widen_a)), the
    /// panels are bf16 (not [`wide_b`](Self::wide_b)). Only where every k range the kernel
    /// walks has an even length and start: an even K, or blocks of an even width.
    pub bf16_dot: bool,
}

/// The L2 share a GEMM task's panels are sized to ([`crate::exec`]'s blocking).
pub(crate) const L2_SHARE: usize = 512 * 1024;

/// Whether a GEMM whose B panels hold `k_rows` rows each (K, or a sparse panel's kept rows on
/// average; `None` where K is symbolic) over `slots` B operands gets f32 panels.
///
/// A micro-kernel call streams its panels once for `mr` rows of A. Where one panel column's f32
/// panels fit the L2 share, the panels come from L2 on every reuse and a large M is bound by the
/// multiply-add ports; widening there in the loop takes those ports (a sparse dual GEMM at d =
/// 0.25 ran 1.45x slower with 16-bit panels), so a task's panels are widened once, before its
/// micro-kernels run (when packed, for a run-time B; per task, for a 16-bit weight: [`Spec::narrowed`]).
/// Where they do not fit, the kernel streams them from L3 or memory at every reuse, and panels of
/// half the bytes win at every M (llama's dense GEMMs; decode steps 1.5-2.3x faster) and halve
/// the plan's memory. See docs/perf-notes.md, "16-bit B panels where they stream" and "16-bit
/// weight panels widened per task".
pub(crate) fn panels_widened(k_rows: Option<u64>, slots: usize, nr: usize) -> bool {
    match k_rows {
        Some(k) => (k as usize).saturating_mul(nr * 4 * slots) <= L2_SHARE,
        None => true,
    }
}

impl GemmSpec {
    /// The dtype of the panels packed from a B operand stored as `stored`.
    pub fn panel_dtype(&self, stored: DType) -> DType {
        if self.wide_b {
            DType::F32
        } else {
            stored
        }
    }

    /// Slots of the B operands: `[1]` or `[1, 2]`.
    pub fn b_slots(&self) -> std::ops::Range<usize> {
        1..if self.dual { 3 } else { 2 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EwOp {
    Add,
    Mul,
    Act(Activation),
}

/// An elementwise kernel over the output viewed as `[rows, cols]` (cols = the last dim).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct EwSpec {
    pub op: EwOp,
    /// Per operand: whether it is a `[cols]` row vector broadcast over the rows.
    pub row_broadcast: Vec<bool>,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Family {
    Gemm(GemmSpec),
    Elementwise(EwSpec),
    /// `out[b, i, j] = in[b, j, i]` over the last two dims.
    Transpose,
}

/// A plan kernel ready for code generation.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Spec {
    pub family: Family,
    /// Element type of each operand slot, then of the output (the last entry).
    pub dtypes: Vec<DType>,
    pub args: Vec<BufferId>,
    pub out: BufferId,
}

impl Spec {
    /// For a GEMM that reads f32 panels ([`GemmSpec::wide_b`]) with a 16-bit B operand that
    /// `is_weight` (by slot): the same kernel reading that B's panels in its own dtype. Its weight
    /// panels are then packed in 16 bits, half the bytes: a launch whose tasks span few rows
    /// (decode steps) reads them as they are, one that spans many widens each task's panels to
    /// f32 first and runs this spec (`exec`).
    ///
    /// Only where every B operand is a 16-bit weight: their panels are all packed once, so a
    /// launch reads them in one form.
    pub fn narrowed(&self, is_weight: impl Fn(usize) -> bool) -> Option<Spec> {
        let Family::Gemm(g) = &self.family else {
            return None;
        };
        let sixteen = g
            .b_slots()
            .all(|slot| is_weight(slot) && self.dtypes[slot] != DType::F32);
        (g.wide_b && sixteen).then(|| {
            let mut narrow = self.clone();
            if let Family::Gemm(g) = &mut narrow.family {
                g.wide_b = false;
            }
            narrow
        })
    }

    /// Whether launches of this [`narrowed`](Spec::narrowed) GEMM's kernel over many rows widen
    /// its panels per task ([`Spec::widening`]). Not for a dual GEMM of bf16 weights: its
    /// interleaved panels widen in the loop with one operation a vector, and its loop ran faster
    /// that way than with the f32 copy at every M measured (16 to 512 rows; docs/perf-notes.md,
    /// "bf16 panels widened two vectors a load").
    pub fn widens_per_task(&self) -> bool {
        match &self.family {
            Family::Gemm(g) => {
                !(g.dual && g.b_slots().all(|slot| self.dtypes[slot] == DType::Bf16))
            }
            _ => false,
        }
    }

    /// The [`narrowed`](Spec::narrowed) kernel that also stores the f32 panels it widens
    /// ([`GemmSpec::store_wide`]).
    pub fn widening(&self) -> Spec {
        let mut s = self.clone();
        if let Family::Gemm(g) = &mut s.family {
            g.wide_b = false;
            g.store_wide = true;
        }
        s
    }
}

fn unsupported(k: &Kernel, message: impl Into<String>) -> CpuError {
    CpuError::Unsupported {
        kernel: k.name.clone(),
        message: message.into(),
    }
}

/// Decides the family and operand roles of `k`; refuses shapes the kernels do not handle.
pub(crate) fn spec_of(plan: &Plan, k: &Kernel, tiling: &Tiling) -> Result<Spec, CpuError> {
    let nr = tiling.nr;
    let arity = k.op.arity();
    if k.args.len() != arity {
        return Err(unsupported(
            k,
            format!(
                "{} takes {arity} operand(s), the kernel lists {}",
                k.op.mnemonic(),
                k.args.len()
            ),
        ));
    }
    let mut dtypes: Vec<DType> = k.args.iter().map(|&a| plan.buffer(a).ty.dtype).collect();
    let out_ty = &plan.buffer(k.out).ty;
    dtypes.push(out_ty.dtype);
    let family = match &k.op {
        Op::Input | Op::Weight => {
            return Err(unsupported(
                k,
                "inputs and weights are buffers, not kernels",
            ))
        }
        Op::Transpose => {
            let src = &plan.buffer(k.args[0]).ty;
            let r = src.rank();
            let mut want = src.shape.clone();
            if r >= 2 {
                want.swap(r - 2, r - 1);
            }
            if r < 2 || want != out_ty.shape {
                return Err(unsupported(
                    k,
                    format!("transpose of {src} cannot produce {out_ty}"),
                ));
            }
            Family::Transpose
        }
        Op::MatMul => Family::Gemm(GemmSpec {
            a: MatLayout::N,
            b: MatLayout::N,
            dual: false,
            sparse: None,
            gate: Vec::new(),
            up: Vec::new(),
            epi: Vec::new(),
            widen_a: None,
            wide_b: true,
            store_wide: false,
            bf16_dot: false,
        }),
        Op::Gemm(g) => Family::Gemm(gemm_spec(plan, k, g, None)?),
        Op::SparseGemm(s) => {
            s.pattern
                .check()
                .map_err(|m| unsupported(k, format!("invalid block pattern: {m}")))?;
            if s.gemm.b != MatLayout::T {
                return Err(unsupported(k, "a sparse GEMM reads its weight in layout t"));
            }
            Family::Gemm(gemm_spec(plan, k, &s.gemm, Some(s.pattern.clone()))?)
        }
        Op::Add | Op::Mul | Op::Act(_) => {
            let op = match k.op {
                Op::Add => EwOp::Add,
                Op::Mul => EwOp::Mul,
                Op::Act(a) => EwOp::Act(a),
                ref other @ (Op::Input
                | Op::Weight
                | Op::Transpose
                | Op::MatMul
                | Op::Gemm(_)
                | Op::SparseGemm(_)) => {
                    return Err(unsupported(
                        k,
                        format!("`{}` is not elementwise", other.mnemonic()),
                    ))
                }
            };
            let mut row_broadcast = Vec::new();
            for &a in &k.args {
                let t = &plan.buffer(a).ty;
                if t.shape == out_ty.shape {
                    row_broadcast.push(false);
                } else if t.rank() == 1 && out_ty.shape.last() == t.shape.first() {
                    row_broadcast.push(true);
                } else {
                    return Err(unsupported(
                        k,
                        format!("operand {t} neither matches nor row-broadcasts to {out_ty}"),
                    ));
                }
            }
            Family::Elementwise(EwSpec { op, row_broadcast })
        }
    };
    let mut family = family;
    if let Family::Gemm(g) = &mut family {
        // K of a dense B (`None` where symbolic).
        let k_dense = match g.b {
            MatLayout::N => plan.buffer(k.args[1]).ty.shape.first(),
            MatLayout::T => plan.buffer(k.args[1]).ty.shape.get(1),
        }
        .and_then(|d| d.fixed());
        // Every k range the micro-kernel walks starts and ends even: K, or the blocks' width.
        let even_k = match &g.sparse {
            Some(p) => p.block[1] % 2 == 0,
            None => k_dense.is_some_and(|k| k % 2 == 0),
        };
        g.bf16_dot = tiling.bf16_dot
            && g.a == MatLayout::N
            && even_k
            && dtypes[0] == DType::Bf16
            && g.b_slots().all(|slot| dtypes[slot] == DType::Bf16);
        if g.bf16_dot {
            // A is read as stored, and the panels stay bf16.
            g.wide_b = false;
        } else {
            if dtypes[0] != DType::F32 {
                g.widen_a = Some(dtypes[0]);
                dtypes[0] = DType::F32;
            }
            let k_rows = match &g.sparse {
                Some(p) => Some(
                    (p.kept.len() as u64).div_ceil(p.block_rows().max(1)) * u64::from(p.block[1]),
                ),
                None => k_dense,
            };
            g.wide_b = panels_widened(k_rows, g.b_slots().len(), nr);
        }
    }
    Ok(Spec {
        family,
        dtypes,
        args: k.args.clone(),
        out: k.out,
    })
}

fn gemm_spec(
    plan: &Plan,
    k: &Kernel,
    g: &Gemm,
    sparse: Option<Arc<BlockPattern>>,
) -> Result<GemmSpec, CpuError> {
    let out_ty = &plan.buffer(k.out).ty;
    let a_ty = &plan.buffer(k.args[0]).ty;
    if a_ty.rank() == 0 || (g.a == MatLayout::T && a_ty.rank() != 2) {
        return Err(unsupported(
            k,
            format!(
                "A operand {a_ty} is not a matrix in layout {}",
                g.a.letter()
            ),
        ));
    }
    // The micro-kernel reads both B panels of a dual GEMM with one set of sizes.
    let b_ty = &plan.buffer(k.args[1]).ty;
    match &sparse {
        None if b_ty.rank() != 2 => {
            return Err(unsupported(k, format!("B operand {b_ty} is not a matrix")));
        }
        Some(p) => {
            let want: Vec<Option<u64>> = p.packed_shape().into_iter().map(Some).collect();
            let got: Vec<Option<u64>> = b_ty.shape.iter().map(|d| d.fixed()).collect();
            if got != want {
                return Err(unsupported(
                    k,
                    format!("packed B operand {b_ty} does not hold the blocks {want:?}"),
                ));
            }
        }
        None => {}
    }
    if g.dual.is_some() && plan.buffer(k.args[2]).ty.shape != b_ty.shape {
        return Err(unsupported(
            k,
            format!(
                "gate B {b_ty} and up B {} differ in shape",
                plan.buffer(k.args[2]).ty
            ),
        ));
    }
    let spec = GemmSpec {
        a: g.a,
        b: g.b,
        dual: g.dual.is_some(),
        sparse,
        gate: g
            .dual
            .iter()
            .flat_map(|d| d.gate.iter())
            .map(Step::of)
            .collect(),
        up: g
            .dual
            .iter()
            .flat_map(|d| d.up.iter())
            .map(Step::of)
            .collect(),
        epi: g.epilogue.iter().map(Step::of).collect(),
        widen_a: None,
        wide_b: true,
        store_wide: false,
        bf16_dot: false,
    };
    for step in spec.gate.iter().chain(&spec.up).chain(&spec.epi) {
        let (slot, want_row) = match *step {
            Step::Bias(s) => (s, true),
            Step::Add(s) | Step::Mul(s) => (s, false),
            Step::Act(_) => continue,
        };
        let Some(&buf) = k.args.get(slot).filter(|_| slot >= g.matrix_operands()) else {
            return Err(unsupported(
                k,
                format!("epilogue operand {slot} is not an epilogue slot"),
            ));
        };
        let t = &plan.buffer(buf).ty;
        let ok = if want_row {
            t.rank() == 1 && out_ty.shape.last() == t.shape.first()
        } else {
            t.shape == out_ty.shape
        };
        if !ok {
            return Err(unsupported(
                k,
                format!("epilogue operand {slot} is {t}, which does not fit the output {out_ty}"),
            ));
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panels_stay_in_16_bits_only_where_they_do_not_fit_l2() {
        // 32-column panels: 4096 f32 rows of one B fill the 512 KiB share; a dual's two B half.
        assert!(panels_widened(Some(4096), 1, 32));
        assert!(!panels_widened(Some(4097), 1, 32));
        assert!(panels_widened(Some(2048), 2, 32));
        assert!(!panels_widened(Some(2049), 2, 32));
        // llama's dense GEMMs stream; its d = 0.25 gated pair (1024 kept rows) and gpt2's fc2
        // (K = 3072) fit.
        assert!(!panels_widened(Some(4096), 2, 32));
        assert!(!panels_widened(Some(11008), 1, 32));
        assert!(panels_widened(Some(1024), 2, 32));
        assert!(panels_widened(Some(3072), 1, 32));
        // A symbolic K: f32, as before any K is known.
        assert!(panels_widened(None, 1, 32));
    }
}
