//! On a GPU: runs a compiled model through the embedding API (`Compiled::run_device`) on good
//! device tensors, compares with the reference interpreter, then offers inputs that break each
//! assumption the kernels make and checks that every one is refused with a guard error.
//!
//! Last, with re-specialisation enabled, the transposed view must run (through a variant compiled
//! for that layout) and give the reference result.
//!
//! Then a directory written by `compile --emit-weights` must run on its own and agree.
//!
//! usage: gpu_guards MODEL.json   (a model with one input `x: [T, D]`)
//! Prints one line per case and exits with status 1 if any case is not as expected.

use mlpc::runtime::{DeviceTensor, GuardError, RuntimeError};
use mlpc::{Backend, Compiler, Error};
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
    let xv = x.to_f64();
    let storage: Vec<f64> = (0..d)
        .flat_map(|c| (0..t).map(move |r| (r, c)))
        .map(|(r, c)| xv[r * d + c])
        .collect();
    let storage = mlpc::HostTensor::from_f64(x.dtype(), vec![d, t], &storage)
        .map_err(|e| Error::Bench(e.to_string()))?;
    let mut view = device.upload(&storage)?;
    view.shape = vec![t, d];
    view.strides = vec![1, t];
    let out = resp.run_device(&[("x".to_string(), view)].into())?;
    let y = device.download(&out["y"])?;
    device.synchronize()?;
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
    Ok(ok)
}
