use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum JitError {
    #[error(
        "NVRTC (libnvrtc.so.13) could not be loaded. Install it with \
         `pip install nvidia-cuda-nvrtc==13.0.88` and put `<site-packages>/nvidia/cu13/lib` on \
         LD_LIBRARY_PATH, or set MLPC_NVRTC_LIB to the library's path (searched: {searched})"
    )]
    NvrtcUnavailable { searched: String },

    #[error("MLPC_NVRTC_LIB names `{path}`, which could not be loaded: {reason}")]
    NvrtcLibInvalid { path: PathBuf, reason: String },

    #[error(
        "`{name}`, the NVRTC library the dynamic loader finds by name (LD_LIBRARY_PATH, the ld \
         cache), cannot be used: {reason}; take it off the loader's path, or set \
         MLPC_NVRTC_LIB to the path of libnvrtc.so.13"
    )]
    NvrtcByNameInvalid { name: String, reason: String },

    #[error("kernel `{kernel}`: NVRTC failed to compile it:\n{log}")]
    Compile { kernel: String, log: String },

    #[error("kernel `{kernel}`: {call} failed with {code}")]
    Nvrtc {
        kernel: String,
        call: &'static str,
        code: String,
    },

    #[error("kernel `{kernel}`: its {what} contains a NUL byte")]
    NulByte { kernel: String, what: String },

    #[error(
        "kernel `{kernel}`: the NVRTC log has no ptxas resource line for entry `{entry}`:\n{log}"
    )]
    NoResourceInfo {
        kernel: String,
        entry: String,
        log: String,
    },

    #[error(
        "kernel cache `{path}`: {source} (set MLPC_CACHE_DIR to a writable directory, or \
         compile without the cache)"
    )]
    Cache {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Listing, clearing or trimming the cache failed on `path`.
    #[error("kernel cache: cannot {action} `{path}`: {source}")]
    CacheDir {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("MLPC_CACHE_MAX_SIZE: {reason}")]
    CacheMaxSize { value: String, reason: String },

    #[error("no cache directory: the user cache dir is unknown and MLPC_CACHE_DIR is not set")]
    NoCacheDir,

    #[error("writing `{path}`: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("write_artifacts got {kernels} kernels but {compiled} compiled kernels")]
    ArtifactMismatch { kernels: usize, compiled: usize },
}
