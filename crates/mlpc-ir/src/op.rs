//! The closed set of operations. Every consumer (verifier, interpreter, passes, backends) matches
//! on [`Op`] exhaustively, so adding an op is a compile error everywhere it must be handled.

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::fmt;

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
            Activation::Gelu => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
            Activation::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
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
        }
    }

    /// The number of operands the op takes, or `None` for ops whose count depends on parameters.
    pub fn arity(&self) -> usize {
        match self {
            Op::Input | Op::Weight => 0,
            Op::Transpose | Op::Act(_) => 1,
            Op::MatMul | Op::Add | Op::Mul => 2,
            Op::Gemm(g) => {
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
