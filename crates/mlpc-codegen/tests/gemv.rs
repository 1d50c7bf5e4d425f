//! The small-M (weight-streaming) GEMM entries: which kernels get them, their ABI, the runtime's
//! choice among them, snapshots of their source, NVRTC compilation without local memory, and a
//! CPU emulation of `gemv.cuh`'s work decomposition (no GPU here: it replays, lane by lane, the
//! index arithmetic of the templates and checks it against a plain matrix product).
//!
//! The NVRTC tests need NVRTC 13.0 (`LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib`, or
//! `MLPC_NVRTC_LIB`, as `scripts/test.sh` sets up); without it they fail rather than skip.

// The emulation indexes its arrays with the kernels' own loop variables, on purpose.
#![allow(clippy::needless_range_loop)]

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

/// bert-large-sized (1024-4096-1024) SwiGLU: its down projection splits K across a cluster.
fn bert_sized_decode() -> Plan {
    let mut p = swiglu_decode(DType::Bf16, "1024", "4096");
    p.name = "swiglu_decode_bf16_1024".to_string();
    p
}

/// Every dense-GEMM plan the small-M tests look at: the crate's samples and decode-sized MLPs.
fn plans() -> Vec<Plan> {
    let mut v = samples::all();
    v.push(swiglu_decode(DType::Bf16, "4096", "11008"));
    v.push(swiglu_decode(DType::F16, "768", "3072"));
    v.push(bert_sized_decode());
    v.push(swiglu_decode(DType::F32, "768", "3072"));
    // Symbolic widths: K a symbol in both GEMMs (a loop without a constant trip count).
    v.push(symbolic_decode(DType::F16));
    v.push(symbolic_decode(DType::F32));
    v
}

/// `swiglu_decode` with symbolic widths `D` and `H`.
fn symbolic_decode(dtype: DType) -> Plan {
    let mut p = swiglu_decode(dtype, "D", "H");
    p.name = format!("swiglu_decode_{}_symbolic", dtype.name());
    p
}

fn kernels_with_small_m() -> Vec<CudaKernel> {
    kernels_with_small_m_for(CodegenOptions::default().arch)
}

fn kernels_with_small_m_for(arch: Arch) -> Vec<CudaKernel> {
    let opts = CodegenOptions {
        arch,
        ..CodegenOptions::default()
    };
    plans()
        .iter()
        .flat_map(|p| generate(p, &opts).unwrap())
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
    // The block-sparse GEMMs' own entries (on by default) are `gemv_bsr.rs`'s.
    let opts = CodegenOptions {
        sparse_gemv: false,
        bsr_walk: false,
        ..CodegenOptions::default()
    };
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
                    // Launched early (programmatic dependent launch) from sm_90 on: the default target.
                    assert!(v.launch.early_launch, "{}", v.entry);
                    // One CTA per 16 or 32 output columns, along x; along y the CTAs of a
                    // cluster splitting K, as many as the entry's cluster dimensions say.
                    assert!(*tile_m == 16 || *tile_m == 32, "{}: {tile_m}", v.entry);
                    assert_eq!(*tile_n, 1);
                    let cluster = format!(" __cluster_dims__(1, 2, 1) {}(", v.entry);
                    match n.as_constant() {
                        Some(1) => assert!(!k.source.contains(&cluster), "{}", v.entry),
                        Some(2) => assert!(k.source.contains(&cluster), "{}", v.entry),
                        other => panic!("{}: {other:?} CTAs per cluster", v.entry),
                    }
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

#[test]
fn small_m_entries_launch_early_from_sm_90_on_where_their_weights_are_constant() {
    let mut intermediate_b = 0;
    for arch in Arch::ALL {
        let opts = CodegenOptions {
            arch,
            ..CodegenOptions::default()
        };
        // With a B the kernel before writes.
        let intermediate = samples::intermediate_b_bf16();
        for plan in plans().iter().chain([&intermediate]) {
            for (k, pk) in generate(plan, &opts).unwrap().iter().zip(&plan.kernels) {
                // The tiled kernels read their operands from the first instruction on.
                assert!(!k.launch.early_launch, "{}", k.entry);
                // B (and Bu): the matrix operands after A.
                let matrices = match &pk.op {
                    Op::Gemm(g) => g.matrix_operands(),
                    _ => 2,
                };
                let const_b = pk.args[1..matrices.min(pk.args.len())].iter().all(|&b| {
                    matches!(plan.buffers[b].kind, BufferKind::Input | BufferKind::Weight)
                });
                for v in k.small_m.iter().flat_map(|s| &s.variants) {
                    assert_eq!(
                        v.launch.early_launch,
                        arch != Arch::Sm80 && const_b,
                        "{}",
                        v.entry
                    );
                    intermediate_b += usize::from(!const_b);
                }
            }
        }
    }
    assert!(
        intermediate_b > 0,
        "no small-M entry with an intermediate B was checked"
    );
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
        // K split across a cluster.
        (bert_sized_decode(), 1),
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

/// The PTX of one entry, from its `.entry` line to the next entry (or the end).
fn entry_ptx<'a>(ptx: &'a str, entry: &str) -> &'a str {
    let at = ptx
        .find(&format!(".entry {entry}("))
        .unwrap_or_else(|| panic!("no entry {entry}"));
    let rest = &ptx[at + 1..];
    &rest[..rest.find(".entry ").unwrap_or(rest.len())]
}

/// The small-M entries may be launched while the kernel before them runs (`early_launch`): from
/// sm_90 on they let the next kernel launch early, issue weight loads before they wait for the
/// kernel before, and load activations (the 16-byte coherent loads) only after that wait. Before
/// sm_90 there is nothing to wait for.
fn check_early_launch(ptx: &str, entry: &str, arch: Arch) {
    let body = entry_ptx(ptx, entry);
    let wait = body.find("griddepcontrol.wait;");
    if arch == Arch::Sm80 {
        assert!(
            wait.is_none() && !body.contains("griddepcontrol"),
            "{entry}"
        );
        return;
    }
    let wait = wait.unwrap_or_else(|| panic!("{entry}: no griddepcontrol.wait"));
    let trigger = body.find("griddepcontrol.launch_dependents;");
    assert!(
        trigger.is_some_and(|t| t < wait),
        "{entry}: no early trigger"
    );
    // (A constant K below one 16-byte vector has scalar loads only.)
    let weights = body.find("ld.global.nc.L1::no_allocate");
    assert!(
        weights.is_none_or(|w| w < wait),
        "{entry}: no weight load issued before the wait"
    );
    let activations: Vec<usize> = body
        .match_indices("ld.global.v4.u32")
        .map(|(i, _)| i)
        .collect();
    assert!(
        activations.iter().all(|&a| a > wait),
        "{entry}: an activation load before the wait"
    );
}

/// An entry whose grid has CTAs along y splits K across a cluster of that many: the PTX asks for
/// the cluster shape, sums through distributed shared memory and syncs the cluster; the others
/// do none of that.
fn check_cluster(ptx: &str, entry: &str, grid: &Grid) {
    let body = entry_ptx(ptx, entry);
    let Grid::Tiles { n, .. } = grid else {
        panic!("{entry}: {grid:?}")
    };
    let ks = n.as_constant().unwrap_or_else(|| panic!("{entry}: {n:?}"));
    let split = ks > 1;
    assert_eq!(
        body.contains(&format!(".reqnctapercluster 1, {ks}, 1")),
        split,
        "{entry}"
    );
    for op in [
        "mapa.shared::cluster",
        "ld.shared::cluster.f32",
        "barrier.cluster.arrive.release.aligned",
        "barrier.cluster.wait.acquire.aligned",
    ] {
        assert_eq!(body.contains(op), split, "{entry}: {op}");
    }
}

/// The `GemvConfig<...>` parameters of a small-M entry, from its module's source.
fn entry_config(source: &str, entry: &str) -> Vec<u64> {
    let max_m = entry
        .rsplit("_gemv_m")
        .next()
        .unwrap_or_else(|| panic!("{entry}"));
    config_params(source, max_m)
}

/// The `GemvConfig<...>` parameters of the `SmallM<max_m>` alias in a module's source.
fn config_params(source: &str, max_m: impl std::fmt::Display) -> Vec<u64> {
    let alias = format!("using SmallM{max_m} = ");
    let line = source
        .lines()
        .find(|l| l.starts_with(&alias))
        .unwrap_or_else(|| panic!("no `{alias}` line"));
    line.split("GemvConfig<")
        .nth(1)
        .and_then(|r| r.split('>').next())
        .unwrap_or_else(|| panic!("{line}"))
        .split(", ")
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{line}")))
        .collect()
}

/// An entry whose configuration asks for PRE > 0 rounds of weight prefetch issues bulk L2
/// prefetches (sm_90 on), and no other entry does.
fn check_prefetch(source: &str, ptx: &str, entry: &str) {
    let pre = entry_config(source, entry).get(5).copied().unwrap_or(0);
    assert_eq!(
        entry_ptx(ptx, entry).contains("cp.async.bulk.prefetch.L2.global"),
        pre > 0,
        "{entry}: PRE = {pre}"
    );
}

/// Up to 16 tokens (UNROLL x MG <= 4 activation fragments a chunk), a warp issues all of a
/// chunk's activation loads before its first mma: no mma between two activation loads (the
/// 16-byte coherent loads) without a weight load between them too. Larger passes load each
/// fragment just before its mmas, so there the pattern must appear: the check tells the two apart.
fn check_activation_batch(source: &str, ptx: &str, entry: &str) {
    let params = entry_config(source, entry);
    let (mg, unroll) = (params[0], params[3]);
    let body = entry_ptx(ptx, entry);
    // Each activation load, and whether an mma but no weight load came since the one before.
    let mut mma_since = false;
    let mut weight_since = false;
    let mut interleaved = false;
    let mut loads = 0;
    for ins in body.lines().map(str::trim) {
        if ins.starts_with("mma.sync") {
            mma_since = true;
        } else if ins.starts_with("ld.global.nc.") {
            weight_since = true;
        } else if ins.starts_with("ld.global.v4.u32") {
            if loads > 0 && mma_since && !weight_since {
                interleaved = true;
            }
            loads += 1;
            mma_since = false;
            weight_since = false;
        }
    }
    assert!(loads > 0, "{entry}: no activation loads");
    assert_eq!(
        interleaved,
        unroll * mg > 4,
        "{entry} (MG {mg}, UNROLL {unroll}): activation loads between mmas"
    );
}

fn check_nvrtc(arch: Arch) {
    if let Err(e) = ensure_nvrtc() {
        panic!("these tests need NVRTC 13.0: {e}");
    }
    // The small-M part of a module stands alone (its own include and epilogue type): compile
    // that, once per module, and read each entry's report from the log.
    // Generated for sm_80 or sm_90 (the small-M entries of sm_90a are those of sm_90; its tiled
    // entries take tensor maps, whose header the stand-alone small-M part does not include).
    let generated_for = if arch == Arch::Sm80 {
        Arch::Sm80
    } else {
        Arch::Sm90
    };
    let modules: Vec<CudaKernel> = kernels_with_small_m_for(generated_for)
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
        // ... and ask L2 for whole 128-byte lines (measured 4 % faster at llama T = 1 than
        // without the hint, 3 % faster than 256 bytes; docs/perf-notes.md).
        assert!(
            c.ptx
                .match_indices("ld.global.nc.L1::no_allocate")
                .all(|(i, _)| c.ptx[i..].starts_with("ld.global.nc.L1::no_allocate.L2::128B.v4")),
            "{}: a weight load without the L2 prefetch-size hint",
            k.entry
        );
        for v in &small(k).variants {
            entries += 1;
            assert!(
                c.ptx.contains(&format!(".entry {}(", v.entry)),
                "{}",
                v.entry
            );
            check_early_launch(&c.ptx, &v.entry, arch);
            check_cluster(&c.ptx, &v.entry, &v.launch.grid);
            if tensor_cores && !tiny_k {
                check_activation_batch(&k.source, &c.ptx, &v.entry);
            }
            check_prefetch(&k.source, &c.ptx, &v.entry);
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

// ---------------------------------------------------------------------------------------------
// CPU emulation of gemv.cuh's work decomposition
// ---------------------------------------------------------------------------------------------
//
// The functions below replay, thread by thread, the index arithmetic of `GemvMma::run` and
// `GemvSimt::run` (same names, same order), with every loaded element tagged by the (row, k) it
// came from. The mma is emulated from the PTX ISA's fragment layouts of m16n8k16, written out
// independently of the kernel's k permutation. Checked: every product W[n, k] * A[m, k] with
// n < N, m < M, k < K happens exactly once, only between equal k, and lands in the accumulator
// that the reduction later assigns to (m, n); every output element is written exactly once; the
// sums (of small integers, exact in f64) equal the plain matrix product; the reduction buffer
// stores of a warp hit 32 distinct banks.

/// `mlpc::GemvConfig`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cfg {
    mg: usize,
    rt: usize,
    warps: usize,
    unroll: usize,
    /// CTAs of a cluster splitting K.
    ks: usize,
}

impl Cfg {
    fn rows(&self) -> usize {
        16 * self.rt
    }
    fn max_m(&self) -> usize {
        8 * self.mg
    }
    fn pitch(&self) -> usize {
        self.rows() + 4
    }
    fn slice(&self) -> usize {
        8 * self.pitch()
    }
    fn threads(&self) -> usize {
        32 * self.warps
    }
}

/// A loaded element: its value and, when it was read from inside the matrix, its (row, k).
#[derive(Clone, Copy, Debug, Default)]
struct El {
    v: f64,
    at: Option<(usize, usize)>,
}

/// A row-major `[rows, cols]` matrix of small integers.
struct Mat {
    rows: usize,
    cols: usize,
    v: Vec<f64>,
}

impl Mat {
    fn random(rows: usize, cols: usize, seed: &mut u64) -> Mat {
        let v = (0..rows * cols)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 33) % 7) as f64 - 3.0
            })
            .collect();
        Mat { rows, cols, v }
    }

    /// `load16`: `e` consecutive elements of `row` from `k` on; outside the matrix reads as 0.
    fn load(&self, row: usize, k: usize, e: usize) -> Vec<El> {
        (k..k + e)
            .map(|kk| {
                if row < self.rows && kk < self.cols {
                    El {
                        v: self.v[row * self.cols + kk],
                        at: Some((row, kk)),
                    }
                } else {
                    El::default()
                }
            })
            .collect()
    }
}

/// The problem and what the emulated kernel did with it.
struct Run<'a> {
    cfg: Cfg,
    a: &'a Mat,
    /// Gate (or only) weight, and the up weight of a dual GEMM: `[N, K]`.
    w: [&'a Mat; 2],
    dual: bool,
    /// Products W[n, k] * A[m, k] done, per weight, indexed `(n * M + m) * K + k`.
    products: [Vec<u32>; 2],
    /// Output writes per (m, n), and the (gate, up) sums written.
    writes: Vec<u32>,
    out: Vec<(f64, f64)>,
}

impl<'a> Run<'a> {
    fn new(cfg: Cfg, a: &'a Mat, w: &'a Mat, wu: Option<&'a Mat>) -> Run<'a> {
        let (m, n, k) = (a.rows, w.rows, a.cols);
        Run {
            cfg,
            a,
            w: [w, wu.unwrap_or(w)],
            dual: wu.is_some(),
            products: [vec![0; n * m * k], vec![0; n * m * k]],
            writes: vec![0; m * n],
            out: vec![(0.0, 0.0); m * n],
        }
    }

    fn m(&self) -> usize {
        self.a.rows
    }
    fn n(&self) -> usize {
        self.w[0].rows
    }
    fn k(&self) -> usize {
        self.a.cols
    }
    fn chunks(&self) -> usize {
        self.k().div_ceil(32).div_ceil(self.cfg.unroll)
    }
    fn nw(&self) -> usize {
        if self.dual {
            2
        } else {
            1
        }
    }

    /// Records the product of a weight element and an A element that should belong to
    /// accumulator (n, m); returns the product.
    fn product(&mut self, which: usize, w: El, a: El, n: usize, m: usize) -> f64 {
        if let (Some((wn, wk)), Some((am, ak))) = (w.at, a.at) {
            assert_eq!(wk, ak, "a product of different k");
            assert_eq!((wn, am), (n, m), "a product in the wrong accumulator");
            let (mm, kk) = (self.m(), self.k());
            self.products[which][(wn * mm + am) * kk + wk] += 1;
        }
        w.v * a.v
    }

    /// The end of one token group for the KS CTAs of a cluster, from each CTA's warp slices
    /// (`reds[rank]`): `gemv_detail::finish` when KS = 1, else `sum_warps` in every CTA, then
    /// `finish_cluster` in every CTA.
    fn finish(&mut self, reds: &[[Vec<f64>; 2]], m_base: usize, n0: usize) {
        let c = self.cfg;
        assert_eq!(reds.len(), c.ks);
        if c.ks > 1 {
            return self.finish_cluster(reds, m_base, n0);
        }
        let red = &reds[0];
        for tid in 0..c.threads() {
            for i in (tid..c.rows() * 8).step_by(c.threads()) {
                let (row, tok) = (i % c.rows(), i / c.rows());
                self.store(m_base + tok, n0 + row, |which| {
                    (0..c.warps)
                        .map(|w| red[which][w * c.slice() + tok * c.pitch() + row])
                        .sum()
                });
            }
        }
    }

    /// The store of output (m, n), if inside the matrix, of the (gate, up) sums `sum(which)`.
    fn store(&mut self, m: usize, n: usize, sum: impl Fn(usize) -> f64) {
        if m >= self.m() || n >= self.n() {
            return;
        }
        let mut s = [0.0; 2];
        for (which, s) in s.iter_mut().enumerate().take(self.nw()) {
            *s = sum(which);
        }
        let at = m * self.n() + n;
        self.writes[at] += 1;
        self.out[at] = (s[0], s[1]);
    }

    /// `gemv_detail::sum_warps` then `gemv_detail::finish_cluster`, in every CTA of the cluster.
    fn finish_cluster(&mut self, reds: &[[Vec<f64>; 2]], m_base: usize, n0: usize) {
        let c = self.cfg;
        let items = c.rows() * 8;
        let mut parts = vec![[vec![f64::NAN; items], vec![f64::NAN; items]]; c.ks];
        for (red, part) in reds.iter().zip(&mut parts) {
            for tid in 0..c.threads() {
                for i in (tid..items).step_by(c.threads()) {
                    let (row, tok) = (i % c.rows(), i / c.rows());
                    for which in 0..self.nw() {
                        part[which][i] = (0..c.warps)
                            .map(|w| red[which][w * c.slice() + tok * c.pitch() + row])
                            .sum();
                    }
                }
            }
        }
        let share = items.div_ceil(c.ks);
        for rank in 0..c.ks {
            let end = items.min((rank + 1) * share);
            for tid in 0..c.threads() {
                for i in (rank * share + tid..end).step_by(c.threads()) {
                    let (row, tok) = (i % c.rows(), i / c.rows());
                    self.store(m_base + tok, n0 + row, |which| {
                        parts.iter().map(|part| part[which][i]).sum()
                    });
                }
            }
        }
    }

    /// Checks what the emulated kernel did against the plain product.
    fn check(&self, what: &str) {
        let (m, n, k) = (self.m(), self.n(), self.k());
        for which in 0..self.nw() {
            for (i, &p) in self.products[which].iter().enumerate() {
                assert_eq!(
                    p,
                    1,
                    "{what}: product n,m,k = {:?}",
                    (i / k / m, i / k % m, i % k)
                );
            }
        }
        for mm in 0..m {
            for nn in 0..n {
                assert_eq!(
                    self.writes[mm * n + nn],
                    1,
                    "{what}: writes of (m, n) = ({mm}, {nn})"
                );
                for which in 0..self.nw() {
                    let w = self.w[which];
                    let want: f64 = (0..k)
                        .map(|kk| self.a.v[mm * k + kk] * w.v[nn * k + kk])
                        .sum();
                    let got = if which == 0 {
                        self.out[mm * n + nn].0
                    } else {
                        self.out[mm * n + nn].1
                    };
                    assert_eq!(got, want, "{what}: (m, n) = ({mm}, {nn}), weight {which}");
                }
            }
        }
    }
}

/// Asserts that a warp's 32 shared-memory float addresses fall in 32 distinct banks.
fn assert_conflict_free(addrs: &[usize]) {
    let mut banks: Vec<usize> = addrs.iter().map(|a| a % 32).collect();
    banks.sort();
    banks.dedup();
    assert_eq!(banks.len(), 32, "bank conflict: {addrs:?}");
}

/// D (16x8) += A (16x16) B (16x8), from and to lane fragments as the PTX ISA lays them out for
/// `mma.m16n8k16` with 16-bit inputs (g = lane / 4, t = lane % 4; each A / B register holds two
/// elements, the first in the low half):
///   A: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..2t+1), a2 = (g, 2t+8..2t+9), a3 = (g+8, 2t+8..2t+9)
///   B: b0 = (k 2t..2t+1, col g), b1 = (k 2t+8..2t+9, col g)
///   D: d0, d1 = (g, 2t), (g, 2t+1); d2, d3 = (g+8, 2t), (g+8, 2t+1).
/// `rows[i]` / `cols[j]`: the weight row and token the emulation expects in D (i, j).
#[allow(clippy::too_many_arguments)]
fn mma(
    run: &mut Run<'_>,
    which: usize,
    d: &mut [[f64; 4]],
    a: &[[[El; 2]; 4]],
    b: &[[[El; 2]; 2]],
    rows: &[usize],
    cols: &[usize],
) {
    let mut fa = [[El::default(); 16]; 16];
    let mut fb = [[El::default(); 8]; 16];
    for lane in 0..32 {
        let (g, t) = (lane / 4, lane % 4);
        for h in 0..2 {
            fa[g][2 * t + h] = a[lane][0][h];
            fa[g + 8][2 * t + h] = a[lane][1][h];
            fa[g][2 * t + 8 + h] = a[lane][2][h];
            fa[g + 8][2 * t + 8 + h] = a[lane][3][h];
            fb[2 * t + h][g] = b[lane][0][h];
            fb[2 * t + 8 + h][g] = b[lane][1][h];
        }
    }
    let mut dd = [[0.0; 8]; 16];
    for i in 0..16 {
        for j in 0..8 {
            for kk in 0..16 {
                dd[i][j] += run.product(which, fa[i][kk], fb[kk][j], rows[i], cols[j]);
            }
        }
    }
    for (lane, d) in d.iter_mut().enumerate() {
        let (g, t) = (lane / 4, lane % 4);
        d[0] += dd[g][2 * t];
        d[1] += dd[g][2 * t + 1];
        d[2] += dd[g + 8][2 * t];
        d[3] += dd[g + 8][2 * t + 1];
    }
}

/// `GemvMma::run` over the whole grid.
fn emulate_mma(run: &mut Run<'_>) {
    let c = run.cfg;
    let (m_total, chunks) = (run.m(), run.chunks());
    let words = |v: Vec<El>| -> [[El; 2]; 4] { std::array::from_fn(|i| [v[2 * i], v[2 * i + 1]]) };
    for block in 0..run.n().div_ceil(c.rows()) {
        let n0 = block * c.rows();
        let mut m0 = 0;
        while m0 < m_total {
            // accs[rank][which][warp][lane][rt][mg] = the 4 floats of a fragment.
            let mut accs = Vec::new();
            for rank in 0..c.ks {
                let mut acc = vec![vec![vec![vec![vec![[0.0f64; 4]; c.mg]; c.rt]; 32]; c.warps]; 2];
                for warp in 0..c.warps {
                    for chunk in (rank * c.warps + warp..chunks).step_by(c.warps * c.ks) {
                        // Weight words: [which][u][rt][h][lane].
                        let mut w = vec![
                            vec![
                                vec![vec![vec![[[El::default(); 2]; 4]; 32]; 2]; c.rt];
                                c.unroll
                            ];
                            2
                        ];
                        for u in 0..c.unroll {
                            for lane in 0..32 {
                                let (g, t) = (lane / 4, lane % 4);
                                let k = (chunk * c.unroll + u) * 32 + 8 * t;
                                for rt in 0..c.rt {
                                    for h in 0..2 {
                                        let n = n0 + 16 * rt + 8 * h + g;
                                        for which in 0..run.nw() {
                                            w[which][u][rt][h][lane] =
                                                words(run.w[which].load(n, k, 8));
                                        }
                                    }
                                }
                            }
                        }
                        for u in 0..c.unroll {
                            for mg in 0..c.mg {
                                if m0 + 8 * mg >= m_total {
                                    break;
                                }
                                let a: Vec<[[El; 2]; 4]> = (0..32)
                                    .map(|lane| {
                                        let (g, t) = (lane / 4, lane % 4);
                                        let k = (chunk * c.unroll + u) * 32 + 8 * t;
                                        words(run.a.load(m0 + 8 * mg + g, k, 8))
                                    })
                                    .collect();
                                let cols: Vec<usize> = (0..8).map(|j| m0 + 8 * mg + j).collect();
                                for rt in 0..c.rt {
                                    let rows: Vec<usize> =
                                        (0..16).map(|i| n0 + 16 * rt + i).collect();
                                    for j in 0..2 {
                                        let b: Vec<[[El; 2]; 2]> =
                                            a.iter().map(|a| [a[2 * j], a[2 * j + 1]]).collect();
                                        for which in 0..run.nw() {
                                            let lo = &w[which][u][rt][0];
                                            let hi = &w[which][u][rt][1];
                                            let frag: Vec<[[El; 2]; 4]> = (0..32)
                                                .map(|l| {
                                                    [
                                                        lo[l][2 * j],
                                                        hi[l][2 * j],
                                                        lo[l][2 * j + 1],
                                                        hi[l][2 * j + 1],
                                                    ]
                                                })
                                                .collect();
                                            let mut d: Vec<[f64; 4]> = (0..32)
                                                .map(|l| acc[which][warp][l][rt][mg])
                                                .collect();
                                            mma(run, which, &mut d, &frag, &b, &rows, &cols);
                                            for (l, d) in d.into_iter().enumerate() {
                                                acc[which][warp][l][rt][mg] = d;
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                accs.push(acc);
            }
            for mg in 0..c.mg {
                if m0 + 8 * mg >= m_total {
                    break;
                }
                let mut reds = Vec::new();
                for acc in &accs {
                    let mut red = [
                        vec![f64::NAN; c.warps * c.slice()],
                        vec![f64::NAN; c.warps * c.slice()],
                    ];
                    for warp in 0..c.warps {
                        for rt in 0..c.rt {
                            for e in 0..4 {
                                let mut addrs = Vec::new();
                                for lane in 0..32 {
                                    let (g, t) = (lane / 4, lane % 4);
                                    let at =
                                        (2 * t + (e & 1)) * c.pitch() + 16 * rt + g + 8 * (e >> 1);
                                    let addr = warp * c.slice() + at;
                                    addrs.push(addr);
                                    for (which, red) in red.iter_mut().enumerate().take(run.nw()) {
                                        red[addr] = acc[which][warp][lane][rt][mg][e];
                                    }
                                }
                                assert_conflict_free(&addrs);
                            }
                        }
                    }
                    reds.push(red);
                }
                run.finish(&reds, m0 + 8 * mg, n0);
            }
            m0 += c.max_m();
        }
    }
}

/// `gemv_detail::reduce_scatter8` over the 32 lanes of a warp at once: at each level every
/// lane computes `keep` and `send` from its own values and bit, then adds its partner's `send`
/// (`__shfl_xor_sync(send, mask)`).
fn reduce_scatter8(v: &[[f64; 8]]) -> Vec<f64> {
    let mut v: Vec<[f64; 8]> = v.to_vec();
    for (mask, half) in [(4usize, 4usize), (2, 2), (1, 1)] {
        let keep_send = |lane: usize, v: &[[f64; 8]], i: usize| -> (f64, f64) {
            let bit = (lane % 8) & mask != 0;
            if bit {
                (v[lane][i + half], v[lane][i])
            } else {
                (v[lane][i], v[lane][i + half])
            }
        };
        let old = v.clone();
        for (lane, v) in v.iter_mut().enumerate() {
            for i in 0..half {
                let (keep, _) = keep_send(lane, &old, i);
                let (_, partner_send) = keep_send(lane ^ mask, &old, i);
                v[i] = keep + partner_send;
            }
        }
    }
    v.iter().map(|v| v[0]).collect()
}

/// `GemvSimt::run` over the whole grid.
fn emulate_simt(run: &mut Run<'_>) {
    let c = run.cfg;
    assert_eq!(c.ks, 1, "GemvSimt does not split K across CTAs");
    let (m_total, chunks) = (run.m(), run.chunks());
    for block in 0..run.n().div_ceil(c.rows()) {
        let n0 = block * c.rows();
        let mut m0 = 0;
        while m0 < m_total {
            // acc[which][warp][lane][rt][j][token]
            let mut acc =
                vec![vec![vec![vec![vec![vec![0.0f64; c.max_m()]; 4]; c.rt]; 32]; c.warps]; 2];
            for warp in 0..c.warps {
                for chunk in (warp..chunks).step_by(c.warps) {
                    for lane in 0..32 {
                        let (r, q) = (lane / 8, lane % 8);
                        // w[which][u][rt][j]
                        let mut w = vec![vec![vec![vec![Vec::new(); 4]; c.rt]; c.unroll]; 2];
                        for u in 0..c.unroll {
                            let k = (chunk * c.unroll + u) * 32 + 4 * q;
                            for rt in 0..c.rt {
                                for j in 0..4 {
                                    let n = n0 + 16 * rt + r + 4 * j;
                                    for which in 0..run.nw() {
                                        w[which][u][rt][j] = run.w[which].load(n, k, 4);
                                    }
                                }
                            }
                        }
                        for u in 0..c.unroll {
                            let k = (chunk * c.unroll + u) * 32 + 4 * q;
                            for mg in 0..c.mg {
                                if m0 + 8 * mg >= m_total {
                                    break;
                                }
                                for tok in 0..8 {
                                    let m = m0 + 8 * mg + tok;
                                    let a = run.a.load(m, k, 4);
                                    for rt in 0..c.rt {
                                        for j in 0..4 {
                                            let n = n0 + 16 * rt + r + 4 * j;
                                            for which in 0..run.nw() {
                                                let mut s =
                                                    acc[which][warp][lane][rt][j][8 * mg + tok];
                                                for e in 0..4 {
                                                    s += run.product(
                                                        which,
                                                        w[which][u][rt][j][e],
                                                        a[e],
                                                        n,
                                                        m,
                                                    );
                                                }
                                                acc[which][warp][lane][rt][j][8 * mg + tok] = s;
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            for mg in 0..c.mg {
                if m0 + 8 * mg >= m_total {
                    break;
                }
                let mut red = [
                    vec![f64::NAN; c.warps * c.slice()],
                    vec![f64::NAN; c.warps * c.slice()],
                ];
                for warp in 0..c.warps {
                    for rt in 0..c.rt {
                        for j in 0..4 {
                            let addrs: Vec<usize> = (0..32)
                                .map(|lane| {
                                    let (r, q) = (lane / 8, lane % 8);
                                    warp * c.slice() + q * c.pitch() + 16 * rt + r + 4 * j
                                })
                                .collect();
                            assert_conflict_free(&addrs);
                            for (which, red) in red.iter_mut().enumerate().take(run.nw()) {
                                let v: Vec<[f64; 8]> = (0..32)
                                    .map(|lane| {
                                        std::array::from_fn(|i| {
                                            acc[which][warp][lane][rt][j][8 * mg + i]
                                        })
                                    })
                                    .collect();
                                for (lane, total) in reduce_scatter8(&v).into_iter().enumerate() {
                                    red[addrs[lane]] = total;
                                }
                            }
                        }
                    }
                }
                run.finish(&[red], m0 + 8 * mg, n0);
            }
            m0 += c.max_m();
        }
    }
}

/// Emulates `cfg` on every shape of a grid of awkward sizes, single and dual.
fn emulate_shapes(cfg: Cfg, tensor_cores: bool, ms: &[usize], ns: &[usize], ks: &[usize]) {
    let mut seed = 0x5eed_u64
        ^ (cfg.ks * 10000 + cfg.mg * 1000 + cfg.rt * 100 + cfg.warps * 10 + cfg.unroll) as u64;
    for &m in ms {
        for &n in ns {
            for &k in ks {
                let a = Mat::random(m, k, &mut seed);
                let w = Mat::random(n, k, &mut seed);
                let wu = Mat::random(n, k, &mut seed);
                for dual in [false, true] {
                    let mut run = Run::new(cfg, &a, &w, dual.then_some(&wu));
                    if tensor_cores {
                        emulate_mma(&mut run);
                    } else {
                        emulate_simt(&mut run);
                    }
                    run.check(&format!(
                        "{cfg:?} {} M={m} N={n} K={k} dual={dual}",
                        if tensor_cores { "mma" } else { "simt" }
                    ));
                }
            }
        }
    }
}

#[test]
fn the_reduce_scatter_leaves_token_q_in_lane_q() {
    let v: Vec<[f64; 8]> = (0..32)
        .map(|lane| std::array::from_fn(|i| ((lane * 8 + i) * 37 % 101) as f64))
        .collect();
    let got = reduce_scatter8(&v);
    for lane in 0..32 {
        let (group, q) = (lane / 8, lane % 8);
        let want: f64 = (0..8).map(|l| v[group * 8 + l][q]).sum();
        assert_eq!(got[lane], want, "lane {lane}");
    }
}

#[test]
fn the_mma_decomposition_covers_every_product_once() {
    let ms = [1, 2, 3, 7, 8, 9, 16, 17, 31, 64];
    for cfg in [
        Cfg {
            mg: 1,
            rt: 1,
            warps: 8,
            unroll: 4,
            ks: 1,
        },
        Cfg {
            mg: 2,
            rt: 1,
            warps: 16,
            unroll: 2,
            ks: 1,
        },
        Cfg {
            mg: 4,
            rt: 2,
            warps: 2,
            unroll: 1,
            ks: 1,
        },
        Cfg {
            mg: 8,
            rt: 1,
            warps: 3,
            unroll: 3,
            ks: 1,
        },
        // K split across the CTAs of a cluster (a share of outputs per CTA, odd ones too).
        Cfg {
            mg: 2,
            rt: 2,
            warps: 3,
            unroll: 2,
            ks: 2,
        },
        Cfg {
            mg: 1,
            rt: 1,
            warps: 2,
            unroll: 1,
            ks: 3,
        },
    ] {
        emulate_shapes(
            cfg,
            true,
            &ms,
            &[1, 5, 16, 17, 40],
            &[1, 7, 8, 31, 32, 33, 100, 264],
        );
    }
}

#[test]
fn the_simt_decomposition_covers_every_product_once() {
    let ms = [1, 2, 3, 7, 8, 9, 16, 17];
    for cfg in [
        Cfg {
            mg: 1,
            rt: 1,
            warps: 8,
            unroll: 2,
            ks: 1,
        },
        Cfg {
            mg: 2,
            rt: 1,
            warps: 16,
            unroll: 1,
            ks: 1,
        },
        Cfg {
            mg: 1,
            rt: 2,
            warps: 3,
            unroll: 3,
            ks: 1,
        },
    ] {
        emulate_shapes(
            cfg,
            false,
            &ms,
            &[1, 5, 16, 17, 40],
            &[1, 3, 4, 31, 32, 33, 100, 264],
        );
    }
}

/// The configurations the generator emits, read back from the generated sources.
fn generated_configs() -> Vec<(Cfg, bool)> {
    let mut v = Vec::new();
    for k in kernels_with_small_m() {
        let src = small_m_source(&k);
        for (i, var) in small(&k).variants.iter().enumerate() {
            let nums: Vec<usize> = config_params(src, var.max_m)
                .into_iter()
                .map(|x| x as usize)
                .collect();
            let cfg = Cfg {
                mg: nums[0],
                rt: nums[1],
                warps: nums[2],
                unroll: nums[3],
                ks: nums.get(4).copied().unwrap_or(1),
            };
            // The launch description agrees with the configuration.
            assert_eq!(
                var.launch.block,
                [cfg.threads() as u32, 1, 1],
                "{}",
                var.entry
            );
            assert_eq!(cfg.max_m() as u64, var.max_m, "{}", var.entry);
            let Grid::Tiles { tile_m, .. } = &var.launch.grid else {
                unreachable!()
            };
            assert_eq!(*tile_m as usize, cfg.rows(), "{}", var.entry);
            let Grid::Tiles { n, .. } = &var.launch.grid else {
                unreachable!()
            };
            assert_eq!(n.as_constant(), Some(cfg.ks as u64), "{}", var.entry);
            assert!(i == 0 || small(&k).variants[i - 1].max_m < var.max_m);
            let tc = src.contains(&format!("using SmallM{} = mlpc::GemvMma<", var.max_m));
            assert_eq!(tc, !k.entry.contains("_f32_"), "{}", var.entry);
            if !v.contains(&(cfg, tc)) {
                v.push((cfg, tc));
            }
        }
    }
    v
}

#[test]
fn the_generated_configurations_cover_every_product_once() {
    let configs = generated_configs();
    assert!(configs.len() >= 8, "{configs:?}");
    for (cfg, tc) in configs {
        // M around the bucket's bounds, and past it (a second pass).
        let top = cfg.max_m();
        let ms = [1, top / 2 + 1, top, top + 3];
        emulate_shapes(cfg, tc, &ms, &[3, 33], &[5, 40, 129]);
    }
}

#[test]
fn small_m_entries_compile_for_sm_90a_without_local_memory() {
    check_nvrtc(Arch::Sm90a);
}
