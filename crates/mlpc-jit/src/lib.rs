//! mlpc's JIT: compiles generated kernels ([`mlpc_codegen::CudaKernel`]) with NVRTC to CUBIN for
//! the target architecture, with PTX beside it, and reads ptxas' resource report.
//!
//! **Architecture invariant:** this crate uses NVRTC only, never the CUDA driver, so it works on
//! machines without a GPU.
//!
//! # Finding NVRTC
//! NVRTC 13.0 is loaded at run time (cudarc's dynamic loading), checked before first use so that a
//! missing library is an error ([`JitError::NvrtcUnavailable`]), not a panic. Set
//! **`MLPC_NVRTC_LIB`** to the path of `libnvrtc.so.13` to choose it explicitly; otherwise the
//! loader's search path (`LD_LIBRARY_PATH`), `CUDA_HOME`/`CUDA_PATH`, `/usr/local/cuda` and the
//! `nvidia-cuda-nvrtc` Python package are searched ([`ensure_nvrtc`] lists the order). The
//! PyPI package `nvidia-cuda-nvrtc==13.0.88` matches the CUDA 13.0 drivers the kernels run on
//! (newer NVRTC emits PTX those drivers cannot load).
//!
//! # Cache
//! Compiled kernels are cached on disk under **`MLPC_CACHE_DIR`**, or `<user cache
//! dir>/mlpc/kernels` (`~/.cache/mlpc/kernels` on Linux), keyed by the SHA-256 of the source, the
//! headers, the NVRTC options, the architecture and the NVRTC version. [`JitOptions::no_cache`]
//! bypasses it. The cache grows until it is trimmed: [`cache::clear`], [`cache::trim`] (least
//! recently used entries first; `mlpc cache clear` / `trim` on the command line), or after every
//! compilation that stores kernels when **`MLPC_CACHE_MAX_SIZE`** gives a size (`500M`, `2G`,
//! [`cache::parse_size`]); that trim is best effort ([`cache::trim_after_store`]): what it
//! cannot remove stays, and the compilation succeeds.
//!
//! # Checking the kernels on a GPU
//! `cargo run -p mlpc-jit --example gpu_bundle -- DIR` writes every sample plan of
//! `mlpc_codegen::samples` with its compiled kernels; on a machine with a GPU and PyTorch,
//! `python3 crates/mlpc-jit/gpu-check/check_kernels.py DIR [--time T]` runs each kernel on random
//! inputs (aligned and misaligned buffers, several symbol values) against a float64 reference of
//! the plan's semantics. It also accepts any directory laid out as `DIR/<plan>/plan.json` plus
//! `DIR/<plan>/kernels/` from [`write_artifacts`].

pub mod cache;
mod cubin;
mod error;
mod loader;
mod nvrtc;
mod resources;

pub use cubin::check_cubin;
pub use error::JitError;
pub use loader::{ensure_nvrtc, NvrtcInfo};
pub use resources::{parse as entry_resources, Resources};

use mlpc_codegen::{Arch, CudaKernel};
use rayon::prelude::*;
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JitOptions {
    pub arch: Arch,
    /// Neither read nor write the disk cache.
    pub no_cache: bool,
    /// The cache directory; `None` for the default (see the crate documentation).
    pub cache_dir: Option<PathBuf>,
}

/// A compiled kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledKernel {
    /// The plan kernel's name.
    pub name: String,
    /// The entry point in `cubin` and `ptx`.
    pub entry: String,
    pub arch: Arch,
    pub cubin: Vec<u8>,
    pub ptx: String,
    /// The NVRTC log, including ptxas' resource report.
    pub log: String,
    pub resources: Resources,
    /// Whether `resources` was read from ptxas' report (else it is all zeros).
    pub resources_known: bool,
    pub from_cache: bool,
    /// The kernel of the same [`compile_all`] call whose compilation this one shares (their
    /// sources differ only in comment lines, as layers of one shape do); `None` when compiled
    /// (or taken from the cache) for itself. Its CUBIN's line info then names that kernel's
    /// `.cu` file, whose code is the same, line for line.
    pub same_code_as: Option<String>,
}

/// The NVRTC options for `arch`. `-v` makes ptxas report registers, spills and stack frames.
pub fn nvrtc_options(arch: Arch) -> Vec<String> {
    vec![
        format!("--gpu-architecture={}", arch.name()),
        "--std=c++17".to_string(),
        "--generate-line-info".to_string(),
        "--ptxas-options=-v".to_string(),
    ]
}

/// Compiles one kernel (or takes it from the cache).
pub fn compile(kernel: &CudaKernel, opts: &JitOptions) -> Result<CompiledKernel, JitError> {
    let cap = cache_cap(opts)?;
    let compiled = compile_uncapped(kernel, opts)?;
    if let Some((dir, max)) = cap.filter(|_| !compiled.from_cache) {
        cache::trim_after_store(&dir, max);
    }
    Ok(compiled)
}

/// The cache directory and the size to trim it to after storing kernels, when the cache is used
/// and `MLPC_CACHE_MAX_SIZE` sets one ([`cache::max_size_from_env`]).
fn cache_cap(opts: &JitOptions) -> Result<Option<(PathBuf, u64)>, JitError> {
    if opts.no_cache {
        return Ok(None);
    }
    let Some(max) = cache::max_size_from_env()? else {
        return Ok(None);
    };
    let dir = match &opts.cache_dir {
        Some(d) => d.clone(),
        None => cache::default_dir()?,
    };
    Ok(Some((dir, max)))
}

/// [`compile`], without trimming the cache after a store.
fn compile_uncapped(kernel: &CudaKernel, opts: &JitOptions) -> Result<CompiledKernel, JitError> {
    let info = ensure_nvrtc()?;
    let headers = mlpc_codegen::headers();
    let options = nvrtc_options(opts.arch);
    let cache = if opts.no_cache {
        None
    } else {
        let dir = match &opts.cache_dir {
            Some(d) => d.clone(),
            None => cache::default_dir()?,
        };
        let key = cache::key(
            &kernel.source,
            &headers,
            &options,
            opts.arch.name(),
            info.version,
        );
        Some((dir, key))
    };

    let finish = |entry: cache::Entry, from_cache: bool| {
        // Some NVRTC builds leave ptxas' report out of the log now and then (seen on a CUDA 13.0
        // toolkit install); the kernel is fine, only its resource figures are unknown then.
        let parsed = resources::parse(&entry.log, &kernel.entry);
        let resources_known = parsed.is_some();
        let resources = parsed.unwrap_or_default();
        Ok(CompiledKernel {
            name: kernel.name.clone(),
            entry: kernel.entry.clone(),
            arch: opts.arch,
            cubin: entry.cubin,
            ptx: entry.ptx,
            log: entry.log,
            resources,
            resources_known,
            from_cache,
            same_code_as: None,
        })
    };

    if let Some((dir, key)) = &cache {
        if let Some(entry) = cache::lookup(dir, key) {
            return finish(entry, true);
        }
    }
    let file = format!("{}.cu", kernel.name);
    let out = nvrtc::compile(&kernel.name, &file, &kernel.source, &headers, &options)?;
    let entry = cache::Entry {
        cubin: out.cubin,
        ptx: out.ptx,
        log: out.log,
    };
    if let Some((dir, key)) = &cache {
        cache::store(dir, key, &entry)?;
    }
    finish(entry, false)
}

/// Compiles `kernels` in parallel; the result is in the same order. The first error wins.
/// Kernels whose sources differ only in the text of whole-line comments (the kernel's and the
/// nodes' names: the layers of a deep model that share a shape) are compiled once, by the first
/// of them ([`CompiledKernel::same_code_as`]). Where `MLPC_CACHE_MAX_SIZE` caps the cache, it
/// is trimmed once, after all of them, if any was stored.
pub fn compile_all(
    kernels: &[CudaKernel],
    opts: &JitOptions,
) -> Result<Vec<CompiledKernel>, JitError> {
    compile_all_reporting(kernels, opts, &|_, _, _| {})
}

/// [`compile_all`], calling `done(finished, total, kernel)` before the first (0 of `total`, no
/// kernel) and as each distinct kernel is compiled (or taken from the cache), from the compiling
/// threads; `total` counts the kernels compiled for themselves.
pub fn compile_all_reporting(
    kernels: &[CudaKernel],
    opts: &JitOptions,
    done: &(dyn Fn(usize, usize, &str) + Sync),
) -> Result<Vec<CompiledKernel>, JitError> {
    // Load NVRTC once, up front, so a missing library is reported once; a cap that is no size
    // too, before any compilation.
    ensure_nvrtc()?;
    let cap = cache_cap(opts)?;
    // For each kernel, the index in `unique` of the first kernel of the same code.
    let mut first: std::collections::HashMap<String, usize> = Default::default();
    let mut unique: Vec<usize> = Vec::new();
    let slot: Vec<usize> = kernels
        .iter()
        .enumerate()
        .map(|(i, k)| {
            *first.entry(code_of(&k.source)).or_insert_with(|| {
                unique.push(i);
                unique.len() - 1
            })
        })
        .collect();
    done(0, unique.len(), "");
    let finished = std::sync::atomic::AtomicUsize::new(0);
    let compiled: Vec<CompiledKernel> = unique
        .par_iter()
        .map(|&i| {
            let c = compile_uncapped(&kernels[i], opts)?;
            let n = finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            done(n, unique.len(), &kernels[i].name);
            Ok(c)
        })
        .collect::<Result<_, JitError>>()?;
    if let Some((dir, max)) = cap.filter(|_| compiled.iter().any(|c| !c.from_cache)) {
        cache::trim_after_store(&dir, max);
    }
    Ok(kernels
        .iter()
        .zip(slot)
        .map(|(k, j)| {
            let mut c = compiled[j].clone();
            if c.name != k.name {
                c.same_code_as = Some(std::mem::replace(&mut c.name, k.name.clone()));
            }
            c
        })
        .collect())
}

/// `source` with the text of its whole-line comments blanked (the lines kept, so that two
/// sources alike here compile to the same code on the same lines). A comment line ending in a
/// backslash continues onto the next line, so it is kept as it is.
fn code_of(source: &str) -> String {
    source
        .lines()
        .map(|l| {
            let comment = l.trim_start().starts_with("//") && !l.ends_with('\\');
            if comment {
                ""
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The launch description written beside each kernel as `<name>.json`.
#[derive(Serialize)]
struct Manifest<'a> {
    name: &'a str,
    entry: &'a str,
    arch: Arch,
    launch: &'a mlpc_codegen::Launch,
    params: &'a [mlpc_codegen::Param],
    resources: &'a Resources,
}

/// Writes `dir/kernels/<name>.cu`, `.cubin`, `.ptx` and `.json` (entry, launch rule, arguments,
/// resources) for every kernel, and the template headers the `.cu` files include, so that they
/// compile on their own. Returns the paths written.
pub fn write_artifacts(
    dir: &Path,
    kernels: &[CudaKernel],
    compiled: &[CompiledKernel],
) -> Result<Vec<PathBuf>, JitError> {
    if kernels.len() != compiled.len() {
        return Err(JitError::ArtifactMismatch {
            kernels: kernels.len(),
            compiled: compiled.len(),
        });
    }
    let out = dir.join("kernels");
    let write = |path: PathBuf, bytes: &[u8]| -> Result<PathBuf, JitError> {
        std::fs::write(&path, bytes).map_err(|source| JitError::Write {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    };
    std::fs::create_dir_all(&out).map_err(|source| JitError::Write {
        path: out.clone(),
        source,
    })?;
    let mut written = Vec::new();
    for (name, text) in mlpc_codegen::headers() {
        written.push(write(out.join(name), text.as_bytes())?);
    }
    for (k, c) in kernels.iter().zip(compiled) {
        let stem = file_stem(&k.name);
        let manifest = Manifest {
            name: &k.name,
            entry: &k.entry,
            arch: c.arch,
            launch: &k.launch,
            params: &k.params,
            resources: &c.resources,
        };
        // Plain data: serialisation cannot fail.
        let json = serde_json::to_string_pretty(&manifest).unwrap_or_default();
        written.push(write(out.join(format!("{stem}.cu")), k.source.as_bytes())?);
        written.push(write(out.join(format!("{stem}.cubin")), &c.cubin)?);
        written.push(write(out.join(format!("{stem}.ptx")), c.ptx.as_bytes())?);
        written.push(write(out.join(format!("{stem}.json")), json.as_bytes())?);
    }
    Ok(written)
}

/// A file name for a kernel name: anything but letters, digits, `_`, `-` and `.` becomes `_`.
fn file_stem(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}
