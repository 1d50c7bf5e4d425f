//! The caches on disk, as `mlpc cache` shows, clears and trims them. Both live in one directory
//! (`MLPC_CACHE_DIR`, else `<user cache dir>/mlpc/kernels`): the kernel cache, NVRTC's output by
//! the hash of its input ([`mlpc_jit::cache`], which lists and removes its own files), and the
//! autotune cache, `autotune.json` ([`TileCache`]). Files of other names in the directory are
//! neither counted nor removed.

use crate::error::Error;
use crate::tiles::{TileCache, TILE_CACHE_FILE};
use mlpc_jit::cache::{Listing, Removed};
use std::path::{Path, PathBuf};

pub use mlpc_jit::cache::parse_size;

/// The cache directory: `MLPC_CACHE_DIR` (empty is unset), else `<user cache dir>/mlpc/kernels`.
pub fn cache_dir() -> Result<PathBuf, Error> {
    Ok(mlpc_jit::cache::default_dir()?)
}

/// The autotune cache's file, as [`CacheInfo::read`] finds it.
#[derive(Clone, Debug, PartialEq)]
pub struct AutotuneFile {
    pub path: PathBuf,
    pub bytes: u64,
    /// The number of measured tiles it holds, or why it cannot be read (compiles for a GPU then
    /// fail on it, naming it, until it is removed).
    pub tiles: Result<usize, String>,
}

/// What the cache directory holds.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheInfo {
    pub dir: PathBuf,
    /// Whether the directory exists (nothing was cached yet when it does not).
    pub exists: bool,
    /// The kernel cache's entries (least recently used first) and temporary files.
    pub kernels: Listing,
    /// The autotune cache, if there is one.
    pub autotune: Option<AutotuneFile>,
}

impl CacheInfo {
    /// Reads what `dir` holds. A directory that does not exist is an empty cache; one that cannot
    /// be read, or a file where it should be, is an error naming the path.
    pub fn read(dir: &Path) -> Result<CacheInfo, Error> {
        let kernels = mlpc_jit::cache::list(dir)?;
        let exists = dir.is_dir();
        let path = dir.join(TILE_CACHE_FILE);
        let autotune = match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => Some(AutotuneFile {
                bytes: m.len(),
                tiles: match TileCache::load(&path) {
                    Ok(c) => Ok(c.entries.len()),
                    Err(Error::TileCache { reason, .. }) => Err(reason),
                    Err(e) => Err(e.to_string()),
                },
                path,
            }),
            Ok(_) => None,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io("inspect", path)(e)),
        };
        Ok(CacheInfo {
            dir: dir.to_path_buf(),
            exists,
            kernels,
            autotune,
        })
    }

    /// The bytes of every file of both caches.
    pub fn total_bytes(&self) -> u64 {
        self.kernels.total_bytes() + self.autotune.as_ref().map_or(0, |a| a.bytes)
    }
}

/// What [`clear_cache`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cleared {
    pub kernels: Removed,
    /// The bytes of the autotune cache and of the temporary files its saves left, when there
    /// was any.
    pub autotune: Option<u64>,
}

/// Removes both caches in `dir`: every kernel entry ([`mlpc_jit::cache::clear`]) and the
/// autotune cache ([`TileCache::remove`]), with the temporary files of either that a process
/// left behind; nothing else. A directory that does not exist is left so.
pub fn clear_cache(dir: &Path) -> Result<Cleared, Error> {
    let kernels = mlpc_jit::cache::clear(dir)?;
    let autotune = TileCache::remove(&dir.join(TILE_CACHE_FILE))?;
    Ok(Cleared { kernels, autotune })
}

/// Removes the least recently used kernel entries in `dir` until the kernels take at most
/// `max_bytes` ([`mlpc_jit::cache::trim`]). The autotune cache (a few KiB of measured tiles,
/// costly to measure again) is kept, and not counted.
pub fn trim_cache(dir: &Path, max_bytes: u64) -> Result<Removed, Error> {
    Ok(mlpc_jit::cache::trim(dir, max_bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiles::TileCacheEntry;
    use mlpc_codegen::{Arch, TileChoice, TileKey};
    use mlpc_ir::DType;

    fn tiles(n: usize) -> TileCache {
        TileCache {
            entries: (0..n as u64)
                .map(|i| TileCacheEntry {
                    key: TileKey {
                        dtype: DType::Bf16,
                        dual: false,
                        k: 1024,
                        n: 1024 + 64 * i,
                        sparse: false,
                        block: [0, 0],
                    },
                    arch: Arch::Sm90a,
                    device: "GPU".to_string(),
                    m_bucket: 8192,
                    choice: TileChoice::new(128, 1),
                    median_ms: 0.5,
                })
                .collect(),
        }
    }

    #[test]
    fn both_caches_are_listed_and_cleared_and_other_files_stay() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let kernel = "ab".repeat(32);
        std::fs::write(d.join(format!("{kernel}.cubin")), b"cubin").unwrap();
        std::fs::write(d.join(format!("{kernel}.ptx")), b"ptx").unwrap();
        std::fs::write(d.join(format!("{kernel}.log")), b"log").unwrap();
        tiles(3).save(&d.join(TILE_CACHE_FILE)).unwrap();
        std::fs::write(d.join("autotune.json.Q1w2E3.tmp"), b"{\"ver").unwrap();
        std::fs::write(d.join("autotune.json.bak"), b"mine").unwrap();
        std::fs::write(d.join("notes.txt"), b"mine").unwrap();

        let info = CacheInfo::read(d).unwrap();
        assert!(info.exists);
        assert_eq!(info.kernels.entries.len(), 1);
        assert_eq!(info.kernels.entry_bytes(), 11);
        let tile_bytes = std::fs::metadata(d.join(TILE_CACHE_FILE)).unwrap().len();
        let autotune = info.autotune.clone().unwrap();
        assert_eq!((autotune.bytes, &autotune.tiles), (tile_bytes, &Ok(3)));
        assert_eq!(info.total_bytes(), 11 + tile_bytes);

        // Trimming keeps the autotune cache.
        assert_eq!(trim_cache(d, 0).unwrap().entries, 1);
        assert_eq!(CacheInfo::read(d).unwrap().autotune, Some(autotune));

        let cleared = clear_cache(d).unwrap();
        assert_eq!(cleared.kernels, Removed::default());
        assert_eq!(cleared.autotune, Some(tile_bytes + 5));
        let mut left: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["autotune.json.bak", "notes.txt"]);
        let info = CacheInfo::read(d).unwrap();
        assert_eq!((&info.autotune, info.total_bytes()), (&None, 0));
        assert_eq!(clear_cache(d).unwrap(), Cleared::default());
    }

    #[test]
    fn an_unreadable_autotune_cache_is_listed_with_why_and_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join(TILE_CACHE_FILE), b"{ not json").unwrap();
        let info = CacheInfo::read(d).unwrap();
        let tiles = info.autotune.unwrap().tiles.unwrap_err();
        assert!(tiles.contains("key must be a string"), "{tiles}");
        assert_eq!(clear_cache(d).unwrap().autotune, Some(10));
        assert!(!d.join(TILE_CACHE_FILE).exists());
    }

    #[test]
    fn a_missing_directory_is_an_empty_cache_and_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("cache");
        let info = CacheInfo::read(&d).unwrap();
        assert!(!info.exists && info.autotune.is_none() && info.kernels.entries.is_empty());
        assert_eq!(clear_cache(&d).unwrap(), Cleared::default());
        assert_eq!(trim_cache(&d, 0).unwrap(), Removed::default());
        assert!(!d.exists());
    }
}
