//! Errors of the frontend. Every message names the file, the place in it (a JSON location such as
//! `nodes[3].inputs[1]` with its line and column, or a tensor of a safetensors file), the offending
//! node or tensor, and what was expected instead.

use mlpc_ir::{BuildError, DType, VerifyErrors};
use std::fmt;
use std::path::PathBuf;

/// Any failure to read a model, a tensor file or to make inputs.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The model file is not valid JSON.
    #[error("{file}:{line}:{column}: invalid JSON: {message}")]
    Syntax {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// The model file is valid JSON but not a valid model.
    #[error("{}{error}", Where { file, at, pos: *pos })]
    Model {
        file: String,
        /// The JSON location, such as `nodes[3].inputs[1]`; empty for the whole document.
        at: String,
        /// 1-based line and column of the value at `at`, when it exists in the text.
        pos: Option<(usize, usize)>,
        error: Box<ModelError>,
    },
    /// A safetensors file is malformed or holds a tensor mlpc cannot use.
    #[error("{}: {error}", path.display())]
    Tensors {
        path: PathBuf,
        error: TensorFileError,
    },
    /// The graph built from a valid model failed verification: a bug in the frontend.
    #[error(
        "{file}: internal error, the graph built from this model failed verification: {source}"
    )]
    Verify {
        file: String,
        #[source]
        source: VerifyErrors,
    },
    /// [`crate::random_inputs`] could not give an input a concrete shape.
    #[error("cannot make random input `{input}`: {error}")]
    RandomInput {
        input: String,
        error: RandomInputError,
    },
    /// A binding names a symbol that no input of the model has (most likely a misspelling).
    #[error(
        "symbol `{symbol}` is bound, but no input of the model has it (its symbols: {symbols})"
    )]
    UnknownSymbol { symbol: String, symbols: String },
    /// A binding of a symbol to 0, or two bindings of one symbol to different sizes.
    #[error("{0}")]
    Binding(RandomInputError),
}

/// `file:line:col: at `loc`: ` (parts left out when unknown).
struct Where<'a> {
    file: &'a str,
    at: &'a str,
    pos: Option<(usize, usize)>,
}

impl fmt::Display for Where<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.file)?;
        if let Some((l, c)) = self.pos {
            write!(f, ":{l}:{c}")?;
        }
        if !self.at.is_empty() {
            write!(f, ": at `{}`", self.at)?;
        }
        f.write_str(": ")
    }
}

/// What is wrong with a model document; [`FrontendError::Model`] adds where.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("missing format version: a model starts with `\"mlpc\": 1`")]
    MissingVersion,
    #[error("unsupported format version {found}: this mlpc reads `\"mlpc\": 1`")]
    UnsupportedVersion { found: String },
    #[error("expected {expected}, found {found}")]
    Type {
        expected: &'static str,
        found: String,
    },
    #[error("missing key `{key}`: expected {expected}")]
    MissingKey {
        key: &'static str,
        expected: &'static str,
    },
    #[error("unknown key `{key}`{hint}; the keys allowed here are {known}")]
    UnknownKey {
        key: String,
        hint: Hint,
        known: String,
    },
    #[error("{message}")]
    Conflict { message: String },
    #[error("unknown op `{op}`{hint}; the ops are {known}")]
    UnknownOp {
        op: String,
        hint: Hint,
        known: String,
    },
    #[error("node `{node}`: `{op}` takes {expected} input(s), found {actual}")]
    Arity {
        node: String,
        op: &'static str,
        expected: usize,
        actual: usize,
    },
    /// Operands whose shapes or dtypes do not fit the op.
    #[error("{0}")]
    Build(BuildError),
    #[error("the nodes form a cycle: {}", .nodes.join(" -> "))]
    Cycle { nodes: Vec<String> },
    #[error("invalid name {name:?}: {reason}")]
    Name { name: String, reason: &'static str },
    #[error("duplicate name `{name}`: already {first}")]
    Duplicate { name: String, first: String },
    #[error("undefined name `{name}` used by {user}{hint}: it is not a node, a model input or {weights}")]
    Undefined {
        name: String,
        user: String,
        hint: Hint,
        weights: String,
    },
    #[error("weight `{name}` is not {source_desc}{hint}")]
    MissingWeight {
        name: String,
        source_desc: String,
        hint: Hint,
    },
    #[error("cannot load the weights file: {0}")]
    WeightsFile(Box<FrontendError>),
    #[error("cannot use this weight: {0}")]
    WeightData(Box<FrontendError>),
    #[error("weight `{name}` has shape {actual}, expected {expected}")]
    WeightShape {
        name: String,
        expected: String,
        actual: String,
    },
    #[error("invalid dimension {found}: {reason}")]
    Dim { found: String, reason: String },
    #[error("invalid symbolic dimension {name:?}: a symbol is a letter or `_` followed by letters, digits or `_`{extra}")]
    Symbol { name: String, extra: &'static str },
    #[error("the element count of {shape} overflows 64 bits")]
    Overflow { shape: String },
    #[error("unknown dtype {found:?}: expected \"f32\", \"f16\" or \"bf16\"")]
    DType { found: String },
    #[error("input `{input}` has dtype {found}, but the model's dtype is {expected}: every tensor of a model has the model's dtype")]
    InputDType {
        input: String,
        expected: DType,
        found: DType,
    },
    #[error("the output `{name}` names nothing{hint}; outputs name nodes of `nodes`")]
    UnknownOutput { name: String, hint: Hint },
    #[error("the output `{name}` names {what}; outputs name nodes of `nodes`")]
    OutputNotNode { name: String, what: &'static str },
    #[error("the output `{name}` is listed twice")]
    DuplicateOutput { name: String },
    #[error("{what} is empty: expected {expected}")]
    Empty {
        what: &'static str,
        expected: &'static str,
    },
    #[error("`layers` needs exactly one model input (the output is named `y`), found {count}")]
    LayersInputs { count: usize },
    #[error("layer `{layer}` declares \"in\": {declared}, but its input has shape {actual}")]
    LayerIn {
        layer: String,
        declared: u64,
        actual: String,
    },
    #[error("{name} would have {elements} elements; generated tensors are limited to {limit}")]
    TooLarge {
        name: String,
        elements: String,
        limit: u64,
    },
    #[error("{name}: its {bytes} bytes do not fit in memory (the weights generated before it hold {held} bytes)")]
    NoMemory { name: String, bytes: u64, held: u64 },
    #[error("invalid sparsity pattern `{pattern}`: {message}")]
    Glob { pattern: String, message: String },
    #[error("sparsity key `{key}` names {what}, not a weight{hint}")]
    SparsityNotWeight {
        key: String,
        what: String,
        hint: Hint,
    },
    #[error(
        "sparsity pattern `{pattern}` matches no weight of the model; its weights are {weights}"
    )]
    SparsityNoMatch { pattern: String, weights: String },
    /// `first` is the first key in backticks, and how it selected the weight where that was not
    /// by matching it.
    #[error("weight `{weight}` is selected by two sparsity keys, {first} and `{second}`")]
    SparsityOverlap {
        weight: String,
        first: String,
        second: String,
    },
    #[error("sparsity needs a matrix `[out, in]`, but weight `{weight}` has shape {shape:?}")]
    SparsityRank { weight: String, shape: Vec<usize> },
    #[error("block [{}, {}] does not divide weight `{weight}` of shape {shape:?} (each block dim must divide the weight's dim)", block[0], block[1])]
    SparsityBlock {
        weight: String,
        block: [u64; 2],
        shape: Vec<usize>,
    },
    #[error("sparsity key `{key}`: \"with\" {message}")]
    SparsityWith { key: String, message: String },
    #[error("density must be a number in (0, 1], found {found}")]
    Density { found: String },
}

/// A "did you mean" suffix: empty, or ` (did you mean `x`?)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hint(pub Option<String>);

impl fmt::Display for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(s) => write!(f, " (did you mean `{s}`?)"),
            None => Ok(()),
        }
    }
}

/// What is wrong with a safetensors file; [`FrontendError::Tensors`] adds which file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorFileError {
    #[error("not a safetensors file: {len} byte(s), fewer than the 8 of the header length")]
    TooShort { len: usize },
    #[error("not a safetensors file: the header length {header} exceeds the {available} byte(s) after it")]
    HeaderLength { header: u64, available: usize },
    #[error("invalid header: {message}")]
    Header { message: String },
    #[error("tensor `{tensor}`: {message}")]
    TensorInfo { tensor: String, message: String },
    #[error("tensor `{tensor}` has dtype {dtype}; mlpc reads F32, F16 and BF16")]
    DType { tensor: String, dtype: String },
    #[error("tensor `{tensor}` ({dtype} {shape:?}) needs {expected} bytes, but its data_offsets span {actual}")]
    Size {
        tensor: String,
        dtype: String,
        shape: Vec<usize>,
        expected: u64,
        actual: u64,
    },
    #[error("tensor `{tensor}` lies at bytes {begin}..{end} of the data, but the file holds only {len} byte(s) of data (truncated?)")]
    Truncated {
        tensor: String,
        begin: u64,
        end: u64,
        len: usize,
    },
    #[error("invalid layout: {message}")]
    Layout { message: String },
    #[error("cannot serialize: {message}")]
    Serialize { message: String },
}

/// Why [`crate::random_inputs`] could not shape an input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RandomInputError {
    #[error("symbol `{symbol}` is not bound (bound: {bound})")]
    Unbound { symbol: String, bound: String },
    #[error("symbol `{symbol}` is bound to 0; dimensions are at least 1")]
    Zero { symbol: String },
    #[error("symbol `{symbol}` is bound twice, to {first} and {second}")]
    Conflict {
        symbol: String,
        first: u64,
        second: u64,
    },
    #[error("shape {shape:?} has more than {limit} elements")]
    TooLarge { shape: Vec<u64>, limit: u64 },
    #[error("shape {shape:?}: its {bytes} bytes do not fit in memory")]
    NoMemory { shape: Vec<u64>, bytes: u64 },
}
