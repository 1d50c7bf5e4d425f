//! Finding and loading NVRTC before cudarc touches it (cudarc panics when the library is
//! missing).
//!
//! cudarc opens `libnvrtc.so.13` (and a few other names) by name, so the dynamic loader's search
//! path decides. When that fails, this module looks in the usual places and loads the library
//! from there by full path; the loader then hands cudarc the already loaded library, whose soname
//! matches. NVRTC itself opens `libnvrtc-builtins.so.<major>.<minor>` by name at compile time, so
//! the builtins library from the same directory is loaded first.
//!
//! Search order:
//! 1. `MLPC_NVRTC_LIB` (empty is unset): the path of `libnvrtc.so.13` (an error if it cannot be
//!    loaded, is not NVRTC, or is not the NVRTC cudarc then finds by name);
//! 2. the dynamic loader's own search (`LD_LIBRARY_PATH`, the ld cache), as cudarc does it: the
//!    first of its names that opens must hold every NVRTC function mlpc calls (else an error
//!    naming it, where cudarc would panic);
//! 3. `$CUDA_HOME/lib64`, `$CUDA_PATH/lib64` (absolute values only), `/usr/local/cuda/lib64`;
//! 4. the `nvidia/cu13/lib` directory of the `nvidia-cuda-nvrtc` Python package, in the
//!    site-packages of `$VIRTUAL_ENV` (absolute), `~/.local`, pyenv versions, `/usr/local/lib` and `/usr/lib`.

use crate::JitError;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const LIB_NAME: &str = "libnvrtc.so.13";

/// What was loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvrtcInfo {
    /// `(major, minor)` as reported by `nvrtcVersion`.
    pub version: (i32, i32),
    /// Where the library came from: a path, or just its name when the loader's search path
    /// found it.
    pub origin: String,
}

/// Loads NVRTC once per process; later calls return the same result.
pub fn ensure_nvrtc() -> Result<NvrtcInfo, JitError> {
    static LOADED: OnceLock<Result<NvrtcInfo, LoadFailure>> = OnceLock::new();
    LOADED.get_or_init(load).clone().map_err(|f| match f {
        LoadFailure::Missing { searched } => JitError::NvrtcUnavailable { searched },
        LoadFailure::Invalid { path, reason } => JitError::NvrtcLibInvalid { path, reason },
        LoadFailure::ByName { name, reason } => JitError::NvrtcByNameInvalid { name, reason },
    })
}

#[derive(Clone, Debug)]
enum LoadFailure {
    Missing {
        searched: String,
    },
    Invalid {
        path: PathBuf,
        reason: String,
    },
    /// The first library of cudarc's names that the dynamic loader opens is not NVRTC.
    ByName {
        name: String,
        reason: String,
    },
}

/// The NVRTC functions mlpc calls through cudarc, which looks each one up on its first call and
/// panics where the library lacks it.
const SYMBOLS: [&str; 10] = [
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
];

/// The library cudarc opens by name: the first of its candidate names (`libnvrtc.so`, then
/// versioned ones) that the dynamic loader opens, once checked to hold every function in
/// [`SYMBOLS`]; `None` where no name opens.
fn by_name() -> Result<Option<String>, LoadFailure> {
    for name in cudarc::get_lib_name_candidates("nvrtc") {
        // SAFETY: as in `preload`; the handle is closed again (cudarc opens its own).
        let Ok(lib) = (unsafe { libloading::Library::new(&name) }) else {
            continue;
        };
        for sym in SYMBOLS {
            // SAFETY: only the symbol's address is looked up; nothing is called.
            if unsafe { lib.get::<*const ()>(sym) }.is_err() {
                return Err(LoadFailure::ByName {
                    name,
                    reason: format!("it has no {sym}: not an NVRTC library"),
                });
            }
        }
        return Ok(Some(name));
    }
    Ok(None)
}

fn load() -> Result<NvrtcInfo, LoadFailure> {
    // Empty is the same as unset.
    if let Some(path) = std::env::var_os("MLPC_NVRTC_LIB")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
    {
        let version = preload(&path).map_err(|reason| LoadFailure::Invalid {
            path: path.clone(),
            reason,
        })?;
        return finish(&path, Some(version));
    }
    if let Some(name) = by_name()? {
        return finish(Path::new(&name), None);
    }
    let mut searched = vec!["LD_LIBRARY_PATH and the ld cache".to_string()];
    for dir in candidate_dirs() {
        let lib = dir.join(LIB_NAME);
        searched.push(dir.display().to_string());
        if lib.is_file() {
            if let Ok(version) = preload(&lib) {
                return finish(&lib, Some(version));
            }
        }
    }
    Err(LoadFailure::Missing {
        searched: searched.join(", "),
    })
}

/// Checks that cudarc reaches an NVRTC and asks its version: the version of the library loaded
/// from `origin` where that was loaded by path (`preloaded`), which cudarc must see too.
fn finish(origin: &Path, preloaded: Option<(i32, i32)>) -> Result<NvrtcInfo, LoadFailure> {
    let invalid = |reason: String| LoadFailure::Invalid {
        path: origin.to_path_buf(),
        reason,
    };
    // After a successful preload, cudarc finds the library by soname; or a library of another
    // name that the loader finds first, which must be NVRTC too (its version is compared below).
    if by_name()?.is_none() {
        return Err(invalid(format!(
            "it loaded, but cudarc still cannot open {LIB_NAME} by name (is that its soname?)"
        )));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is loaded; nvrtcVersion writes two ints.
    let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(invalid(format!("nvrtcVersion failed with {rc:?}")));
    }
    // cudarc opens NVRTC by name, trying `libnvrtc.so` before `libnvrtc.so.13`: a `libnvrtc.so`
    // on the loader's path is taken over the library loaded by path.
    if let Some((pm, pn)) = preloaded.filter(|&v| v != (major, minor)) {
        return Err(invalid(format!(
            "it is NVRTC {pm}.{pn}, but NVRTC {major}.{minor} was found by name on the loader's \
             path (a libnvrtc.so in LD_LIBRARY_PATH?) and is the one that would run"
        )));
    }
    Ok(NvrtcInfo {
        version: (major, minor),
        origin: origin.display().to_string(),
    })
}

/// Loads `lib` (and the builtins library beside it) for the rest of the process and returns its
/// `nvrtcVersion`; an error where it does not load or is not NVRTC.
fn preload(lib: &Path) -> Result<(i32, i32), String> {
    if let Some(dir) = lib.parent() {
        if let Ok(entries) = std::fs::read_dir(dir) {
            let mut builtins: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("libnvrtc-builtins.so."))
                })
                .collect();
            builtins.sort();
            for b in builtins {
                // SAFETY: a plain shared library without initialisers that need arguments.
                if let Ok(l) = unsafe { libloading::Library::new(&b) } {
                    std::mem::forget(l);
                }
            }
        }
    }
    // SAFETY: as above. The handle is leaked on purpose: NVRTC stays loaded for the process.
    let l = unsafe { libloading::Library::new(lib) }.map_err(|e| {
        // libloading's text is "dlopen failed"; the loader's own reason is its source.
        match std::error::Error::source(&e) {
            Some(why) => why.to_string(),
            None => e.to_string(),
        }
    })?;
    let (mut major, mut minor) = (0, 0);
    {
        type Version = unsafe extern "C" fn(*mut i32, *mut i32) -> i32;
        // SAFETY: `nvrtcVersion` has this signature in every NVRTC; a library without the
        // symbol is refused before anything is called.
        let version = unsafe { l.get::<Version>(b"nvrtcVersion\0") }
            .map_err(|_| "it has no nvrtcVersion: not an NVRTC library".to_string())?;
        // SAFETY: nvrtcVersion writes two ints and returns a status (0: success).
        let rc = unsafe { version(&mut major, &mut minor) };
        if rc != 0 {
            return Err(format!("its nvrtcVersion failed with status {rc}"));
        }
    }
    std::mem::forget(l);
    Ok((major, minor))
}

fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    // Only absolute directories: an empty or relative value would load a library from
    // wherever the command happens to run.
    let absolute = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = absolute(var) {
            dirs.push(v.join("lib64"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));

    let mut prefixes: Vec<PathBuf> = Vec::new();
    if let Some(v) = absolute("VIRTUAL_ENV") {
        prefixes.push(v.join("lib"));
    }
    if let Some(home) = dirs::home_dir() {
        prefixes.push(home.join(".local/lib"));
        if let Ok(versions) = std::fs::read_dir(home.join(".pyenv/versions")) {
            let mut v: Vec<PathBuf> = versions
                .filter_map(|e| e.ok().map(|e| e.path().join("lib")))
                .collect();
            v.sort();
            prefixes.extend(v);
        }
    }
    prefixes.push(PathBuf::from("/usr/local/lib"));
    prefixes.push(PathBuf::from("/usr/lib"));
    for prefix in prefixes {
        let Ok(entries) = std::fs::read_dir(&prefix) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pythons.sort();
        for py in pythons {
            for packages in ["site-packages", "dist-packages"] {
                dirs.push(py.join(packages).join("nvidia/cu13/lib"));
            }
        }
    }
    dirs
}
