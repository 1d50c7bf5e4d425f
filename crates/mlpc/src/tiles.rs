//! The autotune cache: the Hopper GEMM tiles that measured fastest, and the choice of tiles for a
//! run on a device.
//!
//! The cache is one JSON file, `autotune.json`, in the kernel cache directory (`MLPC_CACHE_DIR`,
//! else `<user cache dir>/mlpc/kernels`, as `mlpc-jit`). Each entry is keyed by the GEMM's
//! [`TileKey`], the target architecture, the device (its name and compute capability) and the
//! M bucket: the row count the tile was measured at, rounded up to a power of two. Only this
//! facade reads and writes it; code generation only takes the resulting [`TileOverrides`].
//!
//! A cache file that cannot be parsed is an error ([`Error::TileCache`]) naming the file: a
//! silently ignored cache would make runs slower with no hint why. Deleting the file (also:
//! `mlpc cache clear`, [`TileCache::remove`]), or compiling with the cache off
//! ([`crate::Compiler::autotune_cache`]), gets past it.

use crate::error::Error;
use mlpc_codegen::{Arch, CodegenOptions, TileChoice, TileKey, TileOverrides};
use mlpc_ir::{Bindings, Kernel, Plan};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The file name of the cache in the kernel cache directory.
pub const TILE_CACHE_FILE: &str = "autotune.json";
/// The version of the file's format.
const VERSION: u32 = 1;

/// One measured winner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TileCacheEntry {
    pub key: TileKey,
    pub arch: Arch,
    /// [`mlpc_runtime::Device::describe`], e.g. `NVIDIA H200 (sm_90)`.
    pub device: String,
    /// The output's row count at the measurement, rounded up to a power of two ([`m_bucket`]).
    pub m_bucket: u64,
    pub choice: TileChoice,
    /// The whole plan's median time with this choice, in milliseconds.
    pub median_ms: f64,
}

#[derive(Serialize, Deserialize)]
struct CacheFile {
    version: u32,
    entries: Vec<TileCacheEntry>,
}

/// The autotune cache, as read from its file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TileCache {
    pub entries: Vec<TileCacheEntry>,
}

/// The M bucket of `rows` output rows: the next power of two (1 for 0).
pub fn m_bucket(rows: u64) -> u64 {
    rows.checked_next_power_of_two().unwrap_or(1 << 63)
}

/// Where the cache lives: `autotune.json` in `MLPC_CACHE_DIR`, else in
/// `<user cache dir>/mlpc/kernels`.
pub fn default_tile_cache_path() -> Result<PathBuf, Error> {
    // An empty value means the default, as for the kernel cache.
    let dir = match std::env::var_os("MLPC_CACHE_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => dirs::cache_dir()
            .map(|d| d.join("mlpc").join("kernels"))
            .ok_or_else(|| Error::TileCache {
                path: PathBuf::from(TILE_CACHE_FILE),
                reason: "no cache directory: the user cache dir is unknown and MLPC_CACHE_DIR \
                         is not set"
                    .to_string(),
            })?,
    };
    Ok(dir.join(TILE_CACHE_FILE))
}

impl TileCache {
    /// Reads the cache at `path`; a missing file is an empty cache, a malformed one an error.
    pub fn load(path: &Path) -> Result<TileCache, Error> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TileCache::default()),
            Err(e) => return Err(Error::io("read the autotune cache", path)(e)),
        };
        let bad = |reason: String| Error::TileCache {
            path: path.to_path_buf(),
            reason,
        };
        let file: CacheFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if file.version != VERSION {
            return Err(bad(format!(
                "format version {}, this mlpc reads version {VERSION}",
                file.version
            )));
        }
        Ok(TileCache {
            entries: file.entries,
        })
    }

    /// Reads the cache at `path`, applies `change` and writes it back, under an exclusive lock
    /// on its directory: two processes recording their winners at once both keep theirs (a
    /// plain load, record and save by each would keep only the last writer's).
    pub fn update(path: &Path, change: impl FnOnce(&mut TileCache)) -> Result<(), Error> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(Error::io("create the cache directory", dir))?;
        let _lock = crate::artifacts::ParentLock::exclusive(dir);
        let mut cache = TileCache::load(path)?;
        change(&mut cache);
        cache.save(path)
    }

    /// Writes the cache to `path` (creating its directory), all at once: a concurrent reader
    /// sees the old file or the new one.
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(Error::io("create the cache directory", dir))?;
        let text = serde_json::to_string_pretty(&CacheFile {
            version: VERSION,
            entries: self.entries.clone(),
        })
        .map_err(Error::Serialize)?;
        // `autotune.json.<random>.tmp`, which `remove` knows for a leftover.
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!("{TILE_CACHE_FILE}."))
            .suffix(".tmp")
            .tempfile_in(dir)
            .map_err(Error::io("create a file in the cache directory", dir))?;
        std::io::Write::write_all(&mut tmp, text.as_bytes()).map_err(Error::io(
            "write the autotune cache",
            tmp.path().to_path_buf(),
        ))?;
        tmp.persist(path)
            .map_err(|e| Error::io("write the autotune cache", path)(e.error))?;
        Ok(())
    }

    /// Removes the cache at `path` and the temporary files that saves into its directory left
    /// behind (a process that died saving), under the directory's exclusive lock, as
    /// [`TileCache::update`] takes it; other files stay. Returns the bytes removed, `None` when
    /// there was nothing to remove (a missing directory included).
    pub fn remove(path: &Path) -> Result<Option<u64>, Error> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let _lock = crate::artifacts::ParentLock::exclusive(dir);
        let read = match std::fs::read_dir(dir) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("read the cache directory", dir)(e)),
        };
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let leftover = |file: &str| {
            let Some(random) = name
                .as_deref()
                .and_then(|n| file.strip_prefix(n))
                .and_then(|r| r.strip_prefix('.'))
                .and_then(|r| r.strip_suffix(".tmp"))
            else {
                return false;
            };
            (1..=32).contains(&random.len()) && random.bytes().all(|b| b.is_ascii_alphanumeric())
        };
        let mut removed = None;
        for item in read {
            let item = item.map_err(Error::io("read the cache directory", dir))?;
            let file = item.file_name();
            let file = file.to_string_lossy();
            if Some(&*file) != name.as_deref() && !leftover(&file) {
                continue;
            }
            let p = item.path();
            let bytes = match item.metadata() {
                Ok(m) if m.is_file() => m.len(),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io("inspect", p)(e)),
            };
            match std::fs::remove_file(&p) {
                Ok(()) => removed = Some(removed.unwrap_or(0) + bytes),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("remove", p)(e)),
            }
        }
        Ok(removed)
    }

    /// Records `entry`, replacing the entry of the same key, arch, device and M bucket.
    pub fn record(&mut self, entry: TileCacheEntry) {
        self.entries.retain(|e| {
            (e.key, e.arch, &e.device, e.m_bucket)
                != (entry.key, entry.arch, &entry.device, entry.m_bucket)
        });
        self.entries.push(entry);
    }

    /// The cached choice for `key` on `arch` and `device`: the one measured at `m_bucket` when
    /// given, else (the row count is not known yet) the one measured at the largest M.
    pub fn lookup(
        &self,
        key: &TileKey,
        arch: Arch,
        device: &str,
        m_bucket: Option<u64>,
    ) -> Option<&TileCacheEntry> {
        let matching = self
            .entries
            .iter()
            .filter(|e| e.key == *key && e.arch == arch && e.device == device);
        match m_bucket {
            Some(b) => matching.into_iter().find(|e| e.m_bucket == b),
            None => matching.max_by_key(|e| e.m_bucket),
        }
    }
}

/// Where a kernel's Hopper tile came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TileSource {
    Heuristic,
    /// The autotune cache, for this M bucket.
    Cache {
        m_bucket: u64,
    },
    /// An explicit choice (a candidate being measured, or the f32 GEMMs' FP64 tensor-core
    /// option).
    Forced,
}

/// The tile of one tunable kernel on a device, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileNote {
    pub kernel: String,
    pub key: TileKey,
    pub choice: TileChoice,
    pub source: TileSource,
}

impl std::fmt::Display for TileNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = match &self.source {
            TileSource::Heuristic => "heuristic".to_string(),
            TileSource::Cache { m_bucket } => {
                format!("tile from the autotune cache (M bucket {m_bucket})")
            }
            TileSource::Forced => "forced".to_string(),
        };
        write!(
            f,
            "{}  [{}]  {}  ({why})",
            self.kernel, self.key, self.choice
        )
    }
}

/// The output row count (`M`: the leading dims flattened) of `kernel` for `bindings`, when all
/// its symbols are bound.
pub(crate) fn kernel_rows(plan: &Plan, kernel: &Kernel, bindings: &Bindings) -> Option<u64> {
    let shape = &plan.buffers.get(kernel.out)?.ty.shape;
    let (_, lead) = shape.split_last()?;
    lead.iter()
        .try_fold(1u64, |acc, d| acc.checked_mul(d.resolve(bindings)?))
}

/// The tiles for a run of `plan` on `device` for `arch`: the cached winners that are valid
/// candidates of their kernel (an entry from an older rule set is skipped, not forced), the
/// heuristic elsewhere; and a note per tunable kernel.
pub(crate) fn cached_tiles(
    plan: &Plan,
    opts: &CodegenOptions,
    cache: &TileCache,
    device: &str,
    bindings: &Bindings,
) -> Result<(TileOverrides, Vec<TileNote>), Error> {
    let mut tiles = TileOverrides::new();
    // Overrides are per key: a key's first kernel decides for every kernel of that key.
    let mut decided: std::collections::BTreeMap<TileKey, (TileChoice, TileSource)> =
        Default::default();
    let mut notes = Vec::new();
    for c in mlpc_codegen::plan_tile_candidates(plan, opts)? {
        let (choice, source) = match decided.get(&c.key) {
            Some(d) => d.clone(),
            None => {
                let kernel = plan.kernels.iter().find(|k| k.name == c.kernel);
                let bucket = kernel
                    .and_then(|k| kernel_rows(plan, k, bindings))
                    .map(m_bucket);
                let cached = cache
                    .lookup(&c.key, opts.arch, device, bucket)
                    .filter(|e| c.choices.contains(&e.choice));
                let d = match (cached, c.choices.first()) {
                    (Some(e), _) => {
                        tiles.insert(c.key, e.choice);
                        (
                            e.choice,
                            TileSource::Cache {
                                m_bucket: e.m_bucket,
                            },
                        )
                    }
                    (None, Some(&h)) => (h, TileSource::Heuristic),
                    (None, None) => continue,
                };
                decided.insert(c.key, d.clone());
                d
            }
        };
        notes.push(TileNote {
            kernel: c.kernel,
            key: c.key,
            choice,
            source,
        });
    }
    Ok((tiles, notes))
}

/// The f32 GEMMs' kernel option ([`crate::Compiler::f32_on_fp64_tensor_cores`]): for every
/// tunable kernel that offers the FP64 tensor cores, its first choice on them (`fp64`) or on the
/// FFMA pipes (`!fp64`), forced into `tiles`; returns their keys.
pub(crate) fn force_f32_kernel(
    plan: &Plan,
    opts: &CodegenOptions,
    tiles: &mut TileOverrides,
    fp64: bool,
) -> Result<Vec<TileKey>, Error> {
    let mut keys = Vec::new();
    for c in mlpc_codegen::plan_tile_candidates(plan, opts)? {
        if !c.choices.iter().any(|c| c.fp64_tensor) {
            continue;
        }
        if let Some(&choice) = c.choices.iter().find(|c| c.fp64_tensor == fp64) {
            tiles.insert(c.key, choice);
            keys.push(c.key);
        }
    }
    Ok(keys)
}

/// The notes of a run with explicitly chosen `tiles` (every tunable kernel: forced or heuristic).
pub(crate) fn forced_notes(
    plan: &Plan,
    opts: &CodegenOptions,
    tiles: &TileOverrides,
) -> Result<Vec<TileNote>, Error> {
    Ok(mlpc_codegen::plan_tile_candidates(plan, opts)?
        .into_iter()
        .filter_map(|c| {
            let (choice, source) = match tiles.get(&c.key) {
                Some(t) => (t, TileSource::Forced),
                None => (*c.choices.first()?, TileSource::Heuristic),
            };
            Some(TileNote {
                kernel: c.kernel,
                key: c.key,
                choice,
                source,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlpc_codegen::TileOverride;
    use mlpc_ir::DType;

    fn key(n: u64) -> TileKey {
        TileKey {
            dtype: DType::Bf16,
            dual: false,
            k: 768,
            n,
            sparse: false,
            block: [0, 0],
        }
    }

    fn entry(n: u64, device: &str, m_bucket: u64, bn: u32) -> TileCacheEntry {
        TileCacheEntry {
            key: key(n),
            arch: Arch::Sm90a,
            device: device.to_string(),
            m_bucket,
            choice: TileChoice::new(bn, 1),
            median_ms: 0.25,
        }
    }

    #[test]
    fn m_buckets_round_up_to_powers_of_two() {
        assert_eq!(m_bucket(0), 1);
        assert_eq!(m_bucket(1), 1);
        assert_eq!(m_bucket(8192), 8192);
        assert_eq!(m_bucket(8193), 16384);
        assert_eq!(m_bucket(5000), 8192);
    }

    #[test]
    fn the_cache_round_trips_and_matches_by_key_arch_device_and_bucket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join(TILE_CACHE_FILE);
        assert_eq!(TileCache::load(&path).unwrap(), TileCache::default());
        let mut cache = TileCache::default();
        cache.record(entry(768, "H200", 8192, 192));
        cache.record(entry(768, "H200", 64, 128));
        cache.record(entry(768, "H100", 8192, 256));
        // Replaces the first entry.
        cache.record(entry(768, "H200", 8192, 256));
        assert_eq!(cache.entries.len(), 3);
        cache.save(&path).unwrap();
        let back = TileCache::load(&path).unwrap();
        assert_eq!(back, cache);

        let bn = |n, arch, dev: &str, b| {
            back.lookup(&key(n), arch, dev, b)
                .map(|e: &TileCacheEntry| e.choice.bn)
        };
        assert_eq!(
            bn(768, Arch::Sm90a, "H200", Some(m_bucket(5000))),
            Some(256)
        );
        assert_eq!(bn(768, Arch::Sm90a, "H200", Some(m_bucket(40))), Some(128));
        assert_eq!(bn(768, Arch::Sm90a, "H200", Some(m_bucket(100))), None);
        assert_eq!(bn(768, Arch::Sm90a, "H200", None), Some(256), "largest M");
        assert_eq!(bn(768, Arch::Sm90a, "A100", Some(8192)), None);
        assert_eq!(bn(768, Arch::Sm90, "H200", Some(8192)), None);
        assert_eq!(bn(1024, Arch::Sm90a, "H200", Some(8192)), None);
    }

    /// A cache written before the ping-pong schedule existed (no `pingpong` in its choices)
    /// still loads, its choices cooperative; a ping-pong winner round-trips.
    #[test]
    fn a_cache_without_the_schedule_field_loads_as_cooperative() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TILE_CACHE_FILE);
        let old = r#"{"version": 1, "entries": [{"key": {"dtype": "bf16", "dual": false,
            "k": 768, "n": 3072}, "arch": "sm_90a", "device": "NVIDIA H200 (sm_90)",
            "m_bucket": 8192, "choice": {"bn": 128, "ctas": 1}, "median_ms": 0.18}]}"#;
        std::fs::write(&path, old).unwrap();
        let mut cache = TileCache::load(&path).unwrap();
        assert_eq!(cache.entries.len(), 1);
        assert_eq!(cache.entries[0].choice, TileChoice::new(128, 1));
        let pp = TileChoice {
            pingpong: true,
            ..TileChoice::new(128, 1)
        };
        cache.record(TileCacheEntry {
            choice: pp,
            ..cache.entries[0].clone()
        });
        cache.save(&path).unwrap();
        assert_eq!(TileCache::load(&path).unwrap().entries[0].choice, pp);
    }

    /// Eight writers recording at once, each through its own load and save of the file, keep
    /// all eight entries (unlocked, the last save dropped the others': 30 of 30 rounds of eight
    /// processes lost entries).
    #[test]
    fn concurrent_updates_keep_every_entry() {
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(TILE_CACHE_FILE);
            std::thread::scope(|s| {
                for n in 0..8u64 {
                    let path = &path;
                    s.spawn(move || {
                        TileCache::update(path, |c| {
                            // Widen the window between the load and the save.
                            std::thread::sleep(std::time::Duration::from_millis(2));
                            c.record(entry(n + 1, "GPU", 8192, 128));
                        })
                        .unwrap()
                    });
                }
            });
            let mut keys: Vec<TileKey> = TileCache::load(&path)
                .unwrap()
                .entries
                .iter()
                .map(|e| e.key)
                .collect();
            keys.sort_by_key(|k| format!("{k:?}"));
            keys.dedup();
            assert_eq!(keys.len(), 8);
        }
    }

    #[test]
    fn a_corrupt_cache_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TILE_CACHE_FILE);
        for text in [
            "{ not json",
            r#"{"version": 1, "entries": [{"key": 3}]}"#,
            r#"{"version": 7, "entries": []}"#,
        ] {
            std::fs::write(&path, text).unwrap();
            let e = TileCache::load(&path).unwrap_err();
            assert!(matches!(e, Error::TileCache { .. }), "{e:?}");
            let msg = e.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(msg.contains("--no-autotune-cache"), "{msg}");
        }
    }

    /// What a run on a Hopper device does before loading kernels, with no cache file: for every
    /// model of `tests/cases` and `examples`, the lookup succeeds, forces nothing, and notes
    /// every tunable GEMM as the heuristic's; the forced-tiles path agrees.
    #[test]
    fn every_shipped_model_takes_the_heuristics_tiles_without_a_cache() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut models = Vec::new();
        for dir in ["tests/cases", "examples"] {
            for e in std::fs::read_dir(root.join(dir)).unwrap() {
                let m = e.unwrap().path().join("model.json");
                if m.exists() {
                    models.push(m);
                }
            }
        }
        assert!(models.len() >= 20, "{models:?}");
        let opts = CodegenOptions {
            arch: Arch::Sm90a,
            allow_tf32: false,
            sparse_gemv: false,
            bsr_walk: false,
        };
        let mut tunable = 0;
        for m in &models {
            let c = crate::Compiler::new()
                .cuda_kernels(crate::CudaKernels::Skip)
                .compile_file(m)
                .unwrap_or_else(|e| panic!("{}: {e}", m.display()));
            let (tiles, notes) = cached_tiles(
                c.plan(),
                &opts,
                &TileCache::default(),
                "NVIDIA H200",
                &Bindings::new(),
            )
            .unwrap_or_else(|e| panic!("{}: {e}", m.display()));
            assert!(tiles.is_empty(), "{}", m.display());
            assert!(
                notes.iter().all(|n| n.source == TileSource::Heuristic),
                "{}: {notes:?}",
                m.display()
            );
            let forced = forced_notes(c.plan(), &opts, &TileOverrides::new()).unwrap();
            assert_eq!(forced, notes, "{}", m.display());
            tunable += notes.len();
        }
        // The bf16 / f16 examples and cases with constant K and N have tunable GEMMs.
        assert!(tunable >= 10, "{tunable}");
    }

    /// A bf16 model of two linears (768 -> 768 -> 3072), compiled without kernels.
    fn compiled() -> crate::Compiled {
        let text = r#"{ "mlpc": 1, "dtype": "bf16", "seed": 1,
            "inputs": { "x": { "shape": ["T", 768] } },
            "layers": [ { "op": "linear", "out": 768 }, { "op": "relu" },
                        { "op": "linear", "out": 3072 } ] }"#;
        let model = mlpc_frontend::parse_model(text, Path::new("."), "m.json").unwrap();
        crate::Compiler::new()
            .cuda_kernels(crate::CudaKernels::Skip)
            .compile_model(model)
            .unwrap()
    }

    #[test]
    fn a_run_takes_the_cached_winner_of_its_bucket_and_says_so() {
        let c = compiled();
        let opts = CodegenOptions {
            arch: Arch::Sm90a,
            allow_tf32: false,
            sparse_gemv: false,
            bsr_walk: false,
        };
        let cands = mlpc_codegen::plan_tile_candidates(c.plan(), &opts).unwrap();
        assert_eq!(cands.len(), 2, "{cands:?}");
        let (first, second) = (cands[0].key, cands[1].key);
        assert_eq!(
            (first.k, first.n, second.k, second.n),
            (768, 768, 768, 3072)
        );
        let mut cache = TileCache::default();
        let win = |key, m_bucket, bn| TileCacheEntry {
            key,
            arch: Arch::Sm90a,
            device: "GPU".into(),
            m_bucket,
            choice: TileChoice::new(bn, 1),
            median_ms: 1.0,
        };
        cache.record(win(first, 8192, 192));
        // Not a candidate of the 3072-wide GEMM (64-wide tiles are for N <= 64): skipped.
        cache.record(win(second, 8192, 64));
        let mut t = Bindings::new();
        t.bind(&"T".into(), 5000).unwrap();
        let (tiles, notes) = cached_tiles(c.plan(), &opts, &cache, "GPU", &t).unwrap();
        assert_eq!(tiles.get(&first), Some(TileChoice::new(192, 1)));
        assert_eq!(tiles.get(&second), None);
        assert_eq!(notes.len(), 2);
        assert_eq!(notes[0].source, TileSource::Cache { m_bucket: 8192 });
        assert!(notes[0]
            .to_string()
            .contains("128x192 x1 CTA  (tile from the autotune cache (M bucket 8192))"));
        assert_eq!(notes[1].source, TileSource::Heuristic);
        assert_eq!(notes[1].choice, cands[1].choices[0]);
        assert!(
            notes[1].to_string().ends_with("(heuristic)"),
            "{}",
            notes[1]
        );
        // The generated kernels take the cached tile.
        let kernels = mlpc_codegen::generate_tiled(c.plan(), &opts, &tiles).unwrap();
        assert!(
            kernels[0].entry.ends_with("wgmma_tma_128x192x64"),
            "{}",
            kernels[0].entry
        );

        // Another bucket, another device or the sm_90 target: the heuristic.
        let mut small = Bindings::new();
        small.bind(&"T".into(), 16).unwrap();
        for (dev, b, arch) in [
            ("GPU", &small, Arch::Sm90a),
            ("other GPU", &t, Arch::Sm90a),
            ("GPU", &t, Arch::Sm90),
        ] {
            let o = CodegenOptions {
                arch,
                ..opts.clone()
            };
            let (tiles, _) = cached_tiles(c.plan(), &o, &cache, dev, b).unwrap();
            assert!(tiles.is_empty(), "{dev} {arch}");
        }
        // Unbound rows: the entry of the largest bucket.
        let (tiles, _) = cached_tiles(c.plan(), &opts, &cache, "GPU", &Bindings::new()).unwrap();
        assert_eq!(tiles.get(&first), Some(TileChoice::new(192, 1)));
    }

    #[test]
    fn forced_tiles_win_over_the_cache_and_the_cache_can_be_turned_off() {
        let text = r#"{ "mlpc": 1, "dtype": "bf16", "seed": 1,
            "inputs": { "x": { "shape": ["T", 768] } },
            "layers": [ { "op": "linear", "out": 768 } ] }"#;
        let model = mlpc_frontend::parse_model(text, Path::new("."), "m.json").unwrap();
        let c = crate::Compiler::new()
            .cuda_kernels(crate::CudaKernels::Skip)
            .autotune_cache(false)
            .compile_model(model)
            .unwrap();
        // Without the cache (no file is read): the heuristic (128 x 192 ping-pong for a shallow
        // GEMM whose N 192 divides), said so.
        let (tiles, notes) = c.device_tiles(Arch::Sm90a, "GPU").unwrap();
        assert!(tiles.is_empty());
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].source, TileSource::Heuristic);
        assert_eq!(
            notes[0].choice,
            TileChoice {
                pingpong: true,
                ..TileChoice::new(192, 1)
            }
        );
        // Other targets have no tunable kernels.
        assert!(c.device_tiles(Arch::Sm80, "GPU").unwrap().1.is_empty());
        // A candidate being measured: forced.
        let mut forced = TileOverrides::new();
        let choice = TileChoice::new(256, 1);
        forced.insert(notes[0].key, choice);
        let v = c.with_tiles(forced.clone());
        let (tiles, notes) = v.device_tiles(Arch::Sm90a, "GPU").unwrap();
        assert_eq!(tiles, forced);
        assert_eq!(notes[0].source, TileSource::Forced);
        assert_eq!(notes[0].choice, choice);
        assert_eq!(v.plan(), c.plan());
    }

    #[test]
    fn f32_gemms_take_the_fp64_tensor_cores_unless_the_option_forces_the_ffma_kernel() {
        // A dense f32 GEMM (bias, GELU), then a block-sparse one of 32 x 32 blocks.
        let text = r#"{ "mlpc": 1, "dtype": "f32", "seed": 1,
            "inputs": { "x": { "shape": ["T", 64] } },
            "layers": [ { "op": "linear", "name": "a", "out": 128 }, { "op": "gelu" },
                        { "op": "linear", "name": "b", "out": 64 } ],
            "sparsity": { "b.weight": { "block": [32, 32], "density": 0.5 } } }"#;
        let model = |c: crate::Compiler| {
            c.cuda_kernels(crate::CudaKernels::Skip)
                .autotune_cache(false)
                .compile_model(mlpc_frontend::parse_model(text, Path::new("."), "m.json").unwrap())
                .unwrap()
        };
        // The heuristic: both on the FP64 tensor cores.
        let plain = model(crate::Compiler::new());
        let (tiles, notes) = plain.device_tiles(Arch::Sm90a, "GPU").unwrap();
        assert!(tiles.is_empty());
        assert_eq!(notes.len(), 2);
        for n in &notes {
            assert!(n.choice.fp64_tensor, "{n}");
            assert_eq!(n.source, TileSource::Heuristic);
        }
        for (fp64, name) in [(true, "FP64 tensor cores"), (false, "x1 CTA")] {
            let forced = model(crate::Compiler::new().f32_on_fp64_tensor_cores(fp64));
            for arch in [Arch::Sm90, Arch::Sm90a] {
                let (tiles, notes) = forced.device_tiles(arch, "GPU").unwrap();
                assert_eq!(tiles.iter().count(), 2, "{arch}");
                assert_eq!(notes.len(), 2);
                for n in &notes {
                    assert_eq!(n.choice.fp64_tensor, fp64, "{n}");
                    assert_eq!(n.source, TileSource::Forced);
                    assert!(n.to_string().contains(name), "{n}");
                }
                assert!(notes.iter().any(|n| n.key.sparse));
            }
            assert!(forced.device_tiles(Arch::Sm80, "GPU").unwrap().1.is_empty());
        }
        let on = model(crate::Compiler::new().f32_on_fp64_tensor_cores(true));
        // A candidate being measured (the autotuner's FFMA choice) wins over the option.
        let (tiles, notes) = on.device_tiles(Arch::Sm90a, "GPU").unwrap();
        let ffma: TileOverrides = notes
            .iter()
            .map(|n| TileOverride {
                key: n.key,
                choice: TileChoice {
                    fp64_tensor: false,
                    ..tiles.get(&n.key).unwrap()
                },
            })
            .collect::<Vec<_>>()
            .into();
        let (measured, _) = on
            .with_tiles(ffma.clone())
            .device_tiles(Arch::Sm90a, "GPU")
            .unwrap();
        assert_eq!(measured, ffma);
        // The artifacts (generated for sm_90, not compiled here) take the option too.
        let artifacts = |c: crate::Compiler| {
            c.cuda_kernels(crate::CudaKernels::IfNvrtc)
                .no_cache(true)
                .compile_model(mlpc_frontend::parse_model(text, Path::new("."), "m.json").unwrap())
                .unwrap()
        };
        let sources = |c: &crate::Compiled| -> Vec<String> {
            c.cuda_kernels()
                .unwrap()
                .iter()
                .map(|k| k.source.clone())
                .collect()
        };
        let ffma = sources(&artifacts(
            crate::Compiler::new().f32_on_fp64_tensor_cores(false),
        ));
        assert!(ffma.iter().all(|s| !s.contains("Dmma<")));
        assert!(ffma[0].contains("mlpc::GemmSimt<"), "{}", ffma[0]);
        for c in [
            crate::Compiler::new(),
            crate::Compiler::new().f32_on_fp64_tensor_cores(true),
        ] {
            let fp64 = sources(&artifacts(c));
            assert!(fp64[0].contains("mlpc::GemmDmma<"), "{}", fp64[0]);
            assert!(fp64[1].contains("mlpc::GemmBsrDmma<"), "{}", fp64[1]);
        }
    }
}
