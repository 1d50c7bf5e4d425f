//! The closed set of operations. Every consumer (verifier, interpreter, passes, backends) matches
//! on [`Op`] exhaustively, so adding an op is a compile error everywhere it must be handled.

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::fmt;
use std::sync::Arc;

use crate::tensor::HostTensor;

/// Elementwise activation functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    Relu,
    /// GELU with the exact erf form: `x * 0.5 * (1 + erf(x / sqrt 2))`.
    Gelu,
    /// GELU with the tanh approximation used by GPT-2.
    GeluTanh,
    /// `x * sigmoid(x)`, also called swish.
    Silu,
    Sigmoid,
    Tanh,
}

impl Activation {
    pub const ALL: [Activation; 6] = [
        Activation::Relu,
        Activation::Gelu,
        Activation::GeluTanh,
        Activation::Silu,
        Activation::Sigmoid,
        Activation::Tanh,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
            Activation::GeluTanh => "gelu_tanh",
            Activation::Silu => "silu",
            Activation::Sigmoid => "sigmoid",
            Activation::Tanh => "tanh",
        }
    }

    pub fn parse(s: &str) -> Option<Activation> {
        Activation::ALL.into_iter().find(|a| a.name() == s)
    }

    /// The reference definition, evaluated in f64.
    pub fn eval(self, x: f64) -> f64 {
        match self {
            Activation::Relu => x.max(0.0),
            // x * 0.5 * (1 + erf(x / sqrt 2)) and 0.5 x (1 + tanh u) in forms without the
            // cancellation of `1 + erf` / `1 + tanh` in the negative tail (in f64, 1 + erf
            // keeps no digit below x = -8.5): the same function, and the same NaN at -inf.
            Activation::Gelu => 0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2),
            Activation::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                x / (1.0 + (-2.0 * c * (x + 0.044715 * x * x * x)).exp())
            }
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Activation::Tanh => x.tanh(),
        }
    }
}

impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a GEMM operand sits in memory, in BLAS terms. For `A` (`[M,K]`): `N` reads a row-major
/// `[M,K]` tensor, `T` reads a row-major `[K,M]` tensor as its transpose. Likewise for `B`
/// (`[K,N]`): `T` reads an nn.Linear weight `[N,K]` without moving it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatLayout {
    N,
    T,
}

impl MatLayout {
    pub fn letter(self) -> char {
        match self {
            MatLayout::N => 'n',
            MatLayout::T => 't',
        }
    }

    pub fn flipped(self) -> MatLayout {
        match self {
            MatLayout::N => MatLayout::T,
            MatLayout::T => MatLayout::N,
        }
    }
}

/// One step of a fused GEMM epilogue, applied to the accumulator in registers before the store.
/// `operand` indexes the GEMM node's operand list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Epilogue {
    /// `acc + bias[n]`: a `[N]` row vector broadcast over rows.
    Bias {
        operand: usize,
    },
    Act(Activation),
    /// `acc + r[m,n]`: a residual of the output's shape.
    Add {
        operand: usize,
    },
    /// `acc * r[m,n]`: elementwise with a tensor of the output's shape.
    Mul {
        operand: usize,
    },
}

impl Epilogue {
    pub fn operand(&self) -> Option<usize> {
        match *self {
            Epilogue::Bias { operand } | Epilogue::Add { operand } | Epilogue::Mul { operand } => {
                Some(operand)
            }
            Epilogue::Act(_) => None,
        }
    }
}

pub type EpilogueChain = SmallVec<[Epilogue; 4]>;

/// The gated form `act(A Bg + ...) * (A Bu + ...)`: two GEMMs that share `A`, computed together,
/// combined by a product in the epilogue.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Dual {
    /// Applied to the gate accumulator (`A @ operand 1`), typically `[bias?, act]`.
    pub gate: EpilogueChain,
    /// Applied to the up accumulator (`A @ operand 2`), typically `[bias?]`.
    pub up: EpilogueChain,
}

/// A matrix product with a fused epilogue: `epilogue(A @ B)`, or with [`Dual`]
/// `epilogue(gate(A @ B0) * up(A @ B1))`.
///
/// Operands: `0` is A, `1` is B (the gate's B when dual), `2` is the up B when dual; the operands
/// after those are referenced by epilogue steps, each exactly once.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Gemm {
    pub a: MatLayout,
    pub b: MatLayout,
    pub dual: Option<Dual>,
    pub epilogue: EpilogueChain,
}

impl Gemm {
    /// Number of matrix operands (A and one or two B's) before the epilogue operands.
    pub fn matrix_operands(&self) -> usize {
        if self.dual.is_some() {
            3
        } else {
            2
        }
    }

    /// All epilogue steps in evaluation order (gate, up, then the common chain).
    pub fn all_steps(&self) -> impl Iterator<Item = &Epilogue> {
        let (g, u) = match &self.dual {
            Some(d) => (&d.gate[..], &d.up[..]),
            None => (&[][..], &[][..]),
        };
        g.iter().chain(u.iter()).chain(self.epilogue.iter())
    }
}

/// Packed bytes from which [`BlockPattern::pack`] uses every core.
const PARALLEL_PACK_BYTES: usize = 1 << 20;

/// Which blocks of a block-sparse weight are kept.
///
/// The pattern is over the *logical* weight `[N, K]` of a GEMM (`B` transposed; for an nn.Linear
/// weight `[out, in]` that is the weight as stored): `block = [rows, cols]` divides `[out, inp]`
/// and `kept` lists the kept blocks as `(block_row, block_col)`, sorted row-major, without
/// repeats. Block row `r` covers output columns `r * rows .. (r + 1) * rows`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlockPattern {
    /// `[rows, cols]` of one block.
    pub block: [u32; 2],
    /// `N`: rows of the logical weight (output features).
    pub out: u64,
    /// `K`: columns of the logical weight (input features).
    pub inp: u64,
    /// Kept blocks, `(block_row, block_col)`, sorted row-major.
    pub kept: Vec<(u32, u32)>,
}

impl BlockPattern {
    /// Number of block rows, `out / rows`.
    pub fn block_rows(&self) -> u64 {
        self.out / u64::from(self.block[0].max(1))
    }

    /// Number of block columns, `inp / cols`.
    pub fn block_cols(&self) -> u64 {
        self.inp / u64::from(self.block[1].max(1))
    }

    /// Number of blocks of the dense weight.
    pub fn total_blocks(&self) -> u64 {
        self.block_rows().saturating_mul(self.block_cols())
    }

    /// Elements of one block.
    pub fn block_elems(&self) -> u64 {
        u64::from(self.block[0]) * u64::from(self.block[1])
    }

    /// The shape of the packed weight: `[kept, rows, cols]`.
    pub fn packed_shape(&self) -> [u64; 3] {
        [
            self.kept.len() as u64,
            u64::from(self.block[0]),
            u64::from(self.block[1]),
        ]
    }

    /// Offsets of each block row's kept blocks in `kept` (compressed sparse rows): the kept blocks
    /// of block row `r` are `kept[row_ptr[r]..row_ptr[r + 1]]`.
    pub fn row_ptr(&self) -> Vec<u32> {
        let rows = self.block_rows() as usize;
        let mut ptr = vec![0u32; rows + 1];
        for &(r, _) in &self.kept {
            if let Some(p) = ptr.get_mut(r as usize + 1) {
                *p += 1;
            }
        }
        for i in 0..rows {
            ptr[i + 1] += ptr[i];
        }
        ptr
    }

    /// Bytes of one entry of the pattern's block-index arrays: 2 where every value they can
    /// hold fits 16 bits (a kept block's position, at most the kept count, or a block column:
    /// at most 65535 kept blocks and 65535 block columns), else 4. The kernels store their
    /// index tables at this width.
    pub fn index_width(&self) -> u64 {
        let max = u64::from(u16::MAX);
        match self.kept.len() as u64 <= max && self.block_cols() <= max {
            true => 2,
            false => 4,
        }
    }

    /// Bytes of the pattern's compressed-sparse-rows index arrays ([`BlockPattern::row_ptr`],
    /// and one block column per kept block) at [`BlockPattern::index_width`].
    pub fn index_bytes(&self) -> u64 {
        let entries = (self.block_rows() + 1).saturating_add(self.kept.len() as u64);
        entries.saturating_mul(self.index_width())
    }

    /// Fraction of blocks kept.
    pub fn density(&self) -> f64 {
        self.kept.len() as f64 / self.total_blocks().max(1) as f64
    }

    /// Packs the kept blocks of `weight` into the `[kept, rows, cols]` layout of a sparse GEMM's B
    /// operand. `weight` is the logical `[N, K]` matrix, or with `transposed` its `[K, N]`
    /// transpose as stored. Values are copied bit for bit. `None` if the shape does not match.
    /// Large weights are packed on every core, each a run of whole blocks.
    pub fn pack(&self, weight: &HostTensor, transposed: bool) -> Option<HostTensor> {
        let (n, k) = (self.out as usize, self.inp as usize);
        let want = if transposed { [k, n] } else { [n, k] };
        if weight.shape() != want {
            return None;
        }
        let [br, bc] = self.block.map(|d| d as usize);
        let es = weight.dtype().size_bytes();
        let src = weight.bytes();
        let (row_bytes, block_bytes) = (bc * es, br * bc * es);
        let mut out = vec![0u8; self.kept.len() * block_bytes];
        let fill = |blocks: &[(u32, u32)], dst: &mut [u8]| {
            for (&(r, c), dst) in blocks.iter().zip(dst.chunks_exact_mut(block_bytes)) {
                for (i, dst) in dst.chunks_exact_mut(row_bytes).enumerate() {
                    let row = r as usize * br + i;
                    if transposed {
                        for (j, dst) in dst.chunks_exact_mut(es).enumerate() {
                            let at = ((c as usize * bc + j) * n + row) * es;
                            dst.copy_from_slice(&src[at..at + es]);
                        }
                    } else {
                        let at = (row * k + c as usize * bc) * es;
                        dst.copy_from_slice(&src[at..at + row_bytes]);
                    }
                }
            }
        };
        let threads = crate::par::cores_for(out.len(), PARALLEL_PACK_BYTES);
        if block_bytes > 0 && threads > 1 {
            let per = self.kept.len().div_ceil(threads);
            let fill = &fill;
            std::thread::scope(|scope| {
                for (blocks, dst) in self.kept.chunks(per).zip(out.chunks_mut(per * block_bytes)) {
                    scope.spawn(move || fill(blocks, dst));
                }
            });
        } else if block_bytes > 0 {
            fill(&self.kept, &mut out);
        }
        let shape = self.packed_shape().map(|d| d as usize).to_vec();
        HostTensor::from_bytes(weight.dtype(), shape, out).ok()
    }

    /// The dense logical `[N, K]` weight of a packed `[kept, rows, cols]` tensor, zero outside the
    /// kept blocks. `None` if the packed shape does not match.
    pub fn unpack(&self, packed: &HostTensor) -> Option<HostTensor> {
        let shape = self.packed_shape().map(|d| d as usize);
        if packed.shape() != shape {
            return None;
        }
        let (n, k) = (self.out as usize, self.inp as usize);
        let [br, bc] = self.block.map(|d| d as usize);
        let es = packed.dtype().size_bytes();
        let src = packed.bytes();
        let mut out = vec![0u8; n * k * es];
        for (b, &(r, c)) in self.kept.iter().enumerate() {
            for i in 0..br {
                let from = (b * br + i) * bc * es;
                let to = ((r as usize * br + i) * k + c as usize * bc) * es;
                out[to..to + bc * es].copy_from_slice(&src[from..from + bc * es]);
            }
        }
        HostTensor::from_bytes(packed.dtype(), vec![n, k], out).ok()
    }

    /// Checks the invariants stated on the type; the message says which one fails.
    pub fn check(&self) -> Result<(), String> {
        let [br, bc] = self.block;
        if br == 0 || bc == 0 {
            return Err(format!("block {br}x{bc} has a zero side"));
        }
        if self.out == 0 || self.inp == 0 {
            return Err(format!("weight [{}, {}] is empty", self.out, self.inp));
        }
        if !self.out.is_multiple_of(u64::from(br)) || !self.inp.is_multiple_of(u64::from(bc)) {
            return Err(format!(
                "block {br}x{bc} does not divide the weight [{}, {}]",
                self.out, self.inp
            ));
        }
        if self.kept.is_empty() {
            return Err("no block is kept".to_string());
        }
        let (rows, cols) = (self.block_rows(), self.block_cols());
        for w in self.kept.windows(2) {
            if w[0] >= w[1] {
                return Err(format!(
                    "kept blocks are not sorted row-major without repeats: {:?} then {:?}",
                    w[0], w[1]
                ));
            }
        }
        if let Some(&(r, c)) = self
            .kept
            .iter()
            .find(|&&(r, c)| u64::from(r) >= rows || u64::from(c) >= cols)
        {
            return Err(format!(
                "kept block ({r}, {c}) lies outside the {rows}x{cols} grid of blocks"
            ));
        }
        Ok(())
    }
}

/// A GEMM whose B operand is block-sparse: `epilogue(A @ B)` where only the kept blocks of `B^T`
/// (`[N, K]`) are stored. The operands are those of [`Gemm`], except that each B operand (B, and
/// the up B of a dual GEMM) is a packed weight of shape `[kept, rows, cols]`: block `i` holds the
/// elements of block `pattern.kept[i]` of the logical `[N, K]` weight, row-major (k contiguous).
/// `gemm.b` is always `T` (the weight is read as `[N, K]`). A dual form shares one pattern.
///
/// Value: the GEMM with a dense weight that is zero outside the kept blocks; an output column block
/// with no kept block is the epilogue applied to zero. The reference interpreter visits only kept
/// blocks (a dropped block adds nothing, not `0 * A`); kernels may multiply zeros inside packed
/// panels, which differs only where A is not finite.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SparseGemm {
    pub gemm: Gemm,
    pub pattern: Arc<BlockPattern>,
}

/// An operation of the graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
// One `Op` per node: the size of the Gemm variant costs nothing that matters, and an unboxed enum
// keeps every match plain.
#[allow(clippy::large_enum_variant)]
pub enum Op {
    /// A model input; the node's name is the input's name and its type is given.
    Input,
    /// A constant from the weights table; the node's name is the tensor's name.
    Weight,
    /// Swaps the last two dimensions. A view: it only changes strides.
    Transpose,
    /// `[..., M, K] x [K, N] -> [..., M, N]`; leading dims of the left operand flatten into M.
    MatMul,
    /// Same shape, or a `[N]` row vector (either side) broadcast over the rows of the other.
    Add,
    /// Elementwise product of two tensors of the same shape.
    Mul,
    Act(Activation),
    /// A matrix product with a fused epilogue; made by the fusion passes.
    Gemm(Gemm),
    /// A matrix product with a block-sparse, packed weight; made by `lower-block-sparse`.
    SparseGemm(SparseGemm),
}

impl Op {
    /// The name of the op in model.json and in the text form.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            Op::Input => "input",
            Op::Weight => "weight",
            Op::Transpose => "transpose",
            Op::MatMul => "matmul",
            Op::Add => "add",
            Op::Mul => "mul",
            Op::Act(a) => a.name(),
            Op::Gemm(g) if g.dual.is_some() => "dual_gemm",
            Op::Gemm(_) => "gemm",
            Op::SparseGemm(s) if s.gemm.dual.is_some() => "sparse_dual_gemm",
            Op::SparseGemm(_) => "sparse_gemm",
        }
    }

    /// The number of operands the op takes, or `None` for ops whose count depends on parameters.
    pub fn arity(&self) -> usize {
        match self {
            Op::Input | Op::Weight => 0,
            Op::Transpose | Op::Act(_) => 1,
            Op::MatMul | Op::Add | Op::Mul => 2,
            Op::Gemm(g) | Op::SparseGemm(SparseGemm { gemm: g, .. }) => {
                g.matrix_operands() + g.all_steps().filter(|s| s.operand().is_some()).count()
            }
        }
    }

    /// Whether the op only reinterprets memory (no kernel, no data movement).
    pub fn is_view(&self) -> bool {
        matches!(self, Op::Transpose)
    }

    /// Whether the op is a leaf holding data (input or weight).
    pub fn is_leaf(&self) -> bool {
        matches!(self, Op::Input | Op::Weight)
    }
}

#[cfg(test)]
mod tests {
    use super::Activation;

    /// The negative tails keep their digits (`1 + erf` and `1 + tanh` kept none below about
    /// x = -8.5 and -7.5: gelu(-9) was -0, gelu_tanh(-7) 0.7 % off).
    #[test]
    fn gelu_tails_are_accurate() {
        // Phi(-9) = 1.1285884059538407e-19 (the normal distribution's tables).
        let want = -9.0 * 1.128_588_405_953_840_7e-19;
        let got = Activation::Gelu.eval(-9.0);
        assert!(((got - want) / want).abs() < 1e-12, "gelu(-9) = {got:e}");
        for x in [-7.0f64, -7.5, -9.0, -20.0] {
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            // (1 + tanh u) / 2 = e^(2u) / (1 + e^(2u)), exact for u far below zero.
            let want = x * (2.0 * u).exp() / (1.0 + (2.0 * u).exp());
            let got = Activation::GeluTanh.eval(x);
            assert!(
                got < 0.0 && ((got - want) / want).abs() < 1e-12,
                "gelu_tanh({x}) = {got:e}, want {want:e}"
            );
        }
        // The limits and NaN as before.
        for a in [Activation::Gelu, Activation::GeluTanh] {
            assert_eq!(a.eval(f64::INFINITY), f64::INFINITY);
            assert!(a.eval(f64::NEG_INFINITY).is_nan());
            assert!(a.eval(f64::NAN).is_nan());
            assert_eq!(a.eval(3.0e5), 3.0e5);
            assert!((a.eval(1.0) - 0.841).abs() < 1e-3);
        }
    }
}
