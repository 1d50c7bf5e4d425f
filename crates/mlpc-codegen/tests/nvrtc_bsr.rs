//! Compiles every block-sparse sample kernel and every plan of `bsr_plans` (every block shape,
//! plain and dual) with the real NVRTC, for sm_90 and sm_80, and checks that none touches local
//! memory (no spilled accumulators, no indexed register arrays).
//!
//! Needs NVRTC 13.0 (`LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib`, or `MLPC_NVRTC_LIB`, as
//! `scripts/test.sh` sets up); without it these tests fail rather than skip.

use mlpc_codegen::{generate, samples, Arch, CodegenOptions, CudaKernel};

mod bsr_plans;
mod nvrtc_checks;

fn sparse_kernels(arch: Arch) -> Vec<CudaKernel> {
    let opts = CodegenOptions {
        arch,
        ..CodegenOptions::default()
    };
    samples::sparse()
        .iter()
        .chain(&bsr_plans::all())
        .flat_map(|p| generate(p, &opts).unwrap())
        .collect()
}

fn check(arch: Arch) {
    let kernels = sparse_kernels(arch);
    assert!(kernels.len() >= 8);
    let compiled = nvrtc_checks::compile_clean(&kernels, arch);
    for (k, c) in kernels.iter().zip(&compiled) {
        assert!(c.resources.barriers >= 1, "{}: {:?}", k.name, c.resources);
        // The kept-block lists are constants of the module.
        assert!(c.ptx.contains("row_ptr"), "{}", k.name);
    }
}

#[test]
fn bsr_kernels_compile_for_sm_90_without_local_memory() {
    check(Arch::Sm90);
}

#[test]
fn bsr_kernels_compile_for_sm_80_without_local_memory() {
    check(Arch::Sm80);
}
