//! mlpc's frontend: reads a model (`model.json`, format in `docs/model-format.md`) and its weights
//! (safetensors) into a verified [`mlpc_ir::Graph`].
//!
//! The entry point is [`load_model`] (or [`parse_model`] for text already in memory;
//! [`load_model_zeroed`] where the weights' values are not needed). Every user
//! mistake becomes a [`FrontendError`] naming the file, the JSON location (`nodes[3].inputs[1]`,
//! with line and column), the offending node or tensor and what was expected; no input makes the
//! frontend panic. The crate also reads and writes safetensors files ([`read_tensors`],
//! [`write_tensors`]) and makes deterministic random inputs ([`random_inputs`]).
//!
//! **Architecture invariant:** this crate knows nothing of passes, code generation, CUDA or LLVM.
//! It turns files into IR and tensors, and depends on no mlpc crate but `mlpc-ir`.

mod error;
pub mod generate;
mod json;
mod model;
mod tensors;

pub use error::{FrontendError, Hint, ModelError, RandomInputError, TensorFileError};
pub use generate::{check_bound_symbols, random_inputs, MAX_GENERATED_ELEMENTS};
pub use model::FORMAT_VERSION;
pub use tensors::{
    parse_tensors, read_tensors, read_tensors_named, serialize_tensors, write_tensors,
    SafetensorsFile,
};

use std::path::{Path, PathBuf};

/// A loaded model: the verified graph plus what the model file says beyond it.
#[derive(Clone, Debug)]
pub struct Model {
    /// The graph; it has passed [`mlpc_ir::verify()`].
    pub graph: mlpc_ir::Graph,
    /// The validated `sparsity` section, one entry per selected weight, sorted by weight name.
    pub sparsity: Vec<SparsitySpec>,
    /// Whether f32 matrix products may use TF32 tensor cores (`"allow_tf32"`, default false).
    pub allow_tf32: bool,
    /// The model file.
    pub source: PathBuf,
}

/// The block-sparsity requested for one weight. Validated: `block` divides the weight's
/// `[out, in]` shape and `density`, when given, lies in (0, 1].
#[derive(Clone, Debug, PartialEq)]
pub struct SparsitySpec {
    /// The weight tensor's name (a weight node of the graph).
    pub weight: String,
    /// The key of `sparsity` that selected it, as written (a name or a glob).
    pub pattern: String,
    /// `[rows, cols]` of a block of the `[out, in]` weight.
    pub block: [u64; 2],
    /// Fraction of blocks kept; `None` means the weight's all-zero blocks define the pattern.
    pub density: Option<f64>,
    /// The weight of the same shape pruned together with this one (`"with"`), whose spec names
    /// this one back with the same block and density.
    pub with: Option<String>,
}

/// Reads a model file. A weights file named in it is resolved relative to the model file's
/// directory; errors name the file as `path` is written.
pub fn load_model(path: &Path) -> Result<Model, FrontendError> {
    load(path, false)
}

/// Reads a model file as [`load_model`] does, except that every weight holds zeros of its dtype
/// and shape instead of its values: a weights file's header is read and checked (and each weight's
/// dtype) but not its data, and `params` are not generated. For what needs the graph's types and
/// not the weights' values, such as random inputs (`mlpc gen-inputs`); the zeros' memory is
/// allocated zeroed and never written, so the operating system maps no pages for it until read.
pub fn load_model_zeroed(path: &Path) -> Result<Model, FrontendError> {
    load(path, true)
}

fn load(path: &Path, zeroed: bool) -> Result<Model, FrontendError> {
    let text = std::fs::read_to_string(path).map_err(|source| FrontendError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let base = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    model::parse(
        &text,
        base,
        &path.display().to_string(),
        path.to_path_buf(),
        zeroed,
    )
}

/// Parses model text. `base_dir` is where a weights file is looked up; `file_name` names the model
/// in errors and gives the default model name (its stem).
pub fn parse_model(json: &str, base_dir: &Path, file_name: &str) -> Result<Model, FrontendError> {
    model::parse(json, base_dir, file_name, base_dir.join(file_name), false)
}
