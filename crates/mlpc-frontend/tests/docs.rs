//! The complete models shown in `docs/model-format.md` load as documented.

use mlpc_frontend::{parse_model, write_tensors};
use mlpc_ir::{DType, HostTensor};
use std::collections::BTreeMap;
use std::path::Path;

/// The ```json blocks of the document that are whole models.
fn doc_models() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/model-format.md");
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("```json\n") {
        rest = &rest[start + 8..];
        let end = rest.find("```").unwrap();
        let block = &rest[..end];
        if block.trim_start().starts_with('{') && block.contains("\"mlpc\"") {
            out.push(block.to_string());
        }
        rest = &rest[end + 3..];
    }
    out
}

/// A safetensors file to write: its name and its tensors' names and shapes.
type File = (&'static str, &'static [(&'static str, &'static [usize])]);

fn zeros(shape: &[usize]) -> HostTensor {
    let n: usize = shape.iter().product();
    HostTensor::from_bytes(DType::Bf16, shape.to_vec(), vec![0; 2 * n]).unwrap()
}

#[test]
fn documented_models_load() {
    let dir = tempfile::tempdir().unwrap();
    let files: [File; 2] = [
        (
            "weights.safetensors",
            &[
                ("c_fc.weight", &[3072, 768]),
                ("c_fc.bias", &[3072]),
                ("c_proj.weight", &[768, 3072]),
                ("c_proj.bias", &[768]),
            ],
        ),
        (
            "block.safetensors",
            &[
                ("fc1.weight", &[4096, 1024]),
                ("fc1.bias", &[4096]),
                ("fc2.weight", &[1024, 4096]),
            ],
        ),
    ];
    for (file, tensors) in files {
        let t: BTreeMap<String, HostTensor> = tensors
            .iter()
            .map(|(n, s)| (n.to_string(), zeros(s)))
            .collect();
        write_tensors(&dir.path().join(file), &t).unwrap();
    }
    let models = doc_models();
    assert!(models.len() >= 3, "found {} models", models.len());
    for m in &models {
        if let Err(e) = parse_model(m, dir.path(), "doc.json") {
            panic!("{e}\n{m}");
        }
    }
}
