//! On a GPU: runs a compiled model through the embedding API (`Compiled::run_device`) on good
//! device tensors, compares with the reference interpreter, then offers inputs that break each
//! assumption the kernels make and checks that every one is refused with a guard error.
//!
//! Last, with re-specialisation enabled, the transposed view must run (through a variant compiled
//! for that layout) and give the reference result.
//!
//! Then a directory written by `compile --emit-weights` must run on its own and agree.
//!
//! Last, CUDA graph replay: over calls with fresh inputs, a T that runs a small-M entry, then a T
//! that runs the tiled GEMMs, then the first T again, the runs that replay a graph must give
//! outputs bit-identical to launching the kernels one by one; the first run of each T must
//! launch directly and the later ones replay (updating the nodes whose arguments changed); and a
//! poisoned replay must still match the reference.
//!
//! usage: gpu_guards MODEL.json   (a model with one input `x: [T, D]`)
//! Prints one line per case and exits with status 1 if any case is not as expected.

use mlpc::runtime::{Device, DeviceTensor, Executable, GuardError, RunOptions, RuntimeError};
use mlpc::{Backend, Compiled, Compiler, Error, Tensors};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn guard_of(r: Result<BTreeMap<String, DeviceTensor>, Error>) -> Option<GuardError> {
    match r {
        Err(Error::Runtime(RuntimeError::Guard(g))) => Some(g),
        _ => None,
    }
}

fn run() -> Result<bool, Error> {
    let path: PathBuf = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| "tests/cases/gpt2-mlp/model.json".into());
    let compiled = Compiler::new().compile_file(&path)?;
    let device = compiled.device()?;
    let host = compiled.random_inputs(&[("T", 7)], 3)?;
    let x = &host["x"];
    let (t, d) = (x.shape()[0], x.shape()[1]);
    let mut ok = true;

    // 1. Good inputs: same answer as the reference.
    let good: BTreeMap<String, DeviceTensor> = [("x".to_string(), device.upload(x)?)].into();
    let out = compiled.run_device(&good)?;
    let y = device.download(&out["y"])?;
    device.synchronize()?;
    let want = compiled.run(Backend::Reference, &host)?;
    let err = mlpc::ir::relative_error(&y.to_f64(), &want["y"].to_f64());
    let pass = err <= mlpc::tolerance(y.dtype());
    ok &= pass;
    println!(
        "{} good input: relative error {err:.2e}",
        if pass { "ok  " } else { "FAIL" }
    );

    // 2. Inputs that break an assumption, each with the guard that must refuse it.
    type Case = (&'static str, DeviceTensor, fn(&GuardError) -> bool);
    let other = if x.dtype() == mlpc::DType::F32 {
        mlpc::DType::Bf16
    } else {
        mlpc::DType::F32
    };
    let mut transposed = device.upload(x)?;
    transposed.strides = vec![1, t];
    // The shape claims twice the rows its memory holds (`shape` is a public field).
    let mut oversized = device.upload(x)?;
    oversized.shape = vec![2 * t, d];
    oversized.strides = vec![d, 1];
    let cases: Vec<Case> = vec![
        ("wrong dtype", device.upload(&x.cast(other))?, |g| {
            matches!(g, GuardError::DType { .. })
        }),
        (
            "wrong inner dim",
            device.zeros(x.dtype(), &[t, d + 1])?,
            |g| matches!(g, GuardError::Shape { .. }),
        ),
        ("wrong rank", device.zeros(x.dtype(), &[t * d])?, |g| {
            matches!(g, GuardError::Shape { .. })
        }),
        ("transposed view (strides [1, T])", transposed, |g| {
            matches!(g, GuardError::Strides { .. })
        }),
        (
            "shape past its memory ([2T, d] over T rows)",
            oversized,
            |g| matches!(g, GuardError::Extent { .. }),
        ),
    ];
    for (what, tensor, expected) in cases {
        let inputs: BTreeMap<String, DeviceTensor> = [("x".to_string(), tensor)].into();
        let g = guard_of(compiled.run_device(&inputs));
        let pass = g.as_ref().is_some_and(expected);
        ok &= pass;
        match g {
            Some(g) => println!(
                "{} {what}: refused: {g}",
                if pass { "ok  " } else { "FAIL" }
            ),
            None => println!("FAIL {what}: not refused by a guard"),
        }
    }
    let renamed: BTreeMap<String, DeviceTensor> = [("z".to_string(), device.upload(x)?)].into();
    let g = guard_of(compiled.run_device(&renamed));
    let pass = matches!(g, Some(GuardError::Unknown { .. }));
    ok &= pass;
    println!(
        "{} unknown input name: {}",
        if pass { "ok  " } else { "FAIL" },
        g.map(|g| g.to_string()).unwrap_or_default()
    );

    // 3. With re-specialisation on, a transposed view is not refused: a variant whose GEMM reads
    //    the caller's memory transposed computes the same result.
    let resp = Compiler::new().respecialize(4).compile_file(&path)?;
    // Its own device and stream: the view is written, and the output read, in its order.
    let resp_device = resp.device()?;
    let xv = x.to_f64();
    let storage: Vec<f64> = (0..d)
        .flat_map(|c| (0..t).map(move |r| (r, c)))
        .map(|(r, c)| xv[r * d + c])
        .collect();
    let storage = mlpc::HostTensor::from_f64(x.dtype(), vec![d, t], &storage)
        .map_err(|e| Error::Bench(e.to_string()))?;
    let mut view = resp_device.upload(&storage)?;
    view.shape = vec![t, d];
    view.strides = vec![1, t];
    let out = resp.run_device(&[("x".to_string(), view)].into())?;
    let y = resp_device.download(&out["y"])?;
    resp_device.synchronize()?;
    let err = mlpc::ir::relative_error(&y.to_f64(), &want["y"].to_f64());
    let pass = err <= mlpc::tolerance(y.dtype());
    ok &= pass;
    println!(
        "{} transposed view with re-specialisation: ran a variant, relative error {err:.2e}",
        if pass { "ok  " } else { "FAIL" }
    );

    // 4. The compiled directory runs on its own (plan, CUBINs and weights, no model file).
    let dir = std::env::temp_dir().join(format!("mlpc-bundle-{}", std::process::id()));
    Compiler::new()
        .emit_weights(true)
        .compile_file(&path)?
        .write_to(&dir)?;
    let bundle = mlpc::Bundle::load(&dir)?;
    let y = bundle.run(&host)?;
    let err = mlpc::ir::relative_error(&y["y"].to_f64(), &want["y"].to_f64());
    let pass = err <= mlpc::tolerance(y["y"].dtype());
    ok &= pass;
    println!(
        "{} compiled directory run on its own: relative error {err:.2e}",
        if pass { "ok  " } else { "FAIL" }
    );
    let _ = std::fs::remove_dir_all(&dir);

    // 5. CUDA graph replay, on a fresh executable (so that no T has run before).
    ok &= graph_replay(&Compiler::new().compile_file(&path)?)?;

    // 6. Two models on one stream (`use_device`): the second reads the first's output with no
    //    synchronisation between them.
    ok &= shared_stream(&path, &host)?;
    Ok(ok)
}

/// The model twice, the second on the first's device and stream, the first's output fed to
/// the second as its input (where the shapes allow: an MLP's output is shaped as its input);
/// and `use_device` refused once a model runs on a stream of its own.
fn shared_stream(path: &std::path::Path, host: &Tensors) -> Result<bool, Error> {
    let first = Compiler::new().compile_file(path)?;
    let second = Compiler::new().compile_file(path)?;
    let device = first.device()?;
    second.use_device(&device)?;
    let x = &host["x"];
    let mut ok = true;
    let mut y = first.run_device(&[("x".to_string(), device.upload(x)?)].into())?;
    match y.remove("y") {
        Some(y) if y.shape == x.shape() => {
            let y_host = device.download(&y)?;
            let z = second.run_device(&[("x".to_string(), y)].into())?;
            let z_host = device.download(&z["y"])?;
            device.synchronize()?;
            let want = second.run(Backend::Reference, &[("x".to_string(), y_host)].into())?;
            let err = mlpc::ir::relative_error(&z_host.to_f64(), &want["y"].to_f64());
            let pass = err <= mlpc::tolerance(z_host.dtype());
            ok &= pass;
            println!(
                "{} two models on one stream: the second on the first's output, relative error {err:.2e}",
                mark(pass)
            );
        }
        _ => println!(
            "ok   two models on one stream: skipped (the output is not shaped as the input)"
        ),
    }
    let third = Compiler::new().compile_file(path)?;
    third.run_device(&[("x".to_string(), third.device()?.upload(x)?)].into())?;
    let refused = matches!(third.use_device(&device), Err(Error::DeviceInUse(_)));
    ok &= refused;
    println!(
        "{} use_device after a run on a stream of its own: {}",
        mark(refused),
        if refused { "refused" } else { "NOT refused" }
    );
    Ok(ok)
}

fn mark(pass: bool) -> &'static str {
    if pass {
        "ok  "
    } else {
        "FAIL"
    }
}

fn upload(device: &Device, host: &Tensors) -> Result<BTreeMap<String, DeviceTensor>, Error> {
    let mut dev = BTreeMap::new();
    for (n, t) in host {
        dev.insert(n.clone(), device.upload(t)?);
    }
    Ok(dev)
}

fn download(device: &Device, out: &BTreeMap<String, DeviceTensor>) -> Result<Tensors, Error> {
    let mut host = BTreeMap::new();
    for (n, t) in out {
        host.insert(n.clone(), device.download(t)?);
    }
    device.synchronize()?;
    Ok(host)
}

/// Whether any GEMM runs a small-M entry at token count `t`.
fn runs_small_m(c: &Compiled, exe: &Executable, t: u64) -> Result<bool, Error> {
    let dev = upload(exe.device(), &c.random_inputs(&[("T", t)], 0)?)?;
    let b = exe.check(&dev).map_err(RuntimeError::from)?;
    Ok(exe.launches_for(&b)?.iter().any(|l| l.small_m))
}

fn graph_replay(c: &Compiled) -> Result<bool, Error> {
    let exe = c.executable()?;
    let device = exe.device().clone();
    // The reference launches: one by one, each after the one before has finished.
    let direct = RunOptions {
        poison: false,
        graphs: false,
        early_launch: false,
    };
    // Replays with the small-M kernels launched early (programmatic edges).
    let graphs = RunOptions {
        poison: false,
        graphs: true,
        early_launch: true,
    };
    let mut ok = true;

    let mut small = None;
    for t in [7, 3, 1, 16] {
        if runs_small_m(c, &exe, t)? {
            small = Some(t);
            break;
        }
    }
    let mut tiled = None;
    for t in [64, 129, 256, 512, 1024, 4096] {
        if !runs_small_m(c, &exe, t)? {
            tiled = Some(t);
            break;
        }
    }
    let pass = small.is_some() && tiled.is_some();
    ok &= pass;
    println!(
        "{} graph replay: T = {} runs a small-M entry, T = {} the tiled kernels",
        mark(pass),
        small.map_or("(none found)".into(), |t| t.to_string()),
        tiled.map_or("(none found)".into(), |t| t.to_string()),
    );
    let (small, tiled) = (small.unwrap_or(7), tiled.unwrap_or(4096));

    // Everything stays alive to the end, so that every call gets fresh input and output
    // addresses and a replay must update the graph's nodes.
    let mut keep = Vec::new();
    let mut since_change = 0;
    let mut previous_t = None;
    for (call, t) in [
        small, small, small, tiled, tiled, tiled, small, small, small,
    ]
    .into_iter()
    .enumerate()
    {
        since_change = if previous_t == Some(t) {
            since_change + 1
        } else {
            0
        };
        previous_t = Some(t);
        let host = c.random_inputs(&[("T", t)], 100 + call as u64)?;
        let dev = upload(&device, &host)?;
        let before = exe.graph_stats();
        let out_g = exe.run(&dev, graphs)?;
        let after = exe.graph_stats();
        let out_d = exe.run(&dev, direct)?;
        let (yg, yd) = (download(&device, &out_g)?, download(&device, &out_d)?);
        let how = match (
            after.graph_launches > before.graph_launches,
            after.graph_builds > before.graph_builds,
        ) {
            (false, _) => "launched kernel by kernel",
            (true, true) => "built and launched a graph",
            (true, false) => "replayed the graph",
        };
        let expected = match since_change {
            0 => "launched kernel by kernel",
            1 => "built and launched a graph",
            _ => "replayed the graph",
        };
        let updates = after.node_updates - before.node_updates;
        let identical = yg.len() == yd.len()
            && yg
                .iter()
                .all(|(n, g)| yd.get(n).is_some_and(|d| d.bytes() == g.bytes()));
        let want = c.run(Backend::Reference, &host)?;
        let err = yg
            .iter()
            .map(|(n, g)| {
                want.get(n).map_or(f64::NAN, |w| {
                    mlpc::ir::relative_error(&g.to_f64(), &w.to_f64()) / mlpc::tolerance(g.dtype())
                })
            })
            // NaN (an element no kernel wrote) must fail, so no `f64::max`, which drops it.
            .fold(0.0, |a: f64, e| {
                if a.is_nan() || e.is_nan() {
                    f64::NAN
                } else {
                    a.max(e)
                }
            });
        let pass = identical && err <= 1.0 && how == expected && (since_change < 2 || updates > 0);
        ok &= pass;
        println!(
            "{} graph replay call {call} (T = {t}): {how} (expected: {expected}), {updates} node(s) updated, {} the direct launches, error {err:.2} of tolerance",
            mark(pass),
            if identical { "bit-identical to" } else { "DIFFERENT from" },
        );
        keep.push((dev, out_g, out_d));
    }

    // A poisoned replay: NaN fills on the stream before the graph launch, none left after it.
    let host = c.random_inputs(&[("T", small)], 999)?;
    let dev = upload(&device, &host)?;
    let before = exe.graph_stats();
    let out_p = exe.run(
        &dev,
        RunOptions {
            poison: true,
            graphs: true,
            early_launch: true,
        },
    )?;
    let replayed = exe.graph_stats().graph_launches > before.graph_launches;
    let out_d = exe.run(&dev, direct)?;
    let (yp, yd) = (download(&device, &out_p)?, download(&device, &out_d)?);
    let want = c.run(Backend::Reference, &host)?;
    let mut pass = replayed;
    for (n, p) in &yp {
        let err = want.get(n).map_or(f64::NAN, |w| {
            mlpc::ir::relative_error(&p.to_f64(), &w.to_f64())
        });
        pass &=
            err <= mlpc::tolerance(p.dtype()) && yd.get(n).is_some_and(|d| d.bytes() == p.bytes());
    }
    ok &= pass;
    println!(
        "{} graph replay with poisoned outputs (T = {small}): {}, matches the reference and the direct launches",
        mark(pass),
        if replayed { "replayed the graph" } else { "did NOT replay" },
    );
    drop(keep);
    Ok(ok)
}
