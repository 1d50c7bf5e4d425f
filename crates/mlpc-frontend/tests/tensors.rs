//! safetensors files: round trips, interoperability with the reference implementation, and
//! malformed files naming the file and the tensor.

use mlpc_frontend::{parse_tensors, read_tensors, write_tensors, FrontendError, TensorFileError};
use mlpc_ir::{DType, HostTensor};
use std::collections::BTreeMap;
use std::path::Path;

fn sample() -> BTreeMap<String, HostTensor> {
    let mut t = BTreeMap::new();
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        let shape = vec![3, 5 + i];
        let n: usize = shape.iter().product();
        let mut v: Vec<f64> = (0..n).map(|k| (k as f64 - 7.0) * 0.375).collect();
        v[1] = f64::NAN;
        v[2] = f64::NEG_INFINITY;
        t.insert(
            format!("t.{dtype}"),
            HostTensor::from_f64(dtype, shape, &v).unwrap(),
        );
    }
    t.insert(
        "scalar".into(),
        HostTensor::from_f64(DType::F32, vec![], &[4.0]).unwrap(),
    );
    t
}

fn same_bits(a: &HostTensor, b: &HostTensor) {
    assert_eq!(a.dtype(), b.dtype());
    assert_eq!(a.shape(), b.shape());
    assert_eq!(a.bytes(), b.bytes());
}

#[test]
fn round_trip_every_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.safetensors");
    let t = sample();
    write_tensors(&path, &t).unwrap();
    let back = read_tensors(&path).unwrap();
    assert_eq!(
        back.keys().collect::<Vec<_>>(),
        t.keys().collect::<Vec<_>>()
    );
    for (k, v) in &t {
        same_bits(v, &back[k]);
    }
    // Overwriting replaces the file whole and leaves no temporary file behind.
    let mut smaller = BTreeMap::new();
    smaller.insert("only".to_string(), t["t.f16"].clone());
    write_tensors(&path, &smaller).unwrap();
    assert_eq!(read_tensors(&path).unwrap().len(), 1);
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(files.len(), 1);
}

#[test]
fn the_reference_implementation_reads_what_we_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.safetensors");
    write_tensors(&path, &sample()).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let v = st.tensor("t.bf16").unwrap();
    assert_eq!(v.dtype(), safetensors::Dtype::BF16);
    assert_eq!(v.shape(), &[3, 7]);
    assert_eq!(v.data(), sample()["t.bf16"].bytes());
}

/// A safetensors file with one tensor, written by hand so that it can be wrong.
fn raw(name: &str, dtype: &str, shape: &[usize], data: &[u8], offsets: (usize, usize)) -> Vec<u8> {
    let header = format!(
        r#"{{"__metadata__":{{"format":"pt"}},"{name}":{{"dtype":"{dtype}","shape":{shape:?},"data_offsets":[{},{}]}}}}"#,
        offsets.0, offsets.1
    );
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    b
}

fn err(bytes: &[u8]) -> FrontendError {
    parse_tensors(bytes, Path::new("weights/w.safetensors")).unwrap_err()
}

/// `__metadata__` is the header's metadata: a tensor of that name would make a file no reader
/// accepts (mlpc's own included), so it is refused before anything is written.
#[test]
fn a_tensor_named_like_the_metadata_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.safetensors");
    let mut t = sample();
    t.insert("__metadata__".into(), t.values().next().unwrap().clone());
    let e = write_tensors(&path, &t).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{}: cannot serialize: a tensor named `__metadata__`: the safetensors format \
             reserves the name for its header's metadata",
            path.display()
        )
    );
    assert!(!path.exists());
}

#[test]
fn wrong_dtype_names_file_and_tensor() {
    let e = err(&raw("fc1.weight", "I32", &[2], &[0; 8], (0, 8)));
    assert!(matches!(
        &e,
        FrontendError::Tensors { error: TensorFileError::DType { tensor, .. }, .. } if tensor == "fc1.weight"
    ));
    insta::assert_snapshot!(e.to_string(), @"weights/w.safetensors: tensor `fc1.weight` has dtype I32; mlpc reads F32, F16 and BF16");
}

#[test]
fn truncated_file_names_file_and_tensor() {
    let e = err(&raw("fc1.weight", "F32", &[2, 2], &[0; 10], (0, 16)));
    insta::assert_snapshot!(e.to_string(), @"weights/w.safetensors: tensor `fc1.weight` lies at bytes 0..16 of the data, but the file holds only 10 byte(s) of data (truncated?)");

    // A real file cut short anywhere is refused, never misread.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.safetensors");
    write_tensors(&path, &sample()).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    for cut in [0, 4, 8, 20, bytes.len() / 2, bytes.len() - 1] {
        let e = parse_tensors(&bytes[..cut], &path).unwrap_err();
        assert!(
            e.to_string().starts_with(&path.display().to_string()),
            "{e}"
        );
    }
    let short = &bytes[..bytes.len() - 1];
    std::fs::write(&path, short).unwrap();
    let e = read_tensors(&path).unwrap_err().to_string();
    assert!(e.contains("tensor `t.") && e.contains("truncated"), "{e}");
}

#[test]
fn inconsistent_headers_are_refused() {
    let cases = [
        raw("w", "F16", &[2, 2], &[0; 8], (0, 6)),
        raw("w", "F16", &[2, 2], &[0; 8], (8, 0)),
        raw("w", "F32", &[usize::MAX, 4], &[0; 8], (0, 8)),
        b"\x02\x00\x00\x00\x00\x00\x00\x00[]".to_vec(),
        b"\x04\x00\x00\x00\x00\x00\x00\x00{\xff}\x00".to_vec(),
    ];
    let mut out = String::new();
    for c in cases {
        out.push_str(&err(&c).to_string());
        out.push('\n');
    }
    insta::assert_snapshot!(out);
    let e = read_tensors(Path::new("/nonexistent/w.safetensors")).unwrap_err();
    assert!(matches!(e, FrontendError::Read { .. }), "{e}");
}
