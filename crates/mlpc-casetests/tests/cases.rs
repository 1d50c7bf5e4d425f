//! Every model of `tests/cases/<name>/model.json` through the whole compiler.
//!
//! Per case (directories found at run time, in sorted order, so a new case needs no code):
//! - snapshots, suffixed with the case name: the IR before and after each pass of the default
//!   pipeline, with the block-sparse passes where the model has a `sparsity` section (`ir`),
//!   `--explain` (`explain`), the plan JSON (`plan`) and every generated `.cu` with its launch
//!   rule (`cuda`);
//! - the kernel count stated by the case's optional `expect.txt` (`kernels = N`);
//! - every generated kernel compiles with NVRTC for `sm_90`, and GEMM kernels use no local memory
//!   (no stack frame, no spills). A missing NVRTC fails the test;
//! - on random inputs with `T = 1` and `T = 5` (every other symbol 3), the reference interpreter
//!   run on the *source* graph is the oracle (with the model's `sparsity`, the source graph with
//!   its weights pruned, which `prune-block-sparse` does on purpose); the optimised graph
//!   interpreted and the plan run by the CPU backend must both match it within the relative
//!   Frobenius tolerance of the dtype.
//!
//! Each test goes through all cases and reports every failing case at the end, not just the first.

use mlpc_codegen::{Arch, CodegenOptions, CudaKernel};
use mlpc_cpu::CpuBackend;
use mlpc_frontend::{load_model, random_inputs, Model};
use mlpc_ir::{interpret, relative_error, DType, Dim, Graph, HostTensor, Op, Plan};
use mlpc_jit::{compile_all, entry_resources, JitOptions};
use mlpc_passes::{
    explain, lower_plan, Pass, Pipeline, PipelineOptions, PipelineReport, PrintAfter,
    PruneBlockSparse, SparseWeight,
};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// The directory of the cases, at the repository root.
fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/cases")
}

/// One case directory.
struct Case {
    name: String,
    dir: PathBuf,
}

impl Case {
    fn model_path(&self) -> PathBuf {
        self.dir.join("model.json")
    }
}

/// Every directory of `tests/cases` that holds a `model.json`, sorted by name. A directory without
/// one is an error (most likely a misnamed file), and so is finding no case at all.
fn cases() -> Vec<Case> {
    let dir = cases_dir();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut cases: Vec<Case> = entries
        .map(|e| {
            e.unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .path()
        })
        .filter(|p| p.is_dir())
        .map(|p| {
            assert!(
                p.join("model.json").is_file(),
                "case directory {} has no model.json",
                p.display()
            );
            let name = p
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_else(|| panic!("case directory {} is not UTF-8", p.display()))
                .to_string();
            Case { name, dir: p }
        })
        .collect();
    cases.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(!cases.is_empty(), "no case found in {}", dir.display());
    cases
}

/// Runs `check` on every case, catching panics, and fails listing every case that failed.
fn for_each_case(what: &str, mut check: impl FnMut(&Case) -> Result<(), String>) {
    let mut failures = Vec::new();
    for case in cases() {
        let outcome = catch_unwind(AssertUnwindSafe(|| check(&case)));
        let error = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e,
            Err(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".to_string()),
        };
        failures.push(format!("case `{}`: {error}", case.name));
    }
    assert!(
        failures.is_empty(),
        "{what}: {} case(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// A case taken through the default pipeline (with the block-sparse passes its `sparsity`
/// configures, as `mlpc compile` runs it) and lowered.
struct Compiled {
    model: Model,
    source: Graph,
    /// The source graph with the selected weights pruned: what every backend must compute.
    oracle: Graph,
    /// The passes the pipeline should have run, in order.
    pipeline: Vec<&'static str>,
    optimized: Graph,
    report: PipelineReport,
    plan: Plan,
}

fn compile(case: &Case) -> Result<Compiled, String> {
    let model = load_model(&case.model_path()).map_err(|e| format!("load: {e}"))?;
    let source = model.graph.clone();
    let sparse: Vec<SparseWeight> = model
        .sparsity
        .iter()
        .map(|s| SparseWeight::new(s.weight.clone(), s.block, s.density))
        .collect();
    let mut oracle = source.clone();
    if !sparse.is_empty() {
        PruneBlockSparse::new(sparse.clone())
            .run(&mut oracle, &mut mlpc_passes::Provenance::new(&source))
            .map_err(|e| format!("pruning the oracle's weights: {e}"))?;
    }
    let pipeline = Pipeline::default().with_sparsity(sparse);
    let mut optimized = source.clone();
    let opts = PipelineOptions {
        verify_each: true,
        print_after: PrintAfter::All,
    };
    let report = pipeline
        .run(&mut optimized, &opts)
        .map_err(|e| format!("pipeline: {e}"))?;
    let plan = lower_plan(&optimized, &report.provenance).map_err(|e| format!("plan: {e}"))?;
    plan.check()
        .map_err(|errs| format!("plan check:\n  {}", errs.join("\n  ")))?;
    Ok(Compiled {
        model,
        source,
        oracle,
        pipeline: pipeline.names(),
        optimized,
        report,
        plan,
    })
}

fn generate(c: &Compiled) -> Result<Vec<CudaKernel>, String> {
    generate_for(c, Arch::Sm90)
}

/// The kernels of `c` generated for `arch`.
fn generate_for(c: &Compiled, arch: Arch) -> Result<Vec<CudaKernel>, String> {
    let opts = CodegenOptions {
        arch,
        allow_tf32: c.model.allow_tf32,
        sparse_gemv: true,
        bsr_walk: false,
    };
    mlpc_codegen::generate(&c.plan, &opts).map_err(|e| format!("codegen: {e}"))
}

/// The source IR, then the IR after each pass, under one heading each.
fn ir_dump(c: &Compiled) -> Result<String, String> {
    let mut s = format!("==== source\n{}", c.source);
    let names: Vec<&str> = c.report.passes.iter().map(|p| p.name).collect();
    if names != c.pipeline {
        return Err(format!(
            "the pipeline ran {names:?}, not the expected {:?}",
            c.pipeline
        ));
    }
    for p in &c.report.passes {
        let text = p
            .ir_text
            .as_deref()
            .ok_or_else(|| format!("no IR text recorded after `{}`", p.name))?;
        let changed = if p.changed { "changed" } else { "unchanged" };
        let _ = write!(s, "\n==== after {} ({changed})\n{text}", p.name);
    }
    Ok(s)
}

/// Every kernel's listing (entry, launch rule, arguments, `.cu`), in launch order.
fn cuda_dump(kernels: &[CudaKernel]) -> String {
    let mut s = String::new();
    for (i, k) in kernels.iter().enumerate() {
        if i > 0 {
            s.push('\n');
        }
        let _ = write!(
            s,
            "==== kernel {}/{}: {}\n{}",
            i + 1,
            kernels.len(),
            k.name,
            k.listing()
        );
    }
    s
}

#[test]
fn snapshots() {
    for_each_case("snapshots", |case| {
        let c = compile(case)?;
        let ir = ir_dump(&c)?;
        let explained = explain(&c.source, &c.optimized, &c.plan, &c.report.provenance);
        let plan_json = serde_json::to_string_pretty(&c.plan).map_err(|e| e.to_string())?;
        let cuda = cuda_dump(&generate(&c)?);
        insta::with_settings!({
            snapshot_suffix => case.name.as_str(),
            input_file => case.model_path(),
            omit_expression => true,
        }, {
            insta::assert_snapshot!("ir", ir);
            insta::assert_snapshot!("explain", explained);
            insta::assert_snapshot!("plan", plan_json);
            insta::assert_snapshot!("cuda", cuda);
        });
        Ok(())
    });
}

/// What `expect.txt` states: `key = value` lines, `#` comments.
#[derive(Default)]
struct Expect {
    kernels: Option<usize>,
}

fn read_expect(case: &Case) -> Result<Option<Expect>, String> {
    let path = case.dir.join("expect.txt");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut expect = Expect::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("{}:{}", path.display(), i + 1);
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| format!("{}: expected `key = value`, found `{line}`", at()))?;
        match key.trim() {
            "kernels" => {
                let n = value
                    .trim()
                    .parse()
                    .map_err(|e| format!("{}: kernels: {e}", at()))?;
                expect.kernels = Some(n);
            }
            other => return Err(format!("{}: unknown key `{other}` (known: kernels)", at())),
        }
    }
    Ok(Some(expect))
}

#[test]
fn kernel_counts_match_expect_txt() {
    let mut checked = 0;
    for_each_case("kernel counts", |case| {
        let Some(expect) = read_expect(case)? else {
            return Ok(());
        };
        let c = compile(case)?;
        if let Some(n) = expect.kernels {
            checked += 1;
            let names: Vec<&str> = c.plan.kernels.iter().map(|k| k.name.as_str()).collect();
            if names.len() != n {
                return Err(format!(
                    "expected {n} kernel(s), the plan has {}: {names:?}",
                    names.len()
                ));
            }
        }
        Ok(())
    });
    assert!(checked > 0, "no case states a kernel count");
}

fn is_gemm(op: &Op) -> bool {
    matches!(op, Op::Gemm(_) | Op::SparseGemm(_) | Op::MatMul)
}

#[test]
fn every_kernel_compiles_with_nvrtc_and_gemms_use_no_local_memory() {
    nvrtc_check(Arch::Sm90);
}

/// The Hopper kernels, which a run on an H100 / H200 compiles (wgmma, TMA, the grouped
/// block-sparse kernel): their templates' static assertions hold for every case's shapes.
#[test]
fn every_kernel_compiles_for_sm_90a_and_gemms_use_no_local_memory() {
    nvrtc_check(Arch::Sm90a);
}

/// Every case's kernels compiled by NVRTC for `arch`; every entry of a GEMM's module without local
/// memory.
fn nvrtc_check(arch: Arch) {
    let opts = JitOptions {
        arch,
        no_cache: true,
        cache_dir: None,
    };
    for_each_case(&format!("NVRTC {arch}"), |case| {
        let c = compile(case)?;
        let kernels = generate_for(&c, arch)?;
        let compiled = compile_all(&kernels, &opts).map_err(|e| format!("NVRTC: {e}"))?;
        if compiled.len() != kernels.len() {
            return Err(format!(
                "{} kernels generated, {} compiled",
                kernels.len(),
                compiled.len()
            ));
        }
        let mut errors = Vec::new();
        for ((pk, k), ck) in c.plan.kernels.iter().zip(&kernels).zip(&compiled) {
            if ck.name != k.name || ck.arch != arch || ck.from_cache {
                errors.push(format!(
                    "`{}`: compiled as `{}` for {} (from cache: {})",
                    k.name, ck.name, ck.arch, ck.from_cache
                ));
            }
            if ck.cubin.is_empty() || !ck.ptx.contains(&format!(".entry {}", k.entry)) {
                errors.push(format!(
                    "`{}`: no CUBIN, or the PTX lacks the entry `{}`",
                    k.name, k.entry
                ));
            }
            if !ck.resources_known {
                errors.push(format!(
                    "`{}`: the NVRTC log has no ptxas report, so spills cannot be checked:\n{}",
                    k.name, ck.log
                ));
            }
            if is_gemm(&pk.op) && ck.resources.uses_local_memory() {
                errors.push(format!(
                    "GEMM kernel `{}` uses local memory: {:?}\n{}",
                    k.name, ck.resources, ck.log
                ));
            }
            // The module's other entries (small M, split K, one tile, short grids).
            let small_m = k.small_m.iter().flat_map(|s| &s.variants);
            let entries = k
                .other_entries()
                .into_iter()
                .chain(small_m.map(|v| v.entry.as_str()));
            for entry in entries.filter(|_| is_gemm(&pk.op)) {
                match entry_resources(&ck.log, entry) {
                    Some(r) if r.uses_local_memory() => errors.push(format!(
                        "entry `{entry}` of `{}` uses local memory: {r:?}",
                        k.name
                    )),
                    Some(_) => {}
                    None => errors.push(format!(
                        "entry `{entry}` of `{}`: no ptxas report in the NVRTC log",
                        k.name
                    )),
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("\n"))
        }
    });
}

fn tolerance(dt: DType) -> f64 {
    match dt {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        DType::Bf16 => 1e-2,
    }
}

/// Symbol values for a run: `T = t`, every other symbol of the inputs 3.
fn bindings(g: &Graph, t: u64) -> Vec<(String, u64)> {
    let mut b: BTreeMap<String, u64> = BTreeMap::new();
    for id in g.inputs() {
        for d in g.node(id).ty.shape.iter() {
            if let Dim::Sym(s) = d {
                let v = if &**s == "T" { t } else { 3 };
                b.insert(s.to_string(), v);
            }
        }
    }
    b.into_iter().collect()
}

/// Compares `actual` with the oracle, output by output.
fn compare(
    what: &str,
    actual: &BTreeMap<String, HostTensor>,
    oracle: &BTreeMap<String, HostTensor>,
) -> Vec<String> {
    let mut errors = Vec::new();
    if actual.keys().ne(oracle.keys()) {
        errors.push(format!(
            "{what}: outputs {:?}, expected {:?}",
            actual.keys().collect::<Vec<_>>(),
            oracle.keys().collect::<Vec<_>>()
        ));
        return errors;
    }
    for (name, want) in oracle {
        let got = &actual[name];
        if got.dtype() != want.dtype() || got.shape() != want.shape() {
            errors.push(format!(
                "{what}: output `{name}` is {got:?}, expected {want:?}"
            ));
            continue;
        }
        let err = relative_error(&got.to_f64(), &want.to_f64());
        let tol = tolerance(want.dtype());
        // NaN fails too.
        if err.is_nan() || err > tol {
            errors.push(format!(
                "{what}: output `{name}` relative error {err:.3e} > {tol:.0e}"
            ));
        }
    }
    errors
}

#[test]
fn cpu_backend_and_optimized_graph_match_the_interpreter_on_the_source() {
    let backend = CpuBackend::new().expect("the CPU backend (LLVM) must be available");
    for_each_case("CPU", |case| {
        let c = compile(case)?;
        let exe = backend
            .compile(&c.plan, c.optimized.weights())
            .map_err(|e| format!("mlpc-cpu compile: {e}"))?;
        let mut errors = Vec::new();
        for t in [1, 5] {
            let b = bindings(&c.source, t);
            let b: Vec<(&str, u64)> = b.iter().map(|(s, v)| (s.as_str(), *v)).collect();
            let inputs =
                random_inputs(&c.source, &b, 0x5eed + t).map_err(|e| format!("inputs: {e}"))?;
            let oracle = interpret(&c.oracle, &inputs)
                .map_err(|e| format!("T={t}: interpreting the source graph: {e}"))?;
            // A comparison with an all-zero or non-finite oracle proves nothing.
            for (name, v) in &oracle {
                let v = v.to_f64();
                if v.iter().any(|x| !x.is_finite()) || v.iter().all(|&x| x == 0.0) {
                    errors.push(format!(
                        "T={t}: the oracle's output `{name}` is all zero or not finite"
                    ));
                }
            }
            let opt = interpret(&c.optimized, &inputs)
                .map_err(|e| format!("T={t}: interpreting the optimised graph: {e}"))?;
            errors.extend(compare(&format!("T={t}: optimised graph"), &opt, &oracle));
            let cpu = exe
                .run(&inputs)
                .map_err(|e| format!("T={t}: mlpc-cpu run: {e}"))?;
            errors.extend(compare(&format!("T={t}: mlpc-cpu"), &cpu, &oracle));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("\n"))
        }
    });
}
