//! Block-sparse GEMMs on the CPU: models compiled with `sparsity` (pruned, packed, lowered to
//! sparse GEMMs) run natively and match the reference interpreter, which computes them as the
//! dense GEMMs of the pruned weights. Random masks (empty block rows, a single block, full
//! density), every dtype, dual GEMMs, and panel widths that straddle block rows.

#![cfg(feature = "llvm")]

mod common;

use common::{check_exe, random};
use mlpc_cpu::{CpuBackend, Tiling};
use mlpc_ir::{Activation, DType, Dim, Graph, HostTensor, Op, Shape, TensorType};
use mlpc_passes::{lower_plan, PassError, Pipeline, PipelineOptions, SparseWeight};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn tokens(d: usize, dt: DType) -> TensorType {
    let s: Shape = [Dim::sym("T"), Dim::Fixed(d as u64)].into_iter().collect();
    TensorType::contiguous(dt, s)
}

/// Compiles `g` with `specs` and runs it on the CPU (with `lanes`-wide vectors) at `t` tokens
/// against the interpreter of the optimised graph; returns the sparse kernel count.
fn check(g: Graph, specs: Vec<SparseWeight>, t: usize, lanes: u32) -> Result<usize, PassError> {
    let mut g = g;
    let report = Pipeline::default()
        .with_sparsity(specs)
        .run(&mut g, &PipelineOptions::default())?;
    let plan = lower_plan(&g, &report.provenance).unwrap();
    let backend = CpuBackend::new().unwrap();
    let lanes = lanes.min(backend.tiling().lanes);
    let exe = backend
        .with_tiling(Tiling::for_lanes(lanes))
        .compile(&plan, g.weights())
        .unwrap_or_else(|e| panic!("{e}\n{g}"));
    let dt = g.node(g.inputs()[0]).ty.dtype;
    let k = g.node(g.inputs()[0]).ty.shape[1].fixed().unwrap() as usize;
    let inputs = BTreeMap::from([("x".to_string(), random(dt, &[t, k], 11))]);
    check_exe(&exe, &g, &inputs);
    Ok(plan
        .kernels
        .iter()
        .filter(|k| matches!(k.op, Op::SparseGemm(_)))
        .count())
}

/// `act(x W^T + b)` with W `[n, k]` zero outside the blocks of `mask`.
fn masked_linear(
    dt: DType,
    block: [usize; 2],
    grid: (usize, usize),
    mask: &[bool],
    act: Activation,
    seed: u64,
) -> Graph {
    let (n, k) = (grid.0 * block[0], grid.1 * block[1]);
    let w = random(DType::F32, &[n, k], seed).to_f64();
    let w: Vec<f64> = w
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let b = (i / k / block[0]) * grid.1 + (i % k) / block[1];
            if mask[b] {
                v
            } else {
                0.0
            }
        })
        .collect();
    let mut g = Graph::new("masked");
    let x = g.add_input("x", tokens(k, dt));
    let w = g
        .add_weight("w", HostTensor::from_f64(dt, vec![n, k], &w).unwrap())
        .unwrap();
    let b = g.add_weight("b", random(dt, &[n], seed + 1)).unwrap();
    let wt = g.add("wt", Op::Transpose, &[w]).unwrap();
    let h = g.add("h", Op::MatMul, &[x, wt]).unwrap();
    let hb = g.add("hb", Op::Add, &[h, b]).unwrap();
    let y = g.add("y", Op::Act(act), &[hb]).unwrap();
    g.add_output("y", y);
    g
}

#[test]
fn a_pruned_mlp_runs_sparse_in_every_dtype() {
    for dt in DType::ALL {
        let mut g = Graph::new("mlp");
        let x = g.add_input("x", tokens(64, dt));
        let mut h = x;
        for (i, (inp, out)) in [(64usize, 96usize), (96, 64)].into_iter().enumerate() {
            let w = g
                .add_weight(format!("fc{i}.weight"), random(dt, &[out, inp], i as u64))
                .unwrap();
            let b = g
                .add_weight(format!("fc{i}.bias"), random(dt, &[out], 10 + i as u64))
                .unwrap();
            let wt = g.add(format!("fc{i}.t"), Op::Transpose, &[w]).unwrap();
            let m = g.add(format!("fc{i}"), Op::MatMul, &[h, wt]).unwrap();
            let a = g.add(format!("fc{i}.add"), Op::Add, &[m, b]).unwrap();
            h = g
                .add(format!("act{i}"), Op::Act(Activation::Gelu), &[a])
                .unwrap();
        }
        g.add_output("y", h);
        let specs = vec![
            SparseWeight::new("fc0.weight", [32, 32], Some(0.25)),
            SparseWeight::new("fc1.weight", [16, 32], Some(0.5)),
        ];
        for t in [1, 7, 33, 100] {
            assert_eq!(check(g.clone(), specs.clone(), t, 16).unwrap(), 2, "{dt}");
        }
    }
}

#[test]
fn a_sparse_dual_gemm_runs_with_its_union_pattern() {
    let mut g = Graph::new("swiglu");
    let dt = DType::F32;
    let x = g.add_input("x", tokens(48, dt));
    let wg = g.add_weight("gate", random(dt, &[64, 48], 1)).unwrap();
    let wu = g.add_weight("up", random(dt, &[64, 48], 2)).unwrap();
    let gt = g.add("gt", Op::Transpose, &[wg]).unwrap();
    let ut = g.add("ut", Op::Transpose, &[wu]).unwrap();
    let hg = g.add("hg", Op::MatMul, &[x, gt]).unwrap();
    let hu = g.add("hu", Op::MatMul, &[x, ut]).unwrap();
    let a = g.add("silu", Op::Act(Activation::Silu), &[hg]).unwrap();
    let y = g.add("y", Op::Mul, &[a, hu]).unwrap();
    g.add_output("y", y);
    let specs = vec![
        SparseWeight::new("gate", [16, 16], Some(0.3)),
        SparseWeight::new("up", [16, 16], Some(0.3)),
    ];
    for lanes in [16, 8, 4] {
        assert_eq!(check(g.clone(), specs.clone(), 5, lanes).unwrap(), 1);
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn bf16_sparse_gemms_take_the_hosts_dot_product() {
    // Where the host has AVX-512 BF16: blocks of an even width run on the bf16 dot product
    // (segments of paired panel rows), plain and dual; an odd width keeps the widening kernel.
    let backend = CpuBackend::new().unwrap();
    if !backend.tiling().bf16_dot {
        assert!(!std::arch::is_x86_feature_detected!("avx512bf16") || backend.tiling().lanes < 16);
        return;
    }
    let backend = backend.keep_assembly(true);
    let dt = DType::Bf16;
    let mut dual = Graph::new("swiglu");
    let x = dual.add_input("x", tokens(96, dt));
    let wg = dual.add_weight("gate", random(dt, &[64, 96], 1)).unwrap();
    let wu = dual.add_weight("up", random(dt, &[64, 96], 2)).unwrap();
    let gt = dual.add("gt", Op::Transpose, &[wg]).unwrap();
    let ut = dual.add("ut", Op::Transpose, &[wu]).unwrap();
    let hg = dual.add("hg", Op::MatMul, &[x, gt]).unwrap();
    let hu = dual.add("hu", Op::MatMul, &[x, ut]).unwrap();
    let a = dual.add("silu", Op::Act(Activation::Silu), &[hg]).unwrap();
    let y = dual.add("y", Op::Mul, &[a, hu]).unwrap();
    dual.add_output("y", y);
    let mask = [
        true, false, false, true, true, false, false, false, true, true, false, true,
    ];
    let cases = [
        (
            dual.clone(),
            vec![
                SparseWeight::new("gate", [32, 32], Some(0.3)),
                SparseWeight::new("up", [32, 32], Some(0.3)),
            ],
            true,
        ),
        (
            dual,
            vec![
                SparseWeight::new("gate", [16, 2], Some(0.5)),
                SparseWeight::new("up", [16, 2], Some(0.5)),
            ],
            true,
        ),
        (
            masked_linear(dt, [16, 32], (4, 3), &mask, Activation::Gelu, 3),
            vec![SparseWeight::new("w", [16, 32], None)],
            true,
        ),
        (
            masked_linear(dt, [8, 3], (8, 5), &[true; 40], Activation::Relu, 4),
            vec![SparseWeight::new("w", [8, 3], Some(0.4))],
            false,
        ),
    ];
    for (g, specs, pairs) in cases {
        let mut g = g;
        let report = Pipeline::default()
            .with_sparsity(specs)
            .run(&mut g, &PipelineOptions::default())
            .unwrap();
        let plan = lower_plan(&g, &report.provenance).unwrap();
        assert!(plan
            .kernels
            .iter()
            .any(|k| matches!(k.op, Op::SparseGemm(_))));
        let exe = backend.clone().compile(&plan, g.weights()).unwrap();
        assert_eq!(
            exe.assembly().unwrap().contains("vdpbf16ps"),
            pairs,
            "{}",
            g.name
        );
        let k = g.node(g.inputs()[0]).ty.shape[1].fixed().unwrap() as usize;
        for t in [1, 7, 33] {
            let inputs = BTreeMap::from([("x".to_string(), random(dt, &[t, k], 12 + t as u64))]);
            check_exe(&exe, &g, &inputs);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn random_masks_match_the_interpreter(
        rows in 1usize..5,
        cols in 1usize..4,
        br in prop::sample::select(vec![1usize, 4, 8, 16, 24]),
        bc in prop::sample::select(vec![1usize, 3, 8, 16]),
        seed in any::<u64>(),
        style in 0u8..4,
        t in 1usize..20,
        lanes in prop::sample::select(vec![4u32, 8, 16]),
        dt in prop::sample::select(DType::ALL.to_vec()),
        act in prop::sample::select(Activation::ALL.to_vec()),
    ) {
        let blocks = rows * cols;
        let mask: Vec<bool> = match style {
            0 => (0..blocks).map(|b| b == (seed as usize) % blocks).collect(),
            1 => vec![true; blocks],
            _ => (0..blocks)
                .map(|b| (seed >> (b % 64)) & 1 == 1 && !(rows > 1 && b < cols))
                .collect(),
        };
        prop_assume!(mask.iter().any(|&m| m));
        let g = masked_linear(dt, [br, bc], (rows, cols), &mask, act, seed);
        let specs = vec![SparseWeight::new("w", [br as u64, bc as u64], None)];
        prop_assert_eq!(check(g, specs, t, lanes).unwrap(), 1);
    }
}
