//! Compiling a model and running the result. The pipeline is one short function,
//! [`Compiler::compile_model`]: every stage is a call into the crate that owns it.

use crate::artifacts::Artifacts;
use crate::backend::Backend;
use crate::error::Error;
use crate::tiles::TileNote;
use crate::Tensors;
use mlpc_codegen::{Arch, CodegenOptions, CudaKernel, TileOverrides};
use mlpc_frontend::Model;
use mlpc_ir::{DType, Graph, Plan, TensorType};
use mlpc_jit::{CompiledKernel, JitOptions};
use mlpc_passes::{Pipeline, PipelineOptions, PipelineReport, PrintAfter, SparseWeight};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What to do about CUDA kernels at compile time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CudaKernels {
    /// Generate the CUDA sources, and compile them to CUBIN/PTX when NVRTC can be loaded.
    #[default]
    IfNvrtc,
    /// Generate and compile them; a missing NVRTC is an error.
    Require,
    /// Neither generate nor compile (a CPU-only build of a model).
    Skip,
}

/// The on / off switches the compiler reads from the environment ([`mlpc_runtime::switch`]):
/// [`f32_fp64_tensor_from_env`], [`sparse_gemv_from_env`], [`bsr_walk_from_env`],
/// [`cpu_bf16_dot_from_env`].
pub(crate) const COMPILER_SWITCHES: [&str; 4] = [
    "MLPC_F32_FP64_TENSOR_CORES",
    "MLPC_SPARSE_GEMV",
    "MLPC_BSR_WALK",
    "MLPC_CPU_BF16_DOT",
];

/// Every on / off switch mlpc reads from the environment, checked: the first whose value is
/// none of `1`, `0`, `true`, `false`, `on`, `off`, `yes`, `no` or empty is an error naming it;
/// and `MLPC_CACHE_MAX_SIZE`, which must be empty or a size
/// ([`mlpc_jit::cache::max_size_from_env`]). The CLI calls this before any command and
/// [`Compiler::compile_model`] before compiling, so that a misspelt value never silently reads
/// as its default (the readers below take a refused value for unset).
pub fn check_environment() -> Result<(), Error> {
    for name in COMPILER_SWITCHES
        .iter()
        .chain(mlpc_runtime::RUNTIME_SWITCHES.iter())
    {
        mlpc_runtime::switch(name)?;
    }
    mlpc_jit::cache::max_size_from_env()?;
    Ok(())
}

/// The f32 GEMM kernel forced when the compiler is not told
/// ([`Compiler::f32_on_fp64_tensor_cores`]), from the switch `MLPC_F32_FP64_TENSOR_CORES`: on
/// forces the FP64 tensor cores, off the FFMA kernels; unset or empty forces neither.
pub(crate) fn f32_fp64_tensor_from_env() -> Option<bool> {
    mlpc_runtime::switch_setting("MLPC_F32_FP64_TENSOR_CORES")
}

/// Compiles models. Every option has a sane default; [`Compiler::new`] gives the standard
/// pipeline, CUDA kernels for `sm_90` when NVRTC is present, and the kernel cache.
#[derive(Clone, Debug, Default)]
pub struct Compiler {
    passes: Option<Vec<String>>,
    verify_each: Option<bool>,
    print_after: Option<PrintAfter>,
    /// `None`: compile for sm_90 and, when running on a GPU, for that GPU's own architecture.
    arch: Option<Arch>,
    cuda: CudaKernels,
    no_cache: bool,
    respecialize: usize,
    emit_weights: bool,
    /// `None`: [`mlpc_runtime::graphs_by_default`].
    cuda_graphs: Option<bool>,
    /// `None`: [`mlpc_runtime::early_launch_by_default`].
    early_launch: Option<bool>,
    /// Neither read nor write the autotune cache.
    no_autotune_cache: bool,
    /// The symbol values whose row counts pick the autotune cache's M bucket.
    tile_bindings: Vec<(String, u64)>,
    /// f32 GEMMs forced onto the FP64 tensor cores (`true`) or the FFMA pipes (`false`)
    /// wherever a kernel offers the choice. `None`: [`f32_fp64_tensor_from_env`].
    f32_fp64_tensor: Option<bool>,
    /// The block-sparse GEMMs' weight-streaming small-M entries. `None`:
    /// [`sparse_gemv_from_env`].
    sparse_gemv: Option<bool>,
    /// The block-sparse persistent entries' work-item tables. `None`: [`bsr_walk_from_env`].
    bsr_walk: Option<bool>,
    /// The CPU backend's bf16 GEMMs on the host's bf16 dot product where it has one. `None`:
    /// [`cpu_bf16_dot_from_env`].
    cpu_bf16_dot: Option<bool>,
    /// Told what a compilation is doing ([`Compiler::progress`]).
    progress: Option<ProgressFn>,
}

/// What a compilation is doing, for a progress display ([`Compiler::progress`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress<'a> {
    /// Reading the model file and its weights file, or generating the weights from the seed.
    Loading(&'a Path),
    /// Pruning, running the passes and lowering to the kernel plan.
    Optimizing,
    /// Generating the CUDA sources of this many kernels.
    Generating(usize),
    /// NVRTC has compiled (or the cache has given) `done` of the `total` distinct kernels, the
    /// last of them `kernel` (empty before the first).
    Compiling {
        done: usize,
        total: usize,
        kernel: &'a str,
    },
}

/// The callback of [`Compiler::progress`].
#[derive(Clone)]
struct ProgressFn(Arc<dyn Fn(Progress<'_>) + Send + Sync>);

impl std::fmt::Debug for ProgressFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressFn")
    }
}

/// Whether the block-sparse GEMMs get their small-M entries when the compiler is not told
/// ([`Compiler::sparse_gemv`]): yes, unless the switch `MLPC_SPARSE_GEMV` is off (`0`).
fn sparse_gemv_from_env() -> bool {
    mlpc_runtime::switch_setting("MLPC_SPARSE_GEMV").unwrap_or(true)
}

/// Whether the Hopper block-sparse GEMMs take work-item tables when the compiler is not told
/// ([`Compiler::bsr_walk`]): only where the switch `MLPC_BSR_WALK` is on (`1`).
fn bsr_walk_from_env() -> bool {
    mlpc_runtime::switch_setting("MLPC_BSR_WALK").unwrap_or(false)
}

/// Whether the CPU backend's bf16 GEMMs use the host's bf16 dot product when the compiler is not
/// told ([`Compiler::cpu_bf16_dot`]): yes, unless the switch `MLPC_CPU_BF16_DOT` is off (`0`).
fn cpu_bf16_dot_from_env() -> bool {
    mlpc_runtime::switch_setting("MLPC_CPU_BF16_DOT").unwrap_or(true)
}

impl Compiler {
    pub fn new() -> Compiler {
        Compiler::default()
    }

    /// The passes to run, by name, instead of the default pipeline
    /// ([`mlpc_passes::DEFAULT_PASSES`]).
    pub fn passes(mut self, names: Vec<String>) -> Compiler {
        self.passes = Some(names);
        self
    }

    /// Verify the graph after every pass (on by default in debug builds).
    pub fn verify_each(mut self, on: bool) -> Compiler {
        self.verify_each = Some(on);
        self
    }

    /// Keep the IR text after the given passes (see [`Compiled::pass_ir`]).
    pub fn print_after(mut self, p: PrintAfter) -> Compiler {
        self.print_after = Some(p);
        self
    }

    /// The GPU architecture CUDA kernels are compiled for. Without it, the artifacts are compiled
    /// for `sm_90` (they run on any Hopper GPU) and a run on a GPU uses kernels compiled for that
    /// GPU's own architecture: `sm_90a` (the wgmma kernels) on Hopper, `sm_80` on Ampere.
    pub fn arch(mut self, arch: Arch) -> Compiler {
        self.arch = Some(arch);
        self
    }

    pub fn cuda_kernels(mut self, mode: CudaKernels) -> Compiler {
        self.cuda = mode;
        self
    }

    /// When a device input's strides break the guards but describe a transposed view of row-major
    /// memory, compile a variant for that layout instead of refusing the input, keeping at most
    /// `limit` variants (0, the default, refuses). CUDA runs only: the CPU and reference
    /// backends take host tensors, which are always row-major.
    pub fn respecialize(mut self, limit: usize) -> Compiler {
        self.respecialize = limit;
        self
    }

    /// Also write the weights the plan reads (`weights.safetensors`, packed as the kernels want
    /// them) among the artifacts, so that the directory runs on its own ([`crate::Bundle`]).
    pub fn emit_weights(mut self, on: bool) -> Compiler {
        self.emit_weights = on;
        self
    }

    /// Whether CUDA runs replay the plan as one CUDA graph when the bindings of the symbolic
    /// dims repeat (from the second run with the same bindings on). On by default, unless the
    /// switch `MLPC_NO_GRAPHS` is on in the environment when a run starts (`1`, `true`,
    /// `on` or `yes`; `0`, `false`, `off`, `no` or empty leave it on; compiles refuse any other
    /// value).
    pub fn cuda_graphs(mut self, on: bool) -> Compiler {
        self.cuda_graphs = Some(on);
        self
    }

    /// Whether CUDA runs let the weight-streaming (small-M) kernels start while the kernel before
    /// them finishes (programmatic dependent launch, sm_90 and later): they issue their first
    /// weight loads early and wait for that kernel before reading its output. On by default,
    /// unless the switch `MLPC_NO_EARLY_LAUNCH` is on in the environment when a run starts (the
    /// values as for [`Compiler::cuda_graphs`]).
    pub fn early_launch(mut self, on: bool) -> Compiler {
        self.early_launch = Some(on);
        self
    }

    /// Neither read nor write the on-disk kernel cache.
    pub fn no_cache(mut self, on: bool) -> Compiler {
        self.no_cache = on;
        self
    }

    /// Whether runs on a Hopper GPU take the GEMM tiles measured by [`Compiled::autotune`] from
    /// the autotune cache, and whether autotuning writes them there (on by default). See
    /// `tiles.rs` for the cache.
    pub fn autotune_cache(mut self, on: bool) -> Compiler {
        self.no_autotune_cache = !on;
        self
    }

    /// Force every f32 GEMM that offers the choice onto the FP64 tensor cores (`true`; sm_90 /
    /// sm_90a: exact products summed in f64, rounded to f32 once) or the FFMA pipes (`false`):
    /// dense GEMMs with k-contiguous operands and constant K and N, block-sparse ones with A
    /// k-contiguous and blocks of 8 to 32 rows. Unset, those GEMMs take the autotune cache's
    /// choice, else the heuristic's (the FP64 tensor cores), unless the environment variable
    /// `MLPC_F32_FP64_TENSOR_CORES` forces one (`1` or `0`). A forced kernel overrides the cache,
    /// in the artifacts and in runs on a device.
    pub fn f32_on_fp64_tensor_cores(mut self, on: bool) -> Compiler {
        self.f32_fp64_tensor = Some(on);
        self
    }

    /// Give the f16 / bf16 block-sparse GEMMs (plain and dual) weight-streaming entries for
    /// outputs of at most 64 rows (decode-time token counts), which runs then launch instead of
    /// the tiled kernel at those sizes. On by default; `false` (or `MLPC_SPARSE_GEMV=0` where
    /// this is not called) keeps the tiled kernel at every size (docs/perf-notes.md,
    /// "Block-sparse at small M", has the timings of both).
    pub fn sparse_gemv(mut self, on: bool) -> Compiler {
        self.sparse_gemv = Some(on);
        self
    }

    /// Give the Hopper block-sparse GEMMs' persistent entries a work-item table the runtime
    /// computes for each launch: each round of tiles goes to the CTAs least loaded so far by the
    /// groups' modelled costs, instead of the kernel's fixed snake (`CodegenOptions::bsr_walk`).
    /// Off by default, and `MLPC_BSR_WALK=1` turns it on where this is not called: checked and
    /// timed on a GPU, it won 1-4 % at some sizes and lost up to 2.6 % at others
    /// (docs/perf-notes.md, block-sparse variant 47).
    pub fn bsr_walk(mut self, on: bool) -> Compiler {
        self.bsr_walk = Some(on);
        self
    }

    /// Run the CPU backend's GEMMs of bf16 operands on the host's bf16 dot product (AVX-512
    /// BF16's `vdpbf16ps`) where it has one: about twice the multiply-adds of its f32 FMAs,
    /// the same exact products summed in another order, subnormals flushed to zero
    /// (docs/perf-notes.md, "bf16 GEMMs on the bf16 dot product"). On by default; `false` (or
    /// `MLPC_CPU_BF16_DOT=0` where this is not called) keeps the f32 FMA kernels, whose outputs
    /// are the same on every host.
    pub fn cpu_bf16_dot(mut self, on: bool) -> Compiler {
        self.cpu_bf16_dot = Some(on);
        self
    }

    pub(crate) fn uses_cpu_bf16_dot(&self) -> bool {
        self.cpu_bf16_dot.unwrap_or_else(cpu_bf16_dot_from_env)
    }

    /// The code generation options for `arch` and a model's TF32 permission.
    pub(crate) fn codegen_options(&self, arch: Arch, allow_tf32: bool) -> CodegenOptions {
        CodegenOptions {
            arch,
            allow_tf32,
            sparse_gemv: self.sparse_gemv.unwrap_or_else(sparse_gemv_from_env),
            bsr_walk: self.bsr_walk.unwrap_or_else(bsr_walk_from_env),
        }
    }

    /// The f32 GEMM kernel forced, if any: `Some(true)` the FP64 tensor cores.
    fn forced_f32_kernel(&self) -> Option<bool> {
        self.f32_fp64_tensor.or_else(f32_fp64_tensor_from_env)
    }

    /// The symbol values (e.g. `[("T", 8192)]`) the runs are expected at: the autotune cache's
    /// entry for the matching row count is taken. Without them, or for a row count never
    /// measured, the entry measured at the largest row count of the key is taken.
    pub fn tile_bindings(mut self, bindings: Vec<(String, u64)>) -> Compiler {
        self.tile_bindings = bindings;
        self
    }

    pub(crate) fn uses_autotune_cache(&self) -> bool {
        !self.no_autotune_cache
    }

    /// Calls `f` as a compilation moves on ([`Progress`]), from the compiling threads: for a
    /// progress display on long compilations (a large model's weights, many kernels for NVRTC).
    pub fn progress(mut self, f: impl Fn(Progress<'_>) + Send + Sync + 'static) -> Compiler {
        self.progress = Some(ProgressFn(Arc::new(f)));
        self
    }

    fn report(&self, p: Progress<'_>) {
        if let Some(f) = &self.progress {
            (f.0)(p);
        }
    }

    /// Reads `model.json` (and the weights it names) and compiles it.
    pub fn compile_file(&self, path: &Path) -> Result<Compiled, Error> {
        self.report(Progress::Loading(path));
        let model = mlpc_frontend::load_model(path)?;
        self.compile_model(model)
    }

    /// Compiles a model that is already in memory, e.g. one a framework built from its own
    /// module tree.
    pub fn compile_model(&self, mut model: Model) -> Result<Compiled, Error> {
        check_environment()?;
        mlpc_ir::verify(&model.graph)?;
        self.report(Progress::Optimizing);
        let sparse: Vec<SparseWeight> = model
            .sparsity
            .iter()
            .map(|s| SparseWeight {
                with: s.with.clone(),
                ..SparseWeight::new(s.weight.clone(), s.block, s.density)
            })
            .collect();
        let prune = mlpc_passes::PruneBlockSparse::new(sparse);
        // A model that prunes weights means its pruned weights: `prune-block-sparse` runs over
        // the source graph first, zeroing the dropped blocks in place where the model holds the
        // only reference (else in a copy, the caller's data untouched). The pipeline's run of the
        // same pass over the copy of that graph finds them pruned (a clone shares what it
        // pruned), so no dense pruned copy of a weight lives beside the source one, and the
        // reference interprets the source graph itself.
        let mut pruned_source = None;
        if !prune.specs().is_empty() {
            use mlpc_passes::Pass;
            let started = std::time::Instant::now();
            let mut prov = mlpc_passes::Provenance::new(&model.graph);
            let changed = prune.run(&mut model.graph, &mut prov)?;
            pruned_source = Some((prune.name(), changed, started.elapsed()));
        }
        let pipeline = match &self.passes {
            Some(names) => Pipeline::from_names(names)?,
            None => Pipeline::default(),
        }
        .with_pruning(prune);
        let mut opts = PipelineOptions::default();
        if let Some(v) = self.verify_each {
            opts.verify_each = v;
        }
        if let Some(p) = &self.print_after {
            opts.print_after = p.clone();
        }
        let mut optimized = model.graph.clone();
        let mut report = pipeline.run(&mut optimized, &opts)?;
        drop(pipeline);
        // The pruning's work, done over the source graph, is the pass's in the report.
        if let Some((name, changed, time)) = pruned_source {
            if let Some(p) = report.passes.iter_mut().find(|p| p.name == name) {
                p.changed |= changed;
                p.time += time;
            }
        }
        let plan = mlpc_passes::lower_plan(&optimized, &report.provenance)?;
        let explain = mlpc_passes::explain(&model.graph, &optimized, &plan, &report.provenance);

        let cuda = match self.cuda {
            CudaKernels::Skip => None,
            mode => {
                let opts = self.codegen_options(self.arch.unwrap_or(Arch::Sm90), model.allow_tf32);
                self.report(Progress::Generating(plan.kernels.len()));
                let kernels = self.generate(&plan, &opts)?;
                let jit = self.jit_options();
                let compile_all = |kernels: &[CudaKernel]| {
                    mlpc_jit::compile_all_reporting(kernels, &jit, &|done, total, kernel| {
                        self.report(Progress::Compiling {
                            done,
                            total,
                            kernel,
                        })
                    })
                };
                let compiled = match mode {
                    CudaKernels::Require => Some(compile_all(&kernels)?),
                    _ => match mlpc_jit::ensure_nvrtc() {
                        Ok(_) => Some(compile_all(&kernels)?),
                        // A library named (MLPC_NVRTC_LIB) or found that is not usable NVRTC
                        // is an error, not a quiet "sources only".
                        Err(
                            e @ (mlpc_jit::JitError::NvrtcLibInvalid { .. }
                            | mlpc_jit::JitError::NvrtcByNameInvalid { .. }),
                        ) => return Err(e.into()),
                        Err(_) => None,
                    },
                };
                Some(CudaBuild {
                    kernels,
                    compiled: Mutex::new(compiled.map(Arc::new)),
                    jit,
                })
            }
        };
        Ok(Compiled {
            compiler: self.clone(),
            variants: Mutex::new(Vec::new()),
            model,
            optimized,
            report,
            plan,
            explain,
            cuda,
            arch: self.arch.unwrap_or(Arch::Sm90),
            forced_tiles: None,
            cpu: Mutex::new(None),
            gpu: Mutex::new(None),
        })
    }

    /// The plan's CUDA kernels for `opts` with the heuristic's tiles, and the f32 GEMMs' forced
    /// kernel if any (code generation only).
    fn generate(&self, plan: &Plan, opts: &CodegenOptions) -> Result<Vec<CudaKernel>, Error> {
        let mut tiles = TileOverrides::new();
        if let Some(fp64) = self.forced_f32_kernel() {
            crate::tiles::force_f32_kernel(plan, opts, &mut tiles, fp64)?;
        }
        Ok(mlpc_codegen::generate_tiled(plan, opts, &tiles)?)
    }

    pub(crate) fn jit_options(&self) -> JitOptions {
        JitOptions {
            arch: self.arch.unwrap_or(Arch::Sm90),
            no_cache: self.no_cache,
            cache_dir: None,
        }
    }
}

/// The CUDA side of a compilation: generated kernels, and their CUBINs once compiled.
#[derive(Debug)]
pub(crate) struct CudaBuild {
    pub(crate) kernels: Vec<CudaKernel>,
    pub(crate) compiled: Mutex<Option<Arc<Vec<CompiledKernel>>>>,
    pub(crate) jit: JitOptions,
}

/// A compiled model: ready to run on a backend, and to write its artifacts.
pub struct Compiled {
    compiler: Compiler,
    /// Variants compiled for other input layouts: (transposed inputs, model), oldest first.
    variants: Mutex<Vec<(Vec<String>, Arc<Compiled>)>>,
    model: Model,
    optimized: Graph,
    report: PipelineReport,
    plan: Plan,
    explain: String,
    cuda: Option<CudaBuild>,
    arch: Arch,
    /// Hopper GEMM tiles forced for runs on a device (a candidate being measured); `None`: the
    /// autotune cache's, else the heuristic's.
    forced_tiles: Option<TileOverrides>,
    cpu: Mutex<Option<Arc<crate::cpu::CpuState>>>,
    gpu: Mutex<Option<Arc<crate::cuda::GpuState>>>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("name", &self.name())
            .field("kernels", &self.plan.kernels.len())
            .finish()
    }
}

impl Compiled {
    /// The model as loaded: the source graph, its sparsity specs and options. A model that
    /// prunes weights to block-sparse holds them pruned (what it means): the compilation zeroes
    /// their dropped blocks, in place where the model held the only reference to their data.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The verified source graph: what the model means (its selected weights pruned, see
    /// [`Compiled::model`]).
    pub fn graph(&self) -> &Graph {
        &self.model.graph
    }

    /// Reads the model's inputs from a safetensors file, by name. A tensor the model does not
    /// take is refused as an unexpected input before any dtype of it is looked at (an integer
    /// tensor beside the inputs is an unexpected input, not an unsupported dtype).
    pub fn read_inputs(&self, path: &Path) -> Result<Tensors, Error> {
        let g = self.graph();
        let names: Vec<&str> = g
            .inputs()
            .iter()
            .map(|&i| g.node(i).name.as_str())
            .collect();
        let (inputs, others) = mlpc_frontend::read_tensors_named(path, &names)?;
        mlpc_ir::check_input_names(g, others.iter().map(String::as_str))
            .map_err(mlpc_ir::InterpError::Input)?;
        Ok(inputs)
    }

    /// The graph after the passes: what the kernels compute.
    pub fn optimized(&self) -> &Graph {
        &self.optimized
    }

    /// The graph the reference backend interprets: the source graph, whose selected weights,
    /// when the model prunes weights to block-sparse, the compilation pruned
    /// (`prune-block-sparse` alone: pruning changes the function on purpose; every other pass,
    /// the block-sparse lowering included, preserves it, which the reference checks).
    pub fn reference_graph(&self) -> &Graph {
        &self.model.graph
    }

    /// The kernel plan every backend runs.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Per-pass report: timings, changes, IR text where asked, provenance.
    pub fn report(&self) -> &PipelineReport {
        &self.report
    }

    /// The `--explain` table: what became of every source node.
    pub fn explain(&self) -> &str {
        &self.explain
    }

    /// The IR text after each pass that [`Compiler::print_after`] selected, as (pass, text).
    pub fn pass_ir(&self) -> Vec<(&str, &str)> {
        self.report
            .passes
            .iter()
            .filter_map(|p| p.ir_text.as_deref().map(|t| (p.name, t)))
            .collect()
    }

    /// The generated CUDA kernels, if CUDA kernels were generated.
    pub fn cuda_kernels(&self) -> Option<&[CudaKernel]> {
        self.cuda.as_ref().map(|c| c.kernels.as_slice())
    }

    /// The CUBIN/PTX of every kernel, compiling them now if the compilation did not.
    pub(crate) fn compiled_kernels(
        &self,
    ) -> Result<(Vec<CudaKernel>, Arc<Vec<CompiledKernel>>), Error> {
        let build = match &self.cuda {
            Some(b) => b,
            None => return Err(Error::NoCudaKernels),
        };
        let mut slot = build.compiled.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(Arc::new(mlpc_jit::compile_all(&build.kernels, &build.jit)?));
        }
        let compiled = slot.clone().ok_or(Error::NoCudaKernels)?;
        Ok((build.kernels.clone(), compiled))
    }

    /// The architecture the artifacts' kernels were compiled for.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The architecture the CUDA backend compiles for on a device of compute capability
    /// `(major, minor)`: the one asked for, else the device's own.
    pub(crate) fn arch_for_device(&self, cc: (i32, i32)) -> Result<Arch, Error> {
        if let Some(a) = self.compiler.arch {
            return Ok(a);
        }
        match cc {
            (9, 0) => Ok(Arch::Sm90a),
            (8, _) => Ok(Arch::Sm80),
            (9, _) => Ok(Arch::Sm90),
            (major, minor) => Err(Error::UnsupportedDevice(format!(
                "compute capability {major}.{minor}: mlpc generates kernels for sm_80 and sm_90 (Hopper)"
            ))),
        }
    }

    /// The plan's kernels generated and compiled for `arch` with the Hopper GEMM tiles `tiles`
    /// (the disk cache makes a repeat cheap).
    pub(crate) fn kernels_for(
        &self,
        arch: Arch,
        tiles: &TileOverrides,
    ) -> Result<(Vec<CudaKernel>, Arc<Vec<CompiledKernel>>), Error> {
        if arch == self.arch && tiles.is_empty() {
            return self.compiled_kernels();
        }
        let kernels = mlpc_codegen::generate_tiled(
            &self.plan,
            &self.compiler.codegen_options(arch, self.model.allow_tf32),
            tiles,
        )?;
        let jit = JitOptions {
            arch,
            ..self.compiler.jit_options()
        };
        let compiled = mlpc_jit::compile_all(&kernels, &jit)?;
        Ok((kernels, Arc::new(compiled)))
    }

    /// The Hopper GEMM tiles of a run on `device` (its [`mlpc_runtime::Device::describe`]) for
    /// `arch`: the forced ones, else the autotune cache's winners, else the heuristic's; and one
    /// note per tunable kernel saying which.
    pub(crate) fn device_tiles(
        &self,
        arch: Arch,
        device: &str,
    ) -> Result<(TileOverrides, Vec<TileNote>), Error> {
        let opts = self.compiler.codegen_options(arch, self.model.allow_tf32);
        let (mut tiles, mut notes) = self.chosen_tiles(&opts, device)?;
        // The option overrides the heuristic and the cache, not a candidate being measured.
        let forced = self.compiler.forced_f32_kernel();
        if let (Some(fp64), None) = (forced, &self.forced_tiles) {
            for key in crate::tiles::force_f32_kernel(&self.plan, &opts, &mut tiles, fp64)? {
                for n in notes.iter_mut().filter(|n| n.key == key) {
                    n.choice = tiles.get(&key).unwrap_or(n.choice);
                    n.source = crate::tiles::TileSource::Forced;
                }
            }
        }
        Ok((tiles, notes))
    }

    /// [`Compiled::device_tiles`] before the f32 GEMMs' FP64 tensor-core option.
    fn chosen_tiles(
        &self,
        opts: &CodegenOptions,
        device: &str,
    ) -> Result<(TileOverrides, Vec<TileNote>), Error> {
        let arch = opts.arch;
        if let Some(t) = &self.forced_tiles {
            return Ok((t.clone(), crate::tiles::forced_notes(&self.plan, opts, t)?));
        }
        let none = TileOverrides::new();
        if arch != Arch::Sm90a || !self.compiler.uses_autotune_cache() {
            return Ok((
                none.clone(),
                crate::tiles::forced_notes(&self.plan, opts, &none)?,
            ));
        }
        // With no cache directory at all there is nothing to look up: the heuristic's tiles
        // (only `--autotune`, which has to write the file, makes that an error).
        let cache = match crate::tiles::default_tile_cache_path() {
            Ok(path) => crate::tiles::TileCache::load(&path)?,
            Err(_) => crate::tiles::TileCache::default(),
        };
        let mut bindings = mlpc_ir::Bindings::new();
        for (s, v) in &self.compiler.tile_bindings {
            // A conflicting repeat keeps the first value: the bucket is a speed hint only.
            let _ = bindings.bind(&s.as_str().into(), *v);
        }
        crate::tiles::cached_tiles(&self.plan, opts, &cache, device, &bindings)
    }

    /// This compilation with the Hopper GEMM tiles `tiles` forced for runs on a device (the
    /// device state is not shared: the next run loads the kernels anew).
    pub(crate) fn with_tiles(&self, tiles: TileOverrides) -> Compiled {
        Compiled {
            compiler: self.compiler.clone(),
            variants: Mutex::new(Vec::new()),
            model: self.model.clone(),
            optimized: self.optimized.clone(),
            report: self.report.clone(),
            plan: self.plan.clone(),
            explain: self.explain.clone(),
            cuda: self.cuda.as_ref().map(|b| CudaBuild {
                kernels: b.kernels.clone(),
                compiled: Mutex::new(b.compiled.lock().unwrap_or_else(|p| p.into_inner()).clone()),
                jit: b.jit.clone(),
            }),
            arch: self.arch,
            forced_tiles: Some(tiles),
            cpu: Mutex::new(None),
            gpu: Mutex::new(None),
        }
    }

    pub(crate) fn compiler(&self) -> &Compiler {
        &self.compiler
    }

    /// Which Hopper GEMM tile each tunable kernel runs with on the device, and why (the
    /// heuristic, the autotune cache): empty until the CUDA backend has loaded the kernels (the
    /// first CUDA run, [`Compiled::autotune`]), and on devices without tunable kernels.
    pub fn tile_notes(&self) -> Vec<TileNote> {
        self.gpu
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|g| g.tiles.clone())
            .unwrap_or_default()
    }

    /// The architecture whose kernels [`Compiled::launch_plan`] and [`Compiled::entry_map`]
    /// describe: the one asked for, else `sm_90a`, the kernels a run on a Hopper GPU compiles
    /// for itself (the artifacts of such a compilation are `sm_90`'s; see [`Compiler::arch`]).
    pub fn launch_arch(&self) -> Arch {
        self.compiler.arch.unwrap_or(Arch::Sm90a)
    }

    /// The kernels of [`Compiled::launch_arch`] with the heuristic's tiles (and the f32 GEMMs'
    /// forced kernel, if any): this compilation's own when that is its architecture, else
    /// generated anew (code generation only; nothing is compiled). `None` without CUDA kernels.
    fn launch_kernels(&self) -> Result<Option<std::borrow::Cow<'_, [CudaKernel]>>, Error> {
        let Some(own) = self.cuda_kernels() else {
            return Ok(None);
        };
        let arch = self.launch_arch();
        if arch == self.arch {
            return Ok(Some(std::borrow::Cow::Borrowed(own)));
        }
        let opts = self.compiler.codegen_options(arch, self.model.allow_tf32);
        let kernels = self.compiler.generate(&self.plan, &opts)?;
        Ok(Some(std::borrow::Cow::Owned(kernels)))
    }

    /// Which entry each CUDA kernel of [`Compiled::launch_arch`] launches under `bindings` on a
    /// device of `sms` multiprocessors, as the runtime chooses it (`CudaKernel::choose_entry`;
    /// kernels in clusters as if every SM held one of their CTAs), one line each: the kernel,
    /// the entry, its tiles, grid and workspace. The tiles are the heuristic's (a run on a
    /// device may take others from the autotune cache).
    pub fn launch_plan(&self, bindings: &[(&str, u64)], sms: u32) -> Result<Vec<String>, Error> {
        self.check_bindings(bindings)?;
        check_sms(sms)?;
        let kernels = self.launch_kernels()?.ok_or(Error::NoCudaKernels)?;
        let mut b = mlpc_ir::Bindings::new();
        for &(s, v) in bindings {
            if v == 0 {
                return Err(Error::Launches(format!(
                    "symbol `{s}` is bound to 0; dimensions are at least 1"
                )));
            }
            b.bind(&s.into(), v).map_err(|first| {
                Error::Launches(format!("symbol `{s}` is bound twice, to {first} and {v}"))
            })?;
        }
        kernels
            .iter()
            .map(|k| {
                let c = k
                    .choose_entry(&b, sms, None)
                    .map_err(|e| Error::Launches(format!("kernel `{}`: {e}", k.name)))?;
                let tiles = match &c.launch.grid {
                    mlpc_codegen::Grid::Persistent { tile_m, tile_n, .. }
                    | mlpc_codegen::Grid::Tiles { tile_m, tile_n, .. }
                    | mlpc_codegen::Grid::RowTiles { tile_m, tile_n, .. } => {
                        format!(", tiles {tile_m}x{tile_n}")
                    }
                    mlpc_codegen::Grid::Elements { .. } => String::new(),
                };
                let [x, y, z] = c.grid;
                let workspace = match c.workspace_bytes {
                    0 => String::new(),
                    n => format!(", workspace {n} bytes"),
                };
                Ok(format!(
                    "{}: {}{tiles}, grid {x}x{y}x{z}{workspace}",
                    k.name, c.entry
                ))
            })
            .collect()
    }

    /// Which entry each CUDA kernel of [`Compiled::launch_arch`] launches as the plan's one
    /// symbolic dimension runs from 1 to `max`, on a device of `sms` multiprocessors
    /// ([`Compiled::launch_plan`]'s rule),
    /// as ranges: one line per kernel, e.g. `gemm_bias_bf16_nt (ENTRY): T 1-8 gemv_m8; ...;
    /// 5505- own`, each entry by what its name adds to the kernel's own (see `entry_tag`).
    /// `None` when the plan has no CUDA kernels or not exactly one symbolic dimension.
    pub fn entry_map(&self, sms: u32, max: u64) -> Result<Option<Vec<String>>, Error> {
        check_sms(sms)?;
        if !(1..=ENTRY_MAP_LIMIT).contains(&max) {
            return Err(Error::Launches(format!(
                "an entry map up to {max}: it maps sizes 1 to at most {ENTRY_MAP_LIMIT}"
            )));
        }
        let Some(kernels) = self.launch_kernels()? else {
            return Ok(None);
        };
        let mut syms: Vec<mlpc_ir::Symbol> = Vec::new();
        for b in &self.plan.buffers {
            for s in b.ty.symbols() {
                if !syms.contains(&s) {
                    syms.push(s);
                }
            }
        }
        let [sym] = syms.as_slice() else {
            return Ok(None);
        };
        let mut lines = Vec::new();
        for k in kernels.iter() {
            // (first value, last value, entry) runs of the same entry.
            let mut runs: Vec<(u64, u64, String)> = Vec::new();
            for v in 1..=max {
                let mut b = mlpc_ir::Bindings::new();
                b.bind(sym, v).map_err(|e| Error::Launches(e.to_string()))?;
                let c = k
                    .choose_entry(&b, sms, None)
                    .map_err(|e| Error::Launches(format!("kernel `{}`: {e}", k.name)))?;
                match runs.last_mut() {
                    Some((_, last, e)) if e == c.entry => *last = v,
                    _ => runs.push((v, v, c.entry.to_string())),
                }
            }
            let parts: Vec<String> = runs
                .iter()
                .map(|(first, last, e)| {
                    let span = match (first, last) {
                        (f, l) if f == l => f.to_string(),
                        (f, &l) if l == max => format!("{f}-"),
                        (f, l) => format!("{f}-{l}"),
                    };
                    format!("{span} {}", entry_tag(&k.entry, e))
                })
                .collect();
            lines.push(format!(
                "{} ({}): {sym} {}",
                k.name,
                k.entry,
                parts.join("; ")
            ));
        }
        Ok(Some(lines))
    }

    /// The explain text with the bytes of the block-sparse kernels' tables (their kept-block
    /// lists and schedules, compiled into the kernel images beside the packed weights' index
    /// arrays) and, once the kernels run on a device, the Hopper GEMM tile of each tunable
    /// kernel and where it came from.
    pub fn explain_with_tiles(&self) -> String {
        let mut s = self.explain.clone();
        let tables: Vec<(&str, u64)> = self
            .cuda_kernels()
            .unwrap_or_default()
            .iter()
            .map(|k| (k.name.as_str(), k.table_bytes()))
            .filter(|&(_, b)| b > 0)
            .collect();
        let notes = self.tile_notes();
        if !s.ends_with('\n') && (!tables.is_empty() || !notes.is_empty()) {
            s.push('\n');
        }
        if !tables.is_empty() {
            let total: u64 = tables.iter().map(|t| t.1).sum();
            s.push_str(&format!(
                "block-sparse kernel tables ({} kernels, compiled into their images): {total} \
                 bytes\n",
                self.arch
            ));
            for (name, bytes) in tables {
                s.push_str(&format!("  {name}: {bytes} bytes\n"));
            }
        }
        if !notes.is_empty() {
            s.push_str("\nHopper GEMM tiles (sm_90a, on this device):\n");
            for n in notes {
                s.push_str(&format!("  {n}\n"));
            }
        }
        s
    }

    pub fn name(&self) -> &str {
        &self.model.graph.name
    }

    /// What a user should know although the compilation succeeded, one sentence each: weights the
    /// `sparsity` section selects that some reader still reads dense, and why.
    pub fn warnings(&self) -> Vec<String> {
        self.report
            .provenance
            .stays_dense()
            .iter()
            .map(|(w, why)| {
                format!("weight `{w}` is selected for block sparsity but read dense: {why}")
            })
            .collect()
    }

    /// What the compilation produced, at a glance.
    pub fn summary(&self) -> Summary {
        let g = self.graph();
        let nodes: Vec<_> = g.node_ids().map(|id| g.node(id)).collect();
        let mut dtypes: Vec<DType> = nodes.iter().map(|n| n.ty.dtype).collect();
        dtypes.sort();
        dtypes.dedup();
        let compiled = self
            .cuda
            .as_ref()
            .map(|c| {
                c.compiled
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_some()
            })
            .unwrap_or(false);
        Summary {
            name: g.name.clone(),
            dtypes,
            inputs: g
                .inputs()
                .into_iter()
                .map(|id| (g.node(id).name.clone(), g.node(id).ty.clone()))
                .collect(),
            outputs: g
                .outputs()
                .iter()
                .map(|o| (o.name.clone(), g.node(o.node).ty.clone()))
                .collect(),
            nodes: nodes.len(),
            ops: nodes.iter().filter(|n| !n.op.is_leaf()).count(),
            weights: g.weights().len(),
            weight_bytes: g.weights().values().map(|w| w.bytes().len() as u64).sum(),
            compiled_weight_bytes: self
                .optimized()
                .weights()
                .values()
                .map(|w| w.bytes().len() as u64)
                .sum(),
            sparse_weights: self.model.sparsity.len(),
            packed_weights: mlpc_passes::packed_weights(self.optimized()).len(),
            unused_sparse_weights: self
                .model
                .sparsity
                .iter()
                .filter(|w| {
                    self.report.provenance.fate(&w.weight) == Some(&mlpc_passes::Fate::Removed)
                })
                .count(),
            stays_dense: self
                .report
                .provenance
                .stays_dense()
                .iter()
                .map(|(w, why)| (w.clone(), why.clone()))
                .collect(),
            kernels_before: mlpc_passes::unfused_kernel_count(g),
            kernels: self.plan.kernels.iter().map(|k| k.name.clone()).collect(),
            cuda: match (&self.cuda, compiled) {
                (None, _) => CudaStatus::Skipped,
                (Some(_), false) => CudaStatus::SourcesOnly,
                (Some(_), true) => CudaStatus::Compiled(self.arch.name()),
            },
        }
    }

    /// The files of the compilation: `graph.txt` (the source IR), `optimized.txt`, `plan.json`,
    /// `explain.txt`, and `kernels/` (`.cu` sources with the template headers they include, and,
    /// when compiled, `.cubin`, `.ptx` and a `.json` launch description per kernel).
    pub fn artifacts(&self) -> Result<Artifacts, Error> {
        let mut a = Artifacts::new();
        a.add(Artifacts::MARKER, self.graph().to_string());
        a.add("optimized.txt", self.optimized.to_string());
        a.add(
            "plan.json",
            serde_json::to_string_pretty(&self.plan).map_err(Error::Serialize)?,
        );
        a.add("explain.txt", self.explain_with_tiles());
        if self.compiler.emit_weights {
            a.add_tensors("weights.safetensors", self.optimized.weights().clone())?;
        }
        if let Some(build) = &self.cuda {
            for (name, text) in mlpc_codegen::headers() {
                a.add(Path::new("kernels").join(name), text);
            }
            let compiled = build
                .compiled
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            for (i, k) in build.kernels.iter().enumerate() {
                let dir = Path::new("kernels");
                a.add(dir.join(format!("{}.cu", k.name)), k.source.clone());
                let c = compiled.as_ref().and_then(|c| c.get(i));
                if let Some(c) = c {
                    a.add(dir.join(format!("{}.cubin", k.name)), c.cubin.clone());
                    a.add(dir.join(format!("{}.ptx", k.name)), c.ptx.clone());
                }
                // The serialised kernel (what the runtime needs to launch it), plus the
                // architecture and what ptxas reported.
                let mut manifest = serde_json::to_value(k).map_err(Error::Serialize)?;
                if let Some(m) = manifest.as_object_mut() {
                    m.insert("arch".into(), self.arch.name().into());
                    m.insert(
                        "resources".into(),
                        match c.filter(|c| c.resources_known) {
                            Some(c) => serde_json::json!({
                                "registers": c.resources.registers,
                                "stack_frame_bytes": c.resources.stack_frame_bytes,
                                "spill_store_bytes": c.resources.spill_store_bytes,
                                "spill_load_bytes": c.resources.spill_load_bytes,
                            }),
                            None => serde_json::Value::Null,
                        },
                    );
                }
                a.add(
                    dir.join(format!("{}.json", k.name)),
                    serde_json::to_string_pretty(&manifest).map_err(Error::Serialize)?,
                );
            }
        }
        a.add_checksums()?;
        Ok(a)
    }

    /// Writes [`Compiled::artifacts`] into `dir`, all at once (see [`Artifacts::write_to`]).
    pub fn write_to(&self, dir: &Path) -> Result<Vec<PathBuf>, Error> {
        self.artifacts()?.write_to(dir)
    }

    /// Refuses a binding of a symbol no input of the model has (a misspelt name, which would
    /// otherwise be ignored whenever the real symbols are bound too).
    pub fn check_bindings(&self, bindings: &[(&str, u64)]) -> Result<(), Error> {
        Ok(mlpc_frontend::check_bound_symbols(self.graph(), bindings)?)
    }

    /// Deterministic random inputs for the model, with the symbolic dims bound as given
    /// (e.g. `[("T", 8)]`); a binding of a symbol no input has is an error.
    pub fn random_inputs(&self, bindings: &[(&str, u64)], seed: u64) -> Result<Tensors, Error> {
        Ok(mlpc_frontend::random_inputs(self.graph(), bindings, seed)?)
    }

    /// Runs the model on `backend`. Inputs are matched by name and checked (dtype, shape, the
    /// binding of symbolic dims) before anything runs; outputs come back by name.
    pub fn run(&self, backend: Backend, inputs: &Tensors) -> Result<Tensors, Error> {
        self.run_with(backend, inputs, false)
    }

    /// [`Compiled::run`], optionally filling outputs and intermediates with NaN first (on the
    /// CUDA backend), so that an element no kernel writes cannot pass a comparison.
    pub fn run_with(
        &self,
        backend: Backend,
        inputs: &Tensors,
        poison: bool,
    ) -> Result<Tensors, Error> {
        backend.require()?;
        match backend {
            Backend::Reference => Ok(mlpc_ir::interpret(self.reference_graph(), inputs)?),
            Backend::Cpu => self.cpu_state()?.run(inputs),
            Backend::Cuda => self.gpu_state()?.run(inputs, self.run_options(poison)),
        }
    }

    /// The options of a CUDA run: poisoning as asked, graphs and early launches as the compiler
    /// says ([`Compiler::cuda_graphs`], [`Compiler::early_launch`]).
    pub fn run_options(&self, poison: bool) -> mlpc_runtime::RunOptions {
        mlpc_runtime::RunOptions {
            poison,
            graphs: self
                .compiler
                .cuda_graphs
                .unwrap_or_else(mlpc_runtime::graphs_by_default),
            early_launch: self
                .compiler
                .early_launch
                .unwrap_or_else(mlpc_runtime::early_launch_by_default),
        }
    }

    /// The loaded CUDA executable (the device opened and the kernels loaded on first use), for
    /// callers that want the runtime's own API: runs with explicit [`mlpc_runtime::RunOptions`],
    /// [`mlpc_runtime::Executable::graph_stats`], [`mlpc_runtime::Executable::launches_for`].
    pub fn executable(&self) -> Result<Arc<mlpc_runtime::Executable>, Error> {
        Ok(self.gpu_state()?.exe.clone())
    }

    /// The device the CUDA backend runs on (opened on first use), for callers that keep their
    /// tensors on the GPU. Each model opens a stream of its own unless told otherwise
    /// ([`Compiled::use_device`]).
    pub fn device(&self) -> Result<mlpc_runtime::Device, Error> {
        Ok(self.gpu_state()?.exe.device().clone())
    }

    /// Runs this model's CUDA kernels on `device` and its stream, e.g. another model's
    /// ([`Compiled::device`]): models whose device tensors pass from one to the next then run
    /// in that stream's order, with no synchronisation between them (on streams of their own,
    /// the caller would have to synchronise). Loads the kernels now; must come before the
    /// model's first CUDA run, or name the device it already runs on.
    pub fn use_device(&self, device: &mlpc_runtime::Device) -> Result<(), Error> {
        let state = self.gpu_state_on(device)?;
        if !Arc::ptr_eq(state.exe.device().stream(), device.stream()) {
            return Err(Error::DeviceInUse(self.plan.name.clone()));
        }
        Ok(())
    }

    /// Runs the CUDA kernels on tensors already on the device, enqueued on the device's stream:
    /// the embedding API. Every input is checked against the guards first (dtype, shape, symbolic
    /// dims, strides, alignment, device); a violation is an [`mlpc_runtime::GuardError`], never a
    /// wrong result.
    pub fn run_device(
        &self,
        inputs: &std::collections::BTreeMap<String, mlpc_runtime::DeviceTensor>,
    ) -> Result<std::collections::BTreeMap<String, mlpc_runtime::DeviceTensor>, Error> {
        match self.gpu_state()?.exe.run(inputs, self.run_options(false)) {
            Err(mlpc_runtime::RuntimeError::Guard(g))
                if g.is_layout() && self.compiler.respecialize > 0 =>
            {
                self.run_variant(inputs, g)
            }
            r => Ok(r?),
        }
    }

    /// Runs the variant compiled for the inputs' layout (see [`crate::transpose_inputs`]), or
    /// returns `refused` when no variant can take these strides.
    fn run_variant(
        &self,
        inputs: &std::collections::BTreeMap<String, mlpc_runtime::DeviceTensor>,
        refused: mlpc_runtime::GuardError,
    ) -> Result<std::collections::BTreeMap<String, mlpc_runtime::DeviceTensor>, Error> {
        let refuse = || Error::Runtime(mlpc_runtime::RuntimeError::Guard(refused.clone()));
        let mut transposed = Vec::new();
        for (name, t) in inputs {
            if crate::respecialize::is_contiguous(&t.shape, &t.strides) {
                continue;
            }
            if !crate::respecialize::is_transposed_view(&t.shape, &t.strides) {
                return Err(refuse());
            }
            transposed.push(name.clone());
        }
        if transposed.is_empty() {
            return Err(refuse());
        }
        let variant = {
            let mut variants = self.variants.lock().unwrap_or_else(|p| p.into_inner());
            match variants.iter().find(|(k, _)| *k == transposed) {
                Some((_, v)) => v.clone(),
                None => {
                    let mut model = self.model.clone();
                    model.graph =
                        crate::respecialize::transpose_inputs(&self.model.graph, &transposed)?;
                    let v = Arc::new(self.compiler.compile_model(model)?);
                    if variants.len() >= self.compiler.respecialize {
                        variants.remove(0);
                    }
                    variants.push((transposed.clone(), v.clone()));
                    v
                }
            }
        };
        // Hand each transposed input over as the row-major memory it is.
        let refs: std::collections::BTreeMap<String, mlpc_runtime::TensorRef<'_>> = inputs
            .iter()
            .map(|(n, t)| {
                let mut r = t.as_ref();
                if transposed.contains(n) {
                    let k = r.shape.len();
                    r.shape.swap(k - 2, k - 1);
                    r.strides.swap(k - 2, k - 1);
                }
                (n.clone(), r)
            })
            .collect();
        // On this model's device and stream: the inputs were written, and the outputs will be
        // read, in that stream's order (a device of its own would race with both).
        let device = self.gpu_state()?.exe.device().clone();
        Ok(variant
            .gpu_state_on(&device)?
            .exe
            .run_refs(&refs, self.run_options(false))?)
    }

    pub(crate) fn cpu_state(&self) -> Result<Arc<crate::cpu::CpuState>, Error> {
        let mut slot = self.cpu.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slot.as_ref() {
            return Ok(s.clone());
        }
        let s = Arc::new(crate::cpu::CpuState::new(
            &self.plan,
            &self.optimized,
            self.compiler.uses_cpu_bf16_dot(),
        )?);
        *slot = Some(s.clone());
        Ok(s)
    }

    pub(crate) fn gpu_state(&self) -> Result<Arc<crate::cuda::GpuState>, Error> {
        self.gpu_state_with(|| Ok(mlpc_runtime::Device::open(0)?))
    }

    /// [`Compiled::gpu_state`], made on `device` (its stream) if it does not exist yet: a
    /// variant's kernels run on its model's stream, where the caller's tensors are ordered.
    fn gpu_state_on(
        &self,
        device: &mlpc_runtime::Device,
    ) -> Result<Arc<crate::cuda::GpuState>, Error> {
        self.gpu_state_with(|| Ok(device.clone()))
    }

    fn gpu_state_with(
        &self,
        device: impl FnOnce() -> Result<mlpc_runtime::Device, Error>,
    ) -> Result<Arc<crate::cuda::GpuState>, Error> {
        let mut slot = self.gpu.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slot.as_ref() {
            return Ok(s.clone());
        }
        let s = Arc::new(crate::cuda::GpuState::new(self, device()?)?);
        *slot = Some(s.clone());
        Ok(s)
    }
}

/// The largest size [`Compiled::entry_map`] maps up to (it chooses an entry at every size).
pub const ENTRY_MAP_LIMIT: u64 = 1 << 20;

/// A device for [`Compiled::launch_plan`] and [`Compiled::entry_map`] has multiprocessors.
fn check_sms(sms: u32) -> Result<(), Error> {
    match sms {
        0 => Err(Error::Launches(
            "a device of 0 multiprocessors (at least 1)".into(),
        )),
        _ => Ok(()),
    }
}

/// Whether CUDA kernels were generated and compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaStatus {
    Skipped,
    /// Sources generated; NVRTC was not available to compile them.
    SourcesOnly,
    Compiled(&'static str),
}

/// What a compilation produced, for a one-screen report.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub name: String,
    /// The distinct element types in the graph (one for every model today).
    pub dtypes: Vec<DType>,
    pub inputs: Vec<(String, TensorType)>,
    pub outputs: Vec<(String, TensorType)>,
    /// All nodes, including inputs and weights.
    pub nodes: usize,
    /// Nodes that compute (neither inputs nor weights).
    pub ops: usize,
    pub weights: usize,
    pub weight_bytes: u64,
    /// Bytes of the optimised graph's weights, what a run uploads: packed block-sparse weights
    /// take only their kept blocks (their index arrays live in the kernels), dead weights none.
    pub compiled_weight_bytes: u64,
    /// Weights that the `sparsity` section selects for block-sparse kernels.
    pub sparse_weights: usize,
    /// Packed block-sparse weights the kernels read (one per selected weight, unless a weight
    /// is packed to two patterns).
    pub packed_weights: usize,
    /// Of those, the ones no output needs (removed with the nodes that read them).
    pub unused_sparse_weights: usize,
    /// Selected weights that some reader still reads dense, and why (see [`Compiled::warnings`]).
    pub stays_dense: Vec<(String, String)>,
    /// Kernels an unfused execution would launch (one per non-view op).
    pub kernels_before: usize,
    /// The plan's kernels, in launch order.
    pub kernels: Vec<String>,
    pub cuda: CudaStatus,
}

/// How [`Compiled::entry_map`] names entry `e` of a kernel whose own entry is `own`: `own` for
/// that one, what its name adds to `own` for the entries that extend it (`gemv_m16`, `short`),
/// and its name past the two names' common `_`-separated parts otherwise (`128x256x64` for a
/// short grid's entry on another tile).
fn entry_tag<'e>(own: &str, e: &'e str) -> &'e str {
    if e == own {
        return "own";
    }
    if let Some(rest) = e.strip_prefix(own) {
        return rest.trim_start_matches('_');
    }
    let common = own
        .bytes()
        .zip(e.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    match e[..common].rfind('_') {
        Some(cut) => &e[cut + 1..],
        None => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &str = r#"{ "mlpc": 1, "dtype": "bf16", "seed": 1,
        "inputs": { "x": { "shape": ["T", 16] } },
        "layers": [ { "op": "linear", "out": 8 }, { "op": "relu" } ] }"#;

    fn compiled(c: Compiler) -> Compiled {
        let model = mlpc_frontend::parse_model(MODEL, Path::new("."), "m.json").unwrap();
        c.cuda_kernels(CudaKernels::Skip)
            .compile_model(model)
            .unwrap()
    }

    #[test]
    fn entries_are_named_by_what_they_add_to_the_kernels_own() {
        let own = "mlpc_bsr_gemm_bf16_nt_b32x32_wgmma_128x352x64";
        assert_eq!(entry_tag(own, own), "own");
        assert_eq!(entry_tag(own, &format!("{own}_gemv_m16")), "gemv_m16");
        assert_eq!(
            entry_tag(own, "mlpc_bsr_gemm_bf16_nt_b32x32_wgmma_128x256x64"),
            "128x256x64"
        );
        assert_eq!(
            entry_tag(own, "mlpc_bsr_gemm_bf16_nt_b32x32_wgmma_128x256x64_gemv_m8"),
            "128x256x64_gemv_m8"
        );
        assert_eq!(entry_tag("gemm_a", "other"), "other");
    }

    #[test]
    fn a_run_on_a_gpu_compiles_for_its_architecture_unless_told_otherwise() {
        let auto = compiled(Compiler::new());
        assert_eq!(auto.arch(), Arch::Sm90, "artifacts are portable");
        assert_eq!(auto.arch_for_device((9, 0)).unwrap(), Arch::Sm90a);
        assert_eq!(
            auto.launch_arch(),
            Arch::Sm90a,
            "--explain lists a Hopper run's kernels"
        );
        assert_eq!(auto.arch_for_device((8, 6)).unwrap(), Arch::Sm80);
        let e = auto.arch_for_device((12, 0)).unwrap_err().to_string();
        assert!(e.contains("compute capability 12.0"), "{e}");
        let fixed = compiled(Compiler::new().arch(Arch::Sm90));
        assert_eq!(fixed.arch_for_device((9, 0)).unwrap(), Arch::Sm90);
        assert_eq!(fixed.launch_arch(), Arch::Sm90);
    }
}
