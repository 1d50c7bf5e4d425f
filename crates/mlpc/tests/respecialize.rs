//! Re-specialised variants (a transposed input read as the row-major memory it is) compute what
//! the model computes: for three examples, the variant on the reference interpreter and the CPU
//! backend against the reference interpreter on the original model.

use mlpc::{Backend, Compiler};
use std::collections::BTreeMap;
use std::path::Path;

fn check(example: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(example)
        .join("model.json");
    let model = mlpc::frontend::load_model(&path).unwrap();
    let original = Compiler::new()
        .cuda_kernels(mlpc::CudaKernels::Skip)
        .compile_model(model.clone())
        .unwrap();
    let host = original.random_inputs(&[("T", 7)], 3).unwrap();
    let want = original.run(Backend::Reference, &host).unwrap();

    let mut variant_model = model;
    variant_model.graph = mlpc::transpose_inputs(&variant_model.graph, &["x".to_string()]).unwrap();
    let variant = Compiler::new()
        .cuda_kernels(mlpc::CudaKernels::Skip)
        .compile_model(variant_model)
        .unwrap();
    let x = &host["x"];
    let (t, d) = (x.shape()[0], x.shape()[1]);
    let xv = x.to_f64();
    let storage: Vec<f64> = (0..d)
        .flat_map(|c| (0..t).map(move |r| (r, c)))
        .map(|(r, c)| xv[r * d + c])
        .collect();
    let storage = mlpc::HostTensor::from_f64(x.dtype(), vec![d, t], &storage).unwrap();
    let inputs: BTreeMap<String, mlpc::HostTensor> = [("x".to_string(), storage)].into();
    for backend in [Backend::Reference, Backend::Cpu] {
        let got = variant.run(backend, &inputs).unwrap();
        let err = mlpc::ir::relative_error(&got["y"].to_f64(), &want["y"].to_f64());
        assert!(
            err <= mlpc::tolerance(got["y"].dtype()),
            "{example} on {backend:?}: relative error {err}"
        );
    }
}

#[test]
fn gpt2() {
    check("gpt2-mlp");
}

#[test]
fn seed_geglu() {
    check("seed-geglu");
}

#[test]
fn tiny() {
    check("tiny-mlp");
}
