//! The Hopper block-sparse kernel (`GemmBsrWgmma`) compiled with the real NVRTC for sm_90a: every
//! block shape and form of `bsr_plans` and the sample plans that take it. ptxas must report no
//! local memory (no spilled accumulators, no stack frame) and no serialised wgmma.
//!
//! Needs NVRTC 13.0 (`LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib`, or `MLPC_NVRTC_LIB`, as
//! `scripts/test.sh` sets up); without it these tests fail rather than skip.

mod bsr_plans;

use mlpc_codegen::{generate, samples, Arch, CodegenOptions, CudaKernel};
use mlpc_jit::{compile_all, ensure_nvrtc, JitOptions};

fn sm_90a() -> CodegenOptions {
    CodegenOptions {
        arch: Arch::Sm90a,
        allow_tf32: false,
    }
}

fn hopper_kernels() -> Vec<CudaKernel> {
    bsr_plans::all()
        .iter()
        .chain(&samples::sparse())
        .flat_map(|p| generate(p, &sm_90a()).unwrap())
        .filter(|k| k.source.contains("mlpc::GemmBsrWgmma<"))
        .collect()
}

#[test]
fn bsr_wgmma_kernels_compile_for_sm_90a_without_local_memory_or_serialised_wgmma() {
    if let Err(e) = ensure_nvrtc() {
        panic!("these tests need NVRTC 13.0: {e}");
    }
    let kernels = hopper_kernels();
    assert!(kernels.len() >= 13, "{} kernels", kernels.len());
    let opts = JitOptions {
        arch: Arch::Sm90a,
        no_cache: true,
        cache_dir: None,
    };
    let compiled = compile_all(&kernels, &opts).unwrap_or_else(|e| panic!("{e}"));
    for (k, c) in kernels.iter().zip(&compiled) {
        eprintln!("{}: {:?}", k.entry, c.resources);
        assert_eq!(&c.cubin[..4], b"\x7fELF", "{}: not an ELF cubin", k.name);
        assert!(c.ptx.contains(".target sm_90a"), "{}", k.name);
        assert!(
            c.resources_known,
            "{}: no ptxas report in the log:\n{}",
            k.name, c.log
        );
        assert!(
            !c.resources.uses_local_memory(),
            "{} uses local memory: {:?}\n{}",
            k.name,
            c.resources,
            c.log
        );
        assert!(
            !c.log.contains("serialized"),
            "{}: ptxas serialised the wgmmas:\n{}",
            k.name,
            c.log
        );
        assert!(
            c.ptx.contains("wgmma.mma_async.sync.aligned.m64n"),
            "{}",
            k.name
        );
        assert!(
            c.ptx.contains("fence.proxy.async.shared::cta"),
            "{}",
            k.name
        );
        assert!(c.ptx.contains("step_blk"), "{}", k.name);
        assert!(c.resources.barriers >= 1, "{}: {:?}", k.name, c.resources);
    }
}
