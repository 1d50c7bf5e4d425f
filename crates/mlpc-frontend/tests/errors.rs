//! Malformed models and tensor files: every message is a snapshot, one `case: message` block per
//! case in a single file, so the whole catalogue of errors reads as a document.

use mlpc_frontend::{parse_model, random_inputs, write_tensors, FrontendError};
use mlpc_ir::{DType, HostTensor};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// A valid graph-form model; cases edit it.
const BASE: &str = r#"{
  "mlpc": 1,
  "dtype": "f32",
  "params": { "fc1.weight": [16, 8], "fc1.bias": [16] },
  "inputs": { "x": { "shape": ["T", 8] } },
  "nodes": [
    { "name": "w1t", "op": "transpose", "inputs": ["fc1.weight"] },
    { "name": "h", "op": "matmul", "inputs": ["x", "w1t"] },
    { "name": "hb", "op": "add", "inputs": ["h", "fc1.bias"] },
    { "name": "y", "op": "gelu", "inputs": ["hb"] }
  ],
  "outputs": ["y"]
}"#;

/// A valid sequential model; cases edit it.
const SEQ: &str = r#"{
  "mlpc": 1,
  "dtype": "bf16",
  "inputs": { "x": { "shape": ["T", 8] } },
  "layers": [
    { "op": "linear", "in": 8, "out": 16 },
    { "op": "relu" },
    { "op": "linear", "out": 8 }
  ]
}"#;

fn edit(base: &str, from: &str, to: &str) -> String {
    assert!(base.contains(from), "case does not apply: {from}");
    base.replacen(from, to, 1)
}

fn error_of(json: &str, dir: &Path) -> String {
    match parse_model(json, dir, "model.json") {
        Ok(_) => "(no error)".to_string(),
        Err(e) => e.to_string().replace(&dir.display().to_string(), "<dir>"),
    }
}

fn model_cases() -> Vec<(&'static str, String)> {
    vec![
        ("syntax error", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\",]")),
        ("not an object", "[1, 2]".into()),
        ("duplicate key", edit(BASE, "\"dtype\": \"f32\",", "\"dtype\": \"f32\", \"dtype\": \"f16\",")),
        ("missing version", edit(BASE, "\"mlpc\": 1,", "")),
        ("unsupported version", edit(BASE, "\"mlpc\": 1", "\"mlpc\": 2")),
        ("unknown top-level key", edit(BASE, "\"outputs\"", "\"ouputs\"")),
        ("missing dtype", edit(BASE, "\"dtype\": \"f32\",", "")),
        ("bad dtype", edit(BASE, "\"f32\"", "\"fp32\"")),
        ("input dtype differs", edit(BASE, "\"shape\": [\"T\", 8]", "\"shape\": [\"T\", 8], \"dtype\": \"f16\"")),
        ("unknown op", edit(BASE, "\"op\": \"gelu\"", "\"op\": \"gleu\"")),
        ("wrong arity", edit(BASE, "\"inputs\": [\"x\", \"w1t\"]", "\"inputs\": [\"x\"]")),
        ("shape mismatch", edit(BASE, "\"fc1.weight\": [16, 8]", "\"fc1.weight\": [16, 9]")),
        ("bias of the wrong length", edit(BASE, "\"fc1.bias\": [16]", "\"fc1.bias\": [15]")),
        ("rank mismatch", edit(BASE, "\"inputs\": [\"x\", \"w1t\"]", "\"inputs\": [\"x\", \"fc1.bias\"]")),
        ("cycle", edit(BASE, "\"inputs\": [\"x\", \"w1t\"]", "\"inputs\": [\"y\", \"w1t\"]")),
        ("self loop", edit(BASE, "\"inputs\": [\"hb\"]", "\"inputs\": [\"y\"]")),
        ("duplicate node", edit(BASE, "{ \"name\": \"y\"", "{ \"name\": \"h\"")),
        ("node named like an input", edit(BASE, "{ \"name\": \"hb\"", "{ \"name\": \"x\"")),
        ("undefined name", edit(BASE, "[\"h\", \"fc1.bias\"]", "[\"h\", \"fc1.biass\"]")),
        ("empty name", edit(BASE, "{ \"name\": \"y\"", "{ \"name\": \"\"")),
        ("name reserved by safetensors", edit(BASE, "{ \"name\": \"hb\"", "{ \"name\": \"__metadata__\"")),
        ("zero dim", edit(BASE, "[\"T\", 8]", "[\"T\", 0]")),
        ("negative dim", edit(BASE, "[\"T\", 8]", "[\"T\", -8]")),
        ("fractional dim", edit(BASE, "[\"T\", 8]", "[\"T\", 8.5]")),
        ("huge dim", edit(BASE, "[\"T\", 8]", "[\"T\", 1e30]")),
        ("overflowing shape", edit(BASE, "[\"T\", 8]", "[4294967296, 4294967296, 8]")),
        ("bad symbol", edit(BASE, "[\"T\", 8]", "[\"2T\", 8]")),
        ("quoted number", edit(BASE, "[\"T\", 8]", "[\"T\", \"8\"]")),
        ("empty shape", edit(BASE, "[\"T\", 8]", "[]")),
        ("dim of the wrong type", edit(BASE, "[\"T\", 8]", "[\"T\", null]")),
        ("unknown key in a node", edit(BASE, "\"op\": \"gelu\"", "\"op\": \"gelu\", \"input\": []")),
        ("output names nothing", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"z\"]")),
        ("output names an input", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"x\"]")),
        ("output listed twice", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\", \"y\"]")),
        ("no outputs", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": []")),
        ("missing outputs", edit(BASE, ",\n  \"outputs\": [\"y\"]", "")),
        ("both forms", edit(BASE, "\"outputs\"", "\"layers\": [], \"outputs\"")),
        ("params and weights", edit(BASE, "\"params\"", "\"weights\": \"w.safetensors\", \"params\"")),
        ("missing weights file", edit(BASE, "\"params\": { \"fc1.weight\": [16, 8], \"fc1.bias\": [16] }", "\"weights\": \"missing.safetensors\"")),
        ("param too large to generate", edit(BASE, "\"fc1.weight\": [16, 8]", "\"fc1.weight\": [16, 8], \"big\": [100000, 100000]").replace("\"inputs\": [\"fc1.weight\"]", "\"inputs\": [\"big\"]")),
        ("sparsity block does not divide", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.weight\": { \"block\": [32, 8] } }")),
        ("sparsity density out of range", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.weight\": { \"block\": [8, 8], \"density\": 1.5 } }")),
        ("sparsity density zero", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.weight\": { \"block\": [8, 8], \"density\": 0 } }")),
        ("sparsity density below a double's range", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.weight\": { \"block\": [8, 8], \"density\": 1e-400 } }")),
        ("sparsity glob matches nothing", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"*.intermediate.dense.weight\": { \"block\": [8, 8] } }")),
        ("sparsity key names a node", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"w1t\": { \"block\": [8, 8] } }")),
        ("sparsity on a vector", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.*\": { \"block\": [8, 8] } }")),
        ("sparsity keys overlap", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.weight\": { \"block\": [8, 8] }, \"*.weight\": { \"block\": [4, 4] } }")),
        ("sparsity bad glob", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.[weight\": { \"block\": [8, 8] } }")),
        ("sparsity block of one dim", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.weight\": { \"block\": [8] } }")),
        ("sparsity with names no weight", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.weight\": { \"block\": [8, 8], \"density\": 0.5, \"with\": \"fc2.weight\" } }")),
        ("sparsity with without density", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.weight\": { \"block\": [8, 8], \"with\": \"fc2.weight\" } }")),
        ("sparsity with names itself", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.weight\": { \"block\": [8, 8], \"density\": 0.5, \"with\": \"fc1.weight\" } }")),
        ("sparsity with of another shape", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.weight\": { \"block\": [8, 8], \"density\": 0.5, \"with\": \"fc1.bias\" } }")),
        ("sparsity with of a glob key with other wildcards", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc?.weight\": { \"block\": [8, 8], \"density\": 0.5, \"with\": \"fc?.other\" } }")),
        ("sparsity with a glob for one weight", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.weight\": { \"block\": [8, 8], \"density\": 0.5, \"with\": \"fc*.other\" } }")),
        ("sparsity with not a string", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.weight\": { \"block\": [8, 8], \"density\": 0.5, \"with\": 3 } }")),
        ("sparsity unknown key", edit(BASE, "\"outputs\": [\"y\"]", "\"outputs\": [\"y\"], \"sparsity\": { \"fc1.weight\": { \"block\": [8, 8], \"denisty\": 0.5 } }")),
        ("layers with two inputs", edit(SEQ, "\"x\": { \"shape\": [\"T\", 8] }", "\"x\": { \"shape\": [\"T\", 8] }, \"z\": { \"shape\": [\"T\", 8] }")),
        ("layers with outputs", edit(SEQ, "\"layers\"", "\"outputs\": [\"y\"], \"layers\"")),
        ("layer in does not match", edit(SEQ, "\"in\": 8", "\"in\": 9")),
        ("layer without out", edit(SEQ, "{ \"op\": \"linear\", \"out\": 8 }", "{ \"op\": \"linear\" }")),
        ("layer unknown op", edit(SEQ, "\"relu\"", "\"rleu\"")),
        ("layer bias not a boolean", edit(SEQ, "\"out\": 16", "\"out\": 16, \"bias\": \"fc1.bias\"")),
        ("layer weight not in params", edit(SEQ, "\"mlpc\": 1,", "\"mlpc\": 1, \"params\": { \"fc9.weight\": [16, 8] },").replace("\"in\": 8, \"out\": 16", "\"weight\": \"fc1.weight\"")),
        ("layer names collide", edit(SEQ, "{ \"op\": \"relu\" }", "{ \"op\": \"relu\", \"name\": \"fc1\" }")),
        ("layers empty", edit(SEQ, "[\n    { \"op\": \"linear\", \"in\": 8, \"out\": 16 },\n    { \"op\": \"relu\" },\n    { \"op\": \"linear\", \"out\": 8 }\n  ]", "[]")),
        ("seed negative", edit(SEQ, "\"dtype\"", "\"seed\": -1, \"dtype\"")),
        ("allow_tf32 not a boolean", edit(SEQ, "\"dtype\"", "\"allow_tf32\": \"yes\", \"dtype\"")),
    ]
}

#[test]
fn model_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut out = String::new();
    for (name, json) in model_cases() {
        let msg = error_of(&json, dir.path());
        assert_ne!(msg, "(no error)", "case `{name}` was accepted");
        writeln!(out, "{name}:\n  {}\n", msg.replace('\n', "\n  ")).unwrap();
    }
    insta::assert_snapshot!(out);
}

fn weights_model(layers_weight: &str) -> String {
    format!(
        r#"{{
  "mlpc": 1,
  "dtype": "f32",
  "weights": "w.safetensors",
  "inputs": {{ "x": {{ "shape": ["T", 8] }} }},
  "layers": [ {layers_weight} ]
}}"#
    )
}

/// A directory with a weights file `w.safetensors` (and `junk.bin`), and models that misuse it.
fn weights_cases() -> (tempfile::TempDir, Vec<(&'static str, String)>) {
    let dir = tempfile::tempdir().unwrap();
    let mut t = BTreeMap::new();
    t.insert(
        "fc1.weight".to_string(),
        HostTensor::from_f64(DType::F32, vec![16, 8], &[0.5; 128]).unwrap(),
    );
    t.insert(
        "fc1.bias".to_string(),
        HostTensor::from_f64(DType::F16, vec![15], &[0.5; 15]).unwrap(),
    );
    t.insert(
        "vec".to_string(),
        HostTensor::from_f64(DType::F32, vec![8], &[0.5; 8]).unwrap(),
    );
    write_tensors(&dir.path().join("w.safetensors"), &t).unwrap();
    let cases = [
        (
            "weight missing from the file",
            weights_model(r#"{ "op": "linear", "weight": "fc1.weigth" }"#),
        ),
        (
            "bias of the wrong length",
            weights_model(r#"{ "op": "linear", "weight": "fc1.weight", "bias": "fc1.bias" }"#),
        ),
        (
            "weight is not a matrix",
            weights_model(r#"{ "op": "linear", "weight": "vec" }"#),
        ),
        (
            "generated linear with a weights file",
            weights_model(r#"{ "op": "linear", "out": 4 }"#),
        ),
        (
            "node named like a tensor of the file",
            weights_model(r#"{ "op": "linear", "name": "vec", "weight": "fc1.weight" }"#),
        ),
        (
            "weights file is not safetensors",
            weights_model(r#"{ "op": "linear", "weight": "fc1.weight" }"#)
                .replace("w.safetensors", "junk.bin"),
        ),
    ];
    std::fs::write(dir.path().join("junk.bin"), b"definitely not safetensors").unwrap();
    (dir, cases.to_vec())
}

#[test]
fn weights_file_errors() {
    let (dir, cases) = weights_cases();
    let mut out = String::new();
    for (name, json) in cases {
        let msg = error_of(&json, dir.path());
        assert_ne!(msg, "(no error)", "case `{name}` was accepted");
        writeln!(out, "{name}:\n  {msg}\n").unwrap();
    }
    insta::assert_snapshot!(out);
}

#[test]
fn random_inputs_name_the_unbound_symbol() {
    let m = parse_model(BASE, Path::new("."), "model.json").unwrap();
    let e = random_inputs(&m.graph, &[], 0).unwrap_err();
    assert!(matches!(e, FrontendError::RandomInput { .. }));
    insta::assert_snapshot!(e.to_string(), @"cannot make random input `x`: symbol `T` is not bound (bound: none)");
    // A symbol no input has is refused, bound beside the real ones or not (a misspelling).
    for bindings in [&[("B", 2)][..], &[("T", 3), ("B", 1)]] {
        let e = random_inputs(&m.graph, bindings, 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "symbol `B` is bound, but no input of the model has it (its symbols: T)"
        );
    }
    // Bindings are checked before any input is made.
    let e = random_inputs(&m.graph, &[("T", 0)], 0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "symbol `T` is bound to 0; dimensions are at least 1"
    );
    let e = random_inputs(&m.graph, &[("T", 3), ("T", 4)], 0).unwrap_err();
    assert_eq!(e.to_string(), "symbol `T` is bound twice, to 3 and 4");
    let a = random_inputs(&m.graph, &[("T", 3)], 9).unwrap();
    let b = random_inputs(&m.graph, &[("T", 3), ("T", 3)], 9).unwrap();
    let c = random_inputs(&m.graph, &[("T", 3)], 10).unwrap();
    assert_eq!(a["x"].shape(), &[3, 8]);
    assert_eq!(a, b);
    assert_ne!(a, c);
}

/// A state_dict may hold integer buffers beside the weights: they are fine until used.
#[test]
fn integer_tensors_load_only_when_unused() {
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let dir = tempfile::tempdir().unwrap();
    let w = vec![0u8; 16 * 8 * 4];
    let ids = vec![0u8; 8 * 8];
    let views = [
        (
            "fc1.weight",
            TensorView::new(Dtype::F32, vec![16, 8], &w).unwrap(),
        ),
        (
            "position_ids",
            TensorView::new(Dtype::I64, vec![8, 1], &ids).unwrap(),
        ),
    ];
    std::fs::write(
        dir.path().join("w.safetensors"),
        safetensors::serialize(views, &None).unwrap(),
    )
    .unwrap();
    let ok = weights_model(r#"{ "op": "linear", "weight": "fc1.weight" }"#);
    assert!(parse_model(&ok, dir.path(), "model.json").is_ok());
    let bad = weights_model(r#"{ "op": "linear", "weight": "position_ids" }"#);
    insta::assert_snapshot!(error_of(&bad, dir.path()), @"model.json:6:43: at `layers[0].weight`: cannot use this weight: <dir>/w.safetensors: tensor `position_ids` has dtype I64; mlpc reads F32, F16 and BF16");
    // Loaded zeroed, the weight's dtype is checked all the same.
    let path = dir.path().join("model.json");
    std::fs::write(&path, &bad).unwrap();
    let e = mlpc_frontend::load_model_zeroed(&path).unwrap_err();
    assert!(
        e.to_string()
            .contains("tensor `position_ids` has dtype I64"),
        "{e}"
    );
    // Reading the whole file, as for run-time inputs, refuses it.
    let e = mlpc_frontend::read_tensors(&dir.path().join("w.safetensors")).unwrap_err();
    assert!(
        e.to_string()
            .contains("tensor `position_ids` has dtype I64"),
        "{e}"
    );
}

/// `load_model_zeroed` reads no weight values, but refuses every model `load_model` refuses, with
/// the same message, and loads the same graph where `load_model` loads one.
#[test]
fn zeroed_loading_refuses_what_loading_refuses() {
    let (dir, mut cases) = weights_cases();
    cases.extend(model_cases());
    cases.push(("base", BASE.to_string()));
    cases.push(("sequential", SEQ.to_string()));
    let path = dir.path().join("model.json");
    let (mut loaded, mut refused) = (0, 0);
    for (name, json) in cases {
        std::fs::write(&path, &json).unwrap();
        match (
            mlpc_frontend::load_model(&path),
            mlpc_frontend::load_model_zeroed(&path),
        ) {
            (Err(a), Err(b)) => {
                assert_eq!(a.to_string(), b.to_string(), "case `{name}`");
                refused += 1;
            }
            (Ok(a), Ok(b)) => {
                assert_eq!(a.graph.to_string(), b.graph.to_string(), "case `{name}`");
                assert_eq!(a.sparsity, b.sparsity, "case `{name}`");
                loaded += 1;
            }
            (a, b) => panic!(
                "case `{name}`: load_model gave {:?}, load_model_zeroed {:?}",
                a.err().map(|e| e.to_string()),
                b.err().map(|e| e.to_string())
            ),
        }
    }
    assert!(
        loaded >= 2 && refused >= 20,
        "{loaded} loaded, {refused} refused"
    );
}
