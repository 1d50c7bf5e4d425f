//! The canonical models: kernel counts, kernel names, plans, IR snapshots after each pass and the
//! `--explain` report.

mod common;

use common::*;
use mlpc_ir::{interpret, BufferKind, DType, Graph, Plan};
use mlpc_passes::{
    explain, lower_plan, PassError, Pipeline, PipelineOptions, PipelineReport, PrintAfter,
};

fn optimise(g: &Graph, print: PrintAfter) -> (Graph, PipelineReport, Plan) {
    let mut opt = g.clone();
    let opts = PipelineOptions {
        verify_each: true,
        print_after: print,
    };
    let report = Pipeline::default().run(&mut opt, &opts).unwrap();
    let plan = lower_plan(&opt, &report.provenance).unwrap();
    (opt, report, plan)
}

#[test]
fn canonical_kernel_counts() {
    for (g, want) in canonical(D, H) {
        let (_, _, plan) = optimise(&g, PrintAfter::Nothing);
        let names: Vec<&str> = plan.kernels.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(plan.kernels.len(), want, "{}: {names:?}", g.name);
    }
}

#[test]
fn canonical_kernel_names() {
    let names = |g: &Graph| -> Vec<String> {
        let (_, _, plan) = optimise(g, PrintAfter::Nothing);
        plan.kernels.into_iter().map(|k| k.name).collect()
    };
    let (dm, dh) = (8, 16);
    assert_eq!(
        names(&one_linear(DType::Bf16, dm, dh)),
        ["gemm_bias_bf16_nt"]
    );
    assert_eq!(
        names(&linear_gelu_linear(DType::Bf16, dm, dh)),
        ["gemm_bias_gelu_bf16_nt", "gemm_bias_bf16_nt"]
    );
    assert_eq!(
        names(&three_linears(DType::F32, dm, dh)),
        [
            "gemm_bias_relu_f32_nt",
            "gemm_bias_tanh_f32_nt",
            "gemm_bias_f32_nt"
        ]
    );
    assert_eq!(
        names(&geglu(DType::Bf16, dm, dh)),
        ["dual_gemm_gelu_tanh_mul_bf16_nt", "gemm_bf16_nt"]
    );
    assert_eq!(
        names(&swiglu(DType::Bf16, dm, dh)),
        ["dual_gemm_silu_mul_bf16_nt", "gemm_bf16_nt"]
    );
}

#[test]
fn canonical_plans_check_and_roundtrip_through_json() {
    for (g, _) in canonical(D, H) {
        let (_, _, plan) = optimise(&g, PrintAfter::Nothing);
        plan.check().unwrap();
        let json = serde_json::to_string_pretty(&plan).unwrap();
        let back: Plan = serde_json::from_str(&json).unwrap();
        assert_eq!(back, plan, "{}", g.name);
        // One input, guarded row-major and 16-byte aligned; no intermediates besides the gated
        // product / hidden activations between GEMMs.
        assert_eq!(plan.guards.len(), 1);
        assert_eq!(plan.guards[0].tensor, "x");
        assert_eq!(plan.guards[0].align_bytes, 16);
        assert_eq!(plan.outputs.len(), 1);
        assert_eq!(plan.buffer(plan.outputs[0].1).kind, BufferKind::Output);
        let intermediates = plan
            .buffers
            .iter()
            .filter(|b| b.kind == BufferKind::Intermediate)
            .count();
        assert_eq!(intermediates, plan.kernels.len() - 1, "{}", g.name);
    }
}

#[test]
fn canonical_models_compute_the_same_values() {
    for (g, _) in canonical(24, 40) {
        for dtype in [DType::F32, DType::Bf16] {
            let g = retype(&g, dtype);
            let (opt, _, _) = optimise(&g, PrintAfter::Nothing);
            let inputs = random_inputs(&g, &bind_t(5), 7);
            let want = interpret(&g, &inputs).unwrap();
            let got = interpret(&opt, &inputs).unwrap();
            let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
            let err = max_error(&got, &want);
            assert!(err <= tol, "{} {dtype}: error {err}", g.name);
        }
    }
}

/// The same canonical model in another dtype.
fn retype(g: &Graph, dtype: DType) -> Graph {
    let (dm, dh) = (24, 40);
    match g.name.as_str() {
        "linear" => one_linear(dtype, dm, dh),
        "linear-gelu-linear" => linear_gelu_linear(dtype, dm, dh),
        "three-linears" => three_linears(dtype, dm, dh),
        "geglu" => geglu(dtype, dm, dh),
        "swiglu" => swiglu(dtype, dm, dh),
        other => panic!("unknown model {other}"),
    }
}

#[test]
fn snapshots_of_ir_after_each_pass_and_explain() {
    for (g, _) in canonical(D, H) {
        let (opt, report, plan) = optimise(&g, PrintAfter::All);
        let mut text = format!("--- source\n{g}");
        for p in &report.passes {
            let ir = p.ir_text.as_deref().unwrap();
            text.push_str(&format!(
                "--- after {} (changed: {})\n{ir}",
                p.name, p.changed
            ));
        }
        insta::assert_snapshot!(format!("ir_{}", g.name), text);
        insta::assert_snapshot!(
            format!("explain_{}", g.name),
            explain(&g, &opt, &plan, &report.provenance)
        );
    }
}

#[test]
fn plan_json_of_geglu() {
    let (_, _, plan) = optimise(&geglu(DType::Bf16, D, H), PrintAfter::Nothing);
    insta::assert_snapshot!(serde_json::to_string_pretty(&plan).unwrap());
}

#[test]
fn print_after_one_pass_only() {
    let g = geglu(DType::Bf16, 8, 16);
    let (_, report, _) = optimise(&g, PrintAfter::Passes(vec!["cse".into()]));
    let printed: Vec<&str> = report
        .passes
        .iter()
        .filter(|p| p.ir_text.is_some())
        .map(|p| p.name)
        .collect();
    assert_eq!(printed, ["cse"]);
    let timings = report.timings();
    assert_eq!(timings.lines().count(), 4);
    assert!(
        timings.starts_with("dce             unchanged"),
        "{timings}"
    );
    assert!(timings.contains("fuse-epilogue   changed"), "{timings}");
    assert_eq!(PrintAfter::parse("all").unwrap(), PrintAfter::All);
    assert_eq!(
        PrintAfter::parse("cse, dce").unwrap(),
        PrintAfter::Passes(vec!["cse".into(), "dce".into()])
    );
    assert_eq!(
        report.passes.iter().map(|p| p.name).collect::<Vec<_>>(),
        ["dce", "fold-transpose", "cse", "fuse-epilogue"]
    );
}

#[test]
fn pipeline_errors_name_what_is_wrong() {
    let err = Pipeline::from_names(&["fold-transpose", "fuse"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--passes names `fuse`, which is not a pass; \
         the passes are: dce, fold-transpose, cse, fuse-epilogue"
    );
    let err = Pipeline::from_names(&["dce", "", "cse"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--passes names an empty pass name (a comma too many, or no name at all), which is not a \
         pass; the passes are: dce, fold-transpose, cse, fuse-epilogue"
    );
    // --print-after: an empty name is refused when parsed, an unknown one when the pipeline runs.
    for s in ["", " ", "dce,", ",", "cse,,dce"] {
        let err = PrintAfter::parse(s).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--print-after names an empty pass name (a comma too many"),
            "{s:?}: {err}"
        );
    }
    let mut g = one_linear(DType::F32, 4, 4);
    let opts = PipelineOptions {
        verify_each: true,
        print_after: PrintAfter::parse("fuse").unwrap(),
    };
    let err = Pipeline::default().run(&mut g, &opts).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--print-after names `fuse`, which is not a pass; the passes are: dce, fold-transpose, \
         cse, fuse-epilogue, prune-block-sparse, lower-block-sparse (with a sparsity section), \
         or all"
    );
    let p = Pipeline::from_names(&["dce"]).unwrap();
    let mut g = one_linear(DType::F32, 4, 4);
    let opts = PipelineOptions {
        verify_each: true,
        print_after: PrintAfter::Passes(vec!["cse".into()]),
    };
    let err = p.run(&mut g, &opts).unwrap_err();
    assert!(matches!(err, PassError::PrintAfterNotInPipeline { .. }));
    assert_eq!(
        err.to_string(),
        "--print-after names `cse`, which is not in the pipeline (dce)"
    );
}
