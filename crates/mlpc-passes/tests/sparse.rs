//! Block sparsity: `prune-block-sparse` and `lower-block-sparse` in the pipeline, checked against
//! the reference interpreter on the pruned dense model, plus the plan, `--explain` and the packed
//! weight sizes.

mod common;

use common::*;
use mlpc_ir::{interpret, Activation, DType, Graph, HostTensor, Op};
use mlpc_passes::{
    explain, lower_plan, packed_weights, Pipeline, PipelineOptions, PrintAfter, Provenance,
    PruneBlockSparse, SparseWeight,
};
use mlpc_passes::{Pass, PassError, CONFIGURED_PASSES};
use proptest::prelude::*;

fn opts() -> PipelineOptions {
    PipelineOptions {
        verify_each: true,
        print_after: PrintAfter::Nothing,
    }
}

/// `g` with only its weights pruned: the reference the optimised graph must match.
fn pruned_reference(g: &Graph, specs: &[SparseWeight]) -> Graph {
    let mut r = g.clone();
    let mut prov = Provenance::new(&r);
    PruneBlockSparse::new(specs.to_vec())
        .run(&mut r, &mut prov)
        .unwrap();
    r
}

/// Runs the sparse pipeline on `g`; returns the optimised graph, its provenance and the largest
/// error against the pruned dense model at `T = t`.
fn compile_and_compare(g: &Graph, specs: &[SparseWeight], t: u64) -> (Graph, Provenance, f64) {
    let reference = pruned_reference(g, specs);
    let mut opt = g.clone();
    let report = Pipeline::default()
        .with_sparsity(specs.to_vec())
        .run(&mut opt, &opts())
        .unwrap_or_else(|e| panic!("{e}"));
    let inputs = random_inputs(g, &bind_t(t), 7);
    let want = interpret(&reference, &inputs).unwrap();
    let got = interpret(&opt, &inputs).unwrap();
    assert_dense_ones_said(&opt, &report.provenance, specs);
    (opt, report.provenance, max_error(&got, &want))
}

/// The selected weights that the optimised graph still reads dense (or returns) are exactly the
/// ones the provenance says stay dense: a model is never reported block-sparse where it is not.
fn assert_dense_ones_said(opt: &Graph, prov: &Provenance, specs: &[SparseWeight]) {
    for spec in specs {
        let read = opt
            .find(&spec.weight)
            .filter(|&w| opt.node(w).op == Op::Weight)
            .is_some_and(|w| !opt.users(w).is_empty() || opt.is_output(w));
        assert_eq!(
            read,
            prov.stays_dense().contains_key(&spec.weight),
            "`{}`: read dense {read}, said {:?}\n{opt}",
            spec.weight,
            prov.stays_dense()
        );
    }
}

fn sparse_ops(g: &Graph) -> Vec<String> {
    g.topo_order()
        .unwrap()
        .into_iter()
        .filter(|&n| matches!(g.node(n).op, Op::SparseGemm(_)))
        .map(|n| g.node(n).op.mnemonic().to_string())
        .collect()
}

#[test]
fn the_pipeline_places_the_sparse_passes() {
    let p = Pipeline::default().with_sparsity(vec![SparseWeight::new("w", [2, 2], None)]);
    assert_eq!(
        p.names(),
        [
            "dce",
            "prune-block-sparse",
            "fold-transpose",
            "cse",
            "fuse-epilogue",
            "lower-block-sparse"
        ]
    );
    assert_eq!(
        Pipeline::default().with_sparsity(vec![]).names(),
        Pipeline::default().names()
    );
    // --print-after of a sparse pass that the pipeline lacks says so, not "unknown pass".
    let mut g = one_linear(DType::F32, 8, 8);
    let err = Pipeline::default()
        .run(
            &mut g,
            &PipelineOptions {
                verify_each: true,
                print_after: PrintAfter::parse("lower-block-sparse").unwrap(),
            },
        )
        .unwrap_err();
    assert!(
        matches!(err, PassError::PrintAfterNotInPipeline { .. }),
        "{err}"
    );
    // A pass list that names a sparse pass is told that the compiler inserts it.
    for name in CONFIGURED_PASSES {
        let err = Pipeline::from_names(&["dce", name]).unwrap_err();
        assert!(matches!(err, PassError::ConfiguredPass { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("pass `{name}` cannot be listed: ")),
            "{msg}"
        );
        assert!(
            msg.ends_with("a pass list names only: dce, fold-transpose, cse, fuse-epilogue"),
            "{msg}"
        );
    }
}

#[test]
fn mlp_with_two_sparse_layers_matches_the_pruned_model() {
    let g = linear_gelu_linear(DType::F32, 64, 128);
    let specs = vec![
        SparseWeight::new("fc1.weight", [32, 32], Some(0.25)),
        SparseWeight::new("fc2.weight", [16, 32], Some(0.5)),
    ];
    let (opt, prov, err) = compile_and_compare(&g, &specs, 5);
    assert!(err < 1e-5, "error {err}\n{opt}");
    assert_eq!(sparse_ops(&opt), ["sparse_gemm", "sparse_gemm"]);
    insta::assert_snapshot!("sparse_mlp_ir", opt.to_string());

    let plan = lower_plan(&opt, &prov).unwrap();
    let names: Vec<&str> = plan.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "bsr_gemm_bias_gelu_f32_nt_b32x32",
            "bsr_gemm_bias_f32_nt_b16x32"
        ]
    );
    insta::assert_snapshot!("sparse_mlp_explain", explain(&g, &opt, &plan, &prov));

    // The plan carries the pattern: it survives plan.json.
    let json = serde_json::to_string(&plan).unwrap();
    assert_eq!(serde_json::from_str::<mlpc_ir::Plan>(&json).unwrap(), plan);
}

#[test]
fn packed_weights_take_density_times_dense_plus_small_indices() {
    for (dtype, block, density) in [
        (DType::Bf16, [32, 32], 0.25),
        (DType::Bf16, [16, 16], 0.1),
        (DType::F32, [64, 64], 0.5),
        (DType::F16, [16, 64], 0.75),
        (DType::F32, [32, 32], 1.0),
    ] {
        let g = one_linear(dtype, 256, 512);
        let specs = vec![SparseWeight::new("fc.weight", block, Some(density))];
        let mut opt = g.clone();
        Pipeline::default()
            .with_sparsity(specs)
            .run(&mut opt, &opts())
            .unwrap();
        let packed = packed_weights(&opt);
        assert_eq!(packed.len(), 1, "{opt}");
        let w = &packed[0];
        let dense = (256 * 512 * dtype.size_bytes()) as f64;
        assert_eq!(w.dense_bytes as f64, dense);
        let blocks = (256 / block[1] * 512 / block[0]) as f64;
        let kept = (density * blocks).round();
        assert_eq!(w.pattern.kept.len() as f64, kept, "{block:?} {density}");
        assert_eq!(w.packed_bytes as f64, kept / blocks * dense);
        assert!(
            (w.packed_bytes + w.index_bytes) as f64 <= density * dense * 1.02,
            "{dtype} {block:?} {density}: {w:?}"
        );
        // The dense weight is gone from the optimised graph: only the packed one is stored.
        assert!(opt.weight("fc.weight").is_none());
        let stored = opt.weight(&w.name).unwrap();
        assert_eq!(stored.bytes().len() as u64, w.packed_bytes);
    }
}

#[test]
fn gated_mlp_lowers_the_dual_gemm_with_the_union_pattern() {
    let g = swiglu(DType::F32, 32, 64);
    let specs = vec![
        SparseWeight::new("gate_proj.weight", [16, 16], Some(0.5)),
        SparseWeight::new("up_proj.weight", [16, 16], Some(0.5)),
        SparseWeight::new("down_proj.weight", [16, 16], Some(0.25)),
    ];
    let (opt, prov, err) = compile_and_compare(&g, &specs, 3);
    assert!(err < 1e-5, "error {err}\n{opt}");
    assert_eq!(sparse_ops(&opt), ["sparse_dual_gemm", "sparse_gemm"]);
    let plan = lower_plan(&opt, &prov).unwrap();
    assert_eq!(plan.kernels[0].name, "bsr_dual_gemm_silu_mul_f32_nt_b16x16");
    // Both packed weights follow one pattern: the union of the two, at least as large as each.
    let packed = packed_weights(&opt);
    assert_eq!(packed.len(), 3);
    assert_eq!(packed[0].pattern, packed[1].pattern);
    assert!(packed[0].pattern.kept.len() >= 4);
    assert!(prov.stays_dense().is_empty(), "{:?}", prov.stays_dense());
}

#[test]
fn a_gated_pair_packed_to_its_union_says_what_each_side_keeps() {
    // Gate [64, 32] keeps blocks 0, 1, 2 of its eight 16 x 16 blocks, up keeps 2 and 3: both are
    // packed to the four of the union, and `--explain` says what each keeps of its own.
    let mut g = swiglu(DType::F32, 32, 64);
    let mask = |kept: &[usize]| (0..8).map(|b| kept.contains(&b)).collect::<Vec<_>>();
    g.set_weight(
        "gate_proj.weight",
        masked_weight(4, 2, [16, 16], &mask(&[0, 1, 2]), 1),
    );
    g.set_weight(
        "up_proj.weight",
        masked_weight(4, 2, [16, 16], &mask(&[2, 3]), 2),
    );
    let specs: Vec<SparseWeight> = ["gate_proj.weight", "up_proj.weight"]
        .map(|w| SparseWeight::new(w, [16, 16], None))
        .to_vec();
    let (opt, prov, err) = compile_and_compare(&g, &specs, 3);
    assert!(err < 1e-5, "error {err}\n{opt}");
    let packed = packed_weights(&opt);
    assert_eq!(packed.len(), 2);
    let want = "the union of the gated pair's patterns: `gate_proj.weight` keeps 3 blocks, \
                `up_proj.weight` 2";
    for w in &packed {
        assert_eq!(w.pattern.kept.len(), 4, "{}", w.name);
        assert_eq!(prov.union_note(&w.name), Some(want), "{}", w.name);
    }
    let plan = lower_plan(&opt, &prov).unwrap();
    let text = explain(&g, &opt, &plan, &prov);
    // Each packed weight's row and its line under "block-sparse weights".
    assert_eq!(text.matches(want).count(), 4, "{text}");
    assert!(
        text.contains(&format!(
            "kept 4/8 (50.0%), 8192 -> 4096 bytes + 18 index bytes; {want}"
        )),
        "{text}"
    );

    // The same pattern on both sides: nothing to say.
    g.set_weight(
        "up_proj.weight",
        masked_weight(4, 2, [16, 16], &mask(&[0, 1, 2]), 2),
    );
    let (opt, prov, _) = compile_and_compare(&g, &specs, 3);
    let packed = packed_weights(&opt);
    assert_eq!(packed.len(), 2);
    assert!(packed.iter().all(|w| prov.union_note(&w.name).is_none()));
}

#[test]
fn a_gated_pair_pruned_together_keeps_one_pattern_of_the_density() {
    // Gate and up [64, 32] in 16 x 16 blocks (eight each) at density 0.5, pruned together: both
    // keep the same four blocks, so the dual GEMM's union is four blocks, not up to eight.
    let g = swiglu(DType::F32, 32, 64);
    let specs = vec![
        SparseWeight::new("gate_proj.weight", [16, 16], Some(0.5)).pruned_with("up_proj.weight"),
        SparseWeight::new("up_proj.weight", [16, 16], Some(0.5)).pruned_with("gate_proj.weight"),
    ];
    let (opt, prov, err) = compile_and_compare(&g, &specs, 3);
    assert!(err < 1e-5, "error {err}\n{opt}");
    assert_eq!(sparse_ops(&opt), ["sparse_dual_gemm"]);
    let packed = packed_weights(&opt);
    assert_eq!(packed.len(), 2);
    for w in &packed {
        assert_eq!(w.pattern.kept.len(), 4, "{}", w.name);
        assert!(prov.union_note(&w.name).is_none());
    }
    // The kept blocks are those of largest summed norm, on both weights.
    let gate = g.weight("gate_proj.weight").unwrap();
    let up = g.weight("up_proj.weight").unwrap();
    let want = mlpc_passes::kept_blocks_together(&[gate, up], [16, 16], 0.5).unwrap();
    let reference = pruned_reference(&g, &specs);
    for name in ["gate_proj.weight", "up_proj.weight"] {
        let kept = mlpc_passes::kept_blocks(reference.weight(name).unwrap(), [16, 16], None);
        assert_eq!(kept.unwrap(), want, "{name}");
    }

    // A partner that no output needs, listed before or after the weight: an error, since the
    // weight pruned alone would keep other blocks than the source graph pruned (the reference).
    let mut lone = one_linear(DType::F32, 16, 16);
    let unused = HostTensor::from_f64(DType::F32, vec![16, 16], &[1.0; 256]).unwrap();
    lone.add_weight("a.unused", unused.clone()).unwrap();
    lone.add_weight("z.unused", unused).unwrap();
    for dead in ["a.unused", "z.unused"] {
        let mut specs = vec![
            SparseWeight::new(dead, [8, 8], Some(0.5)).pruned_with("fc.weight"),
            SparseWeight::new("fc.weight", [8, 8], Some(0.5)).pruned_with(dead),
        ];
        if dead == "z.unused" {
            specs.reverse();
        }
        let e = Pipeline::default()
            .with_sparsity(specs)
            .run(&mut lone.clone(), &opts())
            .unwrap_err()
            .to_string();
        assert!(e.contains("which no output needs"), "{e}");
    }

    // A partner that does not name the weight back, or one not selected, is an error.
    for specs in [
        vec![
            SparseWeight::new("gate_proj.weight", [16, 16], Some(0.5))
                .pruned_with("up_proj.weight"),
            SparseWeight::new("up_proj.weight", [16, 16], Some(0.25))
                .pruned_with("gate_proj.weight"),
        ],
        vec![SparseWeight::new("gate_proj.weight", [16, 16], Some(0.5))
            .pruned_with("up_proj.weight")],
        vec![SparseWeight::new("gate_proj.weight", [16, 16], None).pruned_with("up_proj.weight")],
    ] {
        let mut g = g.clone();
        let e = PruneBlockSparse::new(specs)
            .run(&mut g, &mut Provenance::new(&swiglu(DType::F32, 32, 64)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("gate_proj.weight") && e.contains("pruned together"),
            "{e}"
        );
    }
}

/// Weights only the graph holds are pruned where they are: the same bytes as a pruned copy, at
/// the same address; a run again (of the pass, of a clone of it over a copy of the graph, or of
/// a new pass) finds nothing left to zero.
#[test]
fn weights_only_the_graph_holds_are_pruned_in_place() {
    use std::sync::Arc;
    let mut g = linear_gelu_linear(DType::F32, 64, 128);
    let specs = vec![
        SparseWeight::new("fc1.weight", [32, 32], Some(0.25)),
        SparseWeight::new("fc2.weight", [16, 32], Some(0.5)),
    ];
    let want = pruned_reference(&g, &specs);
    let names = ["fc1.weight", "fc2.weight"];
    let at: Vec<*const HostTensor> = names
        .iter()
        .map(|n| Arc::as_ptr(g.weight(n).unwrap()))
        .collect();
    for n in names {
        assert_ne!(
            g.weight(n).unwrap().bytes(),
            want.weight(n).unwrap().bytes()
        );
    }
    let prune = PruneBlockSparse::new(specs.clone());
    assert!(run_pass(&prune, &mut g, &mut Provenance::new(&want)));
    for (n, at) in names.iter().zip(&at) {
        let w = g.weight(n).unwrap();
        assert_eq!(Arc::as_ptr(w), *at, "{n} pruned in place");
        assert_eq!(w.bytes(), want.weight(n).unwrap().bytes(), "{n}");
        assert!(prune.remembers(w), "{n}");
    }
    let mut copy = g.clone();
    assert!(!run_pass(
        &prune.clone(),
        &mut copy,
        &mut Provenance::new(&want)
    ));
    assert!(!run_pass(&prune, &mut g, &mut Provenance::new(&want)));
    let fresh = PruneBlockSparse::new(specs);
    assert!(!run_pass(&fresh, &mut g, &mut Provenance::new(&want)));
    for (n, at) in names.iter().zip(&at) {
        assert!(Arc::ptr_eq(g.weight(n).unwrap(), copy.weight(n).unwrap()));
        assert_eq!(Arc::as_ptr(g.weight(n).unwrap()), *at, "{n}");
    }
}

/// The pass remembers what it pruned, by the data's identity: run again (or a clone of it) over
/// a graph that still holds the same weight data, it zeroes the same blocks; over other data it
/// prunes that data; what it remembers is per spec, so two specs reading one tensor each get
/// their own pruning; and it forgets the data no graph it runs over holds any more.
#[test]
fn a_pass_run_again_stores_what_it_pruned_before() {
    use std::sync::Arc;
    let g = linear_gelu_linear(DType::F32, 64, 128);
    let specs = vec![
        SparseWeight::new("fc1.weight", [32, 32], Some(0.25)),
        SparseWeight::new("fc2.weight", [16, 32], Some(0.5)),
    ];
    let prune = PruneBlockSparse::new(specs.clone());
    let (mut a, mut b) = (g.clone(), g.clone());
    assert!(run_pass(&prune, &mut a, &mut Provenance::new(&g)));
    for name in ["fc1.weight", "fc2.weight"] {
        assert!(prune.remembers(g.weight(name).unwrap()), "{name}");
    }
    assert!(run_pass(&prune.clone(), &mut b, &mut Provenance::new(&g)));
    let fresh = pruned_reference(&g, &specs);
    for name in ["fc1.weight", "fc2.weight"] {
        let (wa, wb) = (a.weight(name).unwrap(), b.weight(name).unwrap());
        assert_eq!(wa.bytes(), wb.bytes(), "{name} pruned again");
        assert!(
            !Arc::ptr_eq(wa, g.weight(name).unwrap()),
            "{name} not pruned"
        );
        assert_eq!(wa.bytes(), fresh.weight(name).unwrap().bytes(), "{name}");
    }

    // Other data under the same name is pruned, not recalled; the unchanged weight is pruned
    // as before.
    let mut c = g.clone();
    let other: Vec<f64> = (0..128 * 64)
        .map(|i| ((i * 37) % 101) as f64 - 50.0)
        .collect();
    c.set_weight(
        "fc1.weight",
        HostTensor::from_f64(DType::F32, vec![128, 64], &other).unwrap(),
    );
    let want = pruned_reference(&c, &specs);
    assert!(run_pass(&prune, &mut c, &mut Provenance::new(&g)));
    assert_eq!(
        c.weight("fc1.weight").unwrap().bytes(),
        want.weight("fc1.weight").unwrap().bytes()
    );
    assert_ne!(
        c.weight("fc1.weight").unwrap().bytes(),
        a.weight("fc1.weight").unwrap().bytes()
    );
    assert_eq!(
        c.weight("fc2.weight").unwrap().bytes(),
        a.weight("fc2.weight").unwrap().bytes()
    );

    // A run over a graph that holds none of those tensors forgets them, and lets go of them.
    let source = g.weight("fc2.weight").unwrap().clone();
    drop((a, b, c));
    let mut unrelated = linear_gelu_linear(DType::F32, 64, 128);
    unrelated.set_weight(
        "fc1.weight",
        HostTensor::from_f64(DType::F32, vec![128, 64], &other).unwrap(),
    );
    unrelated.set_weight(
        "fc2.weight",
        HostTensor::from_f64(DType::F32, vec![64, 128], &other).unwrap(),
    );
    assert!(run_pass(&prune, &mut unrelated, &mut Provenance::new(&g)));
    assert!(!prune.remembers(&source));
    assert_eq!(Arc::strong_count(&source), 2, "held by g and here only");

    // Gate and up holding one tensor, selected at two densities: each keeps its own count, on
    // the first run and on the second.
    let mut tied = swiglu(DType::F32, 32, 64);
    let gate = tied.weight("gate_proj.weight").unwrap().clone();
    tied.set_weight_shared("up_proj.weight", gate);
    let prune = PruneBlockSparse::new(vec![
        SparseWeight::new("gate_proj.weight", [16, 16], Some(0.25)),
        SparseWeight::new("up_proj.weight", [16, 16], Some(0.5)),
    ]);
    for _ in 0..2 {
        let mut t = tied.clone();
        assert!(run_pass(&prune, &mut t, &mut Provenance::new(&tied)));
        for (name, count) in [("gate_proj.weight", 2), ("up_proj.weight", 4)] {
            let kept = mlpc_passes::kept_blocks(t.weight(name).unwrap(), [16, 16], None).unwrap();
            assert_eq!(kept.len(), count, "{name}");
        }
    }
}

#[test]
fn a_dual_gemm_with_one_dense_side_stays_dense() {
    let g = geglu(DType::F32, 32, 64);
    let specs = vec![SparseWeight::new("gate_proj.weight", [16, 16], Some(0.5))];
    let (opt, prov, err) = compile_and_compare(&g, &specs, 2);
    assert!(err < 1e-5, "error {err}");
    assert!(sparse_ops(&opt).is_empty(), "{opt}");
    // Said, so that the model is not reported block-sparse.
    let why = &prov.stays_dense()["gate_proj.weight"];
    assert!(
        why.contains("`up_proj.weight`, which `sparsity` does not select"),
        "{why}"
    );
    // The weight is still pruned.
    let w = opt.weight("gate_proj.weight").unwrap().to_f64();
    assert_eq!(w.iter().filter(|x| **x == 0.0).count(), 32 * 64 / 2);
}

#[test]
fn a_weight_read_as_stored_k_by_n_is_lowered_transposed() {
    // y = relu(x @ W) with W [16, 32] used as [K, N]: the logical [N, K] weight is W^T.
    let mut b = Builder::new("kn", DType::F32, 9);
    let x = b.input("x", &[t(), d(16)]);
    let w = b.weight("w", &[16, 32]);
    let h = b.op("h", Op::MatMul, &[x, w]);
    let y = b.act("relu", Activation::Relu, h);
    b.output("y", y);
    let g = b.finish();
    let specs = vec![SparseWeight::new("w", [8, 4], Some(0.5))];
    let (opt, _, err) = compile_and_compare(&g, &specs, 4);
    assert!(err < 1e-5, "error {err}\n{opt}");
    let packed = packed_weights(&opt);
    assert_eq!(packed[0].pattern.block, [4, 8]);
    assert_eq!(packed[0].pattern.out, 32);
}

#[test]
fn a_weight_read_in_both_layouts_is_packed_twice_and_explained_so() {
    // h = x @ w reads w [16, 16] as [K, N], y = h @ w^T as [N, K]: two packed copies.
    let mut b = Builder::new("both", DType::F32, 5);
    let x = b.input("x", &[t(), d(16)]);
    let w = b.weight("w", &[16, 16]);
    let h = b.op("h", Op::MatMul, &[x, w]);
    let wt = b.op("wt", Op::Transpose, &[w]);
    let y = b.op("y", Op::MatMul, &[h, wt]);
    b.output("y", y);
    let g = b.finish();
    let specs = vec![SparseWeight::new("w", [4, 8], Some(0.25))];
    let (opt, prov, err) = compile_and_compare(&g, &specs, 3);
    assert!(err < 1e-5, "error {err}");
    let packed: Vec<String> = packed_weights(&opt).into_iter().map(|p| p.name).collect();
    assert_eq!(packed, ["w.bsr", "w.bsr.1"]);
    let plan = lower_plan(&opt, &prov).unwrap();
    let text = explain(&g, &opt, &plan, &prov);
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("w "))
        .unwrap();
    assert!(
        row.contains("packed block-sparse as w.bsr (") && row.contains(") and w.bsr.1 ("),
        "{row}"
    );
}

/// Tied weights with square blocks and a symmetric pattern (every block kept): `x @ w^T` and
/// `x @ w` have equal patterns but pack differently. One packed copy served both, and the
/// second product was `x @ w^T` (relative error 1.3).
#[test]
fn a_symmetric_pattern_read_in_both_layouts_is_still_packed_twice() {
    let mut b = Builder::new("tied", DType::F32, 1);
    let x = b.input("x", &[t(), d(16)]);
    let w = b.weight("w", &[16, 16]);
    let wt = b.op("wt", Op::Transpose, &[w]);
    let a = b.op("a", Op::MatMul, &[x, wt]);
    let c = b.op("b", Op::MatMul, &[x, w]);
    b.output("a", a);
    b.output("b", c);
    let g = b.finish();
    let specs = vec![SparseWeight::new("w", [8, 8], Some(1.0))];
    let (opt, _, err) = compile_and_compare(&g, &specs, 3);
    assert!(err < 1e-5, "error {err}");
    let packed: Vec<String> = packed_weights(&opt).into_iter().map(|p| p.name).collect();
    assert_eq!(packed, ["w.bsr", "w.bsr.1"]);
}

#[test]
fn a_shared_weight_is_packed_once_and_an_output_weight_stays() {
    // Two GEMMs read the same weight; the weight is also returned as an output.
    let mut b = Builder::new("shared", DType::F32, 5);
    let x = b.input("x", &[t(), d(16)]);
    let x2 = b.input("x2", &[t(), d(16)]);
    let w = b.weight("w", &[32, 16]);
    let wt = b.op("wt", Op::Transpose, &[w]);
    let h1 = b.op("h1", Op::MatMul, &[x, wt]);
    let h2 = b.op("h2", Op::MatMul, &[x2, wt]);
    b.output("h1", h1);
    b.output("h2", h2);
    b.output("w", w);
    let g = b.finish();
    let specs = vec![SparseWeight::new("w", [8, 8], Some(0.5))];
    let (opt, prov, err) = compile_and_compare(&g, &specs, 2);
    assert!(err < 1e-5, "error {err}");
    assert_eq!(sparse_ops(&opt).len(), 2);
    assert_eq!(packed_weights(&opt).len(), 1);
    // The output still returns the whole (pruned) weight.
    assert!(opt.weight("w").is_some());
    assert!(prov.stays_dense()["w"].contains("output of the graph"));
}

#[test]
fn an_all_zero_weight_stays_dense_and_bad_specs_are_errors() {
    let mut g = one_linear(DType::F32, 16, 16);
    g.set_weight(
        "fc.weight",
        HostTensor::from_f64(DType::F32, vec![16, 16], &[0.0; 256]).unwrap(),
    );
    let specs = vec![SparseWeight::new("fc.weight", [4, 4], None)];
    let (opt, prov, err) = compile_and_compare(&g, &specs, 2);
    assert!(err < 1e-5);
    assert!(sparse_ops(&opt).is_empty());
    assert!(prov.stays_dense()["fc.weight"].contains("no block of it holds data"));
    // A density that rounds to no block says the same.
    let g = one_linear(DType::F32, 16, 16);
    let specs = vec![SparseWeight::new("fc.weight", [8, 8], Some(0.1))];
    let (opt, prov, _) = compile_and_compare(&g, &specs, 2);
    assert!(sparse_ops(&opt).is_empty());
    assert!(prov.stays_dense()["fc.weight"].contains("stays dense and computes zeros"));

    let g = one_linear(DType::F32, 16, 16);
    for (spec, want) in [
        (
            SparseWeight::new("nope", [4, 4], None),
            "block sparsity of weight `nope`: the graph has no weight of this name",
        ),
        (
            SparseWeight::new("fc.weight", [3, 4], Some(0.5)),
            "block sparsity of weight `fc.weight`: block [3, 4] does not divide the weight [16, 16]",
        ),
        (
            SparseWeight::new("fc.bias", [4, 4], Some(0.5)),
            "block sparsity of weight `fc.bias`: the weight has shape [16], not [out, in]",
        ),
    ] {
        let err = Pipeline::default()
            .with_sparsity(vec![spec])
            .run(&mut g.clone(), &opts())
            .unwrap_err();
        assert_eq!(err.to_string(), want);
    }
    // Two specs for one weight (a model built in memory; the frontend refuses two keys).
    let twice = vec![
        SparseWeight::new("fc.weight", [4, 4], Some(0.5)),
        SparseWeight::new("fc.weight", [8, 8], Some(0.25)),
    ];
    let err = Pipeline::default()
        .with_sparsity(twice)
        .run(&mut g.clone(), &opts())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "block sparsity of weight `fc.weight`: selected twice; one block shape and density a weight"
    );
}

#[test]
fn selected_weights_read_dense_are_recorded_with_why() {
    // A dual GEMM whose two weights have different blocks stays dense, both weights said.
    let g = swiglu(DType::F32, 32, 64);
    let specs = vec![
        SparseWeight::new("gate_proj.weight", [16, 16], Some(0.5)),
        SparseWeight::new("up_proj.weight", [8, 16], Some(0.5)),
    ];
    let (opt, prov, err) = compile_and_compare(&g, &specs, 2);
    assert!(err < 1e-5, "error {err}");
    assert!(sparse_ops(&opt).is_empty(), "{opt}");
    let dense = prov.stays_dense();
    assert_eq!(dense.len(), 2, "{dense:?}");
    assert!(dense["up_proj.weight"].contains("(blocks 8x16)"));
    assert!(dense["gate_proj.weight"].contains("need the same block"));

    // A reader that is not a GEMM keeps the dense weight beside the packed one, and says so in
    // --explain.
    let mut b = Builder::new("tied", DType::F32, 3);
    let x = b.input("x", &[t(), d(16)]);
    let w = b.weight("w", &[32, 16]);
    let wt = b.op("wt", Op::Transpose, &[w]);
    let h = b.op("h", Op::MatMul, &[x, wt]);
    let z = b.op("z", Op::Add, &[w, w]);
    b.output("h", h);
    b.output("z", z);
    let g = b.finish();
    let specs = vec![SparseWeight::new("w", [8, 8], Some(0.5))];
    let (opt, prov, err) = compile_and_compare(&g, &specs, 3);
    assert!(err < 1e-5, "error {err}");
    assert_eq!(sparse_ops(&opt).len(), 1);
    let why = &prov.stays_dense()["w"];
    assert!(why.starts_with("`z` (add) reads it too"), "{why}");
    let plan = lower_plan(&opt, &prov).unwrap();
    let text = explain(&g, &opt, &plan, &prov);
    assert!(
        text.contains("selected for block sparsity but read dense: 1\n  w: `z` (add)"),
        "{text}"
    );
    // Its dense bytes count in the total though it stays (it was counted only when removed).
    assert!(
        text.contains("block-sparse weights: 1 packed, 2048 bytes dense"),
        "{text}"
    );

    // A weight read as `w` and as `w^T` is packed once for each; --explain's total counts its
    // dense bytes once (it counted them twice, as if packing both halved the memory).
    let mut b = Builder::new("tied", DType::F32, 3);
    let x = b.input("x", &[t(), d(32)]);
    let w = b.weight("w", &[16, 32]);
    let wt = b.op("wt", Op::Transpose, &[w]);
    let h = b.op("h", Op::MatMul, &[x, wt]);
    let y = b.op("y", Op::MatMul, &[h, w]);
    b.output("y", y);
    let g = b.finish();
    let specs = vec![SparseWeight::new("w", [8, 8], Some(0.5))];
    let (opt, prov, err) = compile_and_compare(&g, &specs, 3);
    assert!(err < 1e-5, "error {err}");
    assert_eq!(sparse_ops(&opt).len(), 2, "{opt}");
    let plan = lower_plan(&opt, &prov).unwrap();
    let text = explain(&g, &opt, &plan, &prov);
    assert!(
        text.contains(
            "block-sparse weights: 1 packed as 2 (once for each way they are read), 2048 bytes \
             dense, 2048 packed + 32 index bytes"
        ),
        "{text}"
    );
}

/// A `[rows * br, cols * bc]` weight whose blocks are zero where `mask` is false.
fn masked_weight(
    rows: usize,
    cols: usize,
    block: [usize; 2],
    mask: &[bool],
    seed: u64,
) -> HostTensor {
    let (n, k) = (rows * block[0], cols * block[1]);
    let mut v = vec![0.0; n * k];
    let mut s = seed;
    for (i, x) in v.iter_mut().enumerate() {
        let b = (i / k / block[0]) * cols + (i % k) / block[1];
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        if mask[b] {
            // In (-1, 1) and never zero: a kept 1 x 1 block of value 0 would be an all-zero
            // block, which the pass rightly prunes.
            *x = ((s >> 33) % 2000) as f64 / 1000.0 - 0.9995;
        }
    }
    HostTensor::from_f64(DType::F32, vec![n, k], &v).unwrap()
}

/// One random zero-block mask (see `style`) on a `rows x cols` grid of `br x bc` blocks: the
/// compiled graph computes the pruned dense model with one sparse GEMM keeping every kept block.
#[allow(clippy::too_many_arguments)]
fn check_random_mask(
    rows: usize,
    cols: usize,
    br: usize,
    bc: usize,
    mask_seed: u64,
    style: u8,
    tokens: u64,
    act: Activation,
) -> Result<(), TestCaseError> {
    let blocks = rows * cols;
    let mask: Vec<bool> = match style {
        // One block only.
        0 => (0..blocks)
            .map(|b| b == (mask_seed as usize) % blocks)
            .collect(),
        // Full density.
        1 => vec![true; blocks],
        // Random; block row 0 empty when there are several.
        _ => (0..blocks)
            .map(|b| (mask_seed >> (b % 64)) & 1 == 1 && !(rows > 1 && b < cols))
            .collect(),
    };
    prop_assume!(mask.iter().any(|&m| m));
    let (n, k) = (rows * br, cols * bc);
    let mut b = Builder::new("prop", DType::F32, mask_seed);
    let x = b.input("x", &[t(), d(k as u64)]);
    let w =
        b.g.add_weight("w", masked_weight(rows, cols, [br, bc], &mask, mask_seed))
            .unwrap();
    let bias = b.weight("bias", &[n]);
    let wt = b.op("wt", Op::Transpose, &[w]);
    let h = b.op("h", Op::MatMul, &[x, wt]);
    let hb = b.op("hb", Op::Add, &[h, bias]);
    let y = b.act("act", act, hb);
    b.output("y", y);
    let g = b.finish();
    let specs = vec![SparseWeight::new("w", [br as u64, bc as u64], None)];
    let (opt, _, err) = compile_and_compare(&g, &specs, tokens);
    prop_assert!(err < 1e-5, "error {}\n{}", err, opt);
    prop_assert_eq!(sparse_ops(&opt), vec!["sparse_gemm".to_string()]);
    let kept = mask.iter().filter(|&&m| m).count();
    prop_assert_eq!(packed_weights(&opt)[0].pattern.kept.len(), kept);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random zero-block masks (empty block rows, single blocks and full density among them):
    /// the compiled graph computes the pruned dense model.
    #[test]
    fn random_masks_match_the_dense_pruned_model(
        rows in 1usize..5,
        cols in 1usize..5,
        br in prop::sample::select(vec![1usize, 2, 4, 8]),
        bc in prop::sample::select(vec![1usize, 3, 4, 8]),
        mask_seed in any::<u64>(),
        style in 0u8..4,
        tokens in 1u64..6,
        act in prop::sample::select(Activation::ALL.to_vec()),
    ) {
        check_random_mask(rows, cols, br, bc, mask_seed, style, tokens, act)?;
    }
}

/// A single output whose six products nearly cancel: the rounding of the reordered sum is large
/// next to the output, small next to its terms (the plain relative error failed it).
#[test]
fn a_cancelling_single_output_matches_within_rounding() {
    check_random_mask(1, 3, 1, 3, 18185895372366155213, 2, 1, Activation::Relu).unwrap();
}
