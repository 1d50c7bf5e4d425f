//! What every NVRTC test of this crate asks of a compiled module, in one place.
//!
//! Needs NVRTC 13.0 (`LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib`, or `MLPC_NVRTC_LIB`, as
//! `scripts/test.sh` sets up); without it the tests that call this fail rather than skip.

use mlpc_codegen::{Arch, CudaKernel};
use mlpc_jit::{compile_all, ensure_nvrtc, entry_resources, CompiledKernel, JitOptions};

/// Compiles `kernels` for `arch` with the real NVRTC (no cache) and checks every module: an ELF
/// cubin, PTX for `arch` with the kernel's entry, a ptxas report, and neither local memory (no
/// spilled accumulators, no indexed register arrays) nor serialised wgmmas (ptxas' fallback,
/// whose timing would not be the tensor pipe's) in the kernel's entry or in any of its other
/// entries (split K, one tile, the short grid). Returns the modules, in the order of `kernels`,
/// for the test's own checks.
pub fn compile_clean(kernels: &[CudaKernel], arch: Arch) -> Vec<CompiledKernel> {
    if let Err(e) = ensure_nvrtc() {
        panic!("these tests need NVRTC 13.0: {e}");
    }
    let opts = JitOptions {
        arch,
        no_cache: true,
        cache_dir: None,
    };
    let compiled = compile_all(kernels, &opts).unwrap_or_else(|e| panic!("{e}"));
    for (k, c) in kernels.iter().zip(&compiled) {
        eprintln!("{}: {:?}", k.entry, c.resources);
        assert_eq!(&c.cubin[..4], b"\x7fELF", "{}: not an ELF cubin", k.entry);
        assert!(
            c.ptx.contains(&format!(".target {arch}")),
            "{}: not PTX for {arch}",
            k.entry
        );
        assert!(
            c.ptx.contains(&format!(".entry {}(", k.entry)),
            "{}: not in the PTX",
            k.entry
        );
        assert!(
            c.resources_known,
            "{}: no ptxas report in the log:\n{}",
            k.entry, c.log
        );
        assert!(
            !c.resources.uses_local_memory(),
            "{} uses local memory on {arch}: {:?}\n{}",
            k.entry,
            c.resources,
            c.log
        );
        assert!(
            !c.log.contains("serialized"),
            "{}: ptxas serialised the wgmmas:\n{}",
            k.entry,
            c.log
        );
        for name in k.other_entries() {
            let r = entry_resources(&c.log, name)
                .unwrap_or_else(|| panic!("{name}: no ptxas report in the log:\n{}", c.log));
            eprintln!("{name}: {r:?}");
            assert!(
                !r.uses_local_memory(),
                "{name} uses local memory on {arch}: {r:?}\n{}",
                c.log
            );
        }
    }
    compiled
}
