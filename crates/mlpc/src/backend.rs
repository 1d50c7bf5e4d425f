//! The backends a compiled model can run on, and which of them this build provides.

use crate::error::Error;
use std::fmt;
use std::str::FromStr;

/// Where a compiled model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The reference interpreter of `mlpc-ir` (f64 arithmetic, one node at a time): slow, exact,
    /// the oracle every other backend is checked against.
    #[default]
    Reference,
    /// Native code for the host CPU, generated through LLVM (`mlpc-cpu`).
    Cpu,
    /// CUDA kernels compiled with NVRTC and launched by `mlpc-runtime`.
    Cuda,
}

impl Backend {
    pub const ALL: [Backend; 3] = [Backend::Reference, Backend::Cpu, Backend::Cuda];

    /// The name used on the command line and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Reference => "reference",
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }

    /// Why this build cannot run the backend, or `None` if it can.
    pub fn unavailable_reason(self) -> Option<String> {
        match self {
            Backend::Reference => None,
            Backend::Cpu if cfg!(feature = "cpu") => None,
            Backend::Cpu => Some("this mlpc was built without the `cpu` feature (LLVM)".into()),
            Backend::Cuda => match mlpc_runtime::check_driver() {
                Ok(()) => None,
                Err(mlpc_runtime::DeviceError::NoDriver) => {
                    Some("the CUDA driver (libcuda.so.1) cannot be loaded on this machine".into())
                }
                // A library named like the driver that is not one.
                Err(e) => Some(e.to_string()),
            },
        }
    }

    /// `Ok` when this build and machine can run the backend, else
    /// [`Error::BackendUnavailable`] naming why and the backends that are available.
    pub fn require(self) -> Result<(), Error> {
        match self.unavailable_reason() {
            None => Ok(()),
            Some(reason) => Err(Error::BackendUnavailable {
                backend: self,
                reason,
                available: Backend::available()
                    .iter()
                    .map(|b| b.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// The fastest backend this machine can run: CUDA when a driver is present, else the CPU
    /// backend when built in, else the reference interpreter.
    pub fn best_available() -> Backend {
        [Backend::Cuda, Backend::Cpu]
            .into_iter()
            .find(|b| b.unavailable_reason().is_none())
            .unwrap_or(Backend::Reference)
    }

    /// The backends this build can run, in the order of [`Backend::ALL`].
    pub fn available() -> Vec<Backend> {
        Backend::ALL
            .into_iter()
            .filter(|b| b.unavailable_reason().is_none())
            .collect()
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The name is not one of [`Backend::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend `{0}` (expected one of: reference, cpu, cuda)")]
pub struct UnknownBackend(pub String);

impl FromStr for Backend {
    type Err = UnknownBackend;

    fn from_str(s: &str) -> Result<Backend, UnknownBackend> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| UnknownBackend(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for b in Backend::ALL {
            assert_eq!(b.name().parse::<Backend>(), Ok(b));
        }
        assert_eq!(
            "gpu".parse::<Backend>(),
            Err(UnknownBackend("gpu".to_string()))
        );
    }

    #[test]
    fn reference_is_always_available() {
        assert!(Backend::available().contains(&Backend::Reference));
        assert_eq!(Backend::default(), Backend::Reference);
    }
}
