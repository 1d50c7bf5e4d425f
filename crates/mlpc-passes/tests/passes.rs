//! Targeted behaviour of each pass, the plan lowering and the pipeline.

mod common;

use common::*;
use mlpc_ir::{
    interpret, verify, Activation, BufferKind, DType, Epilogue, Graph, MatLayout, Op, Plan,
};
use mlpc_passes::{
    explain, lower_plan, Cse, Dce, Fate, FoldTranspose, FuseEpilogue, Pass, PassError, Pipeline,
    PipelineOptions, Provenance,
};

fn run_default(g: &Graph) -> (Graph, Provenance, Plan) {
    let mut opt = g.clone();
    let opts = PipelineOptions {
        verify_each: true,
        ..PipelineOptions::default()
    };
    let report = Pipeline::default().run(&mut opt, &opts).unwrap();
    let plan = lower_plan(&opt, &report.provenance).unwrap();
    (opt, report.provenance, plan)
}

/// Asserts `opt` computes what `g` computes (exactly when `exact`).
fn assert_same_values(g: &Graph, opt: &Graph, exact: bool) {
    let inputs = random_inputs(g, &bind_t(3), 11);
    let want = interpret(g, &inputs).unwrap();
    let got = interpret(opt, &inputs).unwrap();
    let err = max_error(&got, &want);
    if exact {
        assert_eq!(got, want, "\n{g}\n{opt}");
    } else {
        assert!(err <= 1e-5, "error {err}\n{g}\n{opt}");
    }
}

fn line(g: &Graph, name: &str) -> String {
    g.node_text(
        g.find(name)
            .unwrap_or_else(|| panic!("no node {name} in\n{g}")),
    )
}

fn kernel_names(plan: &Plan) -> Vec<&str> {
    plan.kernels.iter().map(|k| k.name.as_str()).collect()
}

#[test]
fn transposed_input_folds_into_the_a_layout() {
    let mut b = Builder::new("xt", DType::F32, 1);
    let xt = b.input("xt", &[d(5), t()]);
    let x = b.op("x", Op::Transpose, &[xt]);
    let y = b.linear("fc", x, 5, 7, false);
    b.output("y", y);
    let g = b.finish();
    let mut opt = g.clone();
    let mut prov = Provenance::new(&g);
    assert!(run_pass(&FoldTranspose, &mut opt, &mut prov));
    assert_eq!(line(&opt, "fc"), "%fc = gemm.tt %xt, %fc.weight : f32[T,7]");
    assert!(opt.find("x").is_none() && opt.find("fc.weight.t").is_none());
    assert_eq!(
        prov.fate("x"),
        Some(&Fate::FoldedIntoStrides(vec!["fc".into()]))
    );
    assert_same_values(&g, &opt, true);
}

#[test]
fn transpose_chains_cancel() {
    let mut b = Builder::new("chain", DType::F32, 2);
    let x = b.input("x", &[t(), d(4)]);
    let w = b.weight("w", &[4, 6]);
    let t1 = b.op("t1", Op::Transpose, &[w]);
    let t2 = b.op("t2", Op::Transpose, &[t1]);
    let h = b.op("h", Op::MatMul, &[x, t2]);
    // An odd chain of three on the input side, returned as an output.
    let u1 = b.op("u1", Op::Transpose, &[x]);
    let u2 = b.op("u2", Op::Transpose, &[u1]);
    let u3 = b.op("u3", Op::Transpose, &[u2]);
    b.output("y", h);
    b.output("xt", u3);
    let g = b.finish();
    let mut opt = g.clone();
    let mut prov = Provenance::new(&g);
    run_pass(&FoldTranspose, &mut opt, &mut prov);
    assert_eq!(line(&opt, "h"), "%h = gemm.nn %x, %w : f32[T,6]");
    assert_eq!(
        line(&opt, "u3"),
        "%u3 = transpose %x : f32[4,T] strides=[1,4]"
    );
    for gone in ["t1", "t2", "u1", "u2"] {
        assert!(opt.find(gone).is_none(), "{gone} survived\n{opt}");
    }
    assert_eq!(prov.fate("t2"), Some(&Fate::Cancelled("w".into())));
    assert_same_values(&g, &opt, true);
    // The transposed output is materialised by one transpose kernel.
    let plan = lower_plan(&opt, &prov).unwrap();
    assert_eq!(kernel_names(&plan), ["gemm_f32_nn", "transpose_f32"]);
    let out = plan.buffer(plan.kernels[1].out);
    assert_eq!((out.name.as_str(), out.kind), ("u3", BufferKind::Output));
    assert_eq!(out.ty.to_string(), "f32[4,T]");
    assert_eq!(plan.buffer(plan.kernels[1].args[0]).name, "x");
}

#[test]
fn a_transpose_with_other_users_stays_a_view() {
    // relu(h^T) reads a strided view; the plan materialises it once.
    let mut b = Builder::new("view", DType::F32, 3);
    let x = b.input("x", &[d(3), d(3)]);
    let h = b.linear("fc", x, 3, 3, false);
    let ht = b.op("ht", Op::Transpose, &[h]);
    let r = b.act("relu", Activation::Relu, ht);
    let s = b.act("tanh", Activation::Tanh, ht);
    let y = b.op("y", Op::Add, &[r, s]);
    b.output("y", y);
    let g = b.finish();
    let (opt, _, plan) = run_default(&g);
    assert!(opt.find("ht").is_some());
    assert_eq!(
        kernel_names(&plan),
        [
            "gemm_f32_nt",
            "transpose_f32",
            "relu_f32",
            "tanh_f32",
            "add_f32"
        ]
    );
    assert_eq!(
        plan.buffer(plan.kernels[1].out).kind,
        BufferKind::Intermediate
    );
    assert_same_values(&g, &opt, false);
}

#[test]
fn a_transposed_left_operand_of_rank_three_stays() {
    let mut b = Builder::new("rank3", DType::F32, 4);
    let x = b.input("x", &[d(2), d(5), t()]);
    let xt = b.op("xt", Op::Transpose, &[x]);
    let w = b.weight("w", &[5, 4]);
    let h = b.op("h", Op::MatMul, &[xt, w]);
    b.output("y", h);
    let g = b.finish();
    let (opt, _, plan) = run_default(&g);
    assert_eq!(line(&opt, "h"), "%h = gemm.nn %xt, %w : f32[2,T,4]");
    assert_eq!(kernel_names(&plan), ["transpose_f32", "gemm_f32_nn"]);
    assert_same_values(&g, &opt, true);
}

#[test]
fn no_fusion_into_a_shared_or_returned_result() {
    let mut b = Builder::new("shared", DType::F32, 5);
    let x = b.input("x", &[t(), d(4)]);
    let h = b.linear("fc", x, 4, 4, false);
    let r = b.act("relu", Activation::Relu, h);
    let s = b.act("tanh", Activation::Tanh, h);
    let y = b.op("y", Op::Add, &[r, s]);
    let h2 = b.linear("fc2", y, 4, 4, false);
    let z = b.act("sigmoid", Activation::Sigmoid, h2);
    b.output("y", z);
    b.output("h2", h2);
    let g = b.finish();
    let (opt, prov, plan) = run_default(&g);
    assert_eq!(line(&opt, "fc"), "%fc = gemm.nt %x, %fc.weight : f32[T,4]");
    assert_eq!(
        line(&opt, "fc2"),
        "%fc2 = gemm.nt %y, %fc2.weight : f32[T,4]"
    );
    assert_eq!(prov.fate("sigmoid"), Some(&Fate::Live));
    assert_eq!(plan.kernels.len(), 6);
    assert_same_values(&g, &opt, true);
}

#[test]
fn bias_then_residual_fuse_in_either_operand_order() {
    let mut b = Builder::new("residual", DType::F32, 6);
    let x = b.input("x", &[t(), d(6)]);
    let w = b.weight("fc.weight", &[6, 6]);
    let wt = b.op("fc.weight.t", Op::Transpose, &[w]);
    let h = b.op("fc", Op::MatMul, &[x, wt]);
    let bias = b.weight("fc.bias", &[6]);
    let hb = b.op("hb", Op::Add, &[bias, h]);
    let g1 = b.act("gelu", Activation::Gelu, hb);
    let y = b.op("res", Op::Add, &[x, g1]);
    let m = b.op("scaled", Op::Mul, &[y, x]);
    b.output("y", m);
    let g = b.finish();
    let (opt, _, plan) = run_default(&g);
    assert_eq!(
        line(&opt, "fc"),
        "%fc = gemm.nt %x, %fc.weight then bias(%fc.bias), gelu, add(%x), mul(%x) : f32[T,6]"
    );
    assert_eq!(kernel_names(&plan), ["gemm_bias_gelu_add_mul_f32_nt"]);
    assert_eq!(plan.kernels[0].args.len(), 5);
    assert_same_values(&g, &opt, false);
}

#[test]
fn swiglu_with_biases_becomes_one_dual_gemm_then_a_fused_down_projection() {
    let mut b = Builder::new("swiglu-bias", DType::F32, 7);
    let x = b.input("x", &[t(), d(8)]);
    let gate = b.linear("gate", x, 8, 12, true);
    let up = b.linear("up", x, 8, 12, true);
    let s = b.act("silu", Activation::Silu, gate);
    // The up side on the left: the gate is still the side with the activation.
    let m = b.op("m", Op::Mul, &[up, s]);
    let down = b.linear("down", m, 12, 8, true);
    let y = b.op("res", Op::Add, &[down, x]);
    b.output("y", y);
    let g = b.finish();
    let (opt, prov, plan) = run_default(&g);
    assert_eq!(
        line(&opt, "gate"),
        "%gate = dual_gemm.nt %x, %gate.weight, %up.weight \
         gate[bias(%gate.bias), silu] up[bias(%up.bias)] mul : f32[T,12]"
    );
    let operands: Vec<String> = opt
        .operands(opt.find("gate").unwrap())
        .into_iter()
        .map(|o| opt.node(o).name.clone())
        .collect();
    assert_eq!(
        operands,
        ["x", "gate.weight", "up.weight", "gate.bias", "up.bias"]
    );
    match &opt.node(opt.find("gate").unwrap()).op {
        Op::Gemm(gm) => {
            let d = gm.dual.as_ref().unwrap();
            assert_eq!(d.gate[0], Epilogue::Bias { operand: 3 });
            assert_eq!(d.up[0], Epilogue::Bias { operand: 4 });
            assert_eq!((gm.a, gm.b), (MatLayout::N, MatLayout::T));
        }
        op => panic!("{op:?}"),
    }
    assert_eq!(
        kernel_names(&plan),
        [
            "dual_gemm_bias_silu_up_bias_mul_f32_nt",
            "gemm_bias_add_f32_nt"
        ]
    );
    assert_eq!(prov.fate("up"), Some(&Fate::FusedInto("gate".into())));
    assert_eq!(
        plan.kernels[0].covers,
        [
            "gate.weight.t",
            "gate",
            "gate.add",
            "up.weight.t",
            "up",
            "up.add",
            "silu",
            "m"
        ]
    );
    assert_same_values(&g, &opt, false);
}

#[test]
fn a_product_of_gemms_with_different_a_fuses_as_a_mul_step() {
    let mut b = Builder::new("two-a", DType::F32, 8);
    let x = b.input("x", &[t(), d(4)]);
    let z = b.input("z", &[t(), d(4)]);
    let g1 = b.linear("g1", x, 4, 5, false);
    let g2 = b.linear("g2", z, 4, 5, false);
    let a = b.act("relu", Activation::Relu, g1);
    let m = b.op("m", Op::Mul, &[a, g2]);
    b.output("y", m);
    let g = b.finish();
    let (opt, _, plan) = run_default(&g);
    assert_eq!(kernel_names(&plan), ["gemm_f32_nt", "gemm_relu_mul_f32_nt"]);
    assert_eq!(
        line(&opt, "g1"),
        "%g1 = gemm.nt %x, %g1.weight then relu, mul(%g2) : f32[T,5]"
    );
    assert_same_values(&g, &opt, false);
}

#[test]
fn a_gate_whose_up_side_has_a_pending_product_still_becomes_dual() {
    // act(x Wg) * ((x Wu) * r): the up side first absorbs `* r`, then the pair joins.
    let mut b = Builder::new("pending", DType::F32, 9);
    let x = b.input("x", &[t(), d(4)]);
    let r = b.input("r", &[t(), d(6)]);
    let gate = b.linear("gate", x, 4, 6, false);
    let a = b.act("silu", Activation::Silu, gate);
    let up = b.linear("up", x, 4, 6, false);
    let ur = b.op("ur", Op::Mul, &[up, r]);
    let m = b.op("m", Op::Mul, &[a, ur]);
    b.output("y", m);
    let g = b.finish();
    let (opt, _, plan) = run_default(&g);
    assert_eq!(kernel_names(&plan), ["dual_gemm_silu_up_mul_mul_f32_nt"]);
    assert_same_values(&g, &opt, false);
}

#[test]
fn a_broadcast_gemm_result_is_not_an_epilogue() {
    // x is a single row [K]: the GEMM yields [N], which the add broadcasts over r's rows.
    let mut b = Builder::new("bcast", DType::F32, 10);
    let x = b.input("x", &[d(4)]);
    let r = b.input("r", &[t(), d(3)]);
    let h = b.linear("fc", x, 4, 3, false);
    let y = b.op("y", Op::Add, &[r, h]);
    b.output("y", y);
    let g = b.finish();
    let (opt, _, plan) = run_default(&g);
    assert_eq!(kernel_names(&plan), ["gemm_f32_nt", "add_f32"]);
    assert_same_values(&g, &opt, true);
}

#[test]
fn cse_merges_tied_transposes_and_the_matmuls_reading_them() {
    let mut b = Builder::new("tied", DType::F32, 11);
    let x = b.input("x", &[t(), d(4)]);
    let w = b.weight("w", &[4, 4]);
    let t1 = b.op("t1", Op::Transpose, &[w]);
    let t2 = b.op("t2", Op::Transpose, &[w]);
    let h1 = b.op("h1", Op::MatMul, &[x, t1]);
    let h2 = b.op("h2", Op::MatMul, &[x, t2]);
    let y = b.op("y", Op::Add, &[h1, h2]);
    b.output("y", y);
    let g = b.finish();

    let mut only_cse = g.clone();
    let mut prov = Provenance::new(&g);
    assert!(run_pass(&Cse, &mut only_cse, &mut prov));
    assert_eq!(prov.fate("t2"), Some(&Fate::MergedWith("t1".into())));
    assert_eq!(prov.fate("h2"), Some(&Fate::MergedWith("h1".into())));
    assert_eq!(line(&only_cse, "y"), "%y = add %h1, %h1 : f32[T,4]");
    assert!(!run_pass(&Cse, &mut only_cse, &mut prov));

    let (opt, prov, plan) = run_default(&g);
    assert_eq!(kernel_names(&plan), ["gemm_f32_nt", "add_f32"]);
    assert_eq!(plan.kernels[0].covers, ["t1", "t2", "h1", "h2"]);
    assert_eq!(prov.fate("h2"), Some(&Fate::MergedWith("h1".into())));
    assert_same_values(&g, &opt, true);
}

#[test]
fn dce_removes_dead_nodes_and_their_weights_but_keeps_inputs() {
    let mut b = Builder::new("dead", DType::F32, 12);
    let x = b.input("x", &[t(), d(4)]);
    b.input("unused", &[d(2)]);
    let y = b.act("relu", Activation::Relu, x);
    let dead = b.linear("dead", x, 4, 4, true);
    b.act("dead_act", Activation::Tanh, dead);
    b.output("y", y);
    let g = b.finish();
    let mut opt = g.clone();
    let mut prov = Provenance::new(&g);
    assert!(run_pass(&Dce, &mut opt, &mut prov));
    assert_eq!(
        opt.to_string(),
        "graph \"dead\" {\n  %x = input : f32[T,4]\n  %unused = input : f32[2]\n  \
         %relu = relu %x : f32[T,4]\n  return y = %relu\n}\n"
    );
    assert!(opt.weights().is_empty());
    for n in [
        "dead",
        "dead.weight",
        "dead.weight.t",
        "dead.bias",
        "dead.add",
        "dead_act",
    ] {
        assert_eq!(prov.fate(n), Some(&Fate::Removed), "{n}");
    }
    assert!(!run_pass(&Dce, &mut opt, &mut prov));
}

#[test]
fn outputs_that_are_inputs_name_the_input_buffer() {
    let mut b = Builder::new("passthrough", DType::Bf16, 13);
    let x = b.input("x", &[t(), d(4)]);
    let x1 = b.op("x1", Op::Transpose, &[x]);
    let x2 = b.op("x2", Op::Transpose, &[x1]);
    let r = b.act("relu", Activation::Relu, x);
    b.output("same", x2);
    b.output("r", r);
    let g = b.finish();
    let (opt, _, plan) = run_default(&g);
    plan.check().unwrap();
    assert_eq!(kernel_names(&plan), ["relu_bf16"]);
    let same = plan.outputs.iter().find(|(n, _)| n == "same").unwrap().1;
    assert_eq!(plan.buffer(same).kind, BufferKind::Input);
    assert_same_values(&g, &opt, true);
}

#[test]
fn kernel_names_get_suffixes_only_on_collisions() {
    let mut b = Builder::new("names", DType::F32, 14);
    let x = b.input("x", &[t(), d(4)]);
    let y = b.input("y", &[t(), d(4)]);
    let a1 = b.op("a1", Op::Add, &[x, y]);
    let a2 = b.op("a2", Op::Add, &[a1, y]);
    let a3 = b.op("a3", Op::Add, &[a2, x]);
    b.output("out", a3);
    let g = b.finish();
    let (_, _, plan) = run_default(&g);
    assert_eq!(kernel_names(&plan), ["add_f32", "add_f32_1", "add_f32_2"]);
}

#[test]
fn passes_are_named_and_described() {
    let all = mlpc_passes::all_passes();
    let names: Vec<&str> = all.iter().map(|p| p.name()).collect();
    assert_eq!(names, ["dce", "fold-transpose", "cse", "fuse-epilogue"]);
    for p in &all {
        assert!(!p.description().is_empty() && !p.description().contains('\n'));
    }
    assert_eq!(
        format!(
            "{:?}",
            Pipeline::from_names(&["cse", "dce", "cse"]).unwrap()
        ),
        r#"["cse", "dce", "cse"]"#
    );
}

/// A pass that breaks the graph on purpose.
struct Breaker;

impl Pass for Breaker {
    fn name(&self) -> &'static str {
        "breaker"
    }
    fn description(&self) -> &'static str {
        "changes a node's type without changing its operands"
    }
    fn run(&self, g: &mut Graph, _: &mut Provenance) -> Result<bool, PassError> {
        let n = g.find("relu").unwrap();
        g.node_mut(n).ty.dtype = DType::F16;
        Ok(true)
    }
}

#[test]
fn verify_each_names_the_pass_that_broke_the_graph() {
    let mut b = Builder::new("broken", DType::F32, 15);
    let x = b.input("x", &[d(2)]);
    let r = b.act("relu", Activation::Relu, x);
    b.output("y", r);
    let g = b.finish();
    let p = Pipeline::new(vec![Box::new(Breaker)]);
    let strict = PipelineOptions {
        verify_each: true,
        ..PipelineOptions::default()
    };
    let err = p.run(&mut g.clone(), &strict).unwrap_err();
    assert!(
        matches!(
            err,
            PassError::Verify {
                pass: "breaker",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("node `relu`"), "{err}");
    let lax = PipelineOptions {
        verify_each: false,
        ..PipelineOptions::default()
    };
    let mut broken = g.clone();
    p.run(&mut broken, &lax).unwrap();
    assert!(verify(&broken).is_err());
}

#[test]
fn fuse_epilogue_alone_turns_matmuls_into_gemms_when_fusing() {
    let g = linear_gelu_linear(DType::F32, 4, 6);
    let mut opt = g.clone();
    let mut prov = Provenance::new(&g);
    assert!(run_pass(&FuseEpilogue, &mut opt, &mut prov));
    assert_eq!(
        line(&opt, "fc1"),
        "%fc1 = gemm.nn %x, %fc1.weight.t then bias(%fc1.bias), gelu : f32[T,6]"
    );
    let plan = lower_plan(&opt, &prov).unwrap();
    assert_eq!(
        kernel_names(&plan),
        [
            "transpose_f32",
            "gemm_bias_gelu_f32_nn",
            "transpose_f32_1",
            "gemm_bias_f32_nn"
        ]
    );
    assert_same_values(&g, &opt, false);
}

/// A chain of 3000 layers (linear, bias, relu) through the pipeline, the lowering and `--explain`:
/// one kernel a layer. Every step is linear in the depth (or n log n); one that is quadratic (a
/// topological sort after every fusion, a scan of all source nodes or all kernels for each
/// kernel or node) makes this test take minutes instead of a second.
#[test]
fn a_deep_chain_fuses_lowers_and_explains_one_kernel_a_layer() {
    const LAYERS: usize = 3000;
    let mut b = Builder::new("deep", DType::F32, 7);
    let mut h = b.input("x", &[t(), d(4)]);
    for i in 0..LAYERS {
        let l = b.linear(&format!("fc{i}"), h, 4, 4, true);
        h = b.act(&format!("relu{i}"), Activation::Relu, l);
    }
    b.output("y", h);
    let g = b.finish();
    let (opt, prov, plan) = run_default(&g);
    assert_eq!(plan.kernels.len(), LAYERS);
    let last = &plan.kernels[LAYERS - 1];
    assert_eq!(last.name, format!("gemm_bias_relu_f32_nt_{}", LAYERS - 1));
    let l = LAYERS - 1;
    let covers = [
        format!("fc{l}.weight.t"),
        format!("fc{l}"),
        format!("fc{l}.add"),
        format!("relu{l}"),
    ];
    assert_eq!(last.covers, covers);
    let text = explain(&g, &opt, &plan, &prov);
    assert!(
        text.contains(&format!("fused into epilogue of {}", last.name)),
        "{text}"
    );
}

/// Gated layers whose up GEMM comes first in the walk: the dual rewrite at the up GEMM makes the
/// later gate GEMM the dual one and removes the node the walk stands on; the walk goes on to the
/// next layer's pair in the same stage.
#[test]
fn dual_gemms_whose_walk_meets_the_up_side_first() {
    let mut b = Builder::new("up-first", DType::F32, 7);
    let mut h = b.input("x", &[t(), d(4)]);
    for i in 0..2 {
        let up = b.linear(&format!("up{i}"), h, 4, 6, false);
        let gate = b.linear(&format!("gate{i}"), h, 4, 6, false);
        let s = b.act(&format!("silu{i}"), Activation::Silu, gate);
        let m = b.op(&format!("m{i}"), Op::Mul, &[up, s]);
        h = b.linear(&format!("down{i}"), m, 6, 4, true);
    }
    b.output("y", h);
    let g = b.finish();
    let (opt, prov, plan) = run_default(&g);
    assert_eq!(
        kernel_names(&plan),
        [
            "dual_gemm_silu_mul_f32_nt",
            "gemm_bias_f32_nt",
            "dual_gemm_silu_mul_f32_nt_1",
            "gemm_bias_f32_nt_1"
        ]
    );
    assert_eq!(
        line(&opt, "gate1"),
        "%gate1 = dual_gemm.nt %down0, %gate1.weight, %up1.weight gate[silu] up[] mul : f32[T,6]"
    );
    for i in 0..2 {
        assert_eq!(
            prov.fate(&format!("up{i}")),
            Some(&Fate::FusedInto(format!("gate{i}")))
        );
    }
    assert_same_values(&g, &opt, false);
}

/// A stack of 1500 gated layers (`down(silu(x Wg) * (x Wu)) + x`): a dual GEMM and a down
/// projection with its residual a layer. All the dual GEMMs are made in one walk; one a walk,
/// each walk starting over from the top, made this quadratic in the depth (seconds here).
#[test]
fn a_deep_gated_stack_makes_one_dual_gemm_a_layer() {
    const LAYERS: usize = 1500;
    let mut b = Builder::new("deep-gated", DType::F32, 7);
    let mut h = b.input("x", &[t(), d(4)]);
    for i in 0..LAYERS {
        let gate = b.linear(&format!("gate{i}"), h, 4, 6, false);
        let s = b.act(&format!("silu{i}"), Activation::Silu, gate);
        let up = b.linear(&format!("up{i}"), h, 4, 6, false);
        let m = b.op(&format!("m{i}"), Op::Mul, &[s, up]);
        let down = b.linear(&format!("down{i}"), m, 6, 4, false);
        h = b.op(&format!("res{i}"), Op::Add, &[down, h]);
    }
    b.output("y", h);
    let g = b.finish();
    let (opt, prov, plan) = run_default(&g);
    assert_eq!(plan.kernels.len(), 2 * LAYERS);
    let l = LAYERS - 1;
    assert_eq!(
        line(&opt, &format!("gate{l}")),
        format!(
            "%gate{l} = dual_gemm.nt %down{}, %gate{l}.weight, %up{l}.weight gate[silu] up[] mul \
             : f32[T,6]",
            l - 1
        )
    );
    assert_eq!(
        kernel_names(&plan)[2 * l..],
        [
            format!("dual_gemm_silu_mul_f32_nt_{l}"),
            format!("gemm_add_f32_nt_{l}")
        ]
    );
    assert_eq!(
        prov.fate(&format!("up{l}")),
        Some(&Fate::FusedInto(format!("gate{l}")))
    );
}

/// A stack of 1500 layers `relu((h W) * r)`, each `r` an input: a GEMM with a `mul` step and a
/// `relu` a layer. The products, and the activations they let fuse, are all fused in one walk;
/// starting over from the top after each made this quadratic in the depth (seconds here).
#[test]
fn a_deep_product_stack_makes_one_gemm_a_layer() {
    const LAYERS: usize = 1500;
    let mut b = Builder::new("deep-products", DType::F32, 7);
    let mut h = b.input("x", &[t(), d(4)]);
    for i in 0..LAYERS {
        let r = b.input(&format!("r{i}"), &[t(), d(4)]);
        let gm = b.linear(&format!("w{i}"), h, 4, 4, false);
        let m = b.op(&format!("m{i}"), Op::Mul, &[gm, r]);
        h = b.act(&format!("relu{i}"), Activation::Relu, m);
    }
    b.output("y", h);
    let g = b.finish();
    let (opt, prov, plan) = run_default(&g);
    assert_eq!(plan.kernels.len(), LAYERS);
    let l = LAYERS - 1;
    assert_eq!(
        line(&opt, &format!("w{l}")),
        format!(
            "%w{l} = gemm.nt %w{}, %w{l}.weight then mul(%r{l}), relu : f32[T,4]",
            l - 1
        )
    );
    for absorbed in [format!("m{l}"), format!("relu{l}")] {
        assert_eq!(
            prov.fate(&absorbed),
            Some(&Fate::FusedInto(format!("w{l}")))
        );
    }
}
