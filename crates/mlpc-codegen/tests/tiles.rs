//! Forced Hopper GEMM tiles: which choices a GEMM offers, that a forced choice changes exactly
//! the targeted kernel, that an invalid one is refused, and that no overrides change nothing.

use mlpc_codegen::samples::{self, PlanBuilder};
use mlpc_codegen::{
    generate, generate_tiled, plan_tile_candidates, tile_candidates, Arch, CodegenError,
    CodegenOptions, EntryBase, Grid, TileChoice, TileKey, TileOverrides,
};
use mlpc_ir::{Activation, BufferKind, DType, Dual, Epilogue, Gemm, MatLayout, Op, Plan};

mod nvrtc_checks;

fn opts(arch: Arch) -> CodegenOptions {
    CodegenOptions {
        arch,
        allow_tf32: false,
        sparse_gemv: false,
        bsr_walk: false,
    }
}

fn gemm_op(dual: bool) -> Op {
    Op::Gemm(Gemm {
        a: MatLayout::N,
        b: MatLayout::T,
        dual: dual.then(|| Dual {
            gate: Default::default(),
            up: Default::default(),
        }),
        epilogue: Default::default(),
    })
}

/// A plain GEMM with a bias (operand 2) then a ReLU: the Hopper kernels start its accumulators at
/// the bias.
fn gemm_bias_relu_op() -> Op {
    Op::Gemm(Gemm {
        a: MatLayout::N,
        b: MatLayout::T,
        dual: None,
        epilogue: [
            Epilogue::Bias { operand: 2 },
            Epilogue::Act(Activation::Relu),
        ]
        .into_iter()
        .collect(),
    })
}

/// Three kernels: a plain GEMM `[T, k] x [n, k]^T` with a bias and a ReLU, a dual GEMM of the
/// same shape, and a plain GEMM with a symbolic K (`D`).
fn plan(k: &str, n: &str) -> Plan {
    plan_of(DType::Bf16, k, n)
}

/// [`plan`] in another 16-bit dtype.
fn plan_of(dtype: DType, k: &str, n: &str) -> Plan {
    let mut p = PlanBuilder::new("tiles", dtype);
    let x = p.dense("x", BufferKind::Input, &["T", k]);
    let w = p.dense("w", BufferKind::Weight, &[n, k]);
    let bias = p.dense("bias", BufferKind::Weight, &[n]);
    let wu = p.dense("wu", BufferKind::Weight, &[n, k]);
    let y = p.dense("y", BufferKind::Intermediate, &["T", n]);
    let h = p.dense("h", BufferKind::Intermediate, &["T", n]);
    let xs = p.dense("xs", BufferKind::Input, &["T", "D"]);
    let ws = p.dense("ws", BufferKind::Weight, &[n, "D"]);
    let z = p.dense("z", BufferKind::Output, &["T", n]);
    p.kernel("plain", gemm_bias_relu_op(), &[x, w, bias], y);
    p.kernel("dual", gemm_op(true), &[x, w, wu], h);
    p.kernel("symbolic_k", gemm_op(false), &[xs, ws], z);
    p.finish()
}

fn c(bn: u32, ctas: u32) -> TileChoice {
    TileChoice::new(bn, ctas)
}

/// A ping-pong choice (one CTA per SM).
fn pp(bn: u32) -> TileChoice {
    TileChoice {
        pingpong: true,
        ..c(bn, 1)
    }
}

/// `choice` in clusters of two CTAs sharing A.
fn cl(choice: TileChoice) -> TileChoice {
    TileChoice {
        cluster: 2,
        share_b: false,
        ..choice
    }
}

/// `choice` in clusters of two CTAs sharing B.
fn clb(choice: TileChoice) -> TileChoice {
    TileChoice {
        share_b: true,
        ..cl(choice)
    }
}

/// `choice` with 256-row tiles (two consumer warpgroups of two bands each).
fn tall(choice: TileChoice) -> TileChoice {
    TileChoice { bm: 256, ..choice }
}

#[test]
fn candidates_follow_the_heuristics_rules() {
    let p = plan("768", "768");
    let all = plan_tile_candidates(&p, &opts(Arch::Sm90a)).unwrap();
    assert_eq!(all.len(), 2, "the symbolic-K GEMM is not tunable: {all:?}");
    let plain = &all[0];
    assert_eq!(plain.kernel, "plain");
    assert_eq!(
        plain.key,
        TileKey {
            dtype: DType::Bf16,
            dual: false,
            k: 768,
            n: 768,
            sparse: false,
            block: [0, 0],
        }
    );
    // The heuristic (128 x 192 ping-pong for a shallow plain GEMM whose N 192 divides) first.
    // Then every one-CTA choice again in clusters of two sharing A, and sharing B; then the
    // 256-row tiles (cooperative, at most 192 wide) alone and in both kinds of cluster.
    assert_eq!(
        plain.choices,
        [
            pp(192),
            c(128, 1),
            pp(128),
            c(128, 2),
            c(192, 1),
            c(256, 1),
            cl(c(128, 1)),
            cl(pp(128)),
            cl(c(192, 1)),
            cl(pp(192)),
            cl(c(256, 1)),
            clb(c(128, 1)),
            clb(pp(128)),
            clb(c(192, 1)),
            clb(pp(192)),
            clb(c(256, 1)),
            tall(c(128, 1)),
            tall(c(192, 1)),
            tall(cl(c(128, 1))),
            tall(cl(c(192, 1))),
            tall(clb(c(128, 1))),
            tall(clb(c(192, 1)))
        ]
    );
    let dual = &all[1];
    assert_eq!(dual.kernel, "dual");
    assert!(dual.key.dual);
    // A dual GEMM: the ping-pong schedule at 96 wide first (each warpgroup holds gate and up
    // of both bands: 192 registers), then at 64, and the cooperative 96- and 128-wide tiles;
    // 256-row tiles 64 or 96 wide.
    assert_eq!(
        dual.choices,
        [
            pp(96),
            pp(64),
            c(96, 1),
            c(128, 1),
            cl(pp(64)),
            cl(c(96, 1)),
            cl(pp(96)),
            cl(c(128, 1)),
            clb(pp(64)),
            clb(c(96, 1)),
            clb(pp(96)),
            clb(c(128, 1)),
            tall(c(64, 1)),
            tall(c(96, 1)),
            tall(cl(c(64, 1))),
            tall(cl(c(96, 1))),
            tall(clb(c(64, 1))),
            tall(clb(c(96, 1)))
        ]
    );
    assert_eq!(
        tile_candidates(&p, &p.kernels[2], &opts(Arch::Sm90a)).unwrap(),
        None
    );

    // N not divisible by 192, deep K: 256 wide first, no 192.
    let p = plan("3072", "1024");
    let plain = tile_candidates(&p, &p.kernels[0], &opts(Arch::Sm90a))
        .unwrap()
        .unwrap();
    assert_eq!(
        plain.choices,
        [
            c(256, 1),
            c(128, 1),
            pp(128),
            c(128, 2),
            cl(c(128, 1)),
            cl(pp(128)),
            cl(c(256, 1)),
            clb(c(128, 1)),
            clb(pp(128)),
            clb(c(256, 1)),
            tall(c(128, 1)),
            tall(cl(c(128, 1))),
            tall(clb(c(128, 1)))
        ]
    );

    // Narrow outputs: 64 only for N <= 64, nothing above 128 for N <= 128.
    let p = plan("768", "64");
    let plain = tile_candidates(&p, &p.kernels[0], &opts(Arch::Sm90a))
        .unwrap()
        .unwrap();
    assert_eq!(
        plain.choices,
        [
            c(64, 1),
            pp(64),
            c(128, 1),
            pp(128),
            c(128, 2),
            cl(c(64, 1)),
            cl(pp(64)),
            cl(c(128, 1)),
            cl(pp(128)),
            clb(c(64, 1)),
            clb(pp(64)),
            clb(c(128, 1)),
            clb(pp(128)),
            tall(c(64, 1)),
            tall(c(128, 1)),
            tall(cl(c(64, 1))),
            tall(cl(c(128, 1))),
            tall(clb(c(64, 1))),
            tall(clb(c(128, 1)))
        ]
    );

    // Other targets have no Hopper tiles to choose.
    for arch in [Arch::Sm80, Arch::Sm90] {
        assert!(plan_tile_candidates(&plan("768", "768"), &opts(arch))
            .unwrap()
            .is_empty());
    }
    // The sample plans' f32 GEMMs choose between the FP64 tensor cores (the heuristic's) and the
    // FFMA kernel on the same tile (see tests/fp64_tensor.rs); every candidate list starts with
    // a distinct heuristic choice and holds no duplicates.
    for p in samples::all() {
        for t in plan_tile_candidates(&p, &opts(Arch::Sm90a)).unwrap() {
            if t.key.dtype == DType::F32 {
                assert_eq!(t.choices.len(), 2, "{}", t.kernel);
                assert!(!t.choices[1].fp64_tensor, "{}", t.kernel);
                assert_eq!(t.choices[0], t.choices[1].on_fp64_tensor_cores());
            }
            let mut sorted = t.choices.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), t.choices.len(), "{}", t.kernel);
        }
    }
}

#[test]
fn no_overrides_is_the_heuristic() {
    for p in samples::all().into_iter().chain([plan("768", "768")]) {
        let o = opts(Arch::Sm90a);
        assert_eq!(
            generate(&p, &o).unwrap(),
            generate_tiled(&p, &o, &TileOverrides::new()).unwrap()
        );
    }
}

#[test]
fn an_override_changes_exactly_the_targeted_kernels() {
    let p = plan("768", "768");
    let o = opts(Arch::Sm90a);
    let base = generate(&p, &o).unwrap();
    let key = tile_candidates(&p, &p.kernels[0], &o).unwrap().unwrap().key;
    for choice in [c(128, 1), c(128, 2), c(192, 1), c(256, 1)] {
        // (The heuristic's tile is 128 x 192 ping-pong: every one of these differs.)
        let mut tiles = TileOverrides::new();
        tiles.insert(key, choice);
        let tuned = generate_tiled(&p, &o, &tiles).unwrap();
        assert_ne!(tuned[0], base[0], "{choice}");
        assert_eq!(
            tuned[1..],
            base[1..],
            "{choice}: only the plain GEMM changes"
        );
        let k = &tuned[0];
        assert!(
            k.source
                .contains(&format!("mlpc::WgmmaTmaConfig<128, {}, ", choice.bn))
                // One CTA per SM stores by the copy engine; two keep the register stores (the
                // staging buffers would cost a third of their ring).
                && k.source.contains(&if choice.ctas == 1 {
                    ", 8, 1, false, 1, false, true>;".to_string()
                } else {
                    format!(", 8, {}>;", choice.ctas)
                }),
            "{choice}:\n{}",
            k.source
        );
        assert!(k
            .entry
            .ends_with(&format!("_wgmma_tma_128x{}x64", choice.bn)));
        let Grid::Persistent { tile_n, per_sm, .. } = k.launch.grid else {
            panic!("{choice}: not persistent")
        };
        assert_eq!((tile_n, per_sm), (choice.bn, choice.ctas));
        let threads = if choice.ctas == 1 { 384 } else { 160 };
        assert_eq!(k.launch.block, [threads, 1, 1]);
        // The tensor map of B reads boxes as wide as the tile.
        assert!(k.params.iter().any(|pm| matches!(
            pm,
            mlpc_codegen::Param::TensorMap { box_rows, .. } if *box_rows == choice.bn
        )));
    }
    // The heuristic's ping-pong schedule: its own entry name, two consumer warpgroups and the
    // producer.
    let k = &base[0];
    assert!(
        k.source
            .contains("mlpc::WgmmaTmaConfig<128, 192, 4, 8, 1, true, 1, false, true>;"),
        "{}",
        k.source
    );
    assert!(k.entry.ends_with("_wgmma_tma_128x192x64_pp"), "{}", k.entry);
    assert_eq!(k.launch.block, [384, 1, 1]);
    // Forcing the heuristic's own choice changes nothing.
    let mut same = TileOverrides::new();
    same.insert(key, pp(192));
    assert_eq!(generate_tiled(&p, &o, &same).unwrap(), base);
    // A key no kernel has changes nothing either.
    let mut other = TileOverrides::new();
    other.insert(TileKey { n: 4096, ..key }, c(256, 1));
    assert_eq!(generate_tiled(&p, &o, &other).unwrap(), base);
}

#[test]
fn deep_wide_gemms_take_a_short_grid_entry_where_their_grid_would_split() {
    // gpt2's down projection: K = 3072, N = 768, 128 x 192 cooperative tiles.
    let p = plan("3072", "768");
    let o = opts(Arch::Sm90a);
    let base = generate(&p, &o).unwrap();
    let k = &base[0];
    assert_eq!(k.short_grids.len(), 1);
    let s = &k.short_grids[0];
    assert_eq!(s.entry, format!("{}_short", k.entry));
    let Grid::Persistent {
        tile_m,
        tile_n,
        split_k: Some(split),
        one_tile: None,
        ..
    } = &s.launch.grid
    else {
        panic!("{:?}", s.launch.grid)
    };
    assert_eq!((*tile_m, *tile_n), (128, 128));
    assert_eq!(split.entry, format!("{}_short_splitk", k.entry));
    assert!(
        k.source.contains("mlpc::WgmmaTmaConfig<128, 128, "),
        "{}",
        k.source
    );
    // Launched where the kernel's own grid would split K (32 tiles at T = 1000 on 132 SMs), or
    // where its tiles take the busiest block a tenth longer than the short grid's: at 34 row
    // tiles, 136 tiles of 128 x 192 take two waves, 204 of 128 x 128 two as well; at 33, one
    // wave against two; at 64 (T = 8192), two waves against three, a tie.
    let runs = |t: u64| {
        let mut b = mlpc_ir::Bindings::new();
        b.bind(&"T".into(), t).unwrap();
        k.short_grid_for(&b, 132).unwrap() == Some(0)
    };
    assert!(runs(1000));
    assert!(runs(2048));
    assert!(runs(128 * 20));
    assert!(runs(5000));
    assert!(runs(128 * 34));
    assert!(!runs(128 * 33));
    assert!(!runs(8192));
    // The whole choice (`choose_entry`): small-M, short grid and its split entry, the kernel's
    // own, each with its grid and workspace.
    let choose = |k: &mlpc_codegen::CudaKernel, t: u64, resident: Option<u32>| {
        let mut b = mlpc_ir::Bindings::new();
        b.bind(&"T".into(), t).unwrap();
        let c = k.choose_entry(&b, 132, resident).unwrap();
        (c.entry.to_string(), c.from, c.grid, c.workspace_bytes)
    };
    let (entry, from, _, ws) = choose(k, 8, None);
    assert!(entry.ends_with("_gemv_m8"), "{entry}");
    assert_eq!((from, ws), (EntryBase::SmallM(0), 0));
    // 8 x 6 tiles of 128 x 128 on 132 SMs: two splits each.
    let (entry, from, grid, ws) = choose(k, 1000, None);
    assert_eq!(entry, format!("{}_short_splitk", k.entry));
    assert_eq!((from, grid), (EntryBase::Short(0), [96, 1, 1]));
    assert_eq!(ws, 16 * 1024 + 96 * 128 * 128 * 4);
    let (entry, from, grid, ws) = choose(k, 5000, None);
    assert_eq!(entry, s.entry);
    assert_eq!((from, grid, ws), (EntryBase::Short(0), [132, 1, 1], 0));
    let (entry, from, grid, ws) = choose(k, 8192, None);
    assert_eq!(entry, k.entry);
    assert_eq!((from, grid, ws), (EntryBase::Main, [132, 1, 1], 0));
    // A kernel in clusters runs on the CTAs the device holds of them, not one per SM.
    let key = tile_candidates(&p, &p.kernels[0], &o).unwrap().unwrap().key;
    let mut tiles = TileOverrides::new();
    tiles.insert(key, cl(c(192, 1)));
    let clustered = &generate_tiled(&p, &o, &tiles).unwrap()[0];
    let (_, from, grid, _) = choose(clustered, 8192, Some(120));
    assert_eq!((from, grid), (EntryBase::Main, [120, 1, 1]));
    // Dual GEMMs (ping-pong) and shallow ones have none; neither has a forced tile other than
    // the heuristic's, while the heuristic's own, forced, keeps it.
    assert!(base[1].short_grids.is_empty());
    assert!(generate(&plan("768", "3072"), &o).unwrap()[0]
        .short_grids
        .is_empty());
    let key = tile_candidates(&p, &p.kernels[0], &o).unwrap().unwrap().key;
    let mut tiles = TileOverrides::new();
    tiles.insert(key, c(256, 1));
    assert!(generate_tiled(&p, &o, &tiles).unwrap()[0]
        .short_grids
        .is_empty());
    tiles.insert(key, c(192, 1));
    assert_eq!(generate_tiled(&p, &o, &tiles).unwrap(), base);
}

#[test]
fn an_invalid_override_is_an_error_naming_kernel_and_choice() {
    let p = plan("768", "768");
    let o = opts(Arch::Sm90a);
    let all = plan_tile_candidates(&p, &o).unwrap();
    let (plain, dual) = (all[0].key, all[1].key);
    for (key, choice, kernel, why) in [
        (plain, c(256, 2), "plain", "two CTAs"),
        (plain, c(64, 1), "plain", "64-wide"),
        (plain, c(96, 1), "plain", "96-wide tiles are for dual GEMMs"),
        (plain, c(80, 1), "plain", "one of"),
        (plain, c(128, 3), "plain", "1 or 2 CTAs"),
        (dual, c(256, 1), "dual", "at most 128"),
        (dual, c(128, 2), "dual", "two CTAs"),
        (plain, pp(256), "plain", "ping-pong"),
        (
            plain,
            TileChoice { ctas: 2, ..pp(128) },
            "plain",
            "ping-pong",
        ),
        (dual, pp(128), "dual", "ping-pong"),
    ] {
        let mut tiles = TileOverrides::new();
        tiles.insert(key, choice);
        let e = generate_tiled(&p, &o, &tiles).unwrap_err();
        assert!(
            matches!(&e, CodegenError::TileChoice { kernel: k, .. } if k == kernel),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(msg.contains(&choice.to_string()), "{msg}");
        assert!(msg.contains(why), "{msg}");
    }
    // 192 must divide N.
    let p = plan("768", "1024");
    let key = plan_tile_candidates(&p, &o).unwrap()[0].key;
    let mut tiles = TileOverrides::new();
    tiles.insert(key, c(192, 1));
    let msg = generate_tiled(&p, &o, &tiles).unwrap_err().to_string();
    assert!(
        msg.contains("192-wide tiles need N divisible by 192"),
        "{msg}"
    );
}

#[test]
fn overrides_round_trip_through_json() {
    let mut tiles = TileOverrides::new();
    let key = TileKey {
        dtype: DType::F16,
        dual: true,
        k: 4096,
        n: 11008,
        sparse: false,
        block: [0, 0],
    };
    tiles.insert(key, c(128, 1));
    tiles.insert(TileKey { dual: false, ..key }, c(256, 1));
    let text = serde_json::to_string(&tiles).unwrap();
    assert!(text.starts_with("[{\"key\":{\"dtype\":\"f16\""), "{text}");
    let back: TileOverrides = serde_json::from_str(&text).unwrap();
    assert_eq!(back, tiles);
    assert_eq!(back.get(&key), Some(c(128, 1)));
    // 256-row tiles name their height; a choice written before heights existed is 128 rows.
    let tall_text = serde_json::to_string(&tall(c(128, 1))).unwrap();
    assert!(tall_text.contains("\"bm\":256"), "{tall_text}");
    assert_eq!(
        serde_json::from_str::<TileChoice>(&tall_text).unwrap(),
        tall(c(128, 1))
    );
    let old: TileChoice = serde_json::from_str(r#"{"bn":256,"ctas":1,"pingpong":false}"#).unwrap();
    assert_eq!(old, c(256, 1));
    assert!(!serde_json::to_string(&old).unwrap().contains("bm"));
    // The FP64 tensor cores and block-sparse keys name themselves; older entries are neither.
    assert!(
        !text.contains("sparse") && !text.contains("fp64_tensor") && !text.contains("block"),
        "{text}"
    );
    let mut f32_tiles = TileOverrides::new();
    let sparse = TileKey {
        dtype: DType::F32,
        dual: false,
        k: 4096,
        n: 4096,
        sparse: true,
        block: [32, 32],
    };
    f32_tiles.insert(sparse, c(128, 1).on_fp64_tensor_cores());
    let f32_text = serde_json::to_string(&f32_tiles).unwrap();
    assert!(f32_text.contains("\"sparse\":true"), "{f32_text}");
    assert!(f32_text.contains("\"block\":[32,32]"), "{f32_text}");
    assert!(f32_text.contains("\"fp64_tensor\":true"), "{f32_text}");
    let back: TileOverrides = serde_json::from_str(&f32_text).unwrap();
    assert_eq!(back.get(&sparse), Some(c(128, 1).on_fp64_tensor_cores()));
    assert_eq!(
        back.get(&TileKey {
            sparse: false,
            ..sparse
        }),
        None
    );
    assert_eq!(
        sparse.to_string(),
        "f32 plain block-sparse (32x32 blocks) K=4096 N=4096"
    );
    // A block-sparse entry written before keys had blocks matches no block-sparse key.
    let older = f32_text.replace(",\"block\":[32,32]", "");
    assert_ne!(older, f32_text);
    let back: TileOverrides = serde_json::from_str(&older).unwrap();
    assert_eq!(back.get(&sparse), None);
}

/// Every candidate tile of a plain and a dual GEMM compiles for sm_90a with NVRTC: the
/// template's `static_assert`s on block size and shared memory hold for each, and none spills.
/// Needs NVRTC 13.0, as the other NVRTC tests.
#[test]
fn every_candidate_compiles_for_sm_90a_without_local_memory() {
    let o = opts(Arch::Sm90a);
    let mut kernels = Vec::new();
    for p in [plan("768", "768"), plan("4096", "1024"), plan("768", "64")] {
        for c in plan_tile_candidates(&p, &o).unwrap() {
            let kernel = p.kernels.iter().find(|k| k.name == c.kernel).unwrap();
            for choice in c.choices {
                let mut tiles = TileOverrides::new();
                tiles.insert(c.key, choice);
                kernels.push(mlpc_codegen::generate_kernel_tiled(&p, kernel, &o, &tiles).unwrap());
            }
        }
    }
    // Each list: the one-CTA choices again in clusters of two, sharing A and sharing B, and
    // the 256-row tiles in the same three forms.
    assert_eq!(kernels.len(), (22 + 18) + (13 + 18) + (19 + 12));
    let compiled = nvrtc_checks::compile_clean(&kernels, Arch::Sm90a);
    for (k, c) in kernels.iter().zip(&compiled) {
        assert!(c.ptx.contains("wgmma.mma_async"), "{}", k.entry);
        // Every CTA of an SM fits in its 228 KiB, with the 1 KiB reserved for each.
        let Grid::Persistent { per_sm, .. } = k.launch.grid else {
            panic!("{}: not persistent", k.entry)
        };
        assert!(
            (k.launch.smem_bytes + 1024) * per_sm <= 228 * 1024,
            "{}: {} bytes x {per_sm}",
            k.entry,
            k.launch.smem_bytes
        );
        // The epilogue by the copy engine (a tensor map of the output among the parameters):
        // `stmatrix` into the staging buffers and bulk tensor stores, and only then; one CTA per
        // SM takes it, two keep the register stores.
        let tma_store = k
            .source
            .contains("const __grid_constant__ mlpc::TensorMap tm_c");
        assert_eq!(tma_store, per_sm == 1, "{}", k.entry);
        // A trailing ReLU of the TMA stores runs on the packed bf16 pairs.
        let relu = k.source.contains("mlpc::Act<mlpc::ActKind::Relu>");
        assert_eq!(
            c.ptx.contains("max.bf16x2"),
            relu && tma_store,
            "{}",
            k.entry
        );
        for needle in [
            "stmatrix.sync.aligned.m8n8.x4.shared.b16",
            "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group",
            "cp.async.bulk.wait_group.read 1",
        ] {
            assert_eq!(c.ptx.contains(needle), tma_store, "{}: {needle}", k.entry);
        }
        // Clusters: the shape compiled into the entry, A copied by multicast.
        let clustered = k.entry.ends_with("_c2") || k.entry.ends_with("_c2b");
        assert_eq!(
            c.ptx.contains(".reqnctapercluster 2, 1, 1"),
            clustered,
            "{}",
            k.entry
        );
        assert_eq!(
            c.ptx.contains(".multicast::cluster"),
            clustered,
            "{}",
            k.entry
        );
        // The peer's releases carry no cluster-scope release semantics: ptxas puts a GPU-wide
        // memory barrier before each such arrival, and it stalled the consumers.
        assert_eq!(
            c.ptx.contains("mbarrier.arrive.shared::cluster.b64"),
            clustered,
            "{}",
            k.entry
        );
        assert!(
            !c.ptx.contains("mbarrier.arrive.release.cluster"),
            "{}",
            k.entry
        );
    }
}

#[test]
fn f16_outputs_take_the_packed_relu_too() {
    let p = plan_of(DType::F16, "4096", "4096");
    let kernels: Vec<_> = generate(&p, &opts(Arch::Sm90a))
        .unwrap()
        .into_iter()
        .filter(|k| k.source.contains("mlpc::Act<mlpc::ActKind::Relu>"))
        .collect();
    assert_eq!(kernels.len(), 1);
    let compiled = nvrtc_checks::compile_clean(&kernels, Arch::Sm90a);
    let c = &compiled[0];
    assert!(c.ptx.contains("max.f16x2"), "{}", kernels[0].entry);
    assert!(!c.ptx.contains("max.bf16x2"), "{}", kernels[0].entry);
}
