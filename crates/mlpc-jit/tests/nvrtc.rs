//! Compiles every kernel that mlpc-codegen emits for its sample plans with the real NVRTC.
//!
//! Run with NVRTC 13.0 reachable, e.g.
//! `LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib cargo test -p mlpc-jit`
//! (or `MLPC_NVRTC_LIB=<path to libnvrtc.so.13>`). Without NVRTC these tests fail: they never
//! skip.

use mlpc_codegen::{generate, samples, Arch, CodegenOptions, CudaKernel};
use mlpc_jit::{
    check_cubin, compile, compile_all, ensure_nvrtc, write_artifacts, JitError, JitOptions,
};

fn require_nvrtc() {
    if let Err(e) = ensure_nvrtc() {
        panic!("these tests need NVRTC 13.0: {e}");
    }
}

fn sample_kernels() -> Vec<CudaKernel> {
    sample_kernels_for(Arch::Sm90)
}

/// The sample plans' kernels as code generation emits them for `arch`.
fn sample_kernels_for(arch: Arch) -> Vec<CudaKernel> {
    let opts = CodegenOptions {
        arch,
        ..CodegenOptions::default()
    };
    samples::all()
        .iter()
        .flat_map(|p| generate(p, &opts).unwrap())
        .collect()
}

fn no_cache(arch: Arch) -> JitOptions {
    JitOptions {
        arch,
        no_cache: true,
        cache_dir: None,
    }
}

#[test]
fn nvrtc_is_the_pinned_version() {
    require_nvrtc();
    let info = ensure_nvrtc().unwrap();
    assert_eq!(
        info.version,
        (13, 0),
        "NVRTC from `{}` is {}.{}; the CUDA 13.0 driver needs 13.0",
        info.origin,
        info.version.0,
        info.version.1
    );
}

fn check_compiled(arch: Arch, kernels: &[CudaKernel]) {
    require_nvrtc();
    let compiled = compile_all(kernels, &no_cache(arch)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(compiled.len(), kernels.len());
    for (k, c) in kernels.iter().zip(&compiled) {
        assert_eq!(c.name, k.name);
        assert!(!c.from_cache);
        assert_eq!(&c.cubin[..4], b"\x7fELF", "{}: not an ELF cubin", k.name);
        // The structural check passes NVRTC's images and refuses any cut of them.
        assert_eq!(check_cubin(&c.cubin), Ok(()), "{}", k.name);
        for cut in [0, 64, c.cubin.len() / 2, c.cubin.len() - 1] {
            assert!(
                check_cubin(&c.cubin[..cut]).is_err(),
                "{}: cut at {cut}",
                k.name
            );
        }
        assert!(
            c.ptx.contains(&format!(".entry {}(", k.entry)),
            "{}: the PTX has no entry `{}`",
            k.name,
            k.entry
        );
        assert!(
            c.ptx.contains(&format!(".target {}", arch.name())),
            "{}",
            k.name
        );
        // No kernel may touch local memory: GEMM accumulators that spill would be slow, and
        // the elementwise kernels have no reason to.
        assert!(
            !c.resources.uses_local_memory(),
            "{} ({}) uses local memory for {}: {:?}\n{}",
            k.name,
            k.entry,
            arch,
            c.resources,
            c.log
        );
        assert!(
            c.resources_known,
            "{}: no ptxas report in the log:\n{}",
            k.name, c.log
        );
        assert!(c.resources.registers > 0 && c.resources.registers <= 255);
        if k.entry.contains("gemm") {
            // The main loop synchronises the CTA.
            assert!(c.resources.barriers >= 1, "{}: {:?}", k.name, c.resources);
        }
    }
}

#[test]
fn every_sample_kernel_compiles_for_sm_90_without_spills() {
    check_compiled(Arch::Sm90, &sample_kernels());
}

#[test]
fn every_sample_kernel_compiles_for_sm_80_without_spills() {
    check_compiled(Arch::Sm80, &sample_kernels_for(Arch::Sm80));
}

/// Kernels generated for sm_90 (f32 GEMMs on the FP64 tensor cores among them) still compile for
/// sm_80, where the f64 mma does not exist: those kernels run their FFMA fallback there.
#[test]
fn sm_90_kernels_compile_for_sm_80_on_their_ffma_fallback() {
    let kernels = sample_kernels();
    assert!(kernels.iter().any(|k| k.source.contains("GemmDmma<")));
    check_compiled(Arch::Sm80, &kernels);
    let compiled = compile_all(&kernels, &no_cache(Arch::Sm80)).unwrap();
    assert!(compiled.iter().all(|c| !c.ptx.contains(".f64.f64.f64.f64")));
}

#[test]
fn dual_gemm_compiles_for_sm_90a() {
    let k: Vec<CudaKernel> = generate(&samples::swiglu_residual_bf16(), &CodegenOptions::default())
        .unwrap()
        .into_iter()
        .take(1)
        .collect();
    check_compiled(Arch::Sm90a, &k);
}

#[test]
fn a_syntax_error_comes_back_with_the_log_and_the_kernel_name() {
    require_nvrtc();
    let mut k = sample_kernels().remove(0);
    k.name = "broken_kernel_7".to_string();
    k.source = k.source.replace("Kernel::run(p);", "Kernel::run(p) oops;");
    let err = compile(&k, &no_cache(Arch::Sm90)).unwrap_err();
    assert!(matches!(err, JitError::Compile { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("kernel `broken_kernel_7`"), "{msg}");
    assert!(
        msg.contains("broken_kernel_7.cu"),
        "the log names the file: {msg}"
    );
    assert!(msg.contains("error"), "{msg}");
}

#[test]
fn the_second_compile_comes_from_the_cache() {
    require_nvrtc();
    let dir = tempfile::tempdir().unwrap();
    let opts = JitOptions {
        arch: Arch::Sm90,
        no_cache: false,
        cache_dir: Some(dir.path().to_path_buf()),
    };
    let k = generate(&samples::tiny_odd_bf16(), &CodegenOptions::default()).unwrap();
    let first = compile_all(&k, &opts).unwrap();
    assert!(!first[0].from_cache);
    let second = compile_all(&k, &opts).unwrap();
    assert!(second[0].from_cache);
    assert_eq!(first[0].cubin, second[0].cubin);
    assert_eq!(first[0].ptx, second[0].ptx);
    assert_eq!(first[0].resources, second[0].resources);
    // A damaged entry (its CUBIN cut short) is a miss, compiled and stored again.
    let cubin = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "cubin"))
        .unwrap();
    std::fs::write(&cubin, &first[0].cubin[..first[0].cubin.len() / 3]).unwrap();
    let again = compile_all(&k, &opts).unwrap();
    assert!(!again[0].from_cache);
    assert_eq!(again[0].cubin, first[0].cubin);
    assert!(compile_all(&k, &opts).unwrap()[0].from_cache);
    // So are an emptied PTX and a log cut before its ptxas report (their artifacts would be
    // empty, the resources unknown).
    for ext in ["ptx", "log"] {
        let path = cubin.with_extension(ext);
        std::fs::write(&path, "").unwrap();
        let again = compile_all(&k, &opts).unwrap();
        assert!(!again[0].from_cache, "an emptied .{ext}");
        assert_eq!(again[0].ptx, first[0].ptx);
        assert_eq!(again[0].resources, first[0].resources);
        // Stored again (the log's compile times differ from run to run).
        let stored = std::fs::read_to_string(&path).unwrap();
        assert!(
            stored.contains(if ext == "ptx" {
                ".entry "
            } else {
                "ptxas info"
            }),
            ".{ext} not stored again: {stored:?}"
        );
    }

    // Another architecture is another entry.
    let sm80 = JitOptions {
        arch: Arch::Sm80,
        ..opts.clone()
    };
    assert!(!compile(&k[0], &sm80).unwrap().from_cache);
    // A changed source is another entry.
    let mut changed = k[0].clone();
    changed.source.push_str("\n// changed\n");
    assert!(!compile(&changed, &opts).unwrap().from_cache);
    // no_cache neither reads nor writes.
    let bypass = JitOptions {
        no_cache: true,
        ..opts
    };
    assert!(!compile(&k[0], &bypass).unwrap().from_cache);
    let entries = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(
        entries,
        3 * 3,
        "three cached compilations of three files each"
    );
}

#[test]
fn artifacts_are_written_beside_the_plan() {
    require_nvrtc();
    let dir = tempfile::tempdir().unwrap();
    let kernels = generate(&samples::gpt2_mlp_f32(), &CodegenOptions::default()).unwrap();
    let compiled = compile_all(&kernels, &no_cache(Arch::Sm90)).unwrap();
    let written = write_artifacts(dir.path(), &kernels, &compiled).unwrap();
    let kdir = dir.path().join("kernels");
    for k in &kernels {
        for ext in ["cu", "cubin", "ptx", "json"] {
            let p = kdir.join(format!("{}.{ext}", k.name));
            assert!(written.contains(&p), "{} not written", p.display());
        }
        let cu = std::fs::read_to_string(kdir.join(format!("{}.cu", k.name))).unwrap();
        assert_eq!(cu, k.source);
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(kdir.join(format!("{}.json", k.name))).unwrap(),
        )
        .unwrap();
        assert_eq!(json["entry"], k.entry.as_str());
        assert_eq!(json["arch"], "sm_90");
    }
    assert!(kdir.join("gemm_simt.cuh").is_file());
    assert!(matches!(
        write_artifacts(dir.path(), &kernels, &compiled[..1]),
        Err(JitError::ArtifactMismatch {
            kernels: 2,
            compiled: 1
        })
    ));
}

#[test]
fn block_sparse_kernels_compile_for_sm_90a_with_unserialised_wgmma() {
    block_sparse_sm_90a(false);
}

/// The same with the persistent walk's work-item tables (`CodegenOptions::bsr_walk`): the
/// table is a by-value argument the kernel indexes at run time, which must not pull it into
/// local memory.
#[test]
fn block_sparse_kernels_with_work_item_tables_compile_for_sm_90a() {
    block_sparse_sm_90a(true);
}

fn block_sparse_sm_90a(bsr_walk: bool) {
    let opts = CodegenOptions {
        arch: Arch::Sm90a,
        allow_tf32: false,
        sparse_gemv: false,
        bsr_walk,
    };
    let kernels: Vec<CudaKernel> = samples::sparse()
        .iter()
        .flat_map(|p| generate(p, &opts).unwrap())
        .collect();
    check_compiled(Arch::Sm90a, &kernels);
    let compiled = compile_all(&kernels, &no_cache(Arch::Sm90a)).unwrap();
    let mut hopper = 0;
    for (k, c) in kernels.iter().zip(&compiled) {
        if !k.source.contains("mlpc::GemmBsrWgmma<") {
            continue;
        }
        hopper += 1;
        assert_eq!(
            k.params.contains(&mlpc_codegen::Param::Walk),
            bsr_walk,
            "{}",
            k.name
        );
        assert!(
            c.ptx.contains("wgmma.mma_async.sync.aligned.m64n"),
            "{}",
            k.name
        );
        assert!(
            !c.log.contains("serialized"),
            "{}: ptxas serialised the wgmmas:\n{}",
            k.name,
            c.log
        );
    }
    // bsr_linear_gelu_bf16 (32x32), bsr_swiglu_residual_f16 (16x16 dual), the 192x32 blocks.
    assert_eq!(hopper, 3);
}

/// Kernels whose sources differ only in whole-line comments (layers of one shape) are compiled
/// once; one whose code differs is compiled for itself.
#[test]
fn kernels_alike_but_for_comments_are_compiled_once() {
    require_nvrtc();
    let k0 = sample_kernels().remove(0);
    let renamed = |name: &str, source: String| CudaKernel {
        name: name.to_string(),
        source,
        ..k0.clone()
    };
    let comment = k0.source.lines().next().unwrap().to_string();
    assert!(comment.starts_with("//"), "{comment}");
    let kernels = [
        k0.clone(),
        renamed(
            "other_layer",
            k0.source.replacen(&comment, "// another layer's names", 1),
        ),
        renamed(
            "other_code",
            format!("{}\n__device__ int mlpc_test_extra;\n", k0.source),
        ),
        // A comment line ending in a backslash takes the next line into the comment.
        renamed(
            "spliced",
            k0.source.replacen(&comment, "// spliced \\\n// next", 1),
        ),
    ];
    let compiled = compile_all(&kernels, &no_cache(Arch::Sm90)).unwrap();
    let names: Vec<_> = compiled.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [k0.name.as_str(), "other_layer", "other_code", "spliced"]
    );
    let shared: Vec<_> = compiled.iter().map(|c| c.same_code_as.as_deref()).collect();
    assert_eq!(shared, [None, Some(k0.name.as_str()), None, None]);
    assert_eq!(compiled[1].cubin, compiled[0].cubin);
}
