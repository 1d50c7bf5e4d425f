//! Snapshots of every generated `.cu` (with its entry, launch rule and arguments) for the sample
//! plans, and the errors for plans that cannot be generated.

use mlpc_codegen::{generate, samples, CodegenError, CodegenOptions, Grid, Param};
use mlpc_ir::{BufferKind, DType, Epilogue, Gemm, MatLayout, Op, Plan, TensorType};
use smallvec::smallvec;

/// Snapshots every kernel of `plan` as `<plan>__<kernel>`.
fn check_plan(plan: &Plan) {
    let kernels = generate(plan, &CodegenOptions::default())
        .unwrap_or_else(|e| panic!("plan `{}`: {e}", plan.name));
    assert_eq!(kernels.len(), plan.kernels.len());
    for k in &kernels {
        insta::assert_snapshot!(format!("{}__{}", plan.name, k.name), k.listing());
    }
}

#[test]
fn sample_plans() {
    for plan in samples::all() {
        check_plan(&plan);
    }
}

#[test]
fn sparse_sample_plans() {
    for plan in samples::sparse() {
        check_plan(&plan);
    }
}

#[test]
fn generation_is_deterministic() {
    for plan in samples::all() {
        let opts = CodegenOptions::default();
        assert_eq!(
            generate(&plan, &opts).unwrap(),
            generate(&plan, &opts).unwrap()
        );
    }
}

#[test]
fn abi_lists_buffers_in_operand_order_then_output_then_symbols() {
    let plan = samples::batched_residual_f16();
    let k = &generate(&plan, &CodegenOptions::default()).unwrap()[0];
    let expected: Vec<Param> = plan.kernels[0]
        .args
        .iter()
        .chain([&plan.kernels[0].out])
        .map(|&buffer| Param::Buffer { buffer })
        .chain(["B", "T"].map(|s| Param::Dim {
            symbol: s.to_string(),
        }))
        .collect();
    assert_eq!(k.params, expected);
    assert!(k.source.contains("long long sym_B,\n    long long sym_T)"));
    match &k.launch.grid {
        Grid::Tiles {
            m,
            n,
            tile_m,
            tile_n,
        } => {
            assert_eq!(m.to_string(), "B*T");
            assert_eq!(n.to_string(), "512");
            assert_eq!((*tile_m, *tile_n), (128, 128));
        }
        other => panic!("expected a tiled grid, got {other:?}"),
    }
    // The launch description survives serialisation.
    let json = serde_json::to_string(k).unwrap();
    let back: mlpc_codegen::CudaKernel = serde_json::from_str(&json).unwrap();
    assert_eq!(&back, k);
}

#[test]
fn f16_and_bf16_use_tensor_cores_and_f32_stays_exact() {
    let opts = CodegenOptions {
        allow_tf32: false,
        sparse_gemv: false,
        bsr_walk: false,
        ..Default::default()
    };
    for plan in samples::all() {
        for (k, pk) in generate(&plan, &opts).unwrap().iter().zip(&plan.kernels) {
            if !matches!(pk.op, Op::Gemm(_) | Op::MatMul) {
                continue;
            }
            match plan.dtype {
                // Exact f32: the FFMA kernel, or the FP64 tensor cores (exact products summed
                // in f64); never the f16 / bf16 tensor-core kernels nor TF32.
                DType::F32 => {
                    assert!(
                        k.source.contains("mlpc::GemmSimt<float")
                            || k.source.contains("mlpc::GemmDmma<float"),
                        "{}",
                        k.name
                    );
                    assert!(!k.source.contains("GemmMma<"), "{}", k.name);
                    assert!(!k.source.to_lowercase().contains("tf32"), "{}", k.name);
                }
                DType::F16 | DType::Bf16 => {
                    assert!(k.source.contains("mlpc::GemmMma<"), "{}", k.name)
                }
            }
        }
    }
}

#[test]
fn errors_name_the_kernel() {
    let opts = CodegenOptions::default();

    // An operand whose rows and columns are both strided.
    let mut plan = samples::linear_bias_bf16();
    let mut ty = TensorType::contiguous(DType::Bf16, samples::shape(&["T", "768"]));
    ty.strides = smallvec![
        mlpc_ir::Extent::constant(2 * 768),
        mlpc_ir::Extent::constant(2)
    ];
    plan.buffers[0].ty = ty;
    let err = generate(&plan, &opts).unwrap_err();
    assert!(matches!(err, CodegenError::Layout { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "kernel `gemm_bias_bf16_nt_0`: `x` (bf16[T,768] strides=[1536,2]) cannot be read by this \
         kernel: neither M nor K is contiguous"
    );

    // Mismatched inner dims.
    let mut plan = samples::linear_bias_bf16();
    plan.buffers[1].ty = TensorType::contiguous(DType::Bf16, samples::shape(&["3072", "512"]));
    let err = generate(&plan, &opts).unwrap_err();
    assert_eq!(
        err.to_string(),
        "kernel `gemm_bias_bf16_nt_0`: the row count of B `fc.weight` is 512, expected 768"
    );

    // Mixed dtypes.
    let mut plan = samples::linear_bias_bf16();
    plan.buffers[2].ty.dtype = DType::F32;
    let err = generate(&plan, &opts).unwrap_err();
    assert_eq!(
        err.to_string(),
        "kernel `gemm_bias_bf16_nt_0`: `fc.bias` is f32, but the kernel computes in bf16"
    );

    // An epilogue step pointing at a matrix operand.
    let mut plan = samples::linear_bias_bf16();
    plan.kernels[0].op = Op::Gemm(Gemm {
        a: MatLayout::N,
        b: MatLayout::T,
        dual: None,
        epilogue: smallvec![Epilogue::Bias { operand: 1 }],
    });
    let err = generate(&plan, &opts).unwrap_err();
    assert!(
        matches!(err, CodegenError::Epilogue { operand: 1, .. }),
        "{err:?}"
    );

    // A leaf op as a kernel.
    let mut plan = samples::linear_bias_bf16();
    plan.kernels[0].op = Op::Input;
    plan.kernels[0].args.clear();
    let err = generate(&plan, &opts).unwrap_err();
    assert_eq!(
        err.to_string(),
        "kernel `gemm_bias_bf16_nt_0`: op `input` has no CUDA template"
    );

    // Rank above 4 in an elementwise kernel.
    let mut plan = samples::elementwise(DType::F32);
    let big = TensorType::contiguous(DType::F32, samples::shape(&["1", "1", "1", "T", "64"]));
    plan.buffers[0].ty = big.clone();
    plan.buffers[4].ty = big;
    plan.buffers[4].kind = BufferKind::Intermediate;
    let err = generate(&plan, &opts).unwrap_err();
    assert!(matches!(err, CodegenError::Rank { rank: 5, .. }), "{err:?}");
}
