//! The Hopper block-sparse kernel (`GemmBsrWgmma`) compiled with the real NVRTC for sm_90a: every
//! block shape and form of `bsr_plans` and the sample plans that take it. ptxas must report no
//! local memory (no spilled accumulators, no stack frame) and no serialised wgmma.
//!
//! Needs NVRTC 13.0 (`LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib`, or `MLPC_NVRTC_LIB`, as
//! `scripts/test.sh` sets up); without it these tests fail rather than skip.

mod bsr_plans;

use mlpc_codegen::{generate, samples, Arch, CodegenOptions, CudaKernel};
use mlpc_jit::{compile_all, ensure_nvrtc, JitOptions};

mod nvrtc_checks;

fn sm_90a() -> CodegenOptions {
    CodegenOptions {
        arch: Arch::Sm90a,
        allow_tf32: false,
        sparse_gemv: false,
        bsr_walk: false,
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

/// The `mlpc::BsrWgmmaConfig<...` text of `k`'s source, up to its closing `>`.
fn config_of(k: &CudaKernel) -> Option<&str> {
    let at = k.source.find("mlpc::BsrWgmmaConfig<")?;
    let end = at + k.source[at..].find('>')?;
    Some(&k.source[at..end])
}

/// `k` with A read by the wgmmas from shared memory (the descriptor form) where the rule chose A
/// from registers (`BsrWgmmaConfig`'s A_REGS, block heights 16, 32 and 64), in every entry of
/// the module: the descriptor form is what every other block height runs, so it is compiled for
/// every plan.
fn with_a_from_shared(k: &CudaKernel) -> Option<CudaKernel> {
    // `<BM, G, BK, STAGES, A_REGS[, WB[, WIDE ...]]`: A_REGS set to false.
    let mut source = k.source.clone();
    let mut changed = false;
    let mut from = 0;
    while let Some(at) = source[from..]
        .find("mlpc::BsrWgmmaConfig<")
        .map(|i| i + from)
    {
        let end = at + source[at..].find('>')?;
        let mut fields: Vec<String> = source[at..end].split(", ").map(String::from).collect();
        if fields.get(4).map(String::as_str) == Some("true") {
            fields[4] = "false".into();
            changed = true;
        }
        let plain = fields.join(", ");
        source.replace_range(at..end, &plain);
        from = at + plain.len();
    }
    changed.then(|| CudaKernel {
        source,
        name: format!("{}_a_shared", k.name),
        ..k.clone()
    })
}

#[test]
fn bsr_wgmma_kernels_compile_for_sm_90a_without_local_memory_or_serialised_wgmma() {
    let mut kernels = hopper_kernels();
    assert!(kernels.len() >= 11, "{} kernels", kernels.len());
    let a_shared: Vec<CudaKernel> = kernels.iter().filter_map(with_a_from_shared).collect();
    assert!(
        a_shared.len() >= 8,
        "{} kernels with A from registers",
        a_shared.len()
    );
    kernels.extend(a_shared);
    // Each kernel's short-grid entry too.
    let compiled = nvrtc_checks::compile_clean(&kernels, Arch::Sm90a);
    for (k, c) in kernels.iter().zip(&compiled) {
        assert!(
            c.ptx.contains("wgmma.mma_async.sync.aligned.m64n"),
            "{}",
            k.name
        );
        // Fed by the copy engine, registers handed from the producer to the consumers.
        assert!(
            c.ptx.contains("cp.async.bulk.tensor.2d") && c.ptx.contains("setmaxnreg.inc"),
            "{}",
            k.name
        );
        assert!(c.ptx.contains("step_blk"), "{}", k.name);
        // A from registers: fragments through ldmatrix, no A descriptor.
        assert_eq!(
            c.ptx.contains("ldmatrix.sync.aligned.m8n8.x4.shared.b16"),
            config_of(k).and_then(|c| c.split(", ").nth(4)) == Some("true"),
            "{}",
            k.name
        );
        // A trailing ReLU runs on the packed pairs of the stores.
        assert_eq!(
            c.ptx.contains("max.bf16x2") || c.ptx.contains("max.f16x2"),
            k.source.contains("mlpc::Act<mlpc::ActKind::Relu>>>;"),
            "{}",
            k.name
        );
        assert!(c.resources.barriers >= 1, "{}: {:?}", k.name, c.resources);
    }
    assert!(
        kernels.iter().any(|k| !k.short_grids.is_empty()),
        "no kernel with a short-grid entry"
    );
}

/// A pattern of 32 x 32 blocks of an `out x inp` weight, each block kept with probability
/// `density`, drawn by a linear congruential generator started at `seed`.
fn random_pattern(out: u64, inp: u64, density: f64, seed: u64) -> mlpc_ir::BlockPattern {
    let mut x = seed;
    bsr_plans::pattern([32, 32], out, inp, |_, _| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 33) as f64) < density * (1u64 << 31) as f64
    })
}

/// The benchmark's shape (W 4096 x 4096 of 32x32 blocks, bf16) at densities 0.5, 0.25 and 0.1:
/// thousands of steps in the constant lists still compile to the same resources.
#[test]
fn the_benchmark_shape_compiles_without_local_memory() {
    let kernels: Vec<CudaKernel> = [(0.5, 1u64), (0.25, 2), (0.1, 3)]
        .into_iter()
        .map(|(density, seed)| {
            let pat = random_pattern(4096, 4096, density, seed);
            let name = format!("bench_d{}", (density * 100.0) as u32);
            let plan = bsr_plans::plan(&name, mlpc_ir::DType::Bf16, pat, false, false, false);
            generate(&plan, &sm_90a()).unwrap().remove(0)
        })
        .collect();
    // Thousands of steps in the constant lists, still no local memory in either entry.
    for (k, _) in kernels
        .iter()
        .zip(nvrtc_checks::compile_clean(&kernels, Arch::Sm90a))
    {
        // The grouped kernel at every density (ahead of the one-block-row kernel at all three),
        // over K windows of two block columns at 0.5, pairs of kept columns at 0.25 and 0.1.
        // Groups of eleven 32-row block rows (352 columns), and the short-grid entries' of
        // eight, six, four and two.
        assert!(k.entry.ends_with("_b32x32_wgmma_128x352x64"), "{}", k.entry);
        let short: Vec<&str> = k.short_grids.iter().map(|s| s.entry.as_str()).collect();
        assert_eq!(short.len(), 4, "{short:?}");
        for (e, cols) in short.iter().zip([256, 192, 128, 64]) {
            assert!(
                e.contains(&format!("_b32x32_wgmma_128x{cols}x")),
                "{short:?}"
            );
        }
        assert_eq!(
            k.source.contains("step_col1["),
            k.name != "bench_d50",
            "{}",
            k.name
        );
    }
}

/// A dual GEMM of 32 x 32 blocks with K = 4096 (llama's gate and up projections, 640 output
/// columns here): groups of five block rows (160 accumulators a thread for the two products)
/// without local memory or serialised wgmmas, short grids of four and two rows beside them;
/// with K = 2048 the groups stay at four rows.
#[test]
fn deep_dual_gemms_take_groups_of_five_block_rows() {
    let kernel = |inp: u64| {
        let pat = random_pattern(640, inp, 0.25, inp);
        let plan = bsr_plans::plan(
            &format!("dual_k{inp}"),
            mlpc_ir::DType::Bf16,
            pat,
            true,
            false,
            false,
        );
        generate(&plan, &sm_90a()).unwrap().remove(0)
    };
    let shallow = kernel(2048);
    assert!(
        shallow.entry.ends_with("_b32x32_wgmma_128x128x64"),
        "{}",
        shallow.entry
    );
    let deep = kernel(4096);
    assert!(
        deep.entry.ends_with("_b32x32_wgmma_128x160x64"),
        "{}",
        deep.entry
    );
    let short: Vec<&str> = deep.short_grids.iter().map(|s| s.entry.as_str()).collect();
    assert_eq!(short.len(), 2, "{short:?}");
    for (e, cols) in short.iter().zip([128, 64]) {
        assert!(
            e.contains(&format!("_b32x32_wgmma_128x{cols}x")),
            "{short:?}"
        );
    }
    nvrtc_checks::compile_clean(&[deep], Arch::Sm90a);
}

/// A plain GEMM of 32 x 32 blocks with K = 11008 (llama's down projection, 352 output columns
/// here): 344 block columns, past the 256 that an 8-bit column field held, still take groups of
/// eleven block rows (a 22-bit mask, the column above it), without local memory.
#[test]
fn deep_k_gemms_keep_groups_of_eleven_block_rows() {
    let pat = random_pattern(352, 11008, 0.25, 7);
    let plan = bsr_plans::plan(
        "down_k11008",
        mlpc_ir::DType::Bf16,
        pat,
        false,
        false,
        false,
    );
    let k = generate(&plan, &sm_90a()).unwrap().remove(0);
    assert!(k.entry.ends_with("_b32x32_wgmma_128x352x64"), "{}", k.entry);
    assert!(
        k.source.contains(">> 22"),
        "the step lists' comment names the 22 mask bits"
    );
    nvrtc_checks::compile_clean(&[k], Arch::Sm90a);
}

/// Compiles the device part of a measurement program under `scripts/gpu/` (built with nvcc on a
/// CUDA machine; `prefix` starts the names of its entries, `entry` is one of them) as NVRTC
/// compiles the templates, and checks that it has `entries` entries using each wgmma `shapes`,
/// none with local memory or serialised wgmmas (a serialised entry would time ptxas' fallback,
/// not the tensor pipe).
fn script_compiles_clean(source: &str, prefix: &str, entry: &str, entries: usize, shapes: &[&str]) {
    if let Err(e) = ensure_nvrtc() {
        panic!("these tests need NVRTC 13.0: {e}");
    }
    let template = hopper_kernels().remove(0);
    let kernel = CudaKernel {
        name: prefix.to_string(),
        entry: entry.to_string(),
        source: source.to_string(),
        small_m: None,
        relayouts: Vec::new(),
        short_grids: Vec::new(),
        tile_fixed_cols: 0,
        ..template
    };
    let opts = JitOptions {
        arch: Arch::Sm90a,
        no_cache: true,
        cache_dir: None,
    };
    let c = compile_all(std::slice::from_ref(&kernel), &opts)
        .unwrap_or_else(|e| panic!("{e}"))
        .remove(0);
    let found = c.ptx.matches(&format!(".entry {prefix}_")).count();
    assert_eq!(found, entries, "entries in the PTX");
    for shape in shapes {
        assert!(c.ptx.contains(shape), "no {shape} in the PTX");
    }
    assert!(c.resources_known, "no ptxas report in the log:\n{}", c.log);
    assert!(!c.log.contains("serialized"), "{}", c.log);
    // ptxas reports every entry: none may spill or keep a stack frame.
    let frames: Vec<&str> = c
        .log
        .lines()
        .filter(|l| l.contains("bytes stack frame"))
        .collect();
    assert_eq!(frames.len(), entries, "{}", c.log);
    for line in frames {
        assert!(
            line.contains(" 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"),
            "{line}"
        );
    }
}

/// The wgmma issue-rate microbenchmark (`scripts/gpu/wgmma_issue.cu`) reuses the Hopper kernels'
/// wgmma wrappers and the block-sparse kernel's descriptor helpers: its device part must keep
/// compiling with them.
#[test]
fn the_wgmma_issue_microbenchmark_compiles_with_the_templates() {
    script_compiles_clean(
        include_str!("../../../scripts/gpu/wgmma_issue.cu"),
        "wgmma_issue",
        "wgmma_issue_rs_n32_x8_bk32_wg2_m0",
        40,
        &[
            "m64n16k16",
            "m64n32k16",
            "m64n64k16",
            "m64n128k16",
            "m64n256k16",
        ],
    );
}

/// The swapped-operand block-sparse probe (`scripts/gpu/bsr_swap.cu`: the weight as wgmma's M
/// side, the tokens as N; docs/perf-notes.md, block-sparse variant 31) reuses the templates'
/// wgmma wrappers, barriers and copies: its device part must keep compiling with them.
#[test]
fn the_swapped_block_sparse_probe_compiles_with_the_templates() {
    script_compiles_clean(
        include_str!("../../../scripts/gpu/bsr_swap.cu"),
        "bsr_swap",
        "bsr_swap_p3_n96",
        6,
        &["m64n96k16", "m64n128k16"],
    );
}
