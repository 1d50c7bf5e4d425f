//! mlpc as a library: the API that Rust frameworks embed and that the `mlpc` binary is built on.
//!
//! ```no_run
//! use std::path::Path;
//!
//! let compiled = mlpc::Compiler::new().compile_file(Path::new("examples/tiny-mlp/model.json"))?;
//! let inputs = compiled.random_inputs(&[("T", 8)], 0)?;
//! let outputs = compiled.run(mlpc::Backend::Reference, &inputs)?;
//! println!("{:?}", outputs["y"]);
//! # Ok::<(), mlpc::Error>(())
//! ```
//!
//! A [`Compiler`] turns a model (a `model.json` file, or a [`Model`] built in memory) into a
//! [`Compiled`] model: the verified source graph, the optimised graph, the kernel plan, and the
//! CUDA kernels JIT-compiled for the target (where NVRTC is found, or as the compiler is told).
//! A [`Compiled`] model runs on a [`Backend`] (the reference interpreter, the LLVM CPU backend,
//! CUDA) and writes its artifacts (the IR text forms, the plan, `--explain`'s report, the kernels'
//! sources and binaries, optionally the weights the kernels read) to a directory, all at once or
//! not at all; a [`Bundle`] runs such a directory on a GPU without the model file.
//! [`Compiler::respecialize`] applies to CUDA runs (host tensors are row-major, so the CPU and
//! reference backends never see a transposed input). Compiled kernels and autotuned tiles are
//! cached on disk ([`cache_dir`]); [`CacheInfo`], [`clear_cache`] and [`trim_cache`] show, clear
//! and trim those caches (`mlpc cache`).
//!
//! **Architecture invariant:** this crate composes the other mlpc crates and owns no algorithm of
//! its own. Parsing lives in `mlpc-frontend`, meaning in `mlpc-ir`, optimisation in `mlpc-passes`,
//! code generation and execution in the backend crates. What is left here is the order in which
//! they are called, the choice of backend and the files a compilation produces.

mod artifacts;
mod autotune;
mod backend;
mod bundle;
mod cache;
mod check;
mod compiler;
mod cpu;
mod cuda;
mod error;
mod respecialize;
mod tiles;

pub use artifacts::{Artifacts, Checksums, FileContents};
pub use autotune::{
    AutotuneOptions, AutotuneProgress, AutotuneReport, CandidateResult, Confirmation, KernelTuning,
};
pub use backend::{Backend, UnknownBackend};
pub use bundle::Bundle;
pub use cache::{cache_dir, clear_cache, parse_size, trim_cache, AutotuneFile, CacheInfo, Cleared};
pub use check::{
    plan_flops, tolerance, Accuracy, BenchOptions, BenchReport, CheckReport, CheckStep,
    OutputCheck, ACTIVATION_ERROR, NOISE_RUNS, ROUNDING_FACTOR,
};
pub use compiler::{
    check_environment, Compiled, Compiler, CudaKernels, CudaStatus, Progress, Summary,
    ENTRY_MAP_LIMIT,
};
pub use error::Error;
pub use mlpc_codegen::{Arch, TileChoice, TileKey, TileOverrides};
pub use mlpc_passes::PrintAfter;
pub use mlpc_runtime::Runs;
pub use respecialize::transpose_inputs;
pub use tiles::{
    default_tile_cache_path, m_bucket, TileCache, TileCacheEntry, TileNote, TileSource,
    TILE_CACHE_FILE,
};

pub use mlpc_frontend::{FrontendError, Model};
pub use mlpc_ir::{DType, Graph, HostTensor, TensorType};
/// The crates mlpc is made of, for callers that need more than this facade.
pub use {
    mlpc_cpu as cpu_backend, mlpc_frontend as frontend, mlpc_ir as ir, mlpc_jit as jit,
    mlpc_passes as passes, mlpc_runtime as runtime,
};

use std::collections::BTreeMap;
use std::path::Path;

/// Named tensors, as read from and written to a safetensors file.
pub type Tensors = BTreeMap<String, HostTensor>;

/// Reads every tensor of a safetensors file, by name.
pub fn read_tensors(path: &Path) -> Result<Tensors, Error> {
    Ok(mlpc_frontend::read_tensors(path)?)
}

/// Writes tensors to a safetensors file by name. The file appears complete or not at all.
pub fn write_tensors(path: &Path, tensors: &Tensors) -> Result<(), Error> {
    Ok(mlpc_frontend::write_tensors(path, tensors)?)
}

/// Deterministic random inputs for the model file at `path`, the same as
/// [`Compiled::random_inputs`] gives for it, without compiling the model or reading its weights'
/// values (the model is loaded with [`mlpc_frontend::load_model_zeroed`]): what `mlpc gen-inputs`
/// writes.
pub fn random_inputs_for_file(
    path: &Path,
    bindings: &[(&str, u64)],
    seed: u64,
) -> Result<Tensors, Error> {
    let model = mlpc_frontend::load_model_zeroed(path)?;
    Ok(mlpc_frontend::random_inputs(&model.graph, bindings, seed)?)
}
