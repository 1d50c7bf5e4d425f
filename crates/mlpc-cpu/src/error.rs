//! The one error type of the CPU backend.

use mlpc_ir::{DType, InputError};

/// Compiling or running a plan on the CPU failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CpuError {
    #[error("the CPU backend was built without LLVM: rebuild mlpc-cpu with its `llvm` feature")]
    NoLlvm,
    #[error(transparent)]
    Input(#[from] InputError),
    #[error("plan `{plan}` is inconsistent: {}", .errors.join("; "))]
    InvalidPlan { plan: String, errors: Vec<String> },
    #[error("kernel `{kernel}`: {message}")]
    Unsupported { kernel: String, message: String },
    #[error("weight `{name}` is missing from the weights table")]
    MissingWeight { name: String },
    #[error("weight `{name}` is {actual_dtype}{actual_shape:?}, but the plan declares {expected}")]
    WeightMismatch {
        name: String,
        expected: String,
        actual_dtype: DType,
        actual_shape: Vec<usize>,
    },
    #[error("buffer `{buffer}`: a dimension is not bound by the inputs ({bindings})")]
    Unbound { buffer: String, bindings: String },
    #[error("buffer `{buffer}`: {elements} elements do not fit in memory")]
    TooLarge { buffer: String, elements: u64 },
    #[error("cannot start the thread pool: {message}")]
    Threads { message: String },
    #[error("LLVM failed while {stage}: {message}")]
    Llvm {
        stage: &'static str,
        message: String,
    },
}
