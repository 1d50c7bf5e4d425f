//! Lowering an optimised graph to a backend-neutral [`Plan`]. A lowering, not a pass: the graph
//! is not changed.
//!
//! - Every input and weight is a buffer of its own (kind `Input`/`Weight`); every input gets a
//!   [`Guard`]: its dtype, its shape pattern (symbols where symbolic), the row-major strides the
//!   kernels assume, and a base address aligned to [`INPUT_ALIGN_BYTES`].
//! - Every node that is neither a leaf nor a view becomes one [`Kernel`], in the graph's
//!   deterministic topological order, writing a buffer named after the node (`Output` when an
//!   output names it, `Intermediate` otherwise). A `matmul` left by a pipeline without
//!   fold-transpose is lowered as a GEMM with layouts N/N, so kernels are only GEMMs, elementwise
//!   ops and transposes.
//! - A view is not a buffer: an argument that is a transpose of a transpose reads the underlying
//!   buffer. Kernel arguments carry no strides of their own, so a single (odd) transpose read by a
//!   kernel, or returned as an output, is materialised once by a `transpose` kernel into a buffer
//!   named after the view. GEMM operands never need this after fold-transpose: their layouts
//!   express the transposition.
//! - An output that is directly an input or a weight names that buffer; executors copy outputs out
//!   of whatever buffer they name.
//! - Kernel names are readable and deterministic: the op, its epilogue steps, the dtype and the
//!   GEMM layouts (`gemm_bias_gelu_tanh_bf16_nt`, `dual_gemm_silu_mul_bf16_nt`, `add_bf16`), and
//!   for a sparse GEMM a `bsr_` prefix and the block shape (`bsr_gemm_bias_gelu_bf16_nt_b32x32`),
//!   with `_1`, `_2`, ... appended only on collisions.
//! - Each kernel's `covers` lists the source nodes it computes, from the [`Provenance`]: the node
//!   itself, what was fused into it, merged with it, or folded into its operand strides.

use crate::provenance::Provenance;
use mlpc_ir::{
    verify, Bindings, Buffer, BufferId, BufferKind, DType, Epilogue, Gemm, Graph, Guard, Kernel,
    MatLayout, NodeId, Op, Plan, Symbol, TensorType, VerifyErrors,
};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Alignment, in bytes, that every input's base address must have (16-byte vector loads).
pub const INPUT_ALIGN_BYTES: u32 = 16;

#[derive(Debug, Clone, thiserror::Error)]
pub enum PlanError {
    #[error("cannot lower an invalid graph: {0}")]
    Invalid(#[from] VerifyErrors),
    #[error("input `{input}` is declared as {ty}; kernels read inputs row-major")]
    StridedInput { input: String, ty: String },
    #[error("the element count of `{node}` ({ty}) overflows")]
    Overflow { node: String, ty: String },
    #[error("the lowered plan is inconsistent (a bug in mlpc): {}", .0.join("; "))]
    Inconsistent(Vec<String>),
}

/// Follows a chain of views down to the first non-view node; returns it and whether the chain
/// transposes an odd number of times.
fn resolve_view(g: &Graph, mut n: NodeId) -> (NodeId, bool) {
    let mut odd = false;
    while g.node(n).op.is_view() {
        match g.operands(n).first() {
            Some(&x) => {
                odd = !odd;
                n = x;
            }
            None => break,
        }
    }
    (n, odd)
}

fn step_name(s: &Epilogue) -> &'static str {
    match s {
        Epilogue::Bias { .. } => "bias",
        Epilogue::Act(a) => a.name(),
        Epilogue::Add { .. } => "add",
        Epilogue::Mul { .. } => "mul",
    }
}

/// The readable name of a kernel computing `op` in `dtype`, before collision suffixes.
pub fn kernel_base_name(op: &Op, dtype: DType) -> String {
    let mut parts: Vec<&str> = Vec::new();
    match op {
        Op::Gemm(gm) => {
            parts.push(op.mnemonic());
            if let Some(d) = &gm.dual {
                parts.extend(d.gate.iter().map(step_name));
                if !d.up.is_empty() {
                    parts.push("up");
                    parts.extend(d.up.iter().map(step_name));
                }
                parts.push("mul");
            }
            parts.extend(gm.epilogue.iter().map(step_name));
            let layouts = format!("{}{}", gm.a.letter(), gm.b.letter());
            return format!("{}_{}_{layouts}", parts.join("_"), dtype.name());
        }
        Op::SparseGemm(s) => {
            let base = kernel_base_name(&Op::Gemm(s.gemm.clone()), dtype);
            let [r, c] = s.pattern.block;
            return format!("bsr_{base}_b{r}x{c}");
        }
        Op::MatMul => return format!("gemm_{}_nn", dtype.name()),
        op => parts.push(op.mnemonic()),
    }
    format!("{}_{}", parts.join("_"), dtype.name())
}

struct Lowering<'g> {
    g: &'g Graph,
    /// The source nodes each live node computes ([`Provenance::coverage`]).
    coverage: BTreeMap<String, Vec<String>>,
    plan: Plan,
    buf_of: BTreeMap<NodeId, BufferId>,
    kernel_names: BTreeSet<String>,
    /// For each base name given a suffix: the suffix to try first (those below it are taken).
    next_suffix: BTreeMap<String, usize>,
}

impl Lowering<'_> {
    fn add_buffer(&mut self, node: NodeId, kind: BufferKind, ty: TensorType) -> BufferId {
        let id = self.plan.buffers.len();
        self.plan.buffers.push(Buffer {
            name: self.g.node(node).name.clone(),
            kind,
            ty,
        });
        self.buf_of.insert(node, id);
        id
    }

    /// `base`, or if it is taken, `base_1`, `base_2`, ...: the first that is not.
    fn unique_kernel_name(&mut self, base: String) -> String {
        let name = if self.kernel_names.contains(&base) {
            let next = self.next_suffix.entry(base.clone()).or_insert(1);
            while self.kernel_names.contains(&format!("{base}_{next}")) {
                *next += 1;
            }
            let name = format!("{base}_{next}");
            *next += 1;
            name
        } else {
            base
        };
        self.kernel_names.insert(name.clone());
        name
    }

    fn covers(&self, node: NodeId) -> Vec<String> {
        let name = &self.g.node(node).name;
        match self.coverage.get(name) {
            Some(covers) if !covers.is_empty() => covers.clone(),
            _ => vec![name.clone()],
        }
    }

    fn push_kernel(&mut self, node: NodeId, op: Op, args: Vec<BufferId>, out: BufferId) {
        let name = self.unique_kernel_name(kernel_base_name(&op, self.g.node(node).ty.dtype));
        let covers = self.covers(node);
        self.plan.kernels.push(Kernel {
            name,
            op,
            covers,
            args,
            out,
        });
    }

    /// The buffer a kernel reads for operand `v`.
    fn arg(&self, v: NodeId) -> Result<BufferId, PlanError> {
        let (base, odd) = resolve_view(self.g, v);
        let key = if odd { v } else { base };
        self.buf_of.get(&key).copied().ok_or_else(|| {
            PlanError::Inconsistent(vec![format!(
                "`{}` is read before its buffer exists",
                self.g.node(key).name
            )])
        })
    }
}

/// Lowers the (optimised, verified) graph `g` to a kernel plan; `prov` says which source nodes
/// each kernel covers.
pub fn lower_plan(g: &Graph, prov: &Provenance) -> Result<Plan, PlanError> {
    verify(g)?;
    let order = g.topo_order().map_err(|_| {
        PlanError::Inconsistent(vec!["the verified graph has no topological order".into()])
    })?;
    let dtype = g
        .outputs()
        .first()
        .map(|o| g.node(o.node).ty.dtype)
        .unwrap_or(DType::F32);

    // Views that must be materialised: odd transposes read by kernels or returned as outputs.
    let mut materialise: BTreeSet<NodeId> = BTreeSet::new();
    let mut output_values: BTreeSet<NodeId> = BTreeSet::new();
    for &n in &order {
        let op = &g.node(n).op;
        if op.is_leaf() || op.is_view() {
            continue;
        }
        for v in g.operands(n) {
            if g.node(v).op.is_view() && resolve_view(g, v).1 {
                materialise.insert(v);
            }
        }
    }
    for o in g.outputs() {
        let (base, odd) = resolve_view(g, o.node);
        if odd {
            materialise.insert(o.node);
            output_values.insert(o.node);
        } else {
            output_values.insert(base);
        }
    }

    let mut low = Lowering {
        g,
        coverage: prov.coverage(),
        plan: Plan {
            name: g.name.clone(),
            dtype,
            buffers: Vec::new(),
            kernels: Vec::new(),
            outputs: Vec::new(),
            guards: Vec::new(),
        },
        buf_of: BTreeMap::new(),
        kernel_names: BTreeSet::new(),
        next_suffix: BTreeMap::new(),
    };

    for &n in &order {
        let node = g.node(n);
        let kind = if output_values.contains(&n) {
            BufferKind::Output
        } else {
            BufferKind::Intermediate
        };
        match &node.op {
            Op::Input => {
                if !node.ty.is_contiguous() {
                    return Err(PlanError::StridedInput {
                        input: node.name.clone(),
                        ty: node.ty.to_string(),
                    });
                }
                low.add_buffer(n, BufferKind::Input, node.ty.clone());
                low.plan.guards.push(Guard {
                    tensor: node.name.clone(),
                    dtype: node.ty.dtype,
                    shape: node.ty.shape.clone(),
                    strides: node.ty.strides.clone(),
                    align_bytes: INPUT_ALIGN_BYTES,
                });
            }
            Op::Weight => {
                low.add_buffer(n, BufferKind::Weight, node.ty.clone());
            }
            Op::Transpose => {
                if !materialise.contains(&n) {
                    continue;
                }
                let (base, _) = resolve_view(g, n);
                let ty = TensorType::try_contiguous(node.ty.dtype, node.ty.shape.clone())
                    .ok_or_else(|| PlanError::Overflow {
                        node: node.name.clone(),
                        ty: node.ty.to_string(),
                    })?;
                let arg = low.arg(base)?;
                let out = low.add_buffer(n, kind, ty);
                low.push_kernel(n, Op::Transpose, vec![arg], out);
            }
            op => {
                let op = match op {
                    Op::MatMul => Op::Gemm(Gemm {
                        a: MatLayout::N,
                        b: MatLayout::N,
                        dual: None,
                        epilogue: Default::default(),
                    }),
                    op => op.clone(),
                };
                let args = g
                    .operands(n)
                    .into_iter()
                    .map(|v| low.arg(v))
                    .collect::<Result<Vec<_>, _>>()?;
                let out = low.add_buffer(n, kind, node.ty.clone());
                low.push_kernel(n, op, args, out);
            }
        }
    }

    for o in g.outputs() {
        let id = low.arg(o.node)?;
        low.plan.outputs.push((o.name.clone(), id));
    }
    let plan = low.plan;
    plan.check().map_err(PlanError::Inconsistent)?;
    Ok(plan)
}

/// A number of bytes that may depend on symbolic dimensions: a sum of terms `coeff * sym * ...`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ByteCount {
    /// Sorted symbols of a term → its coefficient (never 0).
    terms: BTreeMap<Vec<Symbol>, i128>,
}

impl ByteCount {
    pub fn zero() -> ByteCount {
        ByteCount::default()
    }

    /// The bytes of a dense tensor of type `ty`.
    pub fn of_tensor(ty: &TensorType) -> ByteCount {
        let mut b = ByteCount::zero();
        b.add_tensor(ty);
        b
    }

    pub fn add_tensor(&mut self, ty: &TensorType) {
        let numel = ty.numel();
        let coeff = numel.coeff as i128 * ty.dtype.size_bytes() as i128;
        self.add_term(numel.syms.to_vec(), coeff);
    }

    fn add_term(&mut self, mut syms: Vec<Symbol>, coeff: i128) {
        syms.sort();
        let c = self.terms.entry(syms).or_insert(0);
        *c = c.saturating_add(coeff);
        self.terms.retain(|_, c| *c != 0);
    }

    pub fn plus(&self, other: &ByteCount) -> ByteCount {
        let mut r = self.clone();
        for (s, &c) in &other.terms {
            r.add_term(s.clone(), c);
        }
        r
    }

    pub fn minus(&self, other: &ByteCount) -> ByteCount {
        let mut r = self.clone();
        for (s, &c) in &other.terms {
            r.add_term(s.clone(), -c);
        }
        r
    }

    pub fn is_zero(&self) -> bool {
        self.terms.is_empty()
    }

    /// The constant value, if no term has a symbol.
    pub fn as_constant(&self) -> Option<i128> {
        match self.terms.iter().next() {
            None => Some(0),
            Some((s, &c)) if s.is_empty() && self.terms.len() == 1 => Some(c),
            _ => None,
        }
    }

    /// The value under `bindings`, if every symbol is bound.
    pub fn resolve(&self, bindings: &Bindings) -> Option<i128> {
        self.terms.iter().try_fold(0i128, |acc, (syms, &c)| {
            let v = syms
                .iter()
                .try_fold(c, |v, s| v.checked_mul(i128::from(bindings.get(s)?)))?;
            acc.checked_add(v)
        })
    }
}

/// `12288*T + 64`; terms of higher degree first; `0` when empty.
impl fmt::Display for ByteCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        let mut terms: Vec<(&Vec<Symbol>, i128)> =
            self.terms.iter().map(|(s, &c)| (s, c)).collect();
        terms.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(b.0)));
        for (i, (syms, c)) in terms.into_iter().enumerate() {
            let sign = if c < 0 { "-" } else { "+" };
            match (i, c < 0) {
                (0, false) => {}
                (0, true) => f.write_str("-")?,
                _ => write!(f, " {sign} ")?,
            }
            let mag = c.unsigned_abs();
            let mut factors: Vec<String> = Vec::new();
            if mag != 1 || syms.is_empty() {
                factors.push(mag.to_string());
            }
            factors.extend(syms.iter().map(|s| s.to_string()));
            f.write_str(&factors.join("*"))?;
        }
        Ok(())
    }
}

/// Bytes of the intermediate buffers of `plan` (written by one kernel, read by later ones).
pub fn intermediate_bytes(plan: &Plan) -> ByteCount {
    plan.buffers
        .iter()
        .filter(|b| b.kind == BufferKind::Intermediate)
        .fold(ByteCount::zero(), |acc, b| {
            acc.plus(&ByteCount::of_tensor(&b.ty))
        })
}

/// Bytes of intermediates an unfused executor (one kernel per op, as eager frameworks run) stores
/// for `g`: every node that is not a leaf, a view or an output.
pub fn unfused_intermediate_bytes(g: &Graph) -> ByteCount {
    g.node_ids()
        .filter(|&n| {
            let op = &g.node(n).op;
            !op.is_leaf() && !op.is_view() && !g.is_output(n)
        })
        .fold(ByteCount::zero(), |acc, n| {
            acc.plus(&ByteCount::of_tensor(&g.node(n).ty))
        })
}

/// The number of kernels an unfused executor launches for `g`: one per op that is neither a
/// leaf nor a view.
pub fn unfused_kernel_count(g: &Graph) -> usize {
    g.node_ids()
        .filter(|&n| {
            let op = &g.node(n).op;
            !op.is_leaf() && !op.is_view()
        })
        .count()
}
