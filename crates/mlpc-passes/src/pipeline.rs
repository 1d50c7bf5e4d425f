//! The pass pipeline: a list of named passes run in order, with optional verification and IR
//! dumps after each pass and per-pass wall time.
//!
//! The default order is `dce, fold-transpose, cse, fuse-epilogue`: dead users would make a GEMM
//! look shared and block its fusion, so dce goes first; folding turns matmuls into GEMMs (and
//! removes the transposes in front of them) so that cse can merge duplicate GEMMs; cse before
//! fusion merges duplicate consumers that would otherwise make a GEMM look shared. None of the
//! later passes leaves dead code behind, so dce need not run again.
//!
//! A model with a `sparsity` section adds two configured passes ([`Pipeline::with_sparsity`]):
//! `prune-block-sparse` right after `dce` (it changes weight values, so it goes before everything
//! that preserves them) and `lower-block-sparse` last (it needs the fused epilogues, and a sparse
//! GEMM fuses nothing more).

use crate::pass::{
    all_passes, known_pass_names, pass_by_name, print_after_names, Pass, PassError,
    CONFIGURED_PASSES,
};
use crate::provenance::Provenance;
use crate::{LowerBlockSparse, PruneBlockSparse, SparseWeight};
use mlpc_ir::{verify, Graph};
use std::fmt;
use std::time::{Duration, Instant};

/// The names of the default pipeline's passes, in order.
pub const DEFAULT_PASSES: [&str; 4] = ["dce", "fold-transpose", "cse", "fuse-epilogue"];

/// An ordered list of passes.
pub struct Pipeline {
    passes: Vec<Box<dyn Pass>>,
}

impl Default for Pipeline {
    fn default() -> Pipeline {
        // The default names are all registered passes.
        Pipeline::from_names(&DEFAULT_PASSES).unwrap_or_else(|_| Pipeline {
            passes: all_passes(),
        })
    }
}

impl fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// After which passes to record the IR text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PrintAfter {
    #[default]
    Nothing,
    All,
    /// The named passes (each must be in the pipeline).
    Passes(Vec<String>),
}

impl PrintAfter {
    /// The CLI form: `all`, or pass names separated by commas (each checked against the
    /// pipeline when it runs). Names no pass at all (empty, or only commas): an error.
    pub fn parse(s: &str) -> Result<PrintAfter, PassError> {
        match s.trim() {
            "all" => Ok(PrintAfter::All),
            names => {
                let names: Vec<String> = names.split(',').map(|n| n.trim().to_string()).collect();
                match names.iter().find(|n| n.is_empty()) {
                    Some(empty) => Err(PassError::UnknownPass {
                        option: "--print-after",
                        name: empty.clone(),
                        known: print_after_names(),
                    }),
                    None => Ok(PrintAfter::Passes(names)),
                }
            }
        }
    }

    fn wants(&self, pass: &str) -> bool {
        match self {
            PrintAfter::Nothing => false,
            PrintAfter::All => true,
            PrintAfter::Passes(names) => names.iter().any(|n| n == pass),
        }
    }
}

/// How to run a [`Pipeline`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineOptions {
    /// Run the verifier after each pass; an error names the pass that broke the graph.
    pub verify_each: bool,
    pub print_after: PrintAfter,
}

impl Default for PipelineOptions {
    /// Verification after each pass is on in debug builds.
    fn default() -> PipelineOptions {
        PipelineOptions {
            verify_each: cfg!(debug_assertions),
            print_after: PrintAfter::Nothing,
        }
    }
}

/// What one pass did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassReport {
    pub name: &'static str,
    pub changed: bool,
    /// Wall time of the pass (without the verification after it).
    pub time: Duration,
    /// The IR text after the pass, when [`PipelineOptions::print_after`] asked for it.
    pub ir_text: Option<String>,
}

/// What a pipeline run did: one report per pass, in order, and the fate of every source node.
#[derive(Clone, Debug)]
pub struct PipelineReport {
    pub passes: Vec<PassReport>,
    pub provenance: Provenance,
}

impl PipelineReport {
    /// One line per pass: name, whether it changed the graph, wall time. For `--verbose` output;
    /// not deterministic (times), so never part of a snapshot.
    pub fn timings(&self) -> String {
        let width = self.passes.iter().map(|p| p.name.len()).max().unwrap_or(0);
        let mut s = String::new();
        for p in &self.passes {
            s.push_str(&format!(
                "{:<width$}  {:<9}  {:>10.3} ms\n",
                p.name,
                if p.changed { "changed" } else { "unchanged" },
                p.time.as_secs_f64() * 1e3,
            ));
        }
        s
    }
}

impl Pipeline {
    /// The passes named, in the given order (a name may repeat).
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<Pipeline, PassError> {
        let passes = names
            .iter()
            .map(|n| {
                let (name, known) = (n.as_ref().to_string(), known_pass_names());
                pass_by_name(&name).ok_or_else(|| {
                    if CONFIGURED_PASSES.contains(&name.as_str()) {
                        PassError::ConfiguredPass { name, known }
                    } else {
                        PassError::UnknownPass {
                            option: "--passes",
                            name,
                            known,
                        }
                    }
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Pipeline { passes })
    }

    /// A pipeline of the given passes.
    pub fn new(passes: Vec<Box<dyn Pass>>) -> Pipeline {
        Pipeline { passes }
    }

    /// This pipeline with block sparsity for `specs` (one per selected weight): `prune-block-sparse`
    /// after a leading `dce` (or first), `lower-block-sparse` last. Without specs, unchanged.
    pub fn with_sparsity(self, specs: Vec<SparseWeight>) -> Pipeline {
        self.with_pruning(PruneBlockSparse::new(specs))
    }

    /// [`Pipeline::with_sparsity`] with this `prune-block-sparse` pass, which may already have
    /// pruned the same weights elsewhere (and then zeroes the same blocks without ranking them).
    pub fn with_pruning(mut self, prune: PruneBlockSparse) -> Pipeline {
        let specs = prune.specs().to_vec();
        if specs.is_empty() {
            return self;
        }
        let at = usize::from(self.passes.first().is_some_and(|p| p.name() == "dce"));
        self.passes.insert(at, Box::new(prune));
        self.passes.push(Box::new(LowerBlockSparse::new(specs)));
        self
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    pub fn passes(&self) -> &[Box<dyn Pass>] {
        &self.passes
    }

    /// Runs every pass in order on `g`. The input graph is verified first; with
    /// [`PipelineOptions::verify_each`] the graph is verified after every pass too.
    pub fn run(&self, g: &mut Graph, opts: &PipelineOptions) -> Result<PipelineReport, PassError> {
        if let PrintAfter::Passes(wanted) = &opts.print_after {
            let names = self.names();
            if let Some(missing) = wanted.iter().find(|w| !names.contains(&w.as_str())) {
                let known = pass_by_name(missing).is_some()
                    || CONFIGURED_PASSES.contains(&missing.as_str());
                return Err(if !known {
                    PassError::UnknownPass {
                        option: "--print-after",
                        name: missing.clone(),
                        known: print_after_names(),
                    }
                } else {
                    PassError::PrintAfterNotInPipeline {
                        name: missing.clone(),
                        pipeline: names.join(","),
                    }
                });
            }
        }
        verify(g).map_err(PassError::InvalidInput)?;
        let mut prov = Provenance::new(g);
        let mut passes = Vec::with_capacity(self.passes.len());
        for pass in &self.passes {
            let start = Instant::now();
            let changed = pass.run(g, &mut prov)?;
            let time = start.elapsed();
            if opts.verify_each {
                verify(g).map_err(|errors| PassError::Verify {
                    pass: pass.name(),
                    errors,
                })?;
            }
            let ir_text = opts.print_after.wants(pass.name()).then(|| g.to_string());
            passes.push(PassReport {
                name: pass.name(),
                changed,
                time,
                ir_text,
            });
        }
        Ok(PipelineReport {
            passes,
            provenance: prov,
        })
    }
}
