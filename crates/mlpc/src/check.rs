//! Checking a backend against the reference interpreter, and timing the CUDA and CPU backends.

use crate::backend::Backend;
use crate::compiler::Compiled;
use crate::error::Error;
use mlpc_ir::{Bindings, DType, Op, Plan};
use mlpc_runtime::Runs;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The largest relative Frobenius error a backend may show against the reference interpreter,
/// by storage type: f32 must be exact up to summation order; f16 and bf16 round the output and,
/// unfused, every intermediate.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        DType::Bf16 => 1e-2,
    }
}

/// One output compared with the reference.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputCheck {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Relative Frobenius error over the elements where the reference is finite; NaN if any
    /// element is NaN where the reference is not, or does not match the reference's NaN or
    /// infinity where it has one ([`mlpc_ir::relative_error_same_specials`]).
    pub error: f64,
    pub tolerance: f64,
    /// For an output out of tolerance against the source graph: its error against the optimised
    /// graph interpreted, which rounds to the storage type only where the kernels store (a fused
    /// epilogue keeps its intermediates in registers, the source graph rounds each of them).
    /// Within tolerance there, the difference is that rounding, not a wrong kernel; the output
    /// still fails, as the source graph is the model's definition (for block-sparse models, the
    /// source graph with the pruned weights). `None` when the output passes, within tolerance or
    /// by [`OutputCheck::accuracy`].
    pub fused_error: Option<f64>,
    /// For an output out of tolerance against the source graph: how far the backend's output and
    /// the reference interpreter's are from the graph's unrounded math. `None` when the output
    /// is within tolerance.
    pub accuracy: Option<Accuracy>,
}

/// How much further from the graph's unrounded math than the reference interpreter a backend's
/// output may be when it is out of tolerance of the reference ([`Accuracy::comparable`]).
pub const ROUNDING_FACTOR: f64 = 2.0;

/// Relative errors against the graph's unrounded math ([`mlpc_ir::interpret_unrounded`]: every
/// value in f64, only the outputs rounded to their storage type), measured where an output is
/// out of tolerance of the source graph. The source graph rounds each f16 / bf16 (or f32)
/// intermediate, fused kernels only what they store: in a deep chain the two can differ by more
/// than the tolerance while both are about as far from the math.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Accuracy {
    /// The backend's output against the unrounded math.
    pub backend: f64,
    /// The reference interpreter's output (the source graph, each value rounded) against it.
    pub reference: f64,
    /// Where the backend is further than [`ROUNDING_FACTOR`] times `reference`: the root mean
    /// square of [`NOISE_RUNS`] runs' distances from the unrounded math, each run with every
    /// stored value moved by a random relative error of up to its type's unit roundoff, each
    /// product's terms by up to `sqrt(K)` f32 unit roundoffs and each activation by up to
    /// [`ACTIVATION_ERROR`] ([`mlpc_ir::interpret_perturbed`]). How far roundings move this
    /// output: in an ill-conditioned one (a sum that cancels, a long chain of products), the
    /// reference's one draw of them can land near the math by chance.
    pub noise: Option<f64>,
}

/// Perturbed runs that measure an output's conditioning ([`Accuracy::noise`]).
pub const NOISE_RUNS: usize = 8;

/// The relative error up to which the backends compute an activation in f32 (the CPU backend's
/// test holds each activation under it per element; CUDA's f32 activations use the CUDA math
/// library's `erfcf` and `expf`, within a few ulp), which [`Accuracy::noise`]'s runs give each
/// activation's value where its type's unit roundoff is less.
pub const ACTIVATION_ERROR: f64 = 2e-6;

impl Accuracy {
    /// The backend is at most [`ROUNDING_FACTOR`] times as far from the unrounded math as the
    /// source graph's own roundings take the reference, or as random roundings take it on
    /// average where they were measured ([`Accuracy::noise`]); false where the errors are NaN
    /// (a NaN or an infinity on one side only). This decides only where those roundings are of
    /// the tolerance's size: with the reference within a third of the tolerance of the math, an
    /// output within twice that is within the tolerance of the reference anyway.
    pub fn comparable(&self) -> bool {
        self.backend <= ROUNDING_FACTOR * self.reference
            || self
                .noise
                .is_some_and(|n| self.backend <= ROUNDING_FACTOR * n)
    }
}

impl OutputCheck {
    /// Within tolerance of the reference interpreter, or, out of it, about as near the graph's
    /// unrounded math as the reference ([`Accuracy::comparable`]).
    pub fn ok(&self) -> bool {
        self.within_tolerance() || self.passes_by_accuracy()
    }

    /// Within tolerance of the reference interpreter (the source graph).
    pub fn within_tolerance(&self) -> bool {
        self.error <= self.tolerance
    }

    /// Out of tolerance of the reference interpreter, but about as near the graph's unrounded
    /// math as the reference: the difference is of the size of the source graph's roundings.
    pub fn passes_by_accuracy(&self) -> bool {
        !self.within_tolerance() && self.accuracy.is_some_and(|a| a.comparable())
    }

    /// Passed by [`OutputCheck::passes_by_accuracy`] only through the random roundings
    /// ([`Accuracy::noise`]): further from the unrounded math than twice the reference, an
    /// ill-conditioned output.
    pub fn passes_as_ill_conditioned(&self) -> bool {
        self.passes_by_accuracy()
            && self
                .accuracy
                .is_some_and(|a| a.backend > ROUNDING_FACTOR * a.reference)
    }

    /// Out of tolerance against the source graph, and within it against the optimised graph:
    /// a difference of the fusion's rounding (or of an intermediate that overflows only where
    /// the source graph rounds it), not of the kernels.
    pub fn explained_by_fusion(&self) -> bool {
        !self.ok() && self.fused_error.is_some_and(|e| e <= self.tolerance)
    }
}

/// The run a check is starting ([`Compiled::check_with_progress`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckStep {
    /// The reference interpreter on the random inputs.
    Reference,
    /// The backend checked, on the same inputs.
    Backend(Backend),
    /// The graph's unrounded math, for outputs out of tolerance.
    Unrounded,
    /// Run `run` of `of` with random roundings, for outputs further from the unrounded math
    /// than twice the reference ([`Accuracy::noise`]).
    Perturbed { run: usize, of: usize },
    /// The optimised graph interpreted, for outputs that still fail.
    Optimized,
}

/// The result of [`Compiled::check`].
#[derive(Clone, Debug, PartialEq)]
pub struct CheckReport {
    pub backend: Backend,
    pub outputs: Vec<OutputCheck>,
}

impl CheckReport {
    pub fn ok(&self) -> bool {
        self.outputs.iter().all(OutputCheck::ok)
    }

    /// The error that a failed check of `model` ends with ([`Error::CheckFailed`]); `None`
    /// when every output is within tolerance.
    pub fn failure(&self, model: &str) -> Option<Error> {
        let failed = self.outputs.iter().filter(|o| !o.ok()).count();
        (failed > 0).then(|| Error::CheckFailed {
            model: model.to_string(),
            failed,
            outputs: self.outputs.len(),
            explained: self
                .outputs
                .iter()
                .filter(|o| o.explained_by_fusion())
                .count(),
        })
    }

    /// The worst error relative to its tolerance.
    pub fn worst(&self) -> Option<&OutputCheck> {
        self.outputs
            .iter()
            .max_by(|a, b| (a.error / a.tolerance).total_cmp(&(b.error / b.tolerance)))
    }
}

/// Options of [`Compiled::bench`].
#[derive(Clone, Copy, Debug)]
pub struct BenchOptions {
    /// Milliseconds of untimed runs, back to back, before the warm-up: the timed runs then see
    /// the clocks of sustained load (see [`mlpc_runtime::time_runs`]).
    pub heat_ms: u64,
    /// Untimed runs after the heat: a count, or as many as fill a wall time.
    pub warmup: Runs,
    /// Timed runs: a count, or as many as fill a wall time (at least one either way).
    pub iters: Runs,
    /// Weight sets to rotate through; `None` picks enough to exceed the GPU's L2 (2 to 8).
    pub weight_sets: Option<usize>,
    /// Input sets to rotate through.
    pub input_sets: usize,
    /// Zero a 256 MB scratch buffer before every timed run, outside its events, as triton's
    /// `do_bench` does (see [`mlpc_runtime::TimingOptions::flush_bytes`]).
    pub flush_l2: bool,
}

impl Default for BenchOptions {
    fn default() -> BenchOptions {
        BenchOptions {
            heat_ms: 1000,
            warmup: Runs::Count(20),
            iters: Runs::Count(200),
            weight_sets: None,
            input_sets: 4,
            flush_l2: false,
        }
    }
}

/// Timings of one model: on the GPU from CUDA events around each run ([`Compiled::bench`]), on
/// the CPU from the wall clock around each run ([`Compiled::bench_cpu`]).
#[derive(Clone, Debug, PartialEq)]
pub struct BenchReport {
    pub median_ms: f64,
    pub min_ms: f64,
    pub mean_ms: f64,
    pub iters: usize,
    pub weight_sets: usize,
    /// Floating-point operations of one run (2 per multiply-add of every GEMM).
    pub flops: f64,
    /// Median host time of one `run` call (guards, allocation, argument updates, launches), in
    /// microseconds. On the CPU, where the host does the work, the median run itself.
    pub host_us: f64,
    /// Whether the runs were allowed to replay CUDA graphs ([`crate::Compiler::cuda_graphs`]).
    pub graphs: bool,
    /// How many of the timed runs were launched as one CUDA graph.
    pub graph_runs: usize,
    /// What each run launched: `kernel: entry, grid XxYxZ`, in plan order (the entry a GEMM
    /// module's rule picked for these bindings on this device); on the CPU, the kernels' names.
    pub launches: Vec<String>,
}

impl BenchReport {
    pub fn tflops(&self) -> f64 {
        self.flops / (self.median_ms * 1e-3) / 1e12
    }
}

/// `f` run back to back for `ms` milliseconds (at least once when `ms` is not 0).
fn run_for(ms: u64, mut f: impl FnMut() -> Result<(), Error>) -> Result<(), Error> {
    let start = std::time::Instant::now();
    while start.elapsed().as_secs_f64() * 1e3 < ms as f64 {
        f()?;
    }
    Ok(())
}

/// Floating-point operations of one run of `plan` under `bindings`: 2·M·N·K per GEMM (twice that
/// for a dual GEMM); for a block-sparse GEMM only the kept blocks count; elementwise work is not
/// counted.
pub fn plan_flops(plan: &Plan, bindings: &Bindings) -> f64 {
    let mut total = 0.0;
    for k in &plan.kernels {
        let (g, kept_fraction) = match &k.op {
            Op::Gemm(g) => (g, 1.0),
            Op::SparseGemm(sg) => {
                let p = &sg.pattern;
                let blocks =
                    (p.out / u64::from(p.block[0]).max(1)) * (p.inp / u64::from(p.block[1]).max(1));
                (&sg.gemm, p.kept.len() as f64 / blocks.max(1) as f64)
            }
            Op::Input
            | Op::Weight
            | Op::Transpose
            | Op::MatMul
            | Op::Add
            | Op::Mul
            | Op::Act(_) => continue,
        };
        let out = &plan.buffers[k.out].ty;
        let a = &plan.buffers[k.args[0]].ty;
        let numel: f64 = out
            .concrete_shape(bindings)
            .map(|s| s.iter().product::<usize>() as f64)
            .unwrap_or(0.0);
        let kdim = match g.a {
            mlpc_ir::MatLayout::N => a.shape.last(),
            mlpc_ir::MatLayout::T => a.shape.first(),
        };
        let kdim = kdim.and_then(|d| d.resolve(bindings)).unwrap_or(0) as f64;
        total += 2.0 * numel * kdim * kept_fraction * if g.dual.is_some() { 2.0 } else { 1.0 };
    }
    total
}

impl Compiled {
    /// Runs `backend` and the reference interpreter on the same fresh random inputs and compares
    /// every output. On CUDA, outputs and intermediates are filled with NaN before the run. An
    /// output passes within the dtype's [`tolerance`] of the reference, or, out of it, about as
    /// near the graph's unrounded math as the reference ([`Accuracy`]).
    pub fn check(
        &self,
        backend: Backend,
        bindings: &[(&str, u64)],
        seed: u64,
    ) -> Result<CheckReport, Error> {
        self.check_with_progress(backend, bindings, seed, &mut |_| {})
    }

    /// [`Compiled::check`], calling `progress` as each of its runs starts (a check of a large
    /// model spends minutes in the reference interpreter).
    pub fn check_with_progress(
        &self,
        backend: Backend,
        bindings: &[(&str, u64)],
        seed: u64,
        progress: &mut dyn FnMut(CheckStep),
    ) -> Result<CheckReport, Error> {
        let inputs = self.random_inputs(bindings, seed)?;
        progress(CheckStep::Reference);
        let want = self.run(Backend::Reference, &inputs)?;
        self.check_against(backend, &inputs, &want, progress)
    }

    /// [`Compiled::check`] against reference outputs `want` already computed for `inputs`.
    pub(crate) fn check_against(
        &self,
        backend: Backend,
        inputs: &crate::Tensors,
        want: &crate::Tensors,
        progress: &mut dyn FnMut(CheckStep),
    ) -> Result<CheckReport, Error> {
        progress(CheckStep::Backend(backend));
        let got = self.run_with(backend, inputs, true)?;
        let error_of = |name: &str, w: &mlpc_ir::HostTensor| match got.get(name) {
            Some(g) if g.shape() == w.shape() && g.dtype() == w.dtype() => {
                mlpc_ir::relative_error_same_specials(&g.to_f64(), &w.to_f64())
            }
            _ => f64::NAN,
        };
        // The unrounded math, interpreted only once an output is out of tolerance.
        let mut unrounded: Option<crate::Tensors> = None;
        let mut outputs = Vec::new();
        for (name, w) in want {
            let error = error_of(name, w);
            let tolerance = tolerance(w.dtype());
            let failed = error.is_nan() || error > tolerance;
            let accuracy = if failed && backend != Backend::Reference {
                if unrounded.is_none() {
                    progress(CheckStep::Unrounded);
                    unrounded = Some(mlpc_ir::interpret_unrounded(
                        self.reference_graph(),
                        inputs,
                    )?);
                }
                unrounded
                    .as_ref()
                    .and_then(|u| u.get(name))
                    .map(|u| Accuracy {
                        backend: error_of(name, u),
                        reference: mlpc_ir::relative_error_same_specials(&w.to_f64(), &u.to_f64()),
                        noise: None,
                    })
            } else {
                None
            };
            outputs.push(OutputCheck {
                name: name.clone(),
                dtype: w.dtype(),
                shape: w.shape().to_vec(),
                error,
                tolerance,
                fused_error: None,
                accuracy,
            });
        }
        // Outputs out of reach of the reference's own distance: their conditioning, measured by
        // perturbed runs, each run dropped once its distances are taken. Not where the backend's
        // distance is NaN (a NaN or an infinity on one side only), which no distance passes.
        let conditioned: Vec<usize> = (0..outputs.len())
            .filter(|&i| {
                outputs[i]
                    .accuracy
                    .is_some_and(|a| !a.comparable() && !a.backend.is_nan())
            })
            .collect();
        if let (false, Some(u)) = (conditioned.is_empty(), &unrounded) {
            let mut squares = vec![0.0; conditioned.len()];
            for s in 0..NOISE_RUNS {
                progress(CheckStep::Perturbed {
                    run: s + 1,
                    of: NOISE_RUNS,
                });
                let p = mlpc_ir::interpret_perturbed(
                    self.reference_graph(),
                    inputs,
                    s as u64,
                    ACTIVATION_ERROR,
                )?;
                for (sq, &i) in squares.iter_mut().zip(&conditioned) {
                    let name = &outputs[i].name;
                    let e = match (p.get(name), u.get(name)) {
                        (Some(p), Some(u)) => {
                            mlpc_ir::relative_error_same_specials(&p.to_f64(), &u.to_f64())
                        }
                        _ => f64::NAN,
                    };
                    *sq += e * e;
                }
            }
            for (sq, &i) in squares.iter().zip(&conditioned) {
                if let Some(a) = &mut outputs[i].accuracy {
                    a.noise = Some((sq / NOISE_RUNS as f64).sqrt());
                }
            }
        }
        // Only for outputs that still fail: the optimised graph tells their report whether the
        // fusion's rounding explains them.
        if !std::ptr::eq(self.reference_graph(), self.optimized())
            && outputs.iter().any(|o| !o.ok())
        {
            progress(CheckStep::Optimized);
            let fused = mlpc_ir::interpret(self.optimized(), inputs)?;
            for o in outputs.iter_mut().filter(|o| !o.ok()) {
                o.fused_error = fused.get(&o.name).map(|f| error_of(&o.name, f));
            }
        }
        Ok(CheckReport { backend, outputs })
    }

    /// Times the CUDA backend: `heat_ms` of untimed runs back to back, warm-up runs, then `iters`
    /// runs bracketed by CUDA events (either counted, or sized to a wall time from an estimate
    /// taken first, as triton's `do_bench` sizes them), rotating through weight sets (other random weights of the
    /// same shapes, so that weights do not stay in L2) and input sets. Random data, never zeros.
    /// With CUDA graphs on
    /// ([`crate::Compiler::cuda_graphs`]), every weight set's graph is built during the warm-up
    /// once the warm-up gives each set two runs.
    pub fn bench(
        &self,
        bindings: &[(&str, u64)],
        opts: BenchOptions,
    ) -> Result<BenchReport, Error> {
        Backend::Cuda.require()?;
        let gpu = self.gpu_state()?;
        let weight_bytes: usize = self
            .optimized()
            .weights()
            .values()
            .map(|w| w.bytes().len())
            .sum();
        let sets = opts
            .weight_sets
            .unwrap_or_else(|| (400_000_000 / weight_bytes.max(1)).clamp(2, 8));
        let mut extra = Vec::new();
        for s in 1..sets {
            let mut w = BTreeMap::new();
            for (name, t) in self.optimized().weights() {
                let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
                let fan_in = *shape.last().unwrap_or(&1) as f64;
                let fresh = mlpc_frontend::generate::uniform_tensor(
                    s as u64,
                    name,
                    &shape,
                    1.0 / fan_in.sqrt(),
                    t.dtype(),
                )
                .map_err(|e| Error::Bench(format!("weight `{name}` cannot be regenerated: {e}")))?;
                w.insert(name.clone(), Arc::new(fresh));
            }
            extra.push(gpu.with_weights(self, &w)?);
        }
        let mut exes: Vec<&mlpc_runtime::Executable> = vec![gpu.exe.as_ref()];
        exes.extend(extra.iter());
        let device = gpu.exe.device();
        let mut inputs = Vec::new();
        for s in 0..opts.input_sets.max(1) {
            let host = self.random_inputs(bindings, 1000 + s as u64)?;
            let mut dev = BTreeMap::new();
            for (n, t) in &host {
                dev.insert(n.clone(), device.upload(t)?);
            }
            inputs.push(dev);
        }
        let binding = gpu
            .exe
            .check(&inputs[0])
            .map_err(mlpc_runtime::RuntimeError::from)?;
        let run = self.run_options(false);
        let timing = mlpc_runtime::TimingOptions {
            heat: std::time::Duration::from_millis(opts.heat_ms),
            warmup: opts.warmup,
            iters: match opts.iters {
                Runs::Count(n) => Runs::Count(n.max(1)),
                wall => wall,
            },
            flush_bytes: if opts.flush_l2 { 256 << 20 } else { 0 },
        };
        let timings = mlpc_runtime::time_runs(&exes, &inputs, timing, run)?;
        let mut times = timings.gpu_ms;
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let mut host = timings.host_us;
        host.sort_by(f64::total_cmp);
        Ok(BenchReport {
            median_ms: median,
            min_ms: times[0],
            mean_ms: times.iter().sum::<f64>() / times.len() as f64,
            iters: times.len(),
            weight_sets: exes.len(),
            host_us: host.get(host.len() / 2).copied().unwrap_or(f64::NAN),
            graphs: run.graphs,
            graph_runs: timings.graph_runs,
            flops: plan_flops(self.plan(), &binding),
            launches: gpu
                .exe
                .launches_for(&binding)?
                .into_iter()
                .map(|l| {
                    let [x, y, z] = l.grid;
                    format!("{}: {}, grid {x}x{y}x{z}", l.kernel, l.entry)
                })
                .collect(),
        })
    }

    /// Times the CPU backend ([`crate::Backend::Cpu`]): `heat_ms` of untimed runs back to back
    /// (the cores' clocks settle under sustained load as a GPU's do), warm-up runs, then timed
    /// runs, each `run` call bracketed by the wall clock: converting the inputs, every kernel on
    /// the thread pool, and the outputs. Rotates through input sets of random data; the weights
    /// are the model's own, packed once when the backend compiled the plan (compiling for the
    /// CPU happens before the timing, on the first use). A wall time for the warm-up or the timed
    /// runs is counted from the median of five runs taken after the heat (only then are they
    /// taken). [`BenchOptions`]' `weight_sets` and `flush_l2` are for the GPU: asking for either
    /// here is an error.
    pub fn bench_cpu(
        &self,
        bindings: &[(&str, u64)],
        opts: BenchOptions,
    ) -> Result<BenchReport, Error> {
        Backend::Cpu.require()?;
        if opts.flush_l2 {
            return Err(Error::Bench(
                "flushing the L2 cache before each run is for the cuda backend, not `cpu`".into(),
            ));
        }
        if opts.weight_sets.is_some_and(|n| n != 1) {
            return Err(Error::Bench(
                "rotating weight sets is for the cuda backend; `cpu` times the model's own weights"
                    .into(),
            ));
        }
        let cpu = self.cpu_state()?;
        let mut inputs = Vec::new();
        for s in 0..opts.input_sets.max(1) {
            inputs.push(self.random_inputs(bindings, 1000 + s as u64)?);
        }
        let mut bound = Bindings::new();
        for &(sym, value) in bindings {
            // `random_inputs` has checked that every symbol is an input's.
            let _ = bound.bind(&Arc::from(sym), value);
        }
        let mut next = 0usize;
        let mut run = || -> Result<f64, Error> {
            let set = &inputs[next % inputs.len()];
            next += 1;
            let start = std::time::Instant::now();
            let out = cpu.run(set)?;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            drop(out);
            Ok(ms)
        };
        run_for(opts.heat_ms, || run().map(|_| ()))?;
        // Counted phases need no estimate (`Runs::count` reads it only for a wall time).
        let sized = [opts.warmup, opts.iters]
            .iter()
            .any(|r| matches!(r, Runs::Millis(_)));
        let estimate_ms = if sized {
            let mut probe = (0..5).map(|_| run()).collect::<Result<Vec<f64>, Error>>()?;
            probe.sort_by(f64::total_cmp);
            probe[probe.len() / 2]
        } else {
            f64::NAN
        };
        for _ in 0..opts.warmup.count(estimate_ms) {
            run()?;
        }
        let iters = opts.iters.count(estimate_ms).max(1);
        let mut times = (0..iters)
            .map(|_| run())
            .collect::<Result<Vec<f64>, Error>>()?;
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        Ok(BenchReport {
            median_ms: median,
            min_ms: times[0],
            mean_ms: times.iter().sum::<f64>() / times.len() as f64,
            iters: times.len(),
            weight_sets: 1,
            host_us: median * 1e3,
            graphs: false,
            graph_runs: 0,
            flops: plan_flops(self.plan(), &bound),
            launches: self.plan().kernels.iter().map(|k| k.name.clone()).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(name: &str, error: f64, fused_error: Option<f64>) -> OutputCheck {
        OutputCheck {
            name: name.to_string(),
            dtype: DType::Bf16,
            shape: vec![2, 3],
            error,
            tolerance: 1e-2,
            fused_error,
            accuracy: None,
        }
    }

    fn failure(outputs: Vec<OutputCheck>) -> Option<String> {
        let report = CheckReport {
            backend: Backend::Cpu,
            outputs,
        };
        report.failure("m").map(|e| e.to_string())
    }

    /// An output out of tolerance of the reference passes when it is at most twice as far from
    /// the graph's unrounded math as the reference is, and not where either error is NaN.
    #[test]
    fn an_output_about_as_near_the_unrounded_math_as_the_reference_passes() {
        let with = |error, backend, reference| OutputCheck {
            accuracy: Some(Accuracy {
                backend,
                reference,
                noise: None,
            }),
            ..output("a", error, Some(error))
        };
        assert!(with(2e-2, 1e-2, 1.5e-2).passes_by_accuracy());
        assert!(with(2e-2, 2.5e-2, 1.5e-2).ok());
        assert!(!with(2e-2, 3.5e-2, 1.5e-2).ok());
        assert!(!with(f64::NAN, 1e-3, f64::NAN).ok());
        assert!(!with(f64::NAN, f64::NAN, 1e-2).ok());
        // Within tolerance it passes as such, whatever the accuracy says.
        assert!(with(1e-3, 1.0, 1e-3).ok());
        assert!(!with(1e-3, 1.0, 1e-3).passes_by_accuracy());
        // A passing output is neither counted as failed nor explained by the fusion.
        let passing = with(2e-2, 1e-2, 1.5e-2);
        assert!(!passing.explained_by_fusion());
        assert_eq!(failure(vec![passing.clone(), output("b", 0.0, None)]), None);
        assert_eq!(
            failure(vec![
                passing,
                OutputCheck {
                    fused_error: Some(0.0),
                    ..with(2e-2, 4e-2, 1e-2)
                }
            ])
            .as_deref(),
            Some(
                "`m`: 1 of its 2 outputs differs from the reference interpreter's by more than \
                 the tolerance, but is within it of the optimised graph, which is what the fused \
                 kernels compute: not a wrong kernel (see the note above)"
            )
        );
    }

    /// Further than twice the reference's distance from the unrounded math, an output passes
    /// within twice the random roundings' (an ill-conditioned output), not further, and not
    /// where they were not measured or are NaN.
    #[test]
    fn an_output_about_as_near_the_unrounded_math_as_random_roundings_passes() {
        let with = |backend, noise| OutputCheck {
            accuracy: Some(Accuracy {
                backend,
                reference: 1e-5,
                noise,
            }),
            ..output("a", 5e-2, None)
        };
        assert!(with(3e-5, Some(2e-5)).passes_as_ill_conditioned());
        assert!(with(4e-5, Some(2e-5)).ok());
        assert!(!with(4.1e-5, Some(2e-5)).ok());
        assert!(!with(3e-5, None).ok());
        assert!(!with(3e-5, Some(f64::NAN)).ok());
        assert!(!with(f64::NAN, Some(1.0)).ok());
        // The reference's own distance still passes it where the roundings' is smaller.
        assert!(with(2e-5, Some(1e-6)).ok());
        assert!(!with(2e-5, Some(1e-6)).passes_as_ill_conditioned());
    }

    /// The error a failed check ends with counts the outputs out of tolerance and says whether
    /// the optimised graph explains them all, some, or none.
    #[test]
    fn a_failed_check_counts_its_outputs_and_those_the_fusion_explains() {
        assert_eq!(failure(vec![output("a", 1e-3, None)]), None);
        assert_eq!(
            failure(vec![output("a", 2e-2, Some(3e-2))]).as_deref(),
            Some(
                "`m`: its output differs from the reference interpreter's by more than the \
                 tolerance"
            )
        );
        assert_eq!(
            failure(vec![output("a", 2e-2, Some(0.0)), output("b", 0.0, None)]).as_deref(),
            Some(
                "`m`: 1 of its 2 outputs differs from the reference interpreter's by more than \
                 the tolerance, but is within it of the optimised graph, which is what the fused \
                 kernels compute: not a wrong kernel (see the note above)"
            )
        );
        assert_eq!(
            failure(vec![
                output("a", 2e-2, Some(1e-3)),
                output("b", f64::NAN, Some(0.0)),
                output("c", 0.0, None),
            ])
            .as_deref(),
            Some(
                "`m`: 2 of its 3 outputs differ from the reference interpreter's by more than \
                 the tolerance, but are within it of the optimised graph, which is what the \
                 fused kernels compute: not a wrong kernel (see the notes above)"
            )
        );
        assert_eq!(
            failure(vec![
                output("a", 2e-2, Some(1e-3)),
                output("b", f64::NAN, None),
                output("c", 5e-2, Some(5e-2)),
            ])
            .as_deref(),
            Some(
                "`m`: all 3 of its outputs differ from the reference interpreter's by more than \
                 the tolerance (1 of them within it of the optimised graph, which is what the \
                 fused kernels compute)"
            )
        );
    }
}
