//! The `mlpc` command line. This crate parses arguments, prints progress and summaries and
//! renders errors; every other step is a call into the `mlpc` library.
//!
//! **Architecture invariant:** no compiler logic lives here. A framework that embeds the `mlpc`
//! library can do everything this binary does.
//!
//! Every failure prints one message (the error and its causes) to stderr and exits with status 1;
//! nothing is left half-written, because the library writes files and directories atomically.

mod render;
mod stdout;

use clap::{Parser, Subcommand, ValueEnum};
use mlpc::{Arch, Backend, Compiler, CudaKernels};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use stdout::{out, outln};

#[derive(Parser, Debug)]
#[command(
    name = "mlpc",
    version,
    about = "A graph compiler for MLP blocks",
    long_about = "A graph compiler for MLP blocks: reads model.json, verifies it, and runs it.\n\
                  Errors name the offending node or tensor; the exit status is 1 on any error."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Compile a model: verify, optimise, plan, generate and JIT-compile the kernels; write
    /// DIR/graph.txt, optimized.txt, plan.json, explain.txt, kernels/ and checksums.json.
    Compile {
        /// The model file (model.json).
        model: PathBuf,
        /// Output directory [default: out/<model name>]. Replaced as a whole; an existing
        /// directory must be empty or an earlier mlpc output.
        #[arg(short, long, value_name = "DIR")]
        out: Option<PathBuf>,
        #[command(flatten)]
        opts: CompileArgs,
        /// Print a table of what became of every source node, and the kernel counts.
        #[arg(long)]
        explain: bool,
        /// Print the IR after the named passes (comma-separated), or after every pass (`all`).
        #[arg(long, value_name = "PASS|all")]
        print_after: Option<String>,
        /// Print the time each pass took.
        #[arg(long)]
        time_passes: bool,
        /// Also write the weights the kernels read (DIR/weights.safetensors), so that DIR runs
        /// on its own: `mlpc run DIR ...`.
        #[arg(long)]
        emit_weights: bool,
        /// Measure every valid tile of each Hopper GEMM on the GPU (checked against the
        /// reference, then timed) and cache the fastest for later compiles and runs. Needs a
        /// Hopper GPU and `--bind` for every symbolic dimension.
        #[arg(long)]
        autotune: bool,
        /// A value for a symbolic dimension, e.g. `--bind T=8192`: the size --autotune tunes
        /// for, and with --explain, the size whose launches it lists (which entry of each
        /// kernel runs, on what grid: the --target's kernels, else the sm_90a kernels that a
        /// run on Hopper compiles).
        #[arg(long = "bind", value_name = "SYM=N", value_parser = parse_binding)]
        bindings: Vec<(String, u64)>,
        /// With --explain and --bind: the multiprocessors of the device the launches are
        /// listed for (132: an H100 or H200 SXM).
        #[arg(long, value_name = "N", default_value_t = 132,
              value_parser = clap::value_parser!(u32).range(1..=4096))]
        sms: u32,
    },
    /// Run a model on inputs read from a safetensors file; write the outputs to another.
    Run {
        /// The model file (model.json), or a directory written by `mlpc compile --emit-weights`
        /// (runs its compiled kernels on the GPU).
        model: PathBuf,
        /// Inputs by name (safetensors).
        #[arg(short, long, value_name = "IN.safetensors")]
        input: PathBuf,
        /// Where to write the outputs by name (safetensors); written only on success.
        #[arg(short, long, value_name = "OUT.safetensors")]
        output: PathBuf,
        /// Where to run [default: cuda when a GPU driver is present, else cpu].
        #[arg(short, long, value_enum)]
        backend: Option<BackendArg>,
        #[command(flatten)]
        opts: CompileArgs,
        #[command(flatten)]
        graphs: GraphArgs,
    },
    /// Check a backend against the reference interpreter on fresh random inputs (outputs are
    /// poisoned with NaN before the run); exit status 1 if any output is off.
    ///
    /// An output passes within its dtype's relative tolerance of the reference (f32 1e-5, f16
    /// 2e-3, bf16 1e-2), or, out of it, when it is at most twice as far from the graph's
    /// unrounded math (every value in f64) as the reference, which rounds every intermediate:
    /// fused kernels round fewer. An ill-conditioned output passes when it is at most twice as
    /// far as eight runs with random roundings of every stored value and product term are (root
    /// mean square). Each output out of tolerance gets a note with the errors.
    Check {
        /// The model file (model.json).
        model: PathBuf,
        /// The backend to check [default: cuda when a GPU driver is present, else cpu].
        #[arg(short, long, value_enum)]
        backend: Option<BackendArg>,
        /// A value for a symbolic dimension, e.g. `--bind T=8`; repeat for several.
        #[arg(long = "bind", value_name = "SYM=N", value_parser = parse_binding)]
        bindings: Vec<(String, u64)>,
        /// Seed of the random inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Append the result as one JSON line to this file (each output's errors, tolerance and
        /// verdict), also when the check fails.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        #[command(flatten)]
        opts: CompileArgs,
    },
    /// Time the model: on the GPU, CUDA events around each run after warm-up, median of many
    /// runs, rotating weight and input sets; on the CPU (`-b cpu`), the wall clock around each
    /// run.
    Bench {
        /// The model file (model.json).
        model: PathBuf,
        /// The backend to time, `cuda` or `cpu`. Never chosen for you: a timing is of the
        /// backend named.
        #[arg(short, long, value_enum, default_value = "cuda")]
        backend: BackendArg,
        /// A value for a symbolic dimension, e.g. `--bind T=8192`; repeat for several.
        #[arg(long = "bind", value_name = "SYM=N", value_parser = parse_binding)]
        bindings: Vec<(String, u64)>,
        /// Milliseconds of untimed runs, back to back, before the warm-up, so that the timed
        /// runs see the clocks the GPU's power limit holds under sustained load (0: none).
        #[arg(long, value_name = "MS", default_value_t = 1000)]
        heat_ms: u64,
        /// Untimed runs after the heat [default: 20 on the GPU, 2 on the CPU].
        #[arg(long, value_name = "N")]
        warmup: Option<usize>,
        /// Timed runs [default: 200 on the GPU; on the CPU, as many as take 2 s, at least one].
        #[arg(long, value_name = "N")]
        iters: Option<usize>,
        /// Untimed runs after the heat for this many milliseconds instead of `--warmup` runs
        /// (counted from an estimate of one run with its flush, as triton's `do_bench` counts
        /// its 25 ms of warm-up).
        #[arg(long, value_name = "MS", conflicts_with = "warmup")]
        warmup_ms: Option<u64>,
        /// Timed runs for this many milliseconds instead of `--iters` runs (counted as
        /// `--warmup-ms`; `do_bench`'s `rep`): a side timed against a `do_bench` peer then spends
        /// as long at the same duty cycle.
        #[arg(long, value_name = "MS", conflicts_with = "iters")]
        rep_ms: Option<u64>,
        /// Zero a 256 MB scratch buffer before every timed run (outside its timing), as
        /// triton's `do_bench` does: the same duty cycle as a peer timed that way.
        #[arg(long)]
        flush_l2: bool,
        /// Append the result as one JSON line to this file.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        #[command(flatten)]
        opts: CompileArgs,
        #[command(flatten)]
        graphs: GraphArgs,
    },
    /// Write deterministic random inputs for a model (for `mlpc run --input`).
    GenInputs {
        /// The model file (model.json).
        model: PathBuf,
        /// The safetensors file to write.
        #[arg(short, long, value_name = "IN.safetensors")]
        output: PathBuf,
        /// A value for a symbolic dimension, e.g. `--bind T=8`; repeat for several.
        #[arg(long = "bind", value_name = "SYM=N", value_parser = parse_binding)]
        bindings: Vec<(String, u64)>,
        /// Seed of the random generator: the same seed gives the same inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Show the caches on disk (compiled kernels, and the autotune cache beside them, in
    /// MLPC_CACHE_DIR, else ~/.cache/mlpc/kernels), or clear or trim them.
    Cache {
        #[command(subcommand)]
        action: Option<CacheAction>,
    },
}

/// `mlpc cache` subcommands.
#[derive(Subcommand, Debug)]
enum CacheAction {
    /// Print the cache directory, its entries and their size (the default).
    Info,
    /// Remove every compiled kernel and the autotune cache (autotune.json); other files in the
    /// directory stay.
    Clear,
    /// Remove the least recently used compiled kernels until they take at most SIZE (the
    /// autotune cache is kept). MLPC_CACHE_MAX_SIZE=SIZE does this after every compilation
    /// that stores kernels.
    Trim {
        /// The most the compiled kernels may take: bytes (1024), or a number with a unit: K, M,
        /// G, T and KiB, MiB, GiB, TiB are powers of 1024, KB, MB, GB, TB powers of 1000 (e.g.
        /// 500M, 2G, 1.5GiB).
        #[arg(long, value_name = "SIZE", value_parser = mlpc::parse_size,
              allow_hyphen_values = true)]
        max_size: u64,
    },
}

/// Options shared by every command that compiles a model.
#[derive(clap::Args, Debug, Clone)]
struct CompileArgs {
    /// The passes to run, comma-separated, instead of the default pipeline
    /// (dce,fold-transpose,cse,fuse-epilogue). A model's `sparsity` section adds
    /// prune-block-sparse and lower-block-sparse to either.
    #[arg(long, value_name = "PASS,...", value_delimiter = ',')]
    passes: Option<Vec<String>>,
    /// Verify the graph after every pass [default: on in debug builds].
    #[arg(long, value_name = "BOOL")]
    verify_each: Option<bool>,
    /// The CUDA target: `cuda:sm_90`, `cuda:sm_90a` (Hopper's wgmma kernels), `cuda:sm_80` (the
    /// `cuda:` may be left out), or `cpu` to skip CUDA kernels. Default: artifacts for sm_90,
    /// and on a GPU, kernels for that GPU's own architecture (sm_90a on Hopper); `run` and
    /// `check` on another backend compile none.
    #[arg(long, value_name = "TARGET")]
    target: Option<String>,
    /// Neither read nor write the kernel cache.
    #[arg(long)]
    no_cache: bool,
    /// Neither read nor write the autotune cache (Hopper GEMM tiles measured by
    /// `compile --autotune`): the heuristic's tiles.
    #[arg(long)]
    no_autotune_cache: bool,
    /// Run every f32 GEMM that offers the choice on the FP64 tensor cores (sm_90 / sm_90a:
    /// exact products summed in f64, rounded to f32 once), over the autotune cache (also:
    /// MLPC_F32_FP64_TENSOR_CORES=1). Without either option they run there unless the autotune
    /// cache measured the FFMA kernel faster.
    #[arg(long, conflicts_with = "f32_ffma")]
    f32_fp64_tensor_cores: bool,
    /// Run every f32 GEMM on the FFMA pipes, over the heuristic and the autotune cache (also:
    /// MLPC_F32_FP64_TENSOR_CORES=0).
    #[arg(long)]
    f32_ffma: bool,
    /// Leave out the weight-streaming entries the f16 / bf16 block-sparse GEMMs get for outputs
    /// of at most 64 rows: the tiled kernel runs at every size (also: MLPC_SPARSE_GEMV=0).
    #[arg(long)]
    no_sparse_gemv: bool,
}

impl CompileArgs {
    fn compiler(&self, print_after: Option<&str>) -> Result<Compiler, mlpc::Error> {
        let mut c = Compiler::new()
            .no_cache(self.no_cache)
            .autotune_cache(!self.no_autotune_cache);
        if self.f32_fp64_tensor_cores || self.f32_ffma {
            c = c.f32_on_fp64_tensor_cores(self.f32_fp64_tensor_cores);
        }
        if self.no_sparse_gemv {
            c = c.sparse_gemv(false);
        }
        if let Some(p) = &self.passes {
            c = c.passes(p.clone());
        }
        if let Some(v) = self.verify_each {
            c = c.verify_each(v);
        }
        if let Some(p) = print_after {
            c = c.print_after(mlpc::PrintAfter::parse(p)?);
        }
        match self.target.as_deref() {
            None => {}
            Some("cpu") => c = c.cuda_kernels(CudaKernels::Skip),
            Some(t) => {
                let arch = Arch::parse(t).ok_or_else(|| mlpc::Error::BadTarget(t.to_string()))?;
                c = c.arch(arch).cuda_kernels(CudaKernels::Require);
            }
        }
        Ok(c)
    }

    /// [`CompileArgs::compiler`] for a run on `backend`: without `--target`, a run that is not
    /// on CUDA compiles no CUDA kernels (they would only cost NVRTC time).
    fn compiler_for(&self, backend: Backend) -> Result<Compiler, mlpc::Error> {
        let c = self.compiler(None)?;
        Ok(match (backend, &self.target) {
            (Backend::Cuda, _) | (_, Some(_)) => c,
            _ => c.cuda_kernels(CudaKernels::Skip),
        })
    }
}

/// How CUDA runs launch the plan.
#[derive(clap::Args, Debug, Clone, Copy)]
struct GraphArgs {
    /// Launch the kernels one by one on every run instead of replaying the plan as one CUDA
    /// graph when the shapes repeat (also: MLPC_NO_GRAPHS=1).
    #[arg(long)]
    no_graphs: bool,
    /// Start every kernel only after the one before has finished, instead of letting the
    /// small-token (weight-streaming) kernels start early and wait for it themselves
    /// (also: MLPC_NO_EARLY_LAUNCH=1).
    #[arg(long)]
    no_early_launch: bool,
}

impl GraphArgs {
    /// `compiler` with graphs or early launches turned off if asked; otherwise its defaults (the
    /// environment's).
    fn apply(self, mut compiler: Compiler) -> Compiler {
        if self.no_graphs {
            compiler = compiler.cuda_graphs(false);
        }
        if self.no_early_launch {
            compiler = compiler.early_launch(false);
        }
        compiler
    }

    /// The run options of a compiled directory's run: these flags over the environment's
    /// defaults.
    fn run_options(self) -> mlpc::runtime::RunOptions {
        mlpc::runtime::RunOptions {
            graphs: mlpc::runtime::graphs_by_default() && !self.no_graphs,
            early_launch: mlpc::runtime::early_launch_by_default() && !self.no_early_launch,
            ..Default::default()
        }
    }
}

/// `--backend` values; the names are [`Backend::name`]'s.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum BackendArg {
    /// The reference interpreter (exact, slow).
    Reference,
    /// Native code for this CPU, through LLVM.
    Cpu,
    /// CUDA kernels on the GPU.
    Cuda,
}

impl From<BackendArg> for Backend {
    fn from(b: BackendArg) -> Backend {
        match b {
            BackendArg::Reference => Backend::Reference,
            BackendArg::Cpu => Backend::Cpu,
            BackendArg::Cuda => Backend::Cuda,
        }
    }
}

/// The largest size `compile --explain` maps the entries up to.
const ENTRY_MAP_MAX: u64 = 16384;

fn parse_binding(s: &str) -> Result<(String, u64), String> {
    let (sym, value) = s
        .split_once('=')
        .filter(|(sym, _)| !sym.trim().is_empty())
        .ok_or_else(|| format!("expected SYM=N (e.g. T=8), got `{s}`"))?;
    let value = value
        .trim()
        .parse::<u64>()
        .map_err(|e| format!("`{value}` is not a dimension size: {e}"))?;
    Ok((sym.trim().to_string(), value))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout and succeed; usage errors fail like any other error.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match execute(cli.command) {
        Ok(()) if stdout::failed() => ExitCode::FAILURE,
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", render::error_chain(&e));
            if let Some(hint) = render::hint(&e) {
                eprintln!("{hint}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The backend asked for, or the best one this machine can run, with a note saying why when
/// the choice was made for the user and is not the GPU.
fn pick_backend(b: Option<BackendArg>) -> Result<(Backend, Option<String>), mlpc::Error> {
    Ok(match b {
        Some(b) => {
            // Before the model is compiled (generating its weights may take a while).
            let b = Backend::from(b);
            b.require()?;
            (b, None)
        }
        None => {
            let best = Backend::best_available();
            let note = (best != Backend::Cuda)
                .then(|| format!("no usable GPU driver here, so the `{best}` backend was chosen"));
            (best, note)
        }
    })
}

/// `mlpc bench`'s warm-up and timed runs on `backend` when neither is given: on the GPU 20 and
/// 200 runs; on the CPU, where one run of a large model takes a second, 2 runs and 2 s of runs.
fn bench_defaults(backend: Backend) -> (mlpc::Runs, mlpc::Runs) {
    match backend {
        Backend::Cpu => (mlpc::Runs::Count(2), mlpc::Runs::Millis(2000)),
        Backend::Reference | Backend::Cuda => (mlpc::Runs::Count(20), mlpc::Runs::Count(200)),
    }
}

/// A bench phase: the wall time given, else the count given, else `default`.
fn phase(count: Option<usize>, ms: Option<u64>, default: mlpc::Runs) -> mlpc::Runs {
    match (count, ms) {
        (_, Some(ms)) => mlpc::Runs::Millis(ms),
        (Some(n), None) => mlpc::Runs::Count(n),
        (None, None) => default,
    }
}

/// Appends `line` and a newline to the file at `path`, creating it: one write of the whole line,
/// so that appends of concurrent runs stay whole lines (`writeln!` on a `File` writes it in
/// pieces).
fn append_line(path: &Path, line: &serde_json::Value) -> Result<(), mlpc::Error> {
    use std::io::Write;
    let io = |action| {
        move |source| mlpc::Error::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io("open"))?
        .write_all(format!("{line}\n").as_bytes())
        .map_err(io("write"))
}

/// Prints the compilation's warnings to stderr, one line each.
fn warn(compiled: &mlpc::Compiled) {
    for w in compiled.warnings() {
        eprintln!("warning: {w}");
    }
}

fn bindings_of(b: &[(String, u64)]) -> Vec<(&str, u64)> {
    b.iter().map(|(s, v)| (s.as_str(), *v)).collect()
}

fn execute(command: Command) -> Result<(), mlpc::Error> {
    // Every command, whatever it reads: a misspelt switch must not pass for its default.
    mlpc::check_environment()?;
    match command {
        Command::Compile {
            model,
            out,
            opts,
            explain,
            print_after,
            time_passes,
            emit_weights,
            autotune,
            bindings,
            sms,
        } => {
            let compiled = render::compile_file(
                opts.compiler(print_after.as_deref())?
                    .emit_weights(emit_weights)
                    .tile_bindings(bindings.clone()),
                &model,
            )?;
            compiled.check_bindings(&bindings_of(&bindings))?;
            warn(&compiled);
            for (pass, ir) in compiled.pass_ir() {
                outln!("// IR after {pass}\n{ir}");
            }
            if time_passes {
                out!("{}", compiled.report().timings());
            }
            if autotune {
                let report = render::autotune(&compiled, &bindings_of(&bindings))?;
                out!("{report}");
                // Load the kernels as a run would, so that explain.txt says which tiles runs
                // on this device take.
                compiled.executable()?;
            }
            if explain {
                // Resolved before anything is printed: bindings that leave a launch unresolved
                // are an error of their own.
                let launches = match (bindings.is_empty(), compiled.cuda_kernels()) {
                    (false, Some(_)) => Some(compiled.launch_plan(&bindings_of(&bindings), sms)?),
                    _ => None,
                };
                // Without bindings: which entry runs at each size of the one symbolic dim.
                let entry_map = match bindings.is_empty() {
                    true => compiled.entry_map(sms, ENTRY_MAP_MAX)?,
                    false => None,
                };
                outln!("{}", compiled.explain_with_tiles());
                // The launches are those of a run on a device of the launch architecture, which
                // differs from the artifacts' when no target was asked for (sm_90a on Hopper).
                let arch_note = match compiled.launch_arch() {
                    a if a == compiled.arch() => format!(", {a} kernels"),
                    a => format!(
                        ", {a} kernels (a run on Hopper compiles them; the artifacts are {})",
                        compiled.arch()
                    ),
                };
                if let Some(lines) = launches {
                    let at: Vec<String> =
                        bindings.iter().map(|(s, v)| format!("{s}={v}")).collect();
                    outln!("launches at {} on {sms} SMs{}:", at.join(", "), arch_note);
                    for line in lines {
                        outln!("  {line}");
                    }
                    outln!();
                }
                if let Some(lines) = entry_map {
                    outln!("entries by size, up to {ENTRY_MAP_MAX}, on {sms} SMs{arch_note}:");
                    for line in lines {
                        outln!("  {line}");
                    }
                    outln!();
                }
            }
            let dir = out.unwrap_or_else(|| default_out_dir(compiled.name(), &model));
            let written = compiled.write_to(&dir)?;
            out!(
                "{}",
                render::compile_summary(&compiled.summary(), &dir, &written)
            );
        }
        Command::Run {
            model,
            input,
            output,
            backend,
            opts,
            graphs,
        } => {
            if mlpc::Bundle::is_dir(&model) {
                // A compiled directory: its CUBINs run on the CUDA backend only.
                if let Some(b) = backend.map(Backend::from).filter(|&b| b != Backend::Cuda) {
                    return Err(mlpc::Error::Bundle {
                        dir: model,
                        what: format!("a compiled directory runs on the cuda backend, not `{b}`"),
                    });
                }
                let bundle = mlpc::Bundle::load(&model)?;
                let inputs = bundle.read_inputs(&input)?;
                let outputs = bundle.run_with(&inputs, graphs.run_options())?;
                mlpc::write_tensors(&output, &outputs)?;
                let name = bundle.plan().name.clone();
                out!(
                    "{}",
                    render::run_summary(&name, Backend::Cuda, None, &outputs, &output)
                );
                return Ok(());
            }
            let (backend, note) = pick_backend(backend)?;
            let compiled = render::compile_file(graphs.apply(opts.compiler_for(backend)?), &model)?;
            warn(&compiled);
            let inputs = compiled.read_inputs(&input)?;
            let outputs = compiled.run(backend, &inputs)?;
            mlpc::write_tensors(&output, &outputs)?;
            out!(
                "{}",
                render::run_summary(compiled.name(), backend, note.as_deref(), &outputs, &output)
            );
        }
        Command::Check {
            model,
            backend,
            bindings,
            seed,
            json,
            opts,
        } => {
            let (backend, note) = pick_backend(backend)?;
            let compiled = render::compile_file(
                opts.compiler_for(backend)?.tile_bindings(bindings.clone()),
                &model,
            )?;
            warn(&compiled);
            let report = render::check(&compiled, backend, &bindings_of(&bindings), seed)?;
            if let Some(note) = note {
                outln!("note: {note}");
            }
            out!("{}", render::check_report(compiled.name(), &report));
            if let Some(path) = json {
                let line = render::check_json(&compiled, &bindings, seed, &report);
                append_line(&path, &line)?;
            }
            if let Some(failure) = report.failure(compiled.name()) {
                return Err(failure);
            }
        }
        Command::Bench {
            model,
            backend,
            bindings,
            heat_ms,
            warmup,
            iters,
            warmup_ms,
            rep_ms,
            flush_l2,
            json,
            opts,
            graphs,
        } => {
            // Before the model is compiled, as `run` and `check` do.
            let backend = Backend::from(backend);
            backend.require()?;
            let cuda_only = [
                (flush_l2, "--flush-l2"),
                (graphs.no_graphs, "--no-graphs"),
                (graphs.no_early_launch, "--no-early-launch"),
            ];
            match backend {
                Backend::Reference => {
                    return Err(mlpc::Error::Bench(
                        "`bench` times the `cuda` or the `cpu` backend, not the reference \
                         interpreter"
                            .into(),
                    ))
                }
                Backend::Cpu => {
                    if let Some((_, flag)) = cuda_only.iter().find(|(on, _)| *on) {
                        return Err(mlpc::Error::Bench(format!(
                            "{flag} is for the cuda backend, not `cpu`"
                        )));
                    }
                }
                Backend::Cuda => {}
            }
            let compiled = render::compile_file(
                graphs.apply(opts.compiler_for(backend)?.tile_bindings(bindings.clone())),
                &model,
            )?;
            warn(&compiled);
            let b = bindings_of(&bindings);
            let bench_opts = mlpc::BenchOptions {
                heat_ms,
                warmup: phase(warmup, warmup_ms, bench_defaults(backend).0),
                iters: phase(iters, rep_ms, bench_defaults(backend).1),
                flush_l2,
                ..Default::default()
            };
            let r = match backend {
                Backend::Cpu => compiled.bench_cpu(&b, bench_opts)?,
                _ => compiled.bench(&b, bench_opts)?,
            };
            let binds: Vec<String> = bindings.iter().map(|(s, v)| format!("{s}={v}")).collect();
            let timing = match backend {
                Backend::Cpu => format!(
                    " on the CPU: median {:.4} ms (min {:.4}, mean {:.4}, {} runs), {:.1} GFLOP/s",
                    r.median_ms,
                    r.min_ms,
                    r.mean_ms,
                    r.iters,
                    r.tflops() * 1e3,
                ),
                Backend::Reference | Backend::Cuda => format!(
                    ": median {:.4} ms (min {:.4}, mean {:.4}, {} runs, {} weight sets), {:.1} TFLOP/s, host {:.1} us per run, {}",
                    r.median_ms,
                    r.min_ms,
                    r.mean_ms,
                    r.iters,
                    r.weight_sets,
                    r.tflops(),
                    r.host_us,
                    render::graph_use(r.graphs, r.graph_runs, r.iters),
                ),
            };
            outln!(
                "{} [{}] {} kernels{timing}; after {heat_ms} ms of heat{}",
                compiled.name(),
                binds.join(","),
                compiled.plan().kernels.len(),
                if flush_l2 {
                    ", L2 flushed before each run"
                } else {
                    ""
                },
            );
            let tiles = compiled.tile_notes();
            if tiles
                .iter()
                .any(|t| matches!(t.source, mlpc::TileSource::Cache { .. }))
            {
                for t in &tiles {
                    outln!("  tile: {t}");
                }
            }
            if let Some(path) = json {
                let line = serde_json::json!({
                    "model": compiled.name(),
                    "backend": backend.name(),
                    "dtype": compiled.plan().dtype,
                    "bindings": binds,
                    "kernels": compiled.plan().kernels.iter().map(|k| k.name.clone()).collect::<Vec<_>>(),
                    "heat_ms": heat_ms,
                    "warmup_ms": warmup_ms,
                    "rep_ms": rep_ms,
                    "flush_l2": flush_l2,
                    "median_ms": r.median_ms,
                    "min_ms": r.min_ms,
                    "mean_ms": r.mean_ms,
                    "iters": r.iters,
                    "weight_sets": r.weight_sets,
                    "flops": r.flops,
                    "tflops": r.tflops(),
                    "host_us": r.host_us,
                    "graphs": r.graphs,
                    "graph_runs": r.graph_runs,
                    "tiles": tiles.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
                    "launches": r.launches,
                });
                append_line(&path, &line)?;
            }
        }
        Command::GenInputs {
            model,
            output,
            bindings,
            seed,
        } => {
            let inputs = mlpc::random_inputs_for_file(&model, &bindings_of(&bindings), seed)?;
            mlpc::write_tensors(&output, &inputs)?;
            out!("{}", render::tensors_written(&inputs, &output));
        }
        Command::Cache { action } => {
            let dir = mlpc::cache_dir()?;
            match action.unwrap_or(CacheAction::Info) {
                CacheAction::Info => out!("{}", render::cache_info(&mlpc::CacheInfo::read(&dir)?)),
                CacheAction::Clear => {
                    out!("{}", render::cache_cleared(&dir, &mlpc::clear_cache(&dir)?))
                }
                CacheAction::Trim { max_size } => out!(
                    "{}",
                    render::cache_trimmed(&dir, max_size, &mlpc::trim_cache(&dir, max_size)?)
                ),
            }
        }
    }
    Ok(())
}

/// `out/<name>` in the working directory, where `<name>` is the model's name when it is a plain
/// file name, else the model file's stem.
fn default_out_dir(model_name: &str, model_path: &Path) -> PathBuf {
    let plain = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let stem = model_path
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| plain(s))
        .unwrap_or("model");
    let name = if plain(model_name) { model_name } else { stem };
    Path::new("out").join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn autotune_and_the_tile_cache_flags() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.command);
        match parse(&[
            "mlpc",
            "compile",
            "m.json",
            "--autotune",
            "--bind",
            "T=8192",
            "--no-autotune-cache",
        ]) {
            Ok(Command::Compile {
                autotune,
                bindings,
                opts,
                ..
            }) => {
                assert!(autotune);
                assert_eq!(bindings, [("T".to_string(), 8192)]);
                assert!(opts.no_autotune_cache);
            }
            other => panic!("{other:?}"),
        }
        // The compile options of every command that compiles.
        let compile_opts = |args: &[&str]| match parse(args) {
            Ok(
                Command::Compile { opts, .. }
                | Command::Bench { opts, .. }
                | Command::Check { opts, .. }
                | Command::Run { opts, .. },
            ) => opts,
            other => panic!("{args:?}: {other:?}"),
        };
        for cmd in ["compile", "bench", "check", "run"] {
            let mut args = vec!["mlpc", cmd, "m.json", "--f32-fp64-tensor-cores"];
            if cmd == "run" {
                args.extend(["-i", "in.safetensors", "-o", "out.safetensors"]);
            }
            let opts = compile_opts(&args);
            assert!(opts.f32_fp64_tensor_cores && !opts.f32_ffma && !opts.no_autotune_cache);
            args[3] = "--f32-ffma";
            let opts = compile_opts(&args);
            assert!(opts.f32_ffma && !opts.f32_fp64_tensor_cores);
            args.push("--f32-fp64-tensor-cores");
            assert!(parse(&args).is_err(), "{cmd}: both f32 kernels forced");
            args.pop();
            assert!(!compile_opts(&args).no_sparse_gemv);
            args.push("--no-sparse-gemv");
            assert!(compile_opts(&args).no_sparse_gemv, "{cmd}");
        }
        for cmd in ["bench", "check", "run"] {
            let mut args = vec!["mlpc", cmd, "m.json", "--no-autotune-cache"];
            if cmd == "run" {
                args.extend(["-i", "in.safetensors", "-o", "out.safetensors"]);
            }
            assert!(parse(&args).is_ok(), "{cmd}");
        }
        // `--autotune` belongs to compile only.
        assert!(parse(&["mlpc", "bench", "m.json", "--autotune"]).is_err());
    }

    #[test]
    fn bindings_parse() {
        assert_eq!(parse_binding("T=8"), Ok(("T".to_string(), 8)));
        assert!(parse_binding("T").unwrap_err().contains("expected SYM=N"));
        assert!(parse_binding("T=-1").is_err());
        assert!(parse_binding("=5").unwrap_err().contains("expected SYM=N"));
        assert!(parse_binding(" =5").is_err());
    }

    #[test]
    fn sms_is_at_least_one() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.command);
        assert!(parse(&["mlpc", "compile", "m.json", "--sms", "0"]).is_err());
        match parse(&["mlpc", "compile", "m.json", "--sms", "114"]) {
            Ok(Command::Compile { sms, .. }) => assert_eq!(sms, 114),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn default_out_dir_uses_a_plain_model_name() {
        let p = Path::new("examples/tiny/model.json");
        assert_eq!(default_out_dir("tiny-mlp", p), Path::new("out/tiny-mlp"));
        assert_eq!(default_out_dir("../etc", p), Path::new("out/model"));
        assert_eq!(
            default_out_dir("", Path::new("a/ffn.json")),
            Path::new("out/ffn")
        );
    }

    #[test]
    fn no_graphs_is_a_flag_of_run_and_bench() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.command);
        match parse(&["mlpc", "bench", "m.json", "--bind", "T=1", "--no-graphs"]) {
            Ok(Command::Bench { graphs, .. }) => assert!(graphs.no_graphs),
            other => panic!("{other:?}"),
        }
        match parse(&["mlpc", "run", "m.json", "-i", "in.st", "-o", "out.st"]) {
            Ok(Command::Run { graphs, .. }) => assert!(!graphs.no_graphs),
            other => panic!("{other:?}"),
        }
        assert!(parse(&["mlpc", "check", "m.json", "--no-graphs"]).is_err());
    }

    #[test]
    fn no_early_launch_is_a_flag_of_run_and_bench() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.command);
        match parse(&["mlpc", "bench", "m.json", "--no-early-launch"]) {
            Ok(Command::Bench { graphs, .. }) => {
                assert!(graphs.no_early_launch && !graphs.no_graphs);
                let run = graphs.run_options();
                assert!(!run.early_launch && !run.poison);
                assert_eq!(run.graphs, mlpc::runtime::graphs_by_default());
            }
            other => panic!("{other:?}"),
        }
        match parse(&[
            "mlpc",
            "run",
            "d",
            "-i",
            "in.st",
            "-o",
            "o.st",
            "--no-early-launch",
        ]) {
            Ok(Command::Run { graphs, .. }) => assert!(graphs.no_early_launch),
            other => panic!("{other:?}"),
        }
        assert!(parse(&["mlpc", "check", "m.json", "--no-early-launch"]).is_err());
    }

    #[test]
    fn bench_phases_are_counts_or_wall_times_not_both() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.command);
        match parse(&["mlpc", "bench", "m.json"]) {
            Ok(Command::Bench {
                backend,
                warmup,
                iters,
                warmup_ms,
                rep_ms,
                ..
            }) => {
                assert!(matches!(backend, BackendArg::Cuda));
                assert_eq!((warmup, iters, warmup_ms, rep_ms), (None, None, None, None));
                let gpu = bench_defaults(Backend::Cuda);
                assert_eq!(gpu, (mlpc::Runs::Count(20), mlpc::Runs::Count(200)));
                let cpu = bench_defaults(Backend::Cpu);
                assert_eq!(cpu, (mlpc::Runs::Count(2), mlpc::Runs::Millis(2000)));
                assert_eq!(phase(warmup, warmup_ms, gpu.0), mlpc::Runs::Count(20));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            phase(Some(3), None, mlpc::Runs::Millis(1)),
            mlpc::Runs::Count(3)
        );
        assert_eq!(
            phase(None, Some(9), mlpc::Runs::Count(1)),
            mlpc::Runs::Millis(9)
        );
        match parse(&["mlpc", "bench", "m.json", "-b", "cpu"]) {
            Ok(Command::Bench { backend, .. }) => assert!(matches!(backend, BackendArg::Cpu)),
            other => panic!("{other:?}"),
        }
        match parse(&[
            "mlpc",
            "bench",
            "m.json",
            "--warmup-ms",
            "25",
            "--rep-ms",
            "200",
        ]) {
            Ok(Command::Bench {
                warmup_ms, rep_ms, ..
            }) => assert_eq!((warmup_ms, rep_ms), (Some(25), Some(200))),
            other => panic!("{other:?}"),
        }
        // One phase counted, the other sized: fine.
        assert!(parse(&["mlpc", "bench", "m.json", "--warmup", "5", "--rep-ms", "200"]).is_ok());
        assert!(parse(&["mlpc", "bench", "m.json", "--iters", "5", "--rep-ms", "200"]).is_err());
        assert!(parse(&[
            "mlpc",
            "bench",
            "m.json",
            "--warmup",
            "5",
            "--warmup-ms",
            "9"
        ])
        .is_err());
        // The wall times belong to bench only.
        assert!(parse(&["mlpc", "check", "m.json", "--rep-ms", "200"]).is_err());
    }

    #[test]
    fn cache_is_info_unless_told_to_clear_or_trim() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.command);
        assert!(matches!(
            parse(&["mlpc", "cache"]),
            Ok(Command::Cache { action: None })
        ));
        assert!(matches!(
            parse(&["mlpc", "cache", "info"]),
            Ok(Command::Cache {
                action: Some(CacheAction::Info)
            })
        ));
        assert!(matches!(
            parse(&["mlpc", "cache", "clear"]),
            Ok(Command::Cache {
                action: Some(CacheAction::Clear)
            })
        ));
        match parse(&["mlpc", "cache", "trim", "--max-size", "1.5GiB"]) {
            Ok(Command::Cache {
                action: Some(CacheAction::Trim { max_size }),
            }) => assert_eq!(max_size, 3 << 29),
            other => panic!("{other:?}"),
        }
        assert!(parse(&["mlpc", "cache", "trim"]).is_err());
        let e = parse(&["mlpc", "cache", "trim", "--max-size", "5X"]).unwrap_err();
        assert!(
            e.to_string().contains("'5X' for '--max-size <SIZE>'"),
            "{e}"
        );
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
