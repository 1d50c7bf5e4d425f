//! `mlpc compile --autotune`: measuring the Hopper GEMM tiles of a plan on the device and
//! caching the winners (see [`crate::tiles`] for the cache and how a run picks them up).
//!
//! Coordinate descent over the tunable kernels, in launch order: every candidate tile of one
//! kernel ([`mlpc_codegen::tile_candidates`], the heuristic's first) is compiled into the whole
//! plan, the other kernels keeping their best tile so far; its outputs are checked against the
//! reference interpreter ([`Compiled::check`]) and, when they pass, the plan is timed
//! ([`Compiled::bench`]: a second of heat, warm-up, CUDA events, median). The fastest passing
//! candidate stays. A candidate that fails to compile, to run or to match the reference is
//! dropped and reported.
//! Nothing here writes kernels or decides validity: codegen does both.

use crate::backend::Backend;
use crate::check::BenchOptions;
use crate::compiler::Compiled;
use crate::error::Error;
use crate::tiles::{default_tile_cache_path, kernel_rows, m_bucket, TileCache, TileCacheEntry};
use mlpc_codegen::{Arch, CodegenOptions, TileChoice, TileKey, TileOverrides};
use mlpc_runtime::Runs;
use std::path::PathBuf;

/// How to measure.
#[derive(Clone, Copy, Debug)]
pub struct AutotuneOptions {
    pub bench: BenchOptions,
    /// The seed of the checked inputs.
    pub seed: u64,
}

impl Default for AutotuneOptions {
    /// Each candidate timed as the benchmark harness times mlpc (a second of heat, then phases
    /// sized as triton's `do_bench` sizes them, each timed run after an L2 flush), with 100 ms of
    /// timed runs instead of 200: under a power limit the clock a tile runs at depends on how
    /// long and at what duty cycle it is timed, so candidates are ranked as the harness times
    /// them (docs/perf-notes.md, "Measuring").
    fn default() -> AutotuneOptions {
        AutotuneOptions {
            bench: BenchOptions {
                warmup: Runs::Millis(25),
                iters: Runs::Millis(100),
                flush_l2: true,
                ..BenchOptions::default()
            },
            seed: 0,
        }
    }
}

/// Where the tuner is, for a progress display; sent before each candidate and once at the end.
#[derive(Clone, Debug)]
pub struct AutotuneProgress {
    /// Candidates measured (or dropped) so far, of `total`.
    pub done: usize,
    pub total: usize,
    /// The kernel and choice about to be measured (`None` at the end).
    pub current: Option<(String, TileChoice)>,
    /// The best median so far of the current kernel, in milliseconds.
    pub best_ms: Option<f64>,
}

/// What happened to one candidate.
#[derive(Clone, Debug, PartialEq)]
pub enum CandidateResult {
    /// Checked and timed: the plan's median, in milliseconds.
    Timed(f64),
    /// Dropped: why (a compile or run error, or the check's worst output).
    Dropped(String),
}

/// One tuned kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTuning {
    pub kernel: String,
    pub key: TileKey,
    pub m_bucket: u64,
    /// Every candidate, the heuristic's first, with its result.
    pub tried: Vec<(TileChoice, CandidateResult)>,
    pub winner: TileChoice,
    pub winner_ms: f64,
}

/// The result of [`Compiled::autotune`].
#[derive(Clone, Debug, PartialEq)]
pub struct AutotuneReport {
    pub arch: Arch,
    pub device: String,
    pub kernels: Vec<KernelTuning>,
    /// The cache file the winners were written to (`None` with the cache off).
    pub cache: Option<PathBuf>,
}

impl Compiled {
    /// Measures every candidate tile of every tunable GEMM on the first CUDA device with
    /// `bindings` (every symbol of the inputs bound) and writes the winners to the autotune
    /// cache (unless [`crate::Compiler::autotune_cache`] turned it off). Needs a Hopper GPU
    /// running `sm_90a` kernels; `progress` is called before each candidate.
    pub fn autotune(
        &self,
        bindings: &[(&str, u64)],
        opts: AutotuneOptions,
        progress: &mut dyn FnMut(&AutotuneProgress),
    ) -> Result<AutotuneReport, Error> {
        if self.cuda_kernels().is_none() {
            return Err(Error::NoCudaKernels);
        }
        let g = self.graph();
        let mut unbound: Vec<String> = g
            .inputs()
            .into_iter()
            .flat_map(|id| g.node(id).ty.shape.clone())
            .filter_map(|d| match d {
                mlpc_ir::Dim::Sym(s) => Some(s.to_string()),
                mlpc_ir::Dim::Fixed(_) => None,
            })
            .filter(|s| !bindings.iter().any(|(b, _)| b == s))
            .collect();
        unbound.sort();
        unbound.dedup();
        if !unbound.is_empty() {
            return Err(Error::Autotune(format!(
                "tiles are measured at given sizes: bind every symbolic dimension (unbound: {}; \
                 e.g. --bind {}=8192)",
                unbound.join(", "),
                unbound[0]
            )));
        }
        if let Some(reason) = Backend::Cuda.unavailable_reason() {
            return Err(Error::Autotune(format!("needs a CUDA device: {reason}")));
        }
        let (arch, device) = {
            let d = mlpc_runtime::Device::open(0)?;
            (self.arch_for_device(d.compute_capability()?)?, d.describe())
        };
        if arch != Arch::Sm90a {
            return Err(Error::Autotune(format!(
                "tiles are tuned for sm_90a (Hopper) kernels; this run targets {arch} on {device}"
            )));
        }
        let codegen = CodegenOptions {
            arch,
            allow_tf32: self.model().allow_tf32,
        };
        let mut bound = mlpc_ir::Bindings::new();
        for (s, v) in bindings {
            // A symbol bound twice to different values is refused by `random_inputs` below.
            let _ = bound.bind(&(*s).into(), *v);
        }
        // One tuning per key: later kernels of a key share the first one's tile.
        let mut seen = std::collections::BTreeSet::new();
        let tunable: Vec<_> = mlpc_codegen::plan_tile_candidates(self.plan(), &codegen)?
            .into_iter()
            .filter(|c| seen.insert(c.key))
            .collect();
        // Every candidate kernel compiled up front, in parallel: NVRTC's output lands in the
        // kernel cache, which the measurements below then hit. A candidate that does not compile
        // fails again there, where it is dropped and reported; so a failure here is not fatal.
        let mut each = Vec::new();
        for c in &tunable {
            let Some(kernel) = self.plan().kernels.iter().find(|k| k.name == c.kernel) else {
                continue;
            };
            for &choice in &c.choices {
                let mut t = TileOverrides::new();
                t.insert(c.key, choice);
                each.push(mlpc_codegen::generate_kernel_tiled(
                    self.plan(),
                    kernel,
                    &codegen,
                    &t,
                )?);
            }
        }
        let jit = mlpc_jit::JitOptions {
            arch,
            ..self.compiler().jit_options()
        };
        let _ = mlpc_jit::compile_all(&each, &jit);
        // The reference outputs, once: every candidate is checked against them.
        let inputs = self.random_inputs(bindings, opts.seed)?;
        let want = self.run(Backend::Reference, &inputs)?;
        let total = tunable.iter().map(|c| c.choices.len()).sum();
        let mut done = 0;
        let mut best_tiles = TileOverrides::new();
        let mut kernels = Vec::new();
        for cands in tunable {
            let mut tried = Vec::new();
            let mut best: Option<(TileChoice, f64)> = None;
            for &choice in &cands.choices {
                progress(&AutotuneProgress {
                    done,
                    total,
                    current: Some((cands.kernel.clone(), choice)),
                    best_ms: best.map(|b| b.1),
                });
                let mut tiles = best_tiles.clone();
                tiles.insert(cands.key, choice);
                let result = self.measure(tiles, bindings, (&inputs, &want), opts);
                if let CandidateResult::Timed(ms) = result {
                    if best.is_none_or(|(_, b)| ms < b) {
                        best = Some((choice, ms));
                    }
                }
                tried.push((choice, result));
                done += 1;
            }
            let Some((winner, winner_ms)) = best else {
                let why: Vec<String> = tried.iter().map(|(c, r)| format!("{c}: {r:?}")).collect();
                return Err(Error::Autotune(format!(
                    "no tile of kernel `{}` passed: {}",
                    cands.kernel,
                    why.join("; ")
                )));
            };
            best_tiles.insert(cands.key, winner);
            let rows = self
                .plan()
                .kernels
                .iter()
                .find(|k| k.name == cands.kernel)
                .and_then(|k| kernel_rows(self.plan(), k, &bound))
                .ok_or_else(|| {
                    Error::Autotune(format!(
                        "the row count of kernel `{}` needs every symbol bound (--bind)",
                        cands.kernel
                    ))
                })?;
            kernels.push(KernelTuning {
                kernel: cands.kernel,
                key: cands.key,
                m_bucket: m_bucket(rows),
                tried,
                winner,
                winner_ms,
            });
        }
        progress(&AutotuneProgress {
            done,
            total,
            current: None,
            best_ms: None,
        });
        let cache = if self.compiler().uses_autotune_cache() {
            let path = default_tile_cache_path()?;
            let mut cache = TileCache::load(&path)?;
            for k in &kernels {
                cache.record(TileCacheEntry {
                    key: k.key,
                    arch,
                    device: device.clone(),
                    m_bucket: k.m_bucket,
                    choice: k.winner,
                    median_ms: k.winner_ms,
                });
            }
            cache.save(&path)?;
            Some(path)
        } else {
            None
        };
        Ok(AutotuneReport {
            arch,
            device,
            kernels,
            cache,
        })
    }

    /// Checks, then times, the plan with `tiles` forced.
    fn measure(
        &self,
        tiles: TileOverrides,
        bindings: &[(&str, u64)],
        (inputs, want): (&crate::Tensors, &crate::Tensors),
        opts: AutotuneOptions,
    ) -> CandidateResult {
        let variant = self.with_tiles(tiles);
        let check = match variant.check_against(Backend::Cuda, inputs, want) {
            Ok(c) => c,
            Err(e) => return CandidateResult::Dropped(e.to_string()),
        };
        if !check.ok() {
            let worst = check
                .worst()
                .map(|o| {
                    format!(
                        "output `{}` differs from the reference: error {:.3e} > {:.1e}",
                        o.name, o.error, o.tolerance
                    )
                })
                .unwrap_or_default();
            return CandidateResult::Dropped(worst);
        }
        match variant.bench(bindings, opts.bench) {
            Ok(b) => CandidateResult::Timed(b.median_ms),
            Err(e) => CandidateResult::Dropped(e.to_string()),
        }
    }
}
