//! Valid models: the IR text of each is a snapshot, and the loaded data is checked.

use mlpc_frontend::{load_model, parse_model, read_tensors, write_tensors, Model, SparsitySpec};
use mlpc_ir::{DType, HostTensor, Op};
use std::collections::BTreeMap;
use std::path::Path;

fn parse(json: &str) -> Model {
    match parse_model(json, Path::new("."), "model.json") {
        Ok(m) => m,
        Err(e) => panic!("{e}"),
    }
}

fn weight(m: &Model, name: &str) -> Vec<f64> {
    m.graph
        .weight(name)
        .unwrap_or_else(|| panic!("no weight `{name}`"))
        .to_f64()
}

const SEQ_BIAS: &str = r#"{
  "mlpc": 1,
  "name": "seq-bias",
  "dtype": "f32",
  "seed": 3,
  "inputs": { "x": { "shape": ["T", 8] } },
  "layers": [
    { "op": "linear", "in": 8, "out": 16 },
    { "op": "gelu" },
    { "op": "linear", "name": "proj", "out": 8, "bias": true },
    { "op": "tanh", "name": "squash" }
  ]
}"#;

#[test]
fn sequential_with_bias() {
    let m = parse(SEQ_BIAS);
    insta::assert_snapshot!(m.graph.to_string());
    assert!(!m.allow_tf32);
    assert!(m.sparsity.is_empty());
    // nn.Linear's init: uniform in [-1/sqrt(in), 1/sqrt(in)) for weight and bias.
    let bound = 1.0 / 8f64.sqrt();
    for name in ["fc1.weight", "fc1.bias"] {
        let v = weight(&m, name);
        assert!(v.iter().all(|x| x.abs() <= bound), "{name}");
        assert!(
            v.iter().any(|x| x.abs() > bound / 2.0),
            "{name} looks degenerate"
        );
    }
    let b16 = 1.0 / 16f64.sqrt();
    assert!(weight(&m, "proj.weight").iter().all(|x| x.abs() <= b16));
    assert_eq!(m.graph.weight("proj.weight").unwrap().shape(), &[8, 16]);
}

#[test]
fn sequential_without_bias() {
    let m = parse(
        r#"{
  "mlpc": 1,
  "dtype": "bf16",
  "allow_tf32": true,
  "inputs": { "tokens": { "shape": ["B", "T", 4], "dtype": "bf16" } },
  "layers": [
    { "op": "linear", "out": 12, "bias": false },
    { "op": "relu" },
    { "op": "linear", "in": 12, "out": 4, "bias": false },
    { "op": "silu" }
  ]
}"#,
    );
    insta::assert_snapshot!(m.graph.to_string());
    assert!(m.allow_tf32);
    // The default name is the file's stem, where that is a valid name.
    assert_eq!(m.graph.name, "model");
    let text = r#"{ "mlpc": 1, "dtype": "f32", "inputs": { "x": { "shape": [2] } },
                    "layers": [{ "op": "relu" }] }"#;
    for (file, name) in [
        ("ffn-7.json", "ffn-7"),
        ("my\nmodel.json", "model"),
        ("two words.json", "model"),
        ("__metadata__.json", "model"),
    ] {
        let m = parse_model(text, Path::new("."), file).unwrap();
        assert_eq!(m.graph.name, name, "{file:?}");
    }
    // Generated values are rounded to the model dtype.
    for v in weight(&m, "fc1.weight") {
        assert_eq!(DType::Bf16.round(v), v);
    }
}

#[test]
fn graph_form_with_shared_weights_and_a_residual() {
    let m = parse(
        r#"{
  "mlpc": 1,
  "name": "shared",
  "dtype": "f16",
  "params": { "w": [8, 8], "b": [8] },
  "inputs": { "x": { "shape": ["T", 8] } },
  "nodes": [
    { "name": "y", "op": "add", "inputs": ["h2", "x"] },
    { "name": "wt", "op": "transpose", "inputs": ["w"] },
    { "name": "h1", "op": "matmul", "inputs": ["x", "wt"] },
    { "name": "h1b", "op": "add", "inputs": ["h1", "b"] },
    { "name": "a", "op": "relu", "inputs": ["h1b"] },
    { "name": "h2", "op": "matmul", "inputs": ["a", "wt"] }
  ],
  "outputs": ["y", "a"]
}"#,
    );
    insta::assert_snapshot!(m.graph.to_string());
    // One weight node, used by both products through one transpose.
    let weights: Vec<_> = m
        .graph
        .node_ids()
        .filter(|&n| m.graph.node(n).op == Op::Weight)
        .map(|n| m.graph.node(n).name.clone())
        .collect();
    assert_eq!(weights, ["w", "b"]);
    let wt = m.graph.find("wt").unwrap();
    assert_eq!(m.graph.users(wt).len(), 2);
}

const GEGLU: &str = r#"{
  "mlpc": 1,
  "name": "geglu",
  "dtype": "bf16",
  "seed": 11,
  "params": {
    "gate.weight": [32, 16],
    "up.weight": [32, 16],
    "down.weight": [16, 32],
    "unused.weight": [4, 4]
  },
  "inputs": { "x": { "shape": ["T", 16] } },
  "nodes": [
    { "name": "gate.t", "op": "transpose", "inputs": ["gate.weight"] },
    { "name": "up.t", "op": "transpose", "inputs": ["up.weight"] },
    { "name": "down.t", "op": "transpose", "inputs": ["down.weight"] },
    { "name": "g", "op": "matmul", "inputs": ["x", "gate.t"] },
    { "name": "u", "op": "matmul", "inputs": ["x", "up.t"] },
    { "name": "a", "op": "gelu", "inputs": ["g"] },
    { "name": "h", "op": "mul", "inputs": ["a", "u"] },
    { "name": "y", "op": "matmul", "inputs": ["h", "down.t"] }
  ],
  "outputs": ["y"],
  "sparsity": {
    "down.weight": { "block": [16, 16] },
    "{gate,up}.weight": { "block": [8, 16], "density": 0.5 }
  }
}"#;

#[test]
fn gated_geglu_graph_form_with_sparsity() {
    let m = parse(GEGLU);
    insta::assert_snapshot!(m.graph.to_string());
    // Only used weights become nodes.
    assert!(m.graph.weight("unused.weight").is_none());
    assert_eq!(
        m.sparsity,
        vec![
            SparsitySpec {
                weight: "down.weight".into(),
                pattern: "down.weight".into(),
                block: [16, 16],
                density: None,
                with: None,
            },
            SparsitySpec {
                weight: "gate.weight".into(),
                pattern: "{gate,up}.weight".into(),
                block: [8, 16],
                density: Some(0.5),
                with: None,
            },
            SparsitySpec {
                weight: "up.weight".into(),
                pattern: "{gate,up}.weight".into(),
                block: [8, 16],
                density: Some(0.5),
                with: None,
            },
        ]
    );
}

/// A key that is a used weight's name selects that weight, though it reads as a glob: `w[0]`
/// (as a glob, it matches `w0`, which it used to select, leaving `w[0]` dense).
#[test]
fn with_names_the_weight_pruned_together_also_through_a_glob() {
    let spec = |weight: &str, pattern: &str, with: &str| SparsitySpec {
        weight: weight.into(),
        pattern: pattern.into(),
        block: [8, 16],
        density: Some(0.25),
        with: Some(with.into()),
    };
    for (key, with) in [("gate.weight", "up.weight"), ("*gate.w*", "*up.w*")] {
        let text = GEGLU.replace(
            r#""down.weight": { "block": [16, 16] },
    "{gate,up}.weight": { "block": [8, 16], "density": 0.5 }"#,
            &format!(r#""{key}": {{ "block": [8, 16], "density": 0.25, "with": "{with}" }}"#),
        );
        assert_ne!(text, GEGLU);
        let m = parse(&text);
        assert_eq!(
            m.sparsity,
            vec![
                spec("gate.weight", key, "up.weight"),
                spec("up.weight", key, "gate.weight"),
            ],
            "{key}"
        );
    }
}

#[test]
fn a_key_that_names_a_weight_selects_it_before_any_glob_reading() {
    let model = |key: &str| {
        format!(
            r#"{{
  "mlpc": 1, "name": "g", "dtype": "f32", "seed": 1,
  "inputs": {{ "x": {{ "shape": ["T", 8] }} }},
  "params": {{ "w[0]": [8, 8], "w0": [8, 8] }},
  "nodes": [
    {{ "name": "a.t", "op": "transpose", "inputs": ["w[0]"] }},
    {{ "name": "b.t", "op": "transpose", "inputs": ["w0"] }},
    {{ "name": "a", "op": "matmul", "inputs": ["x", "a.t"] }},
    {{ "name": "y", "op": "matmul", "inputs": ["a", "b.t"] }}
  ],
  "outputs": ["y"],
  "sparsity": {{ "{key}": {{ "block": [4, 4], "density": 0.5 }} }}
}}"#
        )
    };
    let selected = |key: &str| -> Vec<String> {
        parse(&model(key))
            .sparsity
            .into_iter()
            .map(|s| s.weight)
            .collect()
    };
    assert_eq!(selected("w[0]"), ["w[0]"]);
    assert_eq!(selected("w0"), ["w0"]);
    assert_eq!(selected("w?"), ["w0"]);
    assert_eq!(selected("w*"), ["w0", "w[0]"]);
}

/// A density is the decimal number written, correctly rounded (serde_json's default float
/// parser is not: 0.12499999999999999 was read as 0.125, keeping round(0.125 x 4) = 1 block of
/// four where the rule keeps round(0.49999999999999994) = 0, and the halfway literal below was
/// read as the next double above 1 and refused).
#[test]
fn densities_are_read_correctly_rounded() {
    for (text, want) in [
        ("0.12499999999999999", 0.12499999999999999_f64),
        (
            "1.00000000000000011102230246251565404236316680908203125",
            1.0,
        ),
        ("0.1", 0.1),
    ] {
        let m = parse(&GEGLU.replace(r#""density": 0.5"#, &format!(r#""density": {text}"#)));
        assert_eq!(m.sparsity[1].density, Some(want), "{text}");
        assert_eq!(
            m.sparsity[1].density.map(f64::to_bits),
            Some(text.parse::<f64>().unwrap().to_bits()),
            "{text}"
        );
    }
}

#[test]
fn generated_weights_depend_on_seed_and_name_only() {
    let a = parse(
        r#"{"mlpc": 1, "dtype": "f32", "seed": 5, "inputs": {"x": {"shape": [2, 8]}},
            "layers": [{"op": "linear", "name": "a", "out": 8}, {"op": "relu"},
                       {"op": "linear", "name": "b", "out": 8}]}"#,
    );
    let b = parse(
        r#"{"mlpc": 1, "dtype": "f32", "seed": 5, "inputs": {"x": {"shape": [2, 8]}},
            "layers": [{"op": "linear", "name": "a", "out": 8}, {"op": "relu"},
                       {"op": "linear", "name": "extra", "out": 8}, {"op": "relu"},
                       {"op": "linear", "name": "b", "out": 8}]}"#,
    );
    let c = parse(
        r#"{"mlpc": 1, "dtype": "f32", "seed": 6, "inputs": {"x": {"shape": [2, 8]}},
            "layers": [{"op": "linear", "name": "b", "out": 8}]}"#,
    );
    assert_eq!(weight(&a, "b.weight"), weight(&b, "b.weight"));
    assert_eq!(weight(&a, "b.bias"), weight(&b, "b.bias"));
    assert_ne!(weight(&a, "a.weight"), weight(&a, "b.weight"));
    assert_ne!(weight(&a, "b.weight"), weight(&c, "b.weight"));
    // The same name in `params` gives the same values as a generated linear.
    let p = parse(
        r#"{"mlpc": 1, "dtype": "f32", "seed": 5, "params": {"b.weight": [8, 8]},
            "inputs": {"x": {"shape": [2, 8]}},
            "layers": [{"op": "linear", "weight": "b.weight"}]}"#,
    );
    assert_eq!(weight(&a, "b.weight"), weight(&p, "b.weight"));
}

fn file_tensors() -> BTreeMap<String, HostTensor> {
    let w1: Vec<f64> = (0..16 * 8).map(|i| (i as f64 - 64.0) / 32.0).collect();
    let b1: Vec<f64> = (0..16).map(|i| i as f64 / 4.0).collect();
    let mut w2: Vec<f64> = (0..8 * 16).map(|i| (i % 7) as f64 - 3.0).collect();
    w2[5] = f64::NAN; // data, not an error
    let mut t = BTreeMap::new();
    t.insert(
        "fc1.weight".into(),
        HostTensor::from_f64(DType::F16, vec![16, 8], &w1).unwrap(),
    );
    t.insert(
        "fc1.bias".into(),
        HostTensor::from_f64(DType::F32, vec![16], &b1).unwrap(),
    );
    t.insert(
        "fc2.weight".into(),
        HostTensor::from_f64(DType::Bf16, vec![8, 16], &w2).unwrap(),
    );
    t.insert(
        "not.used".into(),
        HostTensor::from_f64(DType::F32, vec![3], &[1.0, 2.0, 3.0]).unwrap(),
    );
    t
}

#[test]
fn safetensors_weights_are_converted_to_the_model_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = file_tensors();
    write_tensors(&dir.path().join("w.safetensors"), &tensors).unwrap();
    let model_path = dir.path().join("two-layer.json");
    std::fs::write(
        &model_path,
        r#"{
  "mlpc": 1,
  "dtype": "f32",
  "weights": "w.safetensors",
  "inputs": { "x": { "shape": ["T", 8] } },
  "layers": [
    { "op": "linear", "weight": "fc1.weight", "bias": "fc1.bias" },
    { "op": "gelu_tanh" },
    { "op": "linear", "name": "out", "weight": "fc2.weight" }
  ]
}"#,
    )
    .unwrap();
    let m = load_model(&model_path).unwrap();
    insta::assert_snapshot!(m.graph.to_string());
    assert_eq!(m.source, model_path);
    assert_eq!(m.graph.name, "two-layer");
    assert!(m.graph.weight("not.used").is_none());
    // f16 and bf16 widen to f32 exactly; the NaN stays a NaN.
    assert_eq!(weight(&m, "fc1.weight"), tensors["fc1.weight"].to_f64());
    let w2 = weight(&m, "fc2.weight");
    assert!(w2[5].is_nan());
    assert_eq!(w2[6], tensors["fc2.weight"].get(6));

    // A bf16 model rounds f32 values to bf16.
    let text = std::fs::read_to_string(&model_path)
        .unwrap()
        .replace("\"f32\"", "\"bf16\"");
    let m16 = parse_model(&text, dir.path(), "two-layer.json").unwrap();
    let want: Vec<f64> = tensors["fc1.bias"]
        .to_f64()
        .into_iter()
        .map(|v| DType::Bf16.round(v))
        .collect();
    assert_eq!(weight(&m16, "fc1.bias"), want);
    assert_eq!(m16.graph.weight("fc1.bias").unwrap().dtype(), DType::Bf16);
}

/// `load_model_zeroed` gives the graph `load_model` gives, each weight zeros of the model's dtype
/// and the weight's shape: from a weights file (whose tensors have other dtypes) and from `params`.
#[test]
fn zeroed_weights_keep_their_dtype_and_shape() {
    let dir = tempfile::tempdir().unwrap();
    write_tensors(&dir.path().join("w.safetensors"), &file_tensors()).unwrap();
    let file_model = r#"{
  "mlpc": 1,
  "dtype": "bf16",
  "weights": "w.safetensors",
  "inputs": { "x": { "shape": ["T", 8] } },
  "layers": [
    { "op": "linear", "weight": "fc1.weight", "bias": "fc1.bias" },
    { "op": "relu" },
    { "op": "linear", "weight": "fc2.weight" }
  ],
  "sparsity": { "fc2.weight": { "block": [4, 8], "density": 0.5 } }
}"#;
    for (file, json) in [("file.json", file_model), ("params.json", SEQ_BIAS)] {
        let path = dir.path().join(file);
        std::fs::write(&path, json).unwrap();
        let (a, z) = (
            load_model(&path).unwrap(),
            mlpc_frontend::load_model_zeroed(&path).unwrap(),
        );
        assert_eq!(a.graph.to_string(), z.graph.to_string());
        assert_eq!(a.sparsity, z.sparsity);
        assert_eq!(a.source, z.source);
        let (wa, wz) = (a.graph.weights(), z.graph.weights());
        assert_eq!(wa.keys().collect::<Vec<_>>(), wz.keys().collect::<Vec<_>>());
        for (name, t) in wa {
            let zt = &wz[name];
            assert_eq!((t.dtype(), t.shape()), (zt.dtype(), zt.shape()), "{name}");
            assert!(t.bytes().iter().any(|&b| b != 0), "{name}: all zero loaded");
            assert!(zt.bytes().iter().all(|&b| b == 0), "{name}");
        }
    }
}

#[test]
fn graph_form_reads_weights_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    write_tensors(&dir.path().join("w.safetensors"), &file_tensors()).unwrap();
    let json = r#"{
  "mlpc": 1,
  "dtype": "f16",
  "weights": "w.safetensors",
  "inputs": { "x": { "shape": [4, 8] } },
  "nodes": [
    { "name": "w1t", "op": "transpose", "inputs": ["fc1.weight"] },
    { "name": "h", "op": "matmul", "inputs": ["x", "w1t"] },
    { "name": "hb", "op": "add", "inputs": ["fc1.bias", "h"] }
  ],
  "outputs": ["hb"]
}"#;
    let m = parse_model(json, dir.path(), "g.json").unwrap();
    insta::assert_snapshot!(m.graph.to_string());
    assert_eq!(
        m.graph.weights().keys().collect::<Vec<_>>(),
        ["fc1.bias", "fc1.weight"]
    );
    assert_eq!(
        read_tensors(&dir.path().join("w.safetensors"))
            .unwrap()
            .len(),
        4
    );
}

#[test]
fn every_example_loads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let dirs =
        std::fs::read_dir(&root).unwrap_or_else(|e| panic!("cannot list {}: {e}", root.display()));
    let mut n = 0;
    for d in dirs {
        let path = d.unwrap().path().join("model.json");
        if path.exists() {
            if let Err(e) = load_model(&path) {
                panic!("{e}");
            }
            n += 1;
        }
    }
    assert!(n > 0, "no examples under {}", root.display());
}
