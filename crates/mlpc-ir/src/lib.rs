//! mlpc's intermediate representation.
//!
//! A model is a [`Graph`]: a petgraph of [`Node`]s, each an [`Op`] from a closed enum with a
//! [`TensorType`] (dtype, shape of fixed or symbolic dims, strides). The crate holds everything
//! that defines what a graph *means*: type inference, the [verifier](verify()), the text form and the
//! reference [`interpret`]er that every backend is checked against.
//!
//! **Architecture invariant:** this crate knows nothing of CUDA, LLVM, files or passes. It depends
//! on no other mlpc crate.

pub mod graph;
pub mod infer;
pub mod inputs;
pub mod interp;
pub mod op;
mod par;
pub mod plan;
pub mod print;
pub mod tensor;
pub mod types;
pub mod verify;

pub use graph::{BuildError, Graph, Node, NodeId, Output, TopoWalk};
pub use infer::infer;
pub use inputs::{bind_inputs, check_input_names, InputError};
pub use interp::{interpret, interpret_perturbed, interpret_unrounded, InterpError};
pub use op::{
    Activation, BlockPattern, Dual, Epilogue, EpilogueChain, Gemm, MatLayout, Op, SparseGemm,
};
pub use plan::{Buffer, BufferId, BufferKind, Guard, Kernel, Plan};
pub use tensor::{
    relative_error, relative_error_floored, relative_error_same_specials, HostTensor,
    TensorSizeError,
};
pub use types::{
    contiguous_strides, is_valid_symbol, Bindings, DType, Dim, Extent, Shape, Strides, Symbol,
    TensorType,
};
pub use verify::{verify, VerifyError, VerifyErrors};
