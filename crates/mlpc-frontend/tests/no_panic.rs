//! Whatever the bytes, the frontend answers with a model or an error, never a panic: random byte
//! strings, and structural mutations of valid models (keys dropped, values replaced by other types
//! or by edge-case numbers, nodes duplicated).

use mlpc_frontend::{parse_model, parse_tensors, write_tensors};
use mlpc_ir::{DType, HostTensor};
use proptest::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

const GRAPH: &str = r#"{
  "mlpc": 1,
  "name": "g",
  "dtype": "bf16",
  "seed": 1,
  "allow_tf32": false,
  "params": { "gate.weight": [8, 4], "up.weight": [8, 4], "down.weight": [4, 8], "b": [4] },
  "inputs": { "x": { "shape": ["T", 4], "dtype": "bf16" } },
  "nodes": [
    { "name": "gt", "op": "transpose", "inputs": ["gate.weight"] },
    { "name": "ut", "op": "transpose", "inputs": ["up.weight"] },
    { "name": "dt", "op": "transpose", "inputs": ["down.weight"] },
    { "name": "g", "op": "matmul", "inputs": ["x", "gt"] },
    { "name": "u", "op": "matmul", "inputs": ["x", "ut"] },
    { "name": "a", "op": "gelu_tanh", "inputs": ["g"] },
    { "name": "h", "op": "mul", "inputs": ["a", "u"] },
    { "name": "d", "op": "matmul", "inputs": ["h", "dt"] },
    { "name": "y", "op": "add", "inputs": ["d", "b"] }
  ],
  "outputs": ["y"],
  "sparsity": { "{gate,up}.weight": { "block": [4, 4], "density": 0.5 }, "down.weight": { "block": [2, 4] } }
}"#;

const LAYERS: &str = r#"{
  "mlpc": 1,
  "dtype": "f32",
  "inputs": { "x": { "shape": ["B", "T", 4] } },
  "layers": [
    { "op": "linear", "name": "fc1", "in": 4, "out": 8, "bias": true },
    { "op": "silu" },
    { "op": "linear", "out": 4, "bias": false }
  ],
  "sparsity": { "fc1.weight": { "block": [4, 2], "density": 0.25 } }
}"#;

const FILE: &str = r#"{
  "mlpc": 1,
  "dtype": "f16",
  "weights": "w.safetensors",
  "inputs": { "x": { "shape": ["T", 4] } },
  "layers": [
    { "op": "linear", "weight": "fc1.weight", "bias": "fc1.bias" },
    { "op": "relu" },
    { "op": "linear", "weight": "fc2.weight" }
  ]
}"#;

/// A directory holding `w.safetensors` for [`FILE`], made once.
fn weights_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut t = BTreeMap::new();
        let w = |shape: Vec<usize>| {
            let n: usize = shape.iter().product();
            let v: Vec<f64> = (0..n).map(|i| i as f64 / 8.0).collect();
            HostTensor::from_f64(DType::F32, shape, &v).unwrap()
        };
        t.insert("fc1.weight".to_string(), w(vec![8, 4]));
        t.insert("fc1.bias".to_string(), w(vec![8]));
        t.insert("fc2.weight".to_string(), w(vec![4, 8]));
        write_tensors(&dir.path().join("w.safetensors"), &t).unwrap();
        dir
    })
    .path()
}

#[test]
fn the_seed_models_are_valid() {
    for json in [GRAPH, LAYERS, FILE] {
        if let Err(e) = parse_model(json, weights_dir(), "m.json") {
            panic!("{e}");
        }
    }
}

/// Values that break assumptions: edge-case numbers and every other JSON type.
fn nasty() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::from(0)),
        Just(Value::from(-1)),
        Just(Value::from(1.5)),
        Just(Value::from(u64::MAX)),
        Just(Value::from(i64::MIN)),
        Just(Value::from(1e300)),
        Just(Value::from(4294967296u64)),
        Just(Value::from(1)),
        Just(Value::from(2)),
        Just(Value::Null),
        Just(Value::Bool(true)),
        Just(Value::from("")),
        Just(Value::from("T")),
        Just(Value::from("x")),
        Just(Value::from("y")),
        Just(Value::from("g")),
        Just(Value::from("fc1.weight")),
        Just(Value::from("*")),
        Just(Value::from("[")),
        Just(Value::from(" \u{0} ")),
        Just(Value::Array(vec![])),
        Just(Value::Array(vec![Value::from(3), Value::from("T")])),
        Just(Value::Object(Default::default())),
        "[a-z_.*]{0,6}".prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
    ]
}

#[derive(Clone, Debug)]
enum Mutation {
    /// Remove the entry at this (wrapped) index of an object, or element of an array.
    Drop,
    /// Replace the value with a nasty one.
    Replace(Value),
    /// Duplicate an array element (a node, a layer, an input name).
    Duplicate,
    /// Add an entry with this key.
    Insert(String, Value),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        Just(Mutation::Drop),
        nasty().prop_map(Mutation::Replace),
        Just(Mutation::Duplicate),
        ("[a-z_]{1,8}", nasty()).prop_map(|(k, v)| Mutation::Insert(k, v)),
    ]
}

/// Applies `m` at the value reached by following `path` (each step picks a child by index modulo
/// the number of children, stopping early at leaves).
fn apply(v: &mut Value, path: &[usize], m: &Mutation) {
    let n_children = match v {
        Value::Array(a) => a.len(),
        Value::Object(o) => o.len(),
        _ => 0,
    };
    if let Some((&step, rest)) = path.split_first() {
        if n_children > 0 && !rest.is_empty() {
            let i = step % n_children;
            let child = match v {
                Value::Array(a) => &mut a[i],
                Value::Object(o) => match o.values_mut().nth(i) {
                    Some(c) => c,
                    None => return,
                },
                _ => return,
            };
            return apply(child, rest, m);
        }
        // Act on this container's child `step`.
        match (v, m) {
            (v, Mutation::Replace(new)) if n_children == 0 => *v = new.clone(),
            (Value::Array(a), Mutation::Drop) if !a.is_empty() => {
                a.remove(step % a.len());
            }
            (Value::Object(o), Mutation::Drop) if !o.is_empty() => {
                if let Some(k) = o.keys().nth(step % o.len()).cloned() {
                    o.shift_remove(&k);
                }
            }
            (Value::Array(a), Mutation::Duplicate) if !a.is_empty() => {
                let e = a[step % a.len()].clone();
                a.push(e);
            }
            (Value::Array(a), Mutation::Replace(new)) if !a.is_empty() => {
                let i = step % a.len();
                a[i] = new.clone();
            }
            (Value::Object(o), Mutation::Replace(new)) if !o.is_empty() => {
                let i = step % o.len();
                if let Some(c) = o.values_mut().nth(i) {
                    *c = new.clone();
                }
            }
            (Value::Object(o), Mutation::Insert(k, new)) => {
                o.insert(k.clone(), new.clone());
            }
            (Value::Array(a), Mutation::Insert(_, new)) => a.push(new.clone()),
            _ => {}
        }
    } else if let Mutation::Replace(new) = m {
        *v = new.clone();
    }
}

fn check(text: &str) {
    // Any result is fine; a panic fails the test.
    let _ = parse_model(text, weights_dir(), "m.json");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        check(&String::from_utf8_lossy(&bytes));
        let _ = parse_tensors(&bytes, Path::new("fuzz.safetensors"));
    }

    #[test]
    fn random_text_near_json_never_panics(s in r#"[{}\[\]":,0-9a-z .\-]{0,200}"#) {
        check(&s);
    }

    #[test]
    fn mutated_models_never_panic(
        which in 0usize..3,
        edits in proptest::collection::vec((proptest::collection::vec(any::<usize>(), 1..6), mutation()), 1..4),
    ) {
        let mut v: Value = serde_json::from_str([GRAPH, LAYERS, FILE][which]).unwrap();
        for (path, m) in &edits {
            apply(&mut v, path, m);
        }
        check(&v.to_string());
        check(&serde_json::to_string_pretty(&v).unwrap());
    }

    #[test]
    fn truncated_and_flipped_tensor_files_never_panic(cut in 0usize..400, flip in any::<(usize, u8)>()) {
        let bytes = std::fs::read(weights_dir().join("w.safetensors")).unwrap();
        let mut b = bytes[..cut.min(bytes.len())].to_vec();
        if !b.is_empty() {
            let i = flip.0 % b.len();
            b[i] ^= flip.1;
        }
        let _ = parse_tensors(&b, Path::new("w.safetensors"));
    }
}

/// The mutations reach deep enough to matter: some mutants stay valid, most are rejected.
#[test]
fn mutations_produce_both_valid_and_invalid_models() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = (
        0usize..3,
        proptest::collection::vec(any::<usize>(), 1..6),
        mutation(),
    );
    let (mut ok, mut err) = (0, 0);
    for _ in 0..500 {
        let (which, path, m) = strategy.new_tree(&mut runner).unwrap().current();
        let mut v: Value = serde_json::from_str([GRAPH, LAYERS, FILE][which]).unwrap();
        apply(&mut v, &path, &m);
        match parse_model(&v.to_string(), weights_dir(), "m.json") {
            Ok(_) => ok += 1,
            Err(_) => err += 1,
        }
    }
    assert!(ok > 10 && err > 100, "valid {ok}, rejected {err}");
}
