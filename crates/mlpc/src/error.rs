//! The one error type of the library. Each variant wraps the error of the crate that failed, so
//! the message and its chain of causes come from the place that knows what went wrong. Every
//! message is complete on its own (it includes its cause's text); `source()` still gives the
//! cause, for programs that inspect it, so a printer walking the chain skips causes whose text
//! the message already holds (as the CLI does).

use crate::backend::Backend;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model file, a weights file or a tensors file could not be read or is malformed.
    #[error(transparent)]
    Frontend(#[from] mlpc_frontend::FrontendError),
    /// The graph breaks an IR invariant.
    #[error(transparent)]
    Verify(#[from] mlpc_ir::VerifyErrors),
    /// The reference interpreter refused the inputs or the graph.
    #[error(transparent)]
    Interp(#[from] mlpc_ir::InterpError),
    /// A pass failed, or the pass list is wrong.
    #[error(transparent)]
    Pass(#[from] mlpc_passes::PassError),
    /// The optimised graph could not be lowered to a kernel plan.
    #[error(transparent)]
    Plan(#[from] mlpc_passes::PlanError),
    /// CUDA code generation refused a kernel.
    #[error(transparent)]
    Codegen(#[from] mlpc_codegen::CodegenError),
    /// NVRTC is missing or refused a kernel.
    #[error(transparent)]
    Jit(#[from] mlpc_jit::JitError),
    /// The CPU backend failed (no LLVM in this build, or the inputs do not fit).
    #[error(transparent)]
    Cpu(#[from] mlpc_cpu::CpuError),
    /// The CUDA runtime failed: no GPU, a guard refused an input, or a driver error.
    #[error(transparent)]
    Runtime(#[from] mlpc_runtime::RuntimeError),
    /// An on / off switch in the environment has a value that is none of its spellings.
    #[error(transparent)]
    Environment(#[from] mlpc_runtime::SwitchError),
    /// The kernels' launches cannot be resolved under the given bindings.
    #[error("launches: {0}")]
    Launches(String),
    /// The model was compiled without CUDA kernels.
    #[error("the model was compiled without CUDA kernels (compile with a CUDA target)")]
    NoCudaKernels,
    /// The backend was not compiled into this build, or the machine cannot run it.
    #[error("backend `{backend}` is not available: {reason} (available: {available})")]
    BackendUnavailable {
        backend: Backend,
        reason: String,
        available: String,
    },
    /// `--target` names no known target.
    #[error("unknown target `{0}` (expected cuda:sm_90, cuda:sm_90a, cuda:sm_80 or cpu)")]
    BadTarget(String),
    /// A backend's outputs differ from the reference interpreter's: `failed` of the model's
    /// `outputs` are out of tolerance (and further from the graph's unrounded math than
    /// [`crate::Accuracy::comparable`] allows), and `explained` of those are within tolerance of the
    /// optimised graph (the rounding of the fused kernels, not a wrong kernel; see
    /// [`crate::OutputCheck::fused_error`]). Made by [`crate::CheckReport::failure`].
    #[error("`{model}`: {}", check_failure(*failed, *outputs, *explained))]
    CheckFailed {
        model: String,
        failed: usize,
        outputs: usize,
        explained: usize,
    },
    /// The GPU is of an architecture mlpc generates no kernels for.
    #[error("unsupported GPU: {0}")]
    UnsupportedDevice(String),
    /// A compiled directory cannot be run.
    #[error("compiled directory `{}`: {what}", dir.display())]
    Bundle { dir: PathBuf, what: String },
    /// [`crate::Compiled::use_device`] after the model's kernels were loaded on another device
    /// or stream.
    #[error(
        "model `{0}` already runs on another device or stream (call use_device before its first \
         CUDA run)"
    )]
    DeviceInUse(String),
    /// A variant for the inputs' layout could not be made.
    #[error("re-specialisation: {0}")]
    Respecialize(String),
    /// The autotune cache file cannot be used.
    #[error(
        "autotune cache `{}`: {reason} (delete the file, or pass --no-autotune-cache)",
        path.display()
    )]
    TileCache { path: PathBuf, reason: String },
    /// Autotuning cannot run here, or no candidate of a kernel survived.
    #[error("autotune: {0}")]
    Autotune(String),
    /// Timing could not be set up.
    #[error("benchmark: {0}")]
    Bench(String),
    /// Serialising an artifact failed.
    #[error("cannot serialise an artifact: {0}")]
    Serialize(#[source] serde_json::Error),
    /// The output directory cannot be used, e.g. it exists and holds something other than mlpc
    /// artifacts (mlpc never deletes what it did not write).
    #[error("cannot use `{}` as the output directory: {reason}", path.display())]
    OutputDir { path: PathBuf, reason: String },
    /// A file-system operation on `path` failed.
    #[error("cannot {action} `{}`: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl From<mlpc_runtime::DeviceError> for Error {
    fn from(e: mlpc_runtime::DeviceError) -> Error {
        Error::Runtime(mlpc_runtime::RuntimeError::Device(e))
    }
}

impl Error {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io {
            action,
            path,
            source,
        }
    }
}

/// The text of [`Error::CheckFailed`].
fn check_failure(failed: usize, outputs: usize, explained: usize) -> String {
    let (count, verb) = if outputs == 1 {
        ("its output".to_string(), ("differs", "is"))
    } else if failed == outputs {
        (format!("all {outputs} of its outputs"), ("differ", "are"))
    } else if failed == 1 {
        (format!("1 of its {outputs} outputs"), ("differs", "is"))
    } else {
        (
            format!("{failed} of its {outputs} outputs"),
            ("differ", "are"),
        )
    };
    let mut text = format!(
        "{count} {} from the reference interpreter's by more than the tolerance",
        verb.0
    );
    if explained == failed {
        text.push_str(&format!(
            ", but {} within it of the optimised graph, which is what the fused kernels compute: \
             not a wrong kernel (see the {} above)",
            verb.1,
            if failed == 1 { "note" } else { "notes" }
        ));
    } else if explained > 0 {
        text.push_str(&format!(
            " ({explained} of them within it of the optimised graph, which is what the fused \
             kernels compute)"
        ));
    }
    text
}
