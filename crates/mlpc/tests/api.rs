//! The library API as a framework uses it: compile a model held in memory, run it, write its
//! artifacts.

use mlpc::{Backend, Compiler, DType, Error};
use std::path::Path;

const MODEL: &str = r#"{
  "mlpc": 1,
  "name": "api-test",
  "dtype": "f32",
  "seed": 5,
  "inputs": { "x": { "shape": ["T", 6] } },
  "layers": [
    { "op": "linear", "name": "fc1", "out": 10 },
    { "op": "silu" },
    { "op": "linear", "name": "fc2", "out": 6, "bias": false }
  ],
  "sparsity": { "fc1.weight": { "block": [5, 3], "density": 0.5 } }
}"#;

fn compiled() -> mlpc::Compiled {
    let model = mlpc::frontend::parse_model(MODEL, Path::new("."), "api.json").unwrap();
    Compiler::new().compile_model(model).unwrap()
}

#[test]
fn summary_describes_the_graph() {
    let s = compiled().summary();
    assert_eq!(s.name, "api-test");
    assert_eq!(s.dtypes, vec![DType::F32]);
    assert_eq!(s.inputs.len(), 1);
    assert_eq!(s.inputs[0].0, "x");
    assert_eq!(s.inputs[0].1.to_string(), "f32[T,6]");
    assert_eq!(s.outputs[0].0, "y");
    assert_eq!(s.outputs[0].1.to_string(), "f32[T,6]");
    // fc1.weight, fc1.bias, fc2.weight: (10*6 + 10 + 6*10) f32 values.
    assert_eq!(s.weights, 3);
    assert_eq!(s.weight_bytes, (60 + 10 + 60) * 4);
    assert_eq!(s.nodes, s.ops + s.weights + s.inputs.len());
    assert_eq!(s.sparse_weights, 1);
}

#[test]
fn reference_run_is_the_interpreter() {
    let c = compiled();
    let inputs = c.random_inputs(&[("T", 4)], 9).unwrap();
    assert_eq!(inputs["x"].shape(), &[4, 6]);
    let out = c.run(Backend::Reference, &inputs).unwrap();
    assert_eq!(out, mlpc::ir::interpret(c.graph(), &inputs).unwrap());
    assert_eq!(out["y"].shape(), &[4, 6]);
}

#[test]
fn unavailable_backends_say_so_and_list_the_available_ones() {
    let c = compiled();
    let inputs = c.random_inputs(&[("T", 1)], 0).unwrap();
    for b in [Backend::Cpu, Backend::Cuda] {
        if !Backend::available().contains(&b) {
            let e = c.run(b, &inputs).unwrap_err();
            assert!(matches!(e, Error::BackendUnavailable { backend, .. } if backend == b));
            let text = e.to_string();
            assert!(
                text.contains(b.name()) && text.contains("available: reference"),
                "{text}"
            );
        }
    }
}

#[test]
fn input_errors_come_through_unchanged() {
    let c = compiled();
    let mut inputs = c.random_inputs(&[("T", 2)], 0).unwrap();
    let x = inputs.remove("x").unwrap();
    inputs.insert("z".into(), x);
    let e = c.run(Backend::Reference, &inputs).unwrap_err();
    assert!(matches!(e, Error::Interp(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "unexpected input `z`: the model's inputs are `x`"
    );
}

#[test]
fn artifacts_hold_the_ir_text_and_are_written_together() {
    let c = compiled();
    let a = c.artifacts();
    let text = std::str::from_utf8(a.get("graph.txt").unwrap()).unwrap();
    assert_eq!(text, c.graph().to_string());
    assert!(text.starts_with("graph \"api-test\" {"), "{text}");

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("build");
    let written = c.write_to(&dir).unwrap();
    assert_eq!(written, vec![dir.join("graph.txt")]);
    assert_eq!(
        std::fs::read_to_string(dir.join("graph.txt")).unwrap(),
        text
    );
}

#[test]
fn tensor_files_round_trip() {
    let c = compiled();
    let inputs = c.random_inputs(&[("T", 3)], 1).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("in.safetensors");
    mlpc::write_tensors(&path, &inputs).unwrap();
    assert_eq!(mlpc::read_tensors(&path).unwrap(), inputs);
    let e = mlpc::read_tensors(&tmp.path().join("missing.safetensors")).unwrap_err();
    assert!(matches!(e, Error::Frontend(_)), "{e:?}");
}
