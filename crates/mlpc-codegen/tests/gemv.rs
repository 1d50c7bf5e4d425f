//! The small-M (weight-streaming) GEMM entries: which kernels get them, their ABI, the runtime's
//! choice among them, snapshots of their source, NVRTC compilation without local memory, and a
//! CPU emulation of `gemv.cuh`'s work decomposition (no GPU here: it replays, lane by lane, the
//! index arithmetic of the templates and checks it against a plain matrix product).
//!
//! The NVRTC tests need NVRTC 13.0 (`LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib`, or
//! `MLPC_NVRTC_LIB`, as `scripts/test.sh` sets up); without it they fail rather than skip.

use mlpc_codegen::samples::{self, PlanBuilder};
use mlpc_codegen::{generate, Arch, CodegenOptions, CudaKernel, Grid, SmallM};
use mlpc_ir::{Activation, Bindings, BufferKind, DType, Dual, Epilogue, Gemm, MatLayout, Op, Plan};
use mlpc_jit::{compile_all, ensure_nvrtc, JitOptions};
use smallvec::smallvec;

// ---------------------------------------------------------------------------------------------
// Plans
// ---------------------------------------------------------------------------------------------

/// llama-style SwiGLU with a residual, as decoded: `y = x + down(silu(x Wg^T) * (x Wu^T))`.
fn swiglu_decode(dtype: DType, d: &str, h: &str) -> Plan {
    let mut p = PlanBuilder::new(&format!("swiglu_decode_{}", dtype.name()), dtype);
    let x = p.dense("x", BufferKind::Input, &["T", d]);
    let wg = p.dense("gate.weight", BufferKind::Weight, &[h, d]);
    let wu = p.dense("up.weight", BufferKind::Weight, &[h, d]);
    let wd = p.dense("down.weight", BufferKind::Weight, &[d, h]);
    let hid = p.dense("h", BufferKind::Intermediate, &["T", h]);
    let y = p.dense("y", BufferKind::Output, &["T", d]);
    let up = Op::Gemm(Gemm {
        a: MatLayout::N,
        b: MatLayout::T,
        dual: Some(Dual {
            gate: smallvec![Epilogue::Act(Activation::Silu)],
            up: smallvec![],
        }),
        epilogue: smallvec![],
    });
    p.kernel("dual_gemm_silu_0", up, &[x, wg, wu], hid);
    let down = Op::Gemm(Gemm {
        a: MatLayout::N,
        b: MatLayout::T,
        dual: None,
        epilogue: smallvec![Epilogue::Add { operand: 2 }],
    });
    p.kernel("gemm_add_1", down, &[hid, wd, x], y);
    p.finish()
}

/// Every dense-GEMM plan the small-M tests look at: the crate's samples and decode-sized MLPs.
fn plans() -> Vec<Plan> {
    let mut v = samples::all();
    v.push(swiglu_decode(DType::Bf16, "4096", "11008"));
    v.push(swiglu_decode(DType::F16, "768", "3072"));
    v.push(swiglu_decode(DType::F32, "768", "3072"));
    v
}

fn kernels_with_small_m() -> Vec<CudaKernel> {
    plans()
        .iter()
        .flat_map(|p| generate(p, &CodegenOptions::default()).unwrap())
        .filter(|k| k.small_m.is_some())
        .collect()
}

fn small(k: &CudaKernel) -> &SmallM {
    k.small_m.as_ref().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Which kernels get variants, and the ABI
// ---------------------------------------------------------------------------------------------

#[test]
fn only_dense_gemms_with_k_contiguous_operands_get_small_m_entries() {
    let opts = CodegenOptions::default();
    for plan in plans().iter().chain(&samples::sparse()) {
        for (pk, k) in plan.kernels.iter().zip(generate(plan, &opts).unwrap()) {
            let nt_gemm = match &pk.op {
                Op::Gemm(_) => k.entry.contains("_nt_"),
                _ => false,
            };
            // A constant M above every bucket (none in these plans) would also leave them out.
            assert_eq!(k.small_m.is_some(), nt_gemm, "{}: {}", plan.name, k.entry);
        }
    }
}

#[test]
fn variants_share_the_module_and_arguments_and_grow_in_m() {
    let ks = kernels_with_small_m();
    assert!(ks.len() >= 10, "{}", ks.len());
    for k in &ks {
        let s = small(k);
        assert!(!s.variants.is_empty(), "{}", k.name);
        assert!(s.variants.windows(2).all(|w| w[0].max_m < w[1].max_m));
        for v in &s.variants {
            assert_eq!(v.entry, format!("{}_gemv_m{}", k.entry, v.max_m));
            // Same parameter list as the tiled entry: the signature text repeats verbatim.
            let sig = |entry: &str| {
                let at = k.source.find(&format!(" {entry}(\n")).unwrap();
                let rest = &k.source[at + entry.len() + 3..];
                rest[..rest.find(')').unwrap()].to_string()
            };
            assert_eq!(sig(&v.entry), sig(&k.entry), "{}", v.entry);
            assert_eq!(v.launch.smem_bytes, 0);
            match &v.launch.grid {
                Grid::Tiles {
                    m,
                    n,
                    tile_m,
                    tile_n,
                } => {
                    // One CTA per 16 output columns, along x.
                    assert_eq!(*tile_m, 16);
                    assert_eq!((n.as_constant(), *tile_n), (Some(1), 1));
                    let Grid::Tiles { n: cols, .. } = &k.launch.grid else {
                        panic!("{}: tiled GEMM without a tiled grid", k.name)
                    };
                    assert_eq!(m, cols);
                }
                other => panic!("{}: {other:?}", v.entry),
            }
        }
        // M is the tiled grid's row extent.
        let Grid::Tiles { m, .. } = &k.launch.grid else {
            unreachable!()
        };
        assert_eq!(&s.m, m, "{}", k.name);
    }
}

#[test]
fn buckets_per_dtype() {
    let plan = swiglu_decode(DType::Bf16, "4096", "11008");
    let ks = generate(&plan, &CodegenOptions::default()).unwrap();
    let maxes =
        |k: &CudaKernel| -> Vec<u64> { small(k).variants.iter().map(|v| v.max_m).collect() };
    assert_eq!(maxes(&ks[0]), vec![8, 16, 32, 64]);
    assert_eq!(maxes(&ks[1]), vec![8, 16, 32, 64]);
    let f32 = generate(
        &swiglu_decode(DType::F32, "768", "3072"),
        &CodegenOptions::default(),
    )
    .unwrap();
    assert_eq!(maxes(&f32[0]), vec![8]);
    assert_eq!(maxes(&f32[1]), vec![8, 16]);
    // tiny_odd has the constant M = 1: the smallest bucket only.
    let tiny = generate(&samples::tiny_odd_bf16(), &CodegenOptions::default()).unwrap();
    assert_eq!(maxes(&tiny[0]), vec![8]);
}

#[test]
fn small_m_survives_json_and_old_json_still_loads() {
    for k in kernels_with_small_m() {
        let json = serde_json::to_string(&k).unwrap();
        assert!(json.contains("\"small_m\""));
        let back: CudaKernel = serde_json::from_str(&json).unwrap();
        assert_eq!(back, k);
    }
    // A kernel serialised before the field existed.
    let plain = generate(
        &samples::elementwise(DType::F32),
        &CodegenOptions::default(),
    )
    .unwrap();
    let json = serde_json::to_string(&plain[0]).unwrap();
    assert!(!json.contains("small_m"), "{json}");
    let back: CudaKernel = serde_json::from_str(&json).unwrap();
    assert_eq!(back.small_m, None);
    assert_eq!(back, plain[0]);
}

// ---------------------------------------------------------------------------------------------
// The runtime's choice
// ---------------------------------------------------------------------------------------------

fn bindings(pairs: &[(&str, u64)]) -> Bindings {
    let mut b = Bindings::new();
    for (s, v) in pairs {
        b.bind(&(*s).into(), *v).unwrap();
    }
    b
}

#[test]
fn the_first_variant_holding_m_is_chosen() {
    let plan = swiglu_decode(DType::Bf16, "4096", "11008");
    let k = &generate(&plan, &CodegenOptions::default()).unwrap()[0];
    let pick = |t: u64| k.small_m_variant(&bindings(&[("T", t)])).unwrap();
    assert_eq!(pick(0), None, "an empty problem launches nothing");
    for (t, want) in [
        (1, Some(0)),
        (2, Some(0)),
        (8, Some(0)),
        (9, Some(1)),
        (16, Some(1)),
        (17, Some(2)),
        (32, Some(2)),
        (33, Some(3)),
        (64, Some(3)),
        (65, None),
        (4096, None),
    ] {
        assert_eq!(pick(t), want, "T = {t}");
    }
    assert!(k.small_m_variant(&Bindings::new()).is_err(), "T unbound");
}

#[test]
fn m_is_the_product_of_the_leading_dims() {
    // batched_residual_f16: x [B, T, 512]; M = B * T.
    let k = &generate(&samples::batched_residual_f16(), &CodegenOptions::default()).unwrap()[0];
    let pick = |b: u64, t: u64| k.small_m_variant(&bindings(&[("B", b), ("T", t)])).unwrap();
    assert_eq!(pick(2, 4), Some(0));
    assert_eq!(pick(3, 3), Some(1));
    assert_eq!(pick(4, 16), Some(3));
    assert_eq!(pick(5, 13), None);
    assert_eq!(pick(0, 13), None);
    // An overflowing product is above every bucket, not an error.
    assert_eq!(pick(u64::MAX / 2, 4), None);
    let err = k.small_m_variant(&bindings(&[("T", 1)])).unwrap_err();
    assert!(err.to_string().contains('B'), "{err}");
}

#[test]
fn kernels_without_variants_launch_their_own_entry() {
    let k = &generate(
        &samples::transposed_operands_bf16(),
        &CodegenOptions::default(),
    )
    .unwrap()[0];
    assert_eq!(k.small_m, None);
    assert_eq!(k.small_m_variant(&bindings(&[("T", 1)])), Ok(None));
}

// ---------------------------------------------------------------------------------------------
// Snapshots
// ---------------------------------------------------------------------------------------------

/// The small-M part of a generated module, from its banner to the end.
fn small_m_source(k: &CudaKernel) -> &str {
    let at = k.source.find("\n// Small-M entries").unwrap();
    &k.source[at + 1..]
}

#[test]
fn small_m_sources() {
    let opts = CodegenOptions::default();
    let cases = [
        (swiglu_decode(DType::Bf16, "4096", "11008"), 0),
        (swiglu_decode(DType::Bf16, "4096", "11008"), 1),
        (swiglu_decode(DType::F32, "768", "3072"), 0),
        (samples::gpt2_mlp_f32(), 0),
        (samples::batched_residual_f16(), 0),
        (samples::tiny_odd_bf16(), 0),
    ];
    for (plan, i) in &cases {
        let k = &generate(plan, &opts).unwrap()[*i];
        let listing = format!(
            "small_m: {}\n\n{}",
            serde_json::to_string_pretty(small(k)).unwrap(),
            small_m_source(k)
        );
        insta::assert_snapshot!(format!("{}__{}", plan.name, k.name), listing);
    }
}

// ---------------------------------------------------------------------------------------------
// NVRTC
// ---------------------------------------------------------------------------------------------

/// The ptxas report of `entry` in an NVRTC log (compiled with `--ptxas-options=-v`): the
/// "stack frame, spill stores, spill loads" line and the "Used N registers" line.
fn ptxas_report<'a>(log: &'a str, entry: &str) -> (&'a str, &'a str) {
    let head = format!("Function properties for {entry}\n");
    let at = log
        .find(&head)
        .unwrap_or_else(|| panic!("no report for {entry}:\n{log}"));
    let mut lines = log[at + head.len()..].lines();
    (lines.next().unwrap_or(""), lines.next().unwrap_or(""))
}

fn check_nvrtc(arch: Arch) {
    if let Err(e) = ensure_nvrtc() {
        panic!("these tests need NVRTC 13.0: {e}");
    }
    // The small-M part of a module stands alone (its own include and epilogue type): compile
    // that, once per module, and read each entry's report from the log.
    let modules: Vec<CudaKernel> = kernels_with_small_m()
        .iter()
        .map(|k| CudaKernel {
            source: small_m_source(k).to_string(),
            entry: small(k).variants[0].entry.clone(),
            ..k.clone()
        })
        .collect();
    let opts = JitOptions {
        arch,
        no_cache: true,
        cache_dir: None,
    };
    let compiled = compile_all(&modules, &opts).unwrap_or_else(|e| panic!("{e}"));
    let mut entries = 0;
    for (k, c) in modules.iter().zip(&compiled) {
        assert_eq!(&c.cubin[..4], b"\x7fELF", "{}: not an ELF cubin", k.name);
        let tensor_cores = !k.entry.contains("_f32_");
        assert_eq!(c.ptx.contains("mma.sync"), tensor_cores, "{}", k.entry);
        // Weights stream past L1 in 16-byte loads (unless K is a constant below one vector).
        let tiny_k = k
            .source
            .split("    p.k = ")
            .nth(1)
            .and_then(|r| r[..r.find(';')?].parse::<u64>().ok())
            .is_some_and(|k| k < 8);
        assert_eq!(c.ptx.contains("L1::no_allocate"), !tiny_k, "{}", k.entry);
        for v in &small(k).variants {
            entries += 1;
            assert!(
                c.ptx.contains(&format!(".entry {}(", v.entry)),
                "{}",
                v.entry
            );
            let (frame, regs) = ptxas_report(&c.log, &v.entry);
            assert!(
                frame.contains(" 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"),
                "{} uses local memory on {arch}: {frame}",
                v.entry
            );
            // The reduction buffer is static shared memory; every variant syncs.
            assert!(regs.contains("used 1 barriers"), "{}: {regs}", v.entry);
            assert!(regs.contains("bytes smem"), "{}: {regs}", v.entry);
            eprintln!(
                "{:64} {}",
                v.entry,
                regs.trim_start_matches("ptxas info    : ")
            );
        }
    }
    assert!(entries >= 30, "{entries}");
}

#[test]
fn small_m_entries_compile_for_sm_90_without_local_memory() {
    check_nvrtc(Arch::Sm90);
}

#[test]
fn small_m_entries_compile_for_sm_80_without_local_memory() {
    check_nvrtc(Arch::Sm80);
}
