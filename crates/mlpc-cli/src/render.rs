//! Everything the binary prints: summaries on stdout, errors with their chain of causes on stderr.

use mlpc::{Backend, CheckReport, CudaStatus, Summary, Tensors, ROUNDING_FACTOR};
use std::error::Error;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// `error: <message>` followed by one `caused by:` line per source not already in the message.
pub fn error_chain(e: &dyn Error) -> String {
    let mut out = format!("error: {e}");
    let mut shown = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !shown.contains(&text) {
            let _ = write!(out, "\n  caused by: {text}");
            shown.push('\n');
            shown.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// A line that tells how to fix an error caused by the command's arguments, if there is one.
pub fn hint(e: &mlpc::Error) -> Option<String> {
    use mlpc::frontend::{FrontendError, RandomInputError};
    match e {
        mlpc::Error::Frontend(FrontendError::RandomInput {
            error: RandomInputError::Unbound { symbol, .. },
            ..
        }) => Some(format!(
            "hint: give every symbolic dimension a size, e.g. `--bind {symbol}=8`"
        )),
        _ => None,
    }
}

pub fn compile_summary(s: &Summary, dir: &Path, written: &[PathBuf]) -> String {
    let mut out = String::new();
    let dtypes: Vec<&str> = s.dtypes.iter().map(|d| d.name()).collect();
    let _ = writeln!(out, "compiled `{}` ({})", s.name, dtypes.join(", "));
    for (name, ty) in &s.inputs {
        let _ = writeln!(out, "  input   {name}: {ty}");
    }
    for (name, ty) in &s.outputs {
        let _ = writeln!(out, "  output  {name}: {ty}");
    }
    let _ = writeln!(
        out,
        "  graph   {}: {}, {}, {}",
        count(s.nodes, "node"),
        count(s.inputs.len(), "input"),
        count(s.weights, "weight"),
        count(s.ops, "op")
    );
    let packed = match s.compiled_weight_bytes {
        c if c == s.weight_bytes => String::new(),
        c => format!("; {} as compiled", bytes(c)),
    };
    let _ = writeln!(
        out,
        "  weights {}, {}{packed}",
        count(s.weights, "tensor"),
        bytes(s.weight_bytes)
    );
    if s.sparse_weights > 0 {
        let mut line = count(s.packed_weights, "packed block-sparse weight");
        let dense = s.stays_dense.len();
        if dense > 0 {
            let see = if dense == 1 { "warning" } else { "warnings" };
            line += &format!("; {dense} selected read dense (see the {see})");
        }
        if s.unused_sparse_weights > 0 {
            line += &format!("; {} selected unused (removed)", s.unused_sparse_weights);
        }
        let _ = writeln!(out, "  sparse  {line}");
    }
    let _ = writeln!(
        out,
        "  kernels {} before fusion, {} after: {}",
        s.kernels_before,
        s.kernels.len(),
        s.kernels.join(", ")
    );
    let cuda = match &s.cuda {
        CudaStatus::Skipped => "not generated".to_string(),
        CudaStatus::SourcesOnly => {
            "sources only: NVRTC (libnvrtc.so.13) was not found to compile them".to_string()
        }
        CudaStatus::Compiled(arch) => format!("compiled for {arch}"),
    };
    let _ = writeln!(out, "  cuda    {cuda}");
    let _ = writeln!(out, "wrote {}", dir.display());
    let kernel_files = written
        .iter()
        .filter(|p| is_kernel_file(dir, p) && p.extension().is_some_and(|e| e == "cu"))
        .count();
    for p in written.iter().filter(|p| !is_kernel_file(dir, p)) {
        let _ = writeln!(out, "  {}", p.display());
    }
    if kernel_files > 0 {
        let _ = writeln!(
            out,
            "  {} ({kernel_files} kernels with their templates and build outputs)",
            dir.join("kernels").display()
        );
    }
    out
}

fn is_kernel_file(dir: &Path, p: &Path) -> bool {
    p.strip_prefix(dir).is_ok_and(|r| r.starts_with("kernels"))
}

/// One line per output: the error against the reference and the verdict.
pub fn check_report(name: &str, r: &CheckReport) -> String {
    let mut out = String::new();
    for o in &r.outputs {
        let _ = writeln!(
            out,
            "{} {name} on {}: output `{}` {}{:?}: relative error {:.3e} (tolerance {:.0e})",
            if o.ok() { "ok  " } else { "FAIL" },
            r.backend,
            o.name,
            o.dtype,
            o.shape,
            o.error,
            o.tolerance
        );
        match o.accuracy {
            Some(a) if o.passes_as_ill_conditioned() => {
                let _ = writeln!(
                    out,
                    "     (about as near the graph's unrounded math as random roundings take \
                     it, an ill-conditioned output: {:.3e} against their {:.3e}, within \
                     {ROUNDING_FACTOR}x; the reference interpreter's own roundings {:.3e})",
                    a.backend,
                    a.noise.unwrap_or(f64::NAN),
                    a.reference
                );
            }
            Some(a) if o.passes_by_accuracy() => {
                let _ = writeln!(
                    out,
                    "     (about as near the graph's unrounded math as the reference interpreter, \
                     which rounds every intermediate: {:.3e} against its {:.3e}, within \
                     {ROUNDING_FACTOR}x; the fused kernels keep intermediates in f32)",
                    a.backend, a.reference
                );
            }
            Some(a) => {
                let _ = writeln!(
                    out,
                    "     (against the graph's unrounded math: {:.3e}, the reference \
                     interpreter's {:.3e}{})",
                    a.backend,
                    a.reference,
                    a.noise
                        .map(|n| format!(", random roundings' {n:.3e}"))
                        .unwrap_or_default()
                );
            }
            None => {}
        }
        match o.fused_error.filter(|_| o.explained_by_fusion()) {
            // NaN or an infinity on one side only: not a rounding difference.
            Some(e) if !o.error.is_finite() => {
                let _ = writeln!(
                    out,
                    "     (against the optimised graph: {e:.3e}; the reference has a NaN or an \
                     infinity where the optimised graph has a number, or the other way round: an \
                     f16 / bf16 intermediate that overflows in the source graph but not in a fused \
                     kernel's f32 registers, or an infinite activation that a pruned weight's \
                     zeros multiply in the reference while the block-sparse kernels skip dropped \
                     blocks)"
                );
            }
            Some(e) => {
                let _ = writeln!(
                    out,
                    "     (against the optimised graph, which rounds only where the kernels store: \
                     {e:.3e}; the difference is the rounding of intermediates the fused kernels \
                     keep in f32)"
                );
            }
            None => {}
        }
    }
    out
}

pub fn run_summary(
    name: &str,
    backend: Backend,
    note: Option<&str>,
    outputs: &Tensors,
    path: &Path,
) -> String {
    let mut out = match note {
        Some(n) => format!("ran `{name}` on {backend} ({n})\n"),
        None => format!("ran `{name}` on {backend}\n"),
    };
    out.push_str(&tensors_written(outputs, path));
    out
}

pub fn tensors_written(tensors: &Tensors, path: &Path) -> String {
    let mut out = format!("wrote {}\n", path.display());
    for (name, t) in tensors {
        let _ = writeln!(out, "  {name}: {}{:?}", t.dtype(), t.shape());
    }
    out
}

/// `1 node`, `2 nodes`.
/// Whether a benchmark's runs replayed CUDA graphs, e.g. `graphs on (200 of 200 runs replayed)`.
pub fn graph_use(allowed: bool, graph_runs: usize, runs: usize) -> String {
    if allowed {
        format!("graphs on ({graph_runs} of {runs} runs replayed)")
    } else {
        "graphs off".to_string()
    }
}

fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// `12.0 MiB (12582912 bytes)`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut v = n as f64;
    let mut unit = "bytes";
    for u in UNITS {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit} ({n} bytes)")
}

/// `1 entry`, `2 entries`.
fn entries(n: usize) -> String {
    if n == 1 {
        "1 entry".to_string()
    } else {
        format!("{n} entries")
    }
}

/// `mlpc cache`: the directory, what each cache holds, and the total.
pub fn cache_info(info: &mlpc::CacheInfo) -> String {
    let mut out = String::new();
    let state = if info.exists {
        ""
    } else {
        " (empty: not created yet)"
    };
    let _ = writeln!(out, "cache directory: {}{state}", info.dir.display());
    let k = &info.kernels;
    let mut kernels = match k.entries.len() {
        0 => "empty".to_string(),
        n => format!("{}, {}", entries(n), bytes(k.entry_bytes())),
    };
    let incomplete = k.entries.iter().filter(|e| !e.complete).count();
    if incomplete > 0 {
        let _ = write!(kernels, " ({incomplete} incomplete: misses, trimmed first)");
    }
    if k.temporary_files > 0 {
        let _ = write!(
            kernels,
            "; {} (a store under way, or left by one cut short), {}",
            count(k.temporary_files, "temporary file"),
            bytes(k.temporary_bytes)
        );
    }
    let _ = writeln!(out, "  kernel cache:   {kernels}");
    let autotune = match &info.autotune {
        None => "empty".to_string(),
        Some(a) => match &a.tiles {
            Ok(n) => format!("{}, {}", count(*n, "tile"), bytes(a.bytes)),
            Err(why) => format!(
                "{}, cannot be read: {why} (`mlpc cache clear` removes it)",
                bytes(a.bytes)
            ),
        },
    };
    let _ = writeln!(out, "  autotune cache: {autotune}");
    let _ = writeln!(out, "  total:          {}", bytes(info.total_bytes()));
    out
}

/// `mlpc cache clear`: what was removed.
pub fn cache_cleared(dir: &Path, c: &mlpc::Cleared) -> String {
    let mut parts = Vec::new();
    if c.kernels.entries > 0 {
        parts.push(format!(
            "{} of the kernel cache",
            entries(c.kernels.entries)
        ));
    }
    if c.kernels.temporary_files > 0 {
        parts.push(count(c.kernels.temporary_files, "temporary file"));
    }
    if c.autotune.is_some() {
        parts.push("the autotune cache".to_string());
    }
    let Some(last) = parts.pop() else {
        return format!("cleared {}: it held nothing to remove\n", dir.display());
    };
    let what = match parts.is_empty() {
        true => last,
        false => format!("{} and {last}", parts.join(", ")),
    };
    let freed = c.kernels.bytes + c.autotune.unwrap_or(0);
    format!(
        "cleared {}: removed {what}, {}\n",
        dir.display(),
        bytes(freed)
    )
}

/// `mlpc cache trim`: what was removed and what is left.
pub fn cache_trimmed(dir: &Path, max: u64, r: &mlpc::jit::cache::Removed) -> String {
    let mut out = format!("trimmed {} to at most {}: ", dir.display(), bytes(max));
    let mut parts = Vec::new();
    match r.entries {
        0 => {}
        1 => parts.push("1 entry (the least recently used)".to_string()),
        n => parts.push(format!("{} (the least recently used)", entries(n))),
    }
    if r.temporary_files > 0 {
        parts.push(count(r.temporary_files, "temporary file"));
    }
    match r.files {
        0 => out.push_str("removed nothing"),
        _ => {
            let _ = write!(out, "removed {}, {}", parts.join(" and "), bytes(r.bytes));
        }
    }
    let _ = writeln!(out, "; the kernels take {}", bytes(r.kept_bytes));
    out
}

/// A spinner on stderr with the time since it started and a message.
fn spinner() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {elapsed:>3} {msg}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// Compiles `model` with a spinner on stderr that says what the compilation is doing (reading
/// the model, optimising, generating kernels, NVRTC's count of kernels compiled), cleared when
/// it is done; where stderr is no terminal, nothing is shown.
pub fn compile_file(
    compiler: mlpc::Compiler,
    model: &std::path::Path,
) -> Result<mlpc::Compiled, mlpc::Error> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return compiler.compile_file(model);
    }
    let bar = spinner();
    let shown = bar.clone();
    let compiler = compiler.progress(move |p| {
        shown.set_message(match p {
            mlpc::Progress::Loading(path) => format!("reading {}", path.display()),
            mlpc::Progress::Optimizing => "optimising".to_string(),
            mlpc::Progress::Generating(n) => format!("generating {n} CUDA kernels"),
            mlpc::Progress::Compiling { done: 0, total, .. } => {
                format!("NVRTC: compiling {total} kernels")
            }
            mlpc::Progress::Compiling {
                done,
                total,
                kernel,
            } => format!("NVRTC: {done} of {total} kernels compiled ({kernel})"),
        })
    });
    let compiled = compiler.compile_file(model);
    bar.finish_and_clear();
    compiled
}

/// A check's result as one JSON object: the model, backend, bindings and seed, whether it
/// passed, and per output its errors (against the reference; against the unrounded math, the
/// reference's and the random roundings' where measured; against the optimised graph where
/// measured), tolerance and verdict. NaN errors are `null`.
pub fn check_json(
    compiled: &mlpc::Compiled,
    bindings: &[(String, u64)],
    seed: u64,
    r: &CheckReport,
) -> serde_json::Value {
    let outputs: Vec<serde_json::Value> = r
        .outputs
        .iter()
        .map(|o| {
            serde_json::json!({
                "name": o.name,
                "dtype": o.dtype.name(),
                "shape": o.shape,
                "error": o.error,
                "tolerance": o.tolerance,
                "ok": o.ok(),
                "within_tolerance": o.within_tolerance(),
                "ill_conditioned": o.passes_as_ill_conditioned(),
                "unrounded": o.accuracy.map(|a| serde_json::json!({
                    "backend": a.backend,
                    "reference": a.reference,
                    "random_roundings": a.noise,
                })),
                "optimized_graph": o.fused_error,
            })
        })
        .collect();
    serde_json::json!({
        "model": compiled.name(),
        "backend": r.backend.name(),
        "dtype": compiled.plan().dtype,
        "bindings": bindings.iter().map(|(s, v)| format!("{s}={v}")).collect::<Vec<_>>(),
        "seed": seed,
        "ok": r.ok(),
        "outputs": outputs,
    })
}

/// Runs [`mlpc::Compiled::check`] with a spinner on stderr that says which run it is in (the
/// reference interpreter, the backend, the unrounded math, the random roundings, the optimised
/// graph), cleared when it is done; where stderr is no terminal, nothing is shown.
pub fn check(
    compiled: &mlpc::Compiled,
    backend: mlpc::Backend,
    bindings: &[(&str, u64)],
    seed: u64,
) -> Result<CheckReport, mlpc::Error> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return compiled.check(backend, bindings, seed);
    }
    let bar = spinner();
    let report = compiled.check_with_progress(backend, bindings, seed, &mut |step| {
        bar.set_message(check_step(step));
    });
    bar.finish_and_clear();
    report
}

/// What a check is running, as its spinner says it.
fn check_step(step: mlpc::CheckStep) -> String {
    match step {
        mlpc::CheckStep::Reference => "check: the reference interpreter".to_string(),
        mlpc::CheckStep::Backend(b) => format!("check: the {b} backend"),
        mlpc::CheckStep::Unrounded => "check: the graph's unrounded math".to_string(),
        mlpc::CheckStep::Perturbed { run, of } => {
            format!("check: random roundings, run {run} of {of}")
        }
        mlpc::CheckStep::Optimized => "check: the optimised graph interpreted".to_string(),
    }
}

/// Runs [`mlpc::Compiled::autotune`] with a progress bar on stderr (candidates done / total, the
/// kernel and tile being measured, the best median so far), and renders the result: per kernel,
/// every candidate's median or why it was dropped, and the winner.
pub fn autotune(
    compiled: &mlpc::Compiled,
    bindings: &[(&str, u64)],
) -> Result<String, mlpc::Error> {
    let bar = indicatif::ProgressBar::hidden();
    let mut started = false;
    let report = compiled.autotune(bindings, mlpc::AutotuneOptions::default(), &mut |p| {
        if !started {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            bar.set_length(p.total as u64);
            if let Ok(style) =
                indicatif::ProgressStyle::with_template("autotune [{bar:30}] {pos}/{len} {msg}")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            started = true;
        }
        bar.set_position(p.done as u64);
        match &p.current {
            Some((kernel, choice)) => bar.set_message(match p.best_ms {
                Some(b) => format!("{kernel}: {choice} (best so far {b:.4} ms)"),
                None => format!("{kernel}: {choice}"),
            }),
            None => bar.finish_and_clear(),
        }
    })?;
    let mut out = format!(
        "autotune on {}, {} kernels: {} tuned\n",
        report.device,
        report.arch,
        report.kernels.len()
    );
    for k in &report.kernels {
        let _ = writeln!(out, "  {} [{}], M bucket {}:", k.kernel, k.key, k.m_bucket);
        for (choice, result) in &k.tried {
            let mark = if *choice == k.winner { "*" } else { " " };
            match result {
                mlpc::CandidateResult::Timed(ms) => {
                    let _ = writeln!(out, "   {mark} {choice}: {ms:.4} ms");
                }
                mlpc::CandidateResult::Dropped(why) => {
                    let _ = writeln!(out, "   {mark} {choice}: dropped: {why}");
                }
            }
        }
        if let Some(c) = &k.confirmation {
            out.push_str(&confirmation(c));
        }
    }
    match &report.cache {
        Some(path) => {
            let _ = writeln!(out, "winners cached in {}", path.display());
        }
        None => out.push_str("winners not cached (--no-autotune-cache)\n"),
    }
    Ok(out)
}

/// The lines of a kernel's confirmation: both sides' times, alternately taken, and who won.
fn confirmation(c: &mlpc::Confirmation) -> String {
    let times = |v: &[f64]| {
        let v: Vec<String> = v.iter().map(|ms| format!("{ms:.4}")).collect();
        if v.is_empty() {
            "failed".to_string()
        } else {
            v.join(" / ")
        }
    };
    format!(
        "     confirmation, timed alternately: heuristic {}: {} ms; {}: {} ms; {}\n",
        c.incumbent,
        times(&c.incumbent_ms),
        c.challenger,
        times(&c.challenger_ms),
        if c.challenger_won {
            "the challenger wins"
        } else {
            "the heuristic's tile stays (the challenger is not faster by the margin)"
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_confirmation_names_both_sides_and_the_winner() {
        let t = |bn| mlpc::TileChoice {
            bn,
            ctas: 1,
            pingpong: false,
            cluster: 1,
            share_b: false,
            bm: 128,
            fp64_tensor: false,
        };
        let c = mlpc::Confirmation {
            incumbent: t(128),
            incumbent_ms: vec![0.61, 0.6202],
            challenger: t(256),
            challenger_ms: vec![0.6075, 0.62],
            challenger_won: false,
        };
        let s = confirmation(&c);
        assert!(
            s.contains(&format!("heuristic {}: 0.6100 / 0.6202 ms", t(128))),
            "{s}"
        );
        assert!(
            s.contains(&format!("{}: 0.6075 / 0.6200 ms", t(256))),
            "{s}"
        );
        assert!(s.contains("the heuristic's tile stays"), "{s}");
        let won = mlpc::Confirmation {
            challenger_won: true,
            challenger_ms: vec![],
            ..c
        };
        let s = confirmation(&won);
        assert!(
            s.contains("failed") && s.contains("the challenger wins"),
            "{s}"
        );
    }

    /// Each output out of tolerance gets the note of what it was measured against: passed as
    /// near the math as the reference, passed as an ill-conditioned output, failed with the
    /// random roundings' distance, failed with the optimised graph's explanation.
    #[test]
    fn check_notes_say_what_an_output_was_measured_against() {
        let output = |name: &str, backend, noise, fused_error| mlpc::OutputCheck {
            name: name.to_string(),
            dtype: mlpc_ir::DType::F32,
            shape: vec![5, 5],
            error: 2e-5,
            tolerance: 1e-5,
            fused_error,
            accuracy: Some(mlpc::Accuracy {
                backend,
                reference: 1e-5,
                noise,
            }),
        };
        let r = CheckReport {
            backend: mlpc::Backend::Cpu,
            outputs: vec![
                output("a", 1.5e-5, None, None),
                output("b", 3e-5, Some(2e-5), None),
                output("c", 5e-5, Some(1e-5), Some(2e-5)),
                output("d", 5e-5, Some(1e-5), Some(0.0)),
            ],
        };
        let s = check_report("m", &r);
        let lines: Vec<&str> = s.lines().map(str::trim_start).collect();
        assert_eq!(lines.len(), 9, "{s}");
        assert!(
            lines[0].starts_with("ok   m on cpu: output `a` f32[5, 5]"),
            "{s}"
        );
        assert!(
            lines[1].starts_with(
                "(about as near the graph's unrounded math as the reference interpreter"
            ),
            "{s}"
        );
        assert!(lines[2].starts_with("ok   m on cpu: output `b`"), "{s}");
        assert_eq!(
            lines[3],
            "(about as near the graph's unrounded math as random roundings take it, an \
             ill-conditioned output: 3.000e-5 against their 2.000e-5, within 2x; the reference \
             interpreter's own roundings 1.000e-5)"
        );
        assert!(lines[4].starts_with("FAIL m on cpu: output `c`"), "{s}");
        assert_eq!(
            lines[5],
            "(against the graph's unrounded math: 5.000e-5, the reference interpreter's \
             1.000e-5, random roundings' 1.000e-5)"
        );
        assert!(lines[6].starts_with("FAIL m on cpu: output `d`"), "{s}");
        assert!(
            lines[8].starts_with(
                "(against the optimised graph, which rounds only where the kernels store: \
                 0.000e0;"
            ),
            "{s}"
        );
    }

    #[test]
    fn check_steps_name_their_run() {
        assert_eq!(
            check_step(mlpc::CheckStep::Backend(mlpc::Backend::Cpu)),
            "check: the cpu backend"
        );
        assert_eq!(
            check_step(mlpc::CheckStep::Perturbed { run: 3, of: 8 }),
            "check: random roundings, run 3 of 8"
        );
    }

    #[test]
    fn graph_use_says_how_many_runs_replayed() {
        assert_eq!(
            graph_use(true, 198, 200),
            "graphs on (198 of 200 runs replayed)"
        );
        assert_eq!(graph_use(false, 0, 200), "graphs off");
    }

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn Error + 'static))
        }
    }

    #[test]
    fn chains_show_each_new_cause_once() {
        let e = Layer(
            "cannot write `out/x`",
            Some(Box::new(Layer(
                "Permission denied",
                Some(Box::new(Layer("denied", None))),
            ))),
        );
        assert_eq!(
            error_chain(&e),
            "error: cannot write `out/x`\n  caused by: Permission denied"
        );
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(bytes(0), "0 bytes");
        assert_eq!(bytes(1023), "1023 bytes");
        assert_eq!(bytes(1024), "1.0 KiB (1024 bytes)");
        assert_eq!(
            bytes(9 * 1024 * 1024 + 512 * 1024),
            "9.5 MiB (9961472 bytes)"
        );
    }
}
