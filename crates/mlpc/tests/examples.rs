//! Every example runs on the CPU backend and agrees with the reference interpreter (at two token
//! counts, on fresh random inputs), through the same `check` a user runs.

#![cfg(feature = "cpu")]

use mlpc::{Backend, Compiler, CudaKernels};
use std::path::Path;

#[test]
fn every_example_agrees_with_the_reference_on_the_cpu_backend() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| root.join(n).join("model.json").is_file())
        .collect();
    names.sort();
    assert!(names.len() >= 7, "{names:?}");
    for name in names {
        let c = Compiler::new()
            .cuda_kernels(CudaKernels::Skip)
            .compile_file(&root.join(&name).join("model.json"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for t in [1, 3] {
            let r = c
                .check(Backend::Cpu, &[("T", t)], t)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(r.ok(), "{name} at T={t}: {r:?}");
        }
    }
}
