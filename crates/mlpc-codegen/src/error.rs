//! Why a plan kernel could not be turned into CUDA. Every error names the plan kernel.

use mlpc_ir::{BufferId, DType};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodegenError {
    #[error("kernel `{kernel}`: op `{op}` has no CUDA template")]
    UnsupportedOp { kernel: String, op: String },

    #[error("kernel `{kernel}` has {actual} operands, but `{op}` takes {expected}")]
    Arity {
        kernel: String,
        op: String,
        expected: usize,
        actual: usize,
    },

    #[error("kernel `{kernel}` names buffer {buffer}, which does not exist")]
    NoSuchBuffer { kernel: String, buffer: BufferId },

    #[error("kernel `{kernel}`: `{buffer}` is {actual}, but the kernel computes in {expected}")]
    DType {
        kernel: String,
        buffer: String,
        expected: DType,
        actual: DType,
    },

    #[error("kernel `{kernel}`: {what} is {actual}, expected {expected}")]
    Shape {
        kernel: String,
        what: String,
        expected: String,
        actual: String,
    },

    #[error("kernel `{kernel}`: `{buffer}` ({ty}) cannot be read by this kernel: {reason}")]
    Layout {
        kernel: String,
        buffer: String,
        ty: String,
        reason: String,
    },

    #[error(
        "kernel `{kernel}`: `{buffer}` has rank {rank}; elementwise kernels take rank 4 at most"
    )]
    Rank {
        kernel: String,
        buffer: String,
        rank: usize,
    },

    #[error("kernel `{kernel}` ({key}): the tile {choice} is not valid: {reason}")]
    TileChoice {
        kernel: String,
        key: String,
        choice: String,
        reason: String,
    },

    #[error("kernel `{kernel}`: epilogue operand {operand} {problem}")]
    Epilogue {
        kernel: String,
        operand: usize,
        problem: String,
    },
}

/// Why a launch grid could not be computed for given symbol values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    #[error("the launch needs symbol `{symbol}`, which is not bound")]
    Unbound { symbol: String },
    #[error("grid dimension {axis} would be {blocks} blocks, above the limit {limit}")]
    GridTooLarge {
        axis: usize,
        blocks: u64,
        limit: u64,
    },
}
