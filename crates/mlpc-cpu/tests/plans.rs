//! Hand-built fused plans against the reference interpreter: every epilogue, every activation,
//! dual GEMMs, both operand layouts, every dtype, and sizes that are not multiples of any tile.

#![cfg(feature = "llvm")]

mod common;

use common::{check, compile, dims, fixed, plan_of, random};
use mlpc_cpu::{CpuBackend, CpuError};
use mlpc_ir::{
    Activation, DType, Dim, Dual, Epilogue, Gemm, Graph, HostTensor, MatLayout, Op, TensorType,
};
use smallvec::smallvec;
use std::collections::BTreeMap;

fn inputs(pairs: Vec<(&str, HostTensor)>) -> BTreeMap<String, HostTensor> {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// `y = epi(x W^T)` with `x: [T, k]`, symbolic `T`, weights `w: [n, k]`, `b: [n]` when asked,
/// a residual `r: [T, n]` input when asked.
fn linear(
    dt: DType,
    k: usize,
    n: usize,
    bias: bool,
    act: Option<Activation>,
    residual: bool,
) -> Graph {
    let mut g = Graph::new(format!("linear_{dt}_{k}x{n}"));
    let x = g.add_input(
        "x",
        TensorType::contiguous(dt, dims(&[Dim::sym("T"), Dim::Fixed(k as u64)])),
    );
    let w = g.add_weight("w", random(dt, &[n, k], 1)).unwrap();
    let mut operands = vec![x, w];
    let mut epilogue = smallvec![];
    if bias {
        operands.push(g.add_weight("b", random(dt, &[n], 2)).unwrap());
        epilogue.push(Epilogue::Bias {
            operand: operands.len() - 1,
        });
    }
    if let Some(a) = act {
        epilogue.push(Epilogue::Act(a));
    }
    if residual {
        operands.push(g.add_input(
            "r",
            TensorType::contiguous(dt, dims(&[Dim::sym("T"), Dim::Fixed(n as u64)])),
        ));
        epilogue.push(Epilogue::Add {
            operand: operands.len() - 1,
        });
    }
    let gemm = Gemm {
        a: MatLayout::N,
        b: MatLayout::T,
        dual: None,
        epilogue,
    };
    let y = g.add("y", Op::Gemm(gemm), &operands).unwrap();
    g.add_output("y", y);
    g
}

fn run_linear(
    dt: DType,
    m: usize,
    k: usize,
    n: usize,
    bias: bool,
    act: Option<Activation>,
    residual: bool,
) -> f64 {
    let g = linear(dt, k, n, bias, act, residual);
    let mut ins = vec![("x", random(dt, &[m, k], 10 + m as u64))];
    if residual {
        ins.push(("r", random(dt, &[m, n], 20)));
    }
    check(&g, &inputs(ins))
}

#[test]
fn linear_bias_f32_odd_sizes() {
    for (m, k, n) in [
        (1, 1, 1),
        (7, 13, 3),
        (13, 300, 31),
        (25, 64, 257),
        (1, 300, 64),
        (12, 32, 32),
        (100, 17, 65),
    ] {
        run_linear(DType::F32, m, k, n, true, None, false);
    }
}

#[test]
fn linear_without_bias() {
    run_linear(DType::F32, 9, 40, 33, false, None, false);
}

#[test]
fn every_activation_in_the_epilogue() {
    for a in Activation::ALL {
        for dt in DType::ALL {
            run_linear(dt, 7, 48, 37, true, Some(a), false);
        }
    }
}

#[test]
fn activations_over_a_wide_input_range() {
    // Large |x| exercises exp saturation and the tanh/erf branches.
    for a in Activation::ALL {
        let mut g = Graph::new(format!("wide_{a}"));
        let x = g.add_input("x", TensorType::contiguous(DType::F32, fixed(&[4, 101])));
        let y = g.add("y", Op::Act(a), &[x]).unwrap();
        g.add_output("y", y);
        let v: Vec<f64> = (0..404).map(|i| (i as f64 - 202.0) * 0.25).collect();
        let xs = HostTensor::from_f64(DType::F32, vec![4, 101], &v).unwrap();
        check(&g, &inputs(vec![("x", xs)]));
    }
}

#[test]
fn activations_at_the_ends_of_the_f32_line() {
    // Infinities and NaN exactly as the reference's definitions give them (NaN where they give
    // inf * 0), finite values near the f32 limits and where e^-x leaves the normal range within
    // 2e-6 relative (1e-37 absolute for subnormal results). `exp` once saturated at e^88.38, so
    // silu(-3e38) was -1.25 and silu(-inf) -inf.
    let mut xs = vec![f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 0.0, -0.0];
    for m in [
        f32::MAX as f64,
        3e38,
        1e38,
        1e30,
        1e10,
        1e4,
        200.0,
        104.5,
        103.0,
        100.0,
        89.0,
        88.7,
        88.5,
        88.3,
        87.0,
        1e-40,
    ] {
        xs.extend([m, -m]);
    }
    let xt = HostTensor::from_f64(DType::F32, vec![xs.len()], &xs).unwrap();
    let xs = xt.to_f64();
    for a in Activation::ALL {
        let mut g = Graph::new(format!("ends_{a}"));
        let x = g.add_input("x", TensorType::contiguous(DType::F32, fixed(&[xs.len()])));
        let y = g.add("y", Op::Act(a), &[x]).unwrap();
        g.add_output("y", y);
        let got = compile(&g).run(&inputs(vec![("x", xt.clone())])).unwrap()["y"].to_f64();
        for (&x, &y) in xs.iter().zip(&got) {
            let want = a.eval(x) as f32 as f64;
            let ok = if want.is_nan() || want.is_infinite() {
                y.is_nan() == want.is_nan() && (want.is_nan() || y == want)
            } else {
                y.is_finite() && (y - want).abs() <= 2e-6 * want.abs() + 1e-37
            };
            assert!(ok, "{a}({x:e}) = {y:e}, expected {want:e}");
        }
    }
}

#[test]
fn gelu_tanh_mlp_layer_all_dtypes() {
    for dt in DType::ALL {
        run_linear(dt, 33, 96, 130, true, Some(Activation::GeluTanh), false);
    }
}

#[test]
fn residual_add_after_activation() {
    for dt in DType::ALL {
        run_linear(dt, 14, 29, 45, true, Some(Activation::Relu), true);
    }
}

fn dual(dt: DType, k: usize, n: usize, act: Activation, biases: bool) -> Graph {
    let mut g = Graph::new(format!("glu_{dt}_{act}"));
    let x = g.add_input(
        "x",
        TensorType::contiguous(dt, dims(&[Dim::sym("T"), Dim::Fixed(k as u64)])),
    );
    let wg = g.add_weight("wg", random(dt, &[n, k], 3)).unwrap();
    let wu = g.add_weight("wu", random(dt, &[n, k], 4)).unwrap();
    let mut operands = vec![x, wg, wu];
    let (mut gate, mut up) = (smallvec![], smallvec![]);
    if biases {
        operands.push(g.add_weight("bg", random(dt, &[n], 5)).unwrap());
        gate.push(Epilogue::Bias { operand: 3 });
        operands.push(g.add_weight("bu", random(dt, &[n], 6)).unwrap());
        up.push(Epilogue::Bias { operand: 4 });
    }
    gate.push(Epilogue::Act(act));
    let gemm = Gemm {
        a: MatLayout::N,
        b: MatLayout::T,
        dual: Some(Dual { gate, up }),
        epilogue: smallvec![],
    };
    let h = g.add("h", Op::Gemm(gemm), &operands).unwrap();
    g.add_output("h", h);
    g
}

#[test]
fn dual_gemm_gating() {
    for dt in DType::ALL {
        for (m, k, n, act, biases) in [
            (1, 13, 31, Activation::Silu, false),
            (7, 64, 100, Activation::GeluTanh, true),
            (19, 300, 33, Activation::Silu, true),
        ] {
            let g = dual(dt, k, n, act, biases);
            check(&g, &inputs(vec![("x", random(dt, &[m, k], 7))]));
        }
    }
}

#[test]
fn seed_geglu_mlp_two_kernels() {
    // down(gelu_tanh(x Wg^T) * (x Wu^T)) + x, as the fusion passes produce it.
    let (k, n) = (48, 136);
    let dt = DType::Bf16;
    let mut g = dual(dt, k, n, Activation::GeluTanh, false);
    g.name = "geglu".into();
    let h = g.find("h").unwrap();
    let x = g.find("x").unwrap();
    let wd = g.add_weight("wd", random(dt, &[k, n], 8)).unwrap();
    let down = Gemm {
        a: MatLayout::N,
        b: MatLayout::T,
        dual: None,
        epilogue: smallvec![Epilogue::Add { operand: 2 }],
    };
    let y = g.add("y", Op::Gemm(down), &[h, wd, x]).unwrap();
    g.add_output("y", y);
    let exe = compile(&g);
    assert_eq!(exe.kernel_names().len(), 2);
    common::check_exe(&exe, &g, &inputs(vec![("x", random(dt, &[21, k], 9))]));
}

#[test]
fn operand_layouts_and_runtime_b() {
    // A and B both model inputs (B packed at run time), every layout combination.
    for al in [MatLayout::N, MatLayout::T] {
        for bl in [MatLayout::N, MatLayout::T] {
            let (m, k, n) = (15, 23, 41);
            let mut g = Graph::new(format!("layouts_{}{}", al.letter(), bl.letter()));
            let a_shape = if al == MatLayout::N { [m, k] } else { [k, m] };
            let b_shape = if bl == MatLayout::N { [k, n] } else { [n, k] };
            let a = g.add_input("a", TensorType::contiguous(DType::F32, fixed(&a_shape)));
            let b = g.add_input("b", TensorType::contiguous(DType::F32, fixed(&b_shape)));
            let gemm = Gemm {
                a: al,
                b: bl,
                dual: None,
                epilogue: smallvec![Epilogue::Act(Activation::Tanh)],
            };
            let y = g.add("y", Op::Gemm(gemm), &[a, b]).unwrap();
            g.add_output("y", y);
            check(
                &g,
                &inputs(vec![
                    ("a", random(DType::F32, &a_shape, 11)),
                    ("b", random(DType::F32, &b_shape, 12)),
                ]),
            );
        }
    }
}

#[test]
fn unfused_graph_one_kernel_per_node() {
    // matmul, add with a row vector on either side, transpose materialised, mul, activation.
    for dt in DType::ALL {
        let mut g = Graph::new(format!("unfused_{dt}"));
        let x = g.add_input(
            "x",
            TensorType::contiguous(dt, dims(&[Dim::sym("T"), Dim::Fixed(20)])),
        );
        let w = g.add_weight("w", random(dt, &[35, 20], 13)).unwrap();
        let b = g.add_weight("b", random(dt, &[35], 14)).unwrap();
        let wt = g.add("wt", Op::Transpose, &[w]).unwrap();
        let h = g.add("h", Op::MatMul, &[x, wt]).unwrap();
        let hb = g.add("hb", Op::Add, &[b, h]).unwrap();
        let a = g.add("a", Op::Act(Activation::Gelu), &[hb]).unwrap();
        let m = g.add("m", Op::Mul, &[a, hb]).unwrap();
        let r = g.add("r", Op::Add, &[m, b]).unwrap();
        let t = g.add("t", Op::Transpose, &[r]).unwrap();
        g.add_output("y", r);
        g.add_output("yt", t);
        check(&g, &inputs(vec![("x", random(dt, &[9, 20], 15))]));
    }
}

#[test]
fn batched_activation_flattens_into_rows() {
    let mut g = Graph::new("batched");
    let x = g.add_input(
        "x",
        TensorType::contiguous(
            DType::F32,
            dims(&[Dim::sym("B"), Dim::sym("T"), Dim::Fixed(24)]),
        ),
    );
    let w = g
        .add_weight("w", random(DType::F32, &[50, 24], 16))
        .unwrap();
    let gemm = Gemm {
        a: MatLayout::N,
        b: MatLayout::T,
        dual: None,
        epilogue: smallvec![Epilogue::Act(Activation::Silu)],
    };
    let y = g.add("y", Op::Gemm(gemm), &[x, w]).unwrap();
    g.add_output("y", y);
    check(
        &g,
        &inputs(vec![("x", random(DType::F32, &[3, 5, 24], 17))]),
    );
}

#[test]
fn large_gemm_spans_many_tiles_and_threads() {
    run_linear(
        DType::F32,
        200,
        300,
        515,
        true,
        Some(Activation::GeluTanh),
        true,
    );
}

#[test]
fn one_executable_runs_many_token_counts() {
    let g = linear(DType::F32, 40, 70, true, Some(Activation::Gelu), false);
    let exe = compile(&g);
    for m in [1, 2, 11, 12, 13, 64, 97] {
        common::check_exe(
            &exe,
            &g,
            &inputs(vec![("x", random(DType::F32, &[m, 40], m as u64))]),
        );
    }
}

#[test]
fn wrong_inputs_get_the_interpreters_messages() {
    let g = linear(DType::F32, 8, 4, true, None, false);
    let exe = compile(&g);
    let cases = [
        inputs(vec![]),
        inputs(vec![("x", random(DType::F32, &[2, 9], 1))]),
        inputs(vec![("x", random(DType::Bf16, &[2, 8], 1))]),
        inputs(vec![
            ("x", random(DType::F32, &[2, 8], 1)),
            ("z", random(DType::F32, &[1], 1)),
        ]),
    ];
    for ins in cases {
        let want = mlpc_ir::interpret(&g, &ins).unwrap_err().to_string();
        let got = exe.run(&ins).unwrap_err();
        assert!(matches!(got, CpuError::Input(_)));
        assert_eq!(got.to_string(), want);
    }
}

#[test]
fn weights_must_match_the_plan() {
    let g = linear(DType::F32, 8, 4, true, None, false);
    let plan = plan_of(&g);
    let backend = CpuBackend::new().unwrap();
    let mut w = g.weights().clone();
    w.remove("b");
    let err = backend.compile(&plan, &w).err().unwrap();
    assert_eq!(
        err.to_string(),
        "weight `b` is missing from the weights table"
    );
    let mut w = g.weights().clone();
    w.insert("b".into(), std::sync::Arc::new(random(DType::F32, &[5], 1)));
    let err = backend.compile(&plan, &w).err().unwrap();
    assert_eq!(
        err.to_string(),
        "weight `b` is f32[5], but the plan declares f32[4]"
    );
}

#[test]
fn gemm_uses_the_hosts_widest_vectors() {
    let g = linear(DType::F32, 64, 64, true, Some(Activation::GeluTanh), false);
    let backend = CpuBackend::new().unwrap().keep_assembly(true);
    let exe = backend.compile(&plan_of(&g), g.weights()).unwrap();
    let asm = exe.assembly().unwrap();
    let reg = match backend.tiling().lanes {
        16 => "zmm",
        8 => "ymm",
        _ => "xmm",
    };
    let fmas = asm
        .lines()
        .filter(|l| l.contains("vfmadd") && l.contains(reg))
        .count();
    assert!(
        fmas >= backend.tiling().mr * 2,
        "expected an unrolled {reg} FMA micro-kernel, found {fmas} FMAs"
    );
    assert!(!asm.contains("call"), "the kernels call out of line code");
}

#[test]
fn narrower_vectors_give_the_same_results() {
    // The AVX (8 lanes) and SSE (4 lanes) tilings, run on this host.
    for lanes in [8, 4] {
        let backend = CpuBackend::new()
            .unwrap()
            .with_tiling(mlpc_cpu::Tiling::for_lanes(lanes));
        let graphs = [
            (
                linear(DType::Bf16, 37, 29, true, Some(Activation::GeluTanh), true),
                13usize,
                37usize,
            ),
            (dual(DType::F16, 21, 19, Activation::Silu, true), 7, 21),
        ];
        for (g, m, k) in graphs {
            let exe = backend.compile(&plan_of(&g), g.weights()).unwrap();
            let mut ins = vec![(
                "x",
                random(g.node(g.find("x").unwrap()).ty.dtype, &[m, k], 30),
            )];
            if g.find("r").is_some() {
                ins.push(("r", random(DType::Bf16, &[m, 29], 31)));
            }
            common::check_exe(&exe, &g, &inputs(ins));
        }
    }
}

#[test]
fn sixteen_bit_panels_where_they_stream() {
    // K past the L2 share for one panel column's f32 panels (512 KiB; 4 bytes x nr columns x
    // slots per k) at every tiling: panels kept in 16 bits, widened as the micro-kernel loads
    // them (`vcvtph2ps` for f16 where the host has F16C), against the reference; and short
    // rows, widened when packed. Row counts give full blocks and tails.
    for lanes in [16, 8, 4] {
        let tiling = mlpc_cpu::Tiling::for_lanes(lanes);
        let backend = CpuBackend::new().unwrap();
        if backend.tiling().lanes < lanes {
            continue;
        }
        let backend = backend.with_tiling(tiling);
        let k_stream = 512 * 1024 / (4 * tiling.nr) + 40;
        for dt in [DType::Bf16, DType::F16] {
            let graphs = [
                (
                    linear(dt, k_stream, 29, true, Some(Activation::Relu), false),
                    1,
                ),
                (linear(dt, k_stream, 29, false, None, false), 17),
                (dual(dt, k_stream / 2 + 8, 19, Activation::Silu, true), 9),
                (dual(dt, 300, 19, Activation::Silu, false), 9),
            ];
            for (g, m) in graphs {
                let exe = backend.compile(&plan_of(&g), g.weights()).unwrap();
                let k = g.node(g.find("x").unwrap()).ty.shape[1].fixed().unwrap() as usize;
                common::check_exe(&exe, &g, &inputs(vec![("x", random(dt, &[m, k], 40))]));
            }
        }
    }
}

#[test]
fn sixteen_bit_weights_widen_per_task_where_they_fit_l2() {
    // Small K: one panel column's f32 panels fit the L2 share, so 16-bit weight panels stay in
    // 16 bits, and a launch whose tasks span many rows (two threads, 100 rows, ten panels) runs
    // each task's first rows with the kernel that stores the panels it widens, the others with
    // the kernel reading that f32 copy (but the bf16 dual GEMM, `Spec::widens_per_task`); one
    // of few rows reads the 16-bit panels as they are.
    // Both against the reference, and the long launch row for row bit-identical to single-row
    // launches (the kernels multiply the same values in the same order).
    for lanes in [16, 8] {
        let backend = CpuBackend::new().unwrap();
        if backend.tiling().lanes < lanes {
            continue;
        }
        let backend = backend
            .with_tiling(mlpc_cpu::Tiling::for_lanes(lanes))
            .with_threads(2);
        for dt in [DType::Bf16, DType::F16] {
            let graphs = [
                linear(dt, 200, 300, true, Some(Activation::Gelu), false),
                dual(dt, 136, 300, Activation::Silu, true),
            ];
            for g in graphs {
                let exe = backend.compile(&plan_of(&g), g.weights()).unwrap();
                let k = g.node(g.find("x").unwrap()).ty.shape[1].fixed().unwrap() as usize;
                let x = random(dt, &[100, k], 41);
                common::check_exe(&exe, &g, &inputs(vec![("x", x.clone())]));
                let all = exe.run(&inputs(vec![("x", x.clone())])).unwrap();
                let all = all.values().next().unwrap().bytes();
                let (row_in, row_out) = (k * dt.size_bytes(), all.len() / 100);
                for r in [0, 1, 50, 99] {
                    let one = HostTensor::from_bytes(
                        dt,
                        vec![1, k],
                        x.bytes()[r * row_in..(r + 1) * row_in].to_vec(),
                    )
                    .unwrap();
                    let got = exe.run(&inputs(vec![("x", one)])).unwrap();
                    assert_eq!(
                        got.values().next().unwrap().bytes(),
                        &all[r * row_out..(r + 1) * row_out],
                        "{} row {r}",
                        g.name
                    );
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn bf16_gemms_take_the_hosts_dot_product() {
    // The backend turns the bf16 dot product on exactly where the host has it (AVX-512 BF16).
    let backend = CpuBackend::new().unwrap();
    let has = std::arch::is_x86_feature_detected!("avx512bf16") && backend.tiling().lanes == 16;
    assert_eq!(backend.tiling().bf16_dot, has);
    assert!(!mlpc_cpu::Tiling::for_lanes(16).bf16_dot);
    if !has {
        return;
    }
    // There, bf16 x bf16 GEMMs of an even K multiply pairs (`vdpbf16ps`, A read as stored,
    // panels of paired rows): plain and dual, panels that fit L2 and panels that stream, a
    // weight and a run-time B, full micro-kernels and tails, one thread and two; against the
    // reference, as are the widening kernels of the same graphs (`Tiling::for_lanes`). An odd
    // K, or a 16-bit A beside an f32 B, keeps the widening kernel.
    let backend = backend.keep_assembly(true);
    let widening = CpuBackend::new()
        .unwrap()
        .with_tiling(mlpc_cpu::Tiling::for_lanes(16));
    let dot = |exe: &mlpc_cpu::CpuExecutable| exe.assembly().unwrap().contains("vdpbf16ps");
    let k_stream = 512 * 1024 / (4 * 32) + 40;
    let graphs = [
        (
            linear(DType::Bf16, 200, 29, true, Some(Activation::Gelu), true),
            vec![1, 13, 100],
            true,
        ),
        (
            linear(DType::Bf16, k_stream, 29, false, None, false),
            vec![1, 17],
            true,
        ),
        (
            dual(DType::Bf16, 136, 19, Activation::Silu, true),
            vec![1, 9, 40],
            true,
        ),
        (
            linear(DType::Bf16, 37, 29, true, None, false),
            vec![13],
            false,
        ),
        (
            linear(DType::F16, 200, 29, true, None, false),
            vec![13],
            false,
        ),
    ];
    for (g, rows, pairs) in graphs {
        let plan = plan_of(&g);
        let exe = backend.compile(&plan, g.weights()).unwrap();
        assert_eq!(dot(&exe), pairs, "{}", g.name);
        let wide = widening.compile(&plan, g.weights()).unwrap();
        let k = g.node(g.find("x").unwrap()).ty.shape[1].fixed().unwrap() as usize;
        let dt = g.node(g.find("x").unwrap()).ty.dtype;
        for m in rows {
            let mut ins = vec![("x", random(dt, &[m, k], 50 + m as u64))];
            if g.find("r").is_some() {
                ins.push(("r", random(dt, &[m, 29], 51)));
            }
            common::check_exe(&exe, &g, &inputs(ins.clone()));
            common::check_exe(&wide, &g, &inputs(ins));
        }
    }
    // A run-time B, packed to paired rows on each run.
    let (m, k, n) = (15, 24, 41);
    let mut g = Graph::new("runtime_b");
    let a = g.add_input("a", TensorType::contiguous(DType::Bf16, fixed(&[m, k])));
    let b = g.add_input("b", TensorType::contiguous(DType::Bf16, fixed(&[n, k])));
    let gemm = Gemm {
        a: MatLayout::N,
        b: MatLayout::T,
        dual: None,
        epilogue: smallvec![Epilogue::Act(Activation::Tanh)],
    };
    let y = g.add("y", Op::Gemm(gemm), &[a, b]).unwrap();
    g.add_output("y", y);
    let exe = backend.compile(&plan_of(&g), g.weights()).unwrap();
    assert!(dot(&exe));
    let ins = inputs(vec![
        ("a", random(DType::Bf16, &[m, k], 52)),
        ("b", random(DType::Bf16, &[n, k], 53)),
    ]);
    common::check_exe(&exe, &g, &ins);
    let exe = backend
        .with_threads(2)
        .compile(&plan_of(&g), g.weights())
        .unwrap();
    common::check_exe(&exe, &g, &ins);
}

#[test]
fn mismatched_dual_weights_are_refused() {
    let mut g = dual(DType::F32, 8, 6, Activation::Silu, false);
    let mut plan = plan_of(&g);
    // Declare the up weight with a different shape than the gate weight.
    let wu = plan.buffer_id("wu").unwrap();
    plan.buffers[wu].ty = TensorType::contiguous(DType::F32, fixed(&[5, 8]));
    g.set_weight("wu", random(DType::F32, &[5, 8], 1));
    let err = CpuBackend::new()
        .unwrap()
        .compile(&plan, g.weights())
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("gate B f32[6,8] and up B f32[5,8] differ in shape"),
        "{err}"
    );
}

#[test]
fn activations_are_accurate_per_element() {
    // Every f32 activation against its f64 definition on [-12, 12] in steps of 1/1024: the error
    // is at most `tol * max(|f(x)|, 1e-3)` (the floor covers the cancellation in 1 + erf and
    // 1 + tanh far out on the negative side, which the reference formula shares).
    let xs: Vec<f64> = (-12 * 1024..=12 * 1024)
        .map(|i| i as f64 / 1024.0)
        .collect();
    for a in Activation::ALL {
        let mut g = Graph::new(format!("accuracy_{a}"));
        let x = g.add_input("x", TensorType::contiguous(DType::F32, fixed(&[xs.len()])));
        let y = g.add("y", Op::Act(a), &[x]).unwrap();
        g.add_output("y", y);
        let exe = compile(&g);
        let xt = HostTensor::from_f64(DType::F32, vec![xs.len()], &xs).unwrap();
        let got = exe.run(&inputs(vec![("x", xt)])).unwrap()["y"].to_f64();
        let worst = xs
            .iter()
            .zip(&got)
            .map(|(&x, &y)| {
                let want = a.eval(x);
                (y - want).abs() / want.abs().max(1e-3)
            })
            // NaN wins (`f64::max` would drop it).
            .fold(0.0f64, |a, e| if e.is_nan() || e > a { e } else { a });
        assert!(worst < 2e-6, "{a}: worst relative error {worst:e}");
    }
}
