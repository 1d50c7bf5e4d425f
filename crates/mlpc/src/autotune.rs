//! `mlpc compile --autotune`: measuring the Hopper GEMM tiles of a plan on the device and
//! caching the winners (see [`crate::tiles`] for the cache and how a run picks them up).
//!
//! Coordinate descent over the tunable kernels, in launch order: every candidate tile of one
//! kernel ([`mlpc_codegen::tile_candidates`], the heuristic's first) is compiled into the whole
//! plan, the other kernels keeping their best tile so far; its outputs are checked against the
//! reference interpreter ([`Compiled::check`]) and, when they pass, the plan is timed
//! ([`Compiled::bench`]: a second of heat, warm-up, CUDA events, median). When the fastest
//! passing candidate is not the heuristic's tile, the two are timed again, alternately, for a
//! few rounds, and the challenger stays only if it is faster by a margin (one timing's spread
//! is as large as most wins: docs/perf-notes.md, dense 3n). A candidate that fails to compile,
//! to run or to match the reference is dropped and reported.
//! Nothing here writes kernels or decides validity: codegen does both.

use crate::backend::Backend;
use crate::check::BenchOptions;
use crate::compiler::Compiled;
use crate::error::Error;
use crate::tiles::{default_tile_cache_path, kernel_rows, m_bucket, TileCache, TileCacheEntry};
use mlpc_codegen::{Arch, TileChoice, TileKey, TileOverrides};
use mlpc_runtime::Runs;
use std::path::PathBuf;

/// How to measure.
#[derive(Clone, Copy, Debug)]
pub struct AutotuneOptions {
    pub bench: BenchOptions,
    /// The seed of the checked inputs.
    pub seed: u64,
    /// Rounds of the confirmation: when a kernel's fastest candidate is not the heuristic's
    /// tile, both are timed again this many times each, alternately (0: no confirmation; the
    /// fastest single timing wins).
    pub confirm_rounds: usize,
    /// How much faster than the heuristic's tile, as a fraction of its median over the
    /// confirmation, a challenger must be to win it.
    pub min_gain: f64,
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
            // One timing of a whole plan moves by 2-3 % between two phases of a tuning run on
            // the H200 (the same tiles timed twice: docs/perf-notes.md, dense 3n), as much as
            // the wins it found; three alternating rounds and a 1 % margin keep the heuristic's
            // tile unless another is faster beyond that.
            confirm_rounds: 3,
            min_gain: 0.01,
        }
    }
}

/// Where the tuner is, for a progress display; sent before each candidate and once at the end.
#[derive(Clone, Debug)]
pub struct AutotuneProgress {
    /// Timings done (or candidates dropped) so far, of `total` (which grows by the
    /// confirmation's timings when a kernel needs one).
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
    /// When the fastest candidate was not the heuristic's tile: the rounds that decided between
    /// them.
    pub confirmation: Option<Confirmation>,
    pub winner: TileChoice,
    /// The winner's median: over the confirmation where there was one.
    pub winner_ms: f64,
}

/// The heuristic's tile (the incumbent) and the fastest other candidate (the challenger) timed
/// again, alternately; the challenger wins only if the median of its times is below the
/// incumbent's by more than [`AutotuneOptions::min_gain`].
#[derive(Clone, Debug, PartialEq)]
pub struct Confirmation {
    pub incumbent: TileChoice,
    pub incumbent_ms: Vec<f64>,
    pub challenger: TileChoice,
    pub challenger_ms: Vec<f64>,
    pub challenger_won: bool,
}

/// What [`choose`] decided for one kernel.
#[derive(Clone, Debug, PartialEq)]
struct Chosen {
    tried: Vec<(TileChoice, CandidateResult)>,
    confirmation: Option<Confirmation>,
    winner: TileChoice,
    winner_ms: f64,
}

/// Which timing `choose` asks its `measure` for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Measuring {
    /// The i-th candidate, once.
    Candidate(usize),
    /// A timing of the confirmation.
    Confirmation,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

/// One kernel's winner among `choices` (the heuristic's first): every candidate measured once,
/// then, when the fastest is another tile than the heuristic's and both were timed, the
/// confirmation of `rounds` rounds (the incumbent first in even rounds, the challenger first in
/// odd ones, so that a drift of the clocks during the rounds weighs on both). `None` when no
/// candidate was timed; the candidates' results are then in `tried` of the error.
fn choose(
    choices: &[TileChoice],
    rounds: usize,
    min_gain: f64,
    mut measure: impl FnMut(TileChoice, Measuring) -> CandidateResult,
) -> Result<Chosen, Vec<(TileChoice, CandidateResult)>> {
    let mut tried = Vec::new();
    let mut best: Option<(TileChoice, f64)> = None;
    for (i, &choice) in choices.iter().enumerate() {
        let result = measure(choice, Measuring::Candidate(i));
        if let CandidateResult::Timed(ms) = result {
            if best.is_none_or(|(_, b)| ms < b) {
                best = Some((choice, ms));
            }
        }
        tried.push((choice, result));
    }
    let Some((fastest, fastest_ms)) = best else {
        return Err(tried);
    };
    let incumbent = match tried.first() {
        Some(&(c, CandidateResult::Timed(_))) if c != fastest && rounds > 0 => c,
        _ => {
            return Ok(Chosen {
                tried,
                confirmation: None,
                winner: fastest,
                winner_ms: fastest_ms,
            })
        }
    };
    let (mut inc_ms, mut ch_ms) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let order = if r % 2 == 0 {
            [(incumbent, true), (fastest, false)]
        } else {
            [(fastest, false), (incumbent, true)]
        };
        for (choice, is_incumbent) in order {
            // A tile that fails now (it passed its check before) loses the confirmation.
            if let CandidateResult::Timed(ms) = measure(choice, Measuring::Confirmation) {
                if is_incumbent {
                    inc_ms.push(ms);
                } else {
                    ch_ms.push(ms);
                }
            }
        }
    }
    let (inc, ch) = (median(&inc_ms), median(&ch_ms));
    let challenger_won =
        ch_ms.len() == rounds && (inc_ms.is_empty() || ch < inc * (1.0 - min_gain));
    let (winner, winner_ms) = if challenger_won {
        (fastest, ch)
    } else if inc_ms.is_empty() {
        // Neither side timed again: the sweep's timings decide.
        (fastest, fastest_ms)
    } else {
        (incumbent, inc)
    };
    Ok(Chosen {
        tried,
        confirmation: Some(Confirmation {
            incumbent,
            incumbent_ms: inc_ms,
            challenger: fastest,
            challenger_ms: ch_ms,
            challenger_won,
        }),
        winner,
        winner_ms,
    })
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
        let codegen = self
            .compiler()
            .codegen_options(arch, self.model().allow_tf32);
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
        let mut total = tunable.iter().map(|c| c.choices.len()).sum();
        let mut done = 0;
        let mut best_tiles = TileOverrides::new();
        let mut kernels = Vec::new();
        for cands in tunable {
            let mut best_ms: Option<f64> = None;
            let mut confirming = false;
            let chosen = choose(
                &cands.choices,
                opts.confirm_rounds,
                opts.min_gain,
                |choice, what| {
                    if what == Measuring::Confirmation && !confirming {
                        // The confirmation's timings join the count when it starts.
                        confirming = true;
                        total += 2 * opts.confirm_rounds;
                    }
                    progress(&AutotuneProgress {
                        done,
                        total,
                        current: Some((cands.kernel.clone(), choice)),
                        best_ms,
                    });
                    let mut tiles = best_tiles.clone();
                    tiles.insert(cands.key, choice);
                    let result = self.measure(tiles, bindings, (&inputs, &want), opts);
                    if let (Measuring::Candidate(_), CandidateResult::Timed(ms)) = (what, &result) {
                        if best_ms.is_none_or(|b| *ms < b) {
                            best_ms = Some(*ms);
                        }
                    }
                    done += 1;
                    result
                },
            );
            let Chosen {
                tried,
                confirmation,
                winner,
                winner_ms,
            } = match chosen {
                Ok(c) => c,
                Err(tried) => {
                    let why: Vec<String> =
                        tried.iter().map(|(c, r)| format!("{c}: {r:?}")).collect();
                    return Err(Error::Autotune(format!(
                        "no tile of kernel `{}` passed: {}",
                        cands.kernel,
                        why.join("; ")
                    )));
                }
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
                confirmation,
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
            TileCache::update(&path, |cache| {
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
            })?;
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
        let check = match variant.check_against(Backend::Cuda, inputs, want, &mut |_| {}) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tile(bn: u32) -> TileChoice {
        TileChoice {
            bn,
            ctas: 1,
            pingpong: false,
            cluster: 1,
            share_b: false,
            bm: 128,
            fp64_tensor: false,
        }
    }

    /// A measurer whose tiles take `base[bn]` ms, the sweep's timing of each tile moved by
    /// `sweep_noise[bn]` (what one timing's spread does), and every timing logged.
    fn measurer<'a>(
        base: &'a [(u32, f64)],
        sweep_noise: &'a [(u32, f64)],
        log: &'a mut Vec<(u32, Measuring)>,
    ) -> impl FnMut(TileChoice, Measuring) -> CandidateResult + 'a {
        move |c, what| {
            log.push((c.bn, what));
            let ms = base.iter().find(|(b, _)| *b == c.bn).map(|x| x.1);
            let noise = match what {
                Measuring::Candidate(_) => sweep_noise
                    .iter()
                    .find(|(b, _)| *b == c.bn)
                    .map_or(0.0, |x| x.1),
                Measuring::Confirmation => 0.0,
            };
            match ms {
                Some(ms) => CandidateResult::Timed(ms + noise),
                None => CandidateResult::Dropped("does not compile".into()),
            }
        }
    }

    #[test]
    fn a_win_within_the_spread_does_not_survive_the_confirmation() {
        // 192 looked 3 % faster in its one timing, but is 1 % slower.
        let base = [(128, 1.00), (192, 1.01), (256, 1.05)];
        let noise = [(192, -0.04)];
        let mut log = Vec::new();
        let c = choose(
            &[tile(128), tile(192), tile(256)],
            3,
            0.01,
            measurer(&base, &noise, &mut log),
        )
        .unwrap();
        assert_eq!(c.winner, tile(128));
        assert_eq!(c.winner_ms, 1.00);
        let conf = c.confirmation.unwrap();
        assert_eq!((conf.incumbent, conf.challenger), (tile(128), tile(192)));
        assert_eq!((conf.incumbent_ms.len(), conf.challenger_ms.len()), (3, 3));
        assert!(!conf.challenger_won);
        // Three sweep timings, then the rounds alternating which side goes first.
        let order: Vec<u32> = log.iter().map(|x| x.0).collect();
        assert_eq!(order, [128, 192, 256, 128, 192, 192, 128, 128, 192]);
        assert!(log[3..].iter().all(|x| x.1 == Measuring::Confirmation));
    }

    #[test]
    fn a_win_beyond_the_margin_is_kept() {
        let base = [(128, 1.00), (192, 0.97), (256, 1.05)];
        let mut log = Vec::new();
        let c = choose(
            &[tile(128), tile(192), tile(256)],
            3,
            0.01,
            measurer(&base, &[], &mut log),
        )
        .unwrap();
        assert_eq!(c.winner, tile(192));
        assert_eq!(c.winner_ms, 0.97);
        assert!(c.confirmation.unwrap().challenger_won);
        // 2 % faster against a 3 % margin: not enough.
        let base = [(128, 1.00), (192, 0.98)];
        let mut log = Vec::new();
        let c = choose(
            &[tile(128), tile(192)],
            3,
            0.03,
            measurer(&base, &[], &mut log),
        )
        .unwrap();
        assert_eq!(c.winner, tile(128));
    }

    #[test]
    fn no_confirmation_when_the_heuristic_wins_or_it_is_off_or_dropped() {
        let base = [(128, 1.00), (192, 1.02)];
        let mut log = Vec::new();
        let c = choose(
            &[tile(128), tile(192)],
            3,
            0.01,
            measurer(&base, &[], &mut log),
        )
        .unwrap();
        assert_eq!((c.winner, c.confirmation), (tile(128), None));
        assert_eq!(log.len(), 2);
        // Rounds 0: the fastest single timing wins.
        let base = [(128, 1.00), (192, 0.999)];
        let mut log = Vec::new();
        let c = choose(
            &[tile(128), tile(192)],
            0,
            0.01,
            measurer(&base, &[], &mut log),
        )
        .unwrap();
        assert_eq!((c.winner, c.confirmation), (tile(192), None));
        // The heuristic's tile dropped: nothing to confirm against.
        let base = [(192, 1.1), (256, 1.0)];
        let mut log = Vec::new();
        let c = choose(
            &[tile(128), tile(192), tile(256)],
            3,
            0.01,
            measurer(&base, &[], &mut log),
        )
        .unwrap();
        assert_eq!((c.winner, c.confirmation), (tile(256), None));
        assert!(matches!(c.tried[0].1, CandidateResult::Dropped(_)));
    }

    #[test]
    fn nothing_timed_is_an_error_with_every_reason() {
        let mut log = Vec::new();
        let err = choose(
            &[tile(128), tile(192)],
            3,
            0.01,
            measurer(&[], &[], &mut log),
        )
        .unwrap_err();
        assert_eq!(err.len(), 2);
        assert!(err
            .iter()
            .all(|(_, r)| matches!(r, CandidateResult::Dropped(_))));
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
