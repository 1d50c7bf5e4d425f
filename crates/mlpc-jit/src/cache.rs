//! The disk cache of compiled kernels: `<dir>/<key>.{cubin,ptx,log}`, where the key is the
//! SHA-256 of everything that determines the output (source, headers, options, architecture,
//! NVRTC version). Entries are written to a temporary name and renamed into place, so a reader
//! sees a whole entry or none.

use crate::JitError;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};

pub struct Entry {
    pub cubin: Vec<u8>,
    pub ptx: String,
    pub log: String,
}

/// The cache key of one compilation.
pub fn key(
    source: &str,
    headers: &[(&str, &str)],
    options: &[String],
    arch: &str,
    version: (i32, i32),
) -> String {
    let mut h = Sha256::new();
    // Every field is length-prefixed so that no two inputs hash the same bytes.
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(b"mlpc-jit kernel cache v1");
    field(source.as_bytes());
    for (name, text) in headers {
        field(name.as_bytes());
        field(text.as_bytes());
    }
    for o in options {
        field(o.as_bytes());
    }
    field(arch.as_bytes());
    field(format!("{}.{}", version.0, version.1).as_bytes());
    hex::encode(h.finalize())
}

/// The cache directory: `MLPC_CACHE_DIR`, else `<user cache dir>/mlpc/kernels`.
pub fn default_dir() -> Result<PathBuf, JitError> {
    // An empty value means the default (not the working directory).
    if let Some(d) = std::env::var_os("MLPC_CACHE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    dirs::cache_dir()
        .map(|d| d.join("mlpc").join("kernels"))
        .ok_or(JitError::NoCacheDir)
}

fn paths(dir: &Path, key: &str) -> [PathBuf; 3] {
    ["cubin", "ptx", "log"].map(|ext| dir.join(format!("{key}.{ext}")))
}

/// The entry for `key`, if a complete one exists. Unreadable entries, ones whose CUBIN is not
/// whole ([`crate::check_cubin`]), and ones whose PTX has no `.entry` or whose log no ptxas
/// report (truncated or emptied files: every compile writes both) count as misses, and the next
/// store replaces them.
pub fn lookup(dir: &Path, key: &str) -> Option<Entry> {
    let [cubin, ptx, log] = paths(dir, key);
    Some(Entry {
        cubin: std::fs::read(cubin)
            .ok()
            .filter(|c| crate::check_cubin(c).is_ok())?,
        ptx: std::fs::read_to_string(ptx)
            .ok()
            .filter(|p| p.contains(".entry "))?,
        log: std::fs::read_to_string(log)
            .ok()
            .filter(|l| l.contains("ptxas"))?,
    })
}

/// `e`, a failure to create `dir`, in words that name the file in its way if there is one
/// (the OS says only "File exists" or "Not a directory").
fn file_in_the_way(dir: &Path, e: std::io::Error) -> std::io::Error {
    match dir.ancestors().find(|a| a.exists() && !a.is_dir()) {
        Some(file) => std::io::Error::new(
            e.kind(),
            format!("`{}` is a file, not a directory", file.display()),
        ),
        None => e,
    }
}

/// Stores `entry` under `key`. The `.log` file is renamed into place last, and [`lookup`] needs
/// all three, so a concurrent reader never sees half an entry.
pub fn store(dir: &Path, key: &str, entry: &Entry) -> Result<(), JitError> {
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| JitError::Cache { path, source }
    };
    std::fs::create_dir_all(dir).map_err(|e| JitError::Cache {
        path: dir.to_path_buf(),
        source: file_in_the_way(dir, e),
    })?;
    let [cubin, ptx, log] = paths(dir, key);
    let contents: [(&PathBuf, &[u8]); 3] = [
        (&cubin, &entry.cubin),
        (&ptx, entry.ptx.as_bytes()),
        (&log, entry.log.as_bytes()),
    ];
    for (path, bytes) in contents {
        // A temporary file created exclusively in the same directory, then renamed into place:
        // two threads, or two processes (also in other PID namespaces, sharing the directory),
        // storing the same kernel never write the same file.
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!("{key}."))
            .suffix(".tmp")
            .tempfile_in(dir)
            .map_err(err(dir))?;
        tmp.write_all(bytes).map_err(err(tmp.path()))?;
        tmp.persist(path).map_err(|e| JitError::Cache {
            path: path.clone(),
            source: e.error,
        })?;
    }
    Ok(())
}
