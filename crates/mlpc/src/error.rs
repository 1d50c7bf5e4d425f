//! The one error type of the library. Each variant wraps the error of the crate that failed, so
//! the message and its chain of causes come from the place that knows what went wrong.

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
    /// The backend was not compiled into this build, or the machine cannot run it.
    #[error("backend `{backend}` is not available: {reason} (available: {available})")]
    BackendUnavailable {
        backend: Backend,
        reason: String,
        available: String,
    },
    /// The output directory cannot be used, e.g. it exists and holds something other than mlpc
    /// artifacts (mlpc never deletes what it did not write).
    #[error("cannot use `{}` as the output directory: {reason}", path.display())]
    OutputDir { path: PathBuf, reason: &'static str },
    /// A file-system operation on `path` failed.
    #[error("cannot {action} `{}`", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
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
