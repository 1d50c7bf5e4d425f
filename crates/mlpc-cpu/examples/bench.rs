//! Times the GPT-2 MLP (768-3072-768, gelu_tanh, f32) on the CPU backend, the whole block through
//! the default pass pipeline and each of its GEMMs alone, then a 4096 -> 4096 Linear (f32, no
//! bias) dense and with its weight pruned to 32 x 32 blocks at densities 0.5, 0.25 and 0.1, and
//! prints one JSON object per line: `{"name", "ms" (median), "gflops", "runs"}` (for the sparse
//! rows, `gflops` counts the kept blocks' work only). `scripts/bench_cpu.py` runs it beside numpy
//! and scipy.
//!
//! `cargo run --release -p mlpc-cpu --example bench -- [--tokens 512] [--runs 30] [--threads N]`

use mlpc_cpu::CpuBackend;
use mlpc_ir::{Activation, DType, Dim, Gemm, Graph, HostTensor, MatLayout, Op, Shape, TensorType};
use mlpc_passes::{lower_plan, Pipeline, PipelineOptions, SparseWeight};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::time::Instant;

const D: usize = 768;
const H: usize = 3072;
/// The block-sparse rows' Linear: 4096 -> 4096 in 32 x 32 blocks.
const S: usize = 4096;
const SPARSE_BLOCK: u64 = 32;
const DENSITIES: [f64; 3] = [0.5, 0.25, 0.1];

fn random(shape: &[usize], scale: f64, seed: u64) -> HostTensor {
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.gen_range(-scale..scale)).collect();
    HostTensor::from_f64(DType::F32, shape.to_vec(), &v).expect("shape and data agree")
}

fn tokens_by(d: usize) -> TensorType {
    let s: Shape = [Dim::sym("T"), Dim::Fixed(d as u64)].into_iter().collect();
    TensorType::contiguous(DType::F32, s)
}

/// `y = fc2(gelu_tanh(fc1(x)))` as nn.Linear lowers it: transpose + matmul + add.
fn gpt2_mlp() -> Graph {
    let mut g = Graph::new("gpt2-mlp");
    let x = g.add_input("x", tokens_by(D));
    let mut h = x;
    for (i, (inf, outf)) in [(D, H), (H, D)].into_iter().enumerate() {
        let w = g
            .add_weight(
                format!("fc{i}.weight"),
                random(&[outf, inf], 1.0 / (inf as f64).sqrt(), 2 * i as u64),
            )
            .expect("weight");
        let b = g
            .add_weight(
                format!("fc{i}.bias"),
                random(&[outf], 0.1, 2 * i as u64 + 1),
            )
            .expect("bias");
        let wt = g
            .add(format!("fc{i}.t"), Op::Transpose, &[w])
            .expect("transpose");
        let mm = g
            .add(format!("fc{i}"), Op::MatMul, &[h, wt])
            .expect("matmul");
        h = g.add(format!("fc{i}.add"), Op::Add, &[mm, b]).expect("add");
        if i == 0 {
            h = g
                .add("gelu", Op::Act(Activation::GeluTanh), &[h])
                .expect("gelu");
        }
    }
    g.add_output("y", h);
    g
}

/// `y = x @ W^T` as nn.Linear without bias lowers it (transpose + matmul); the weight is `fc.weight`.
fn linear(k: usize, n: usize) -> Graph {
    let mut g = Graph::new(format!("linear-{k}x{n}"));
    let x = g.add_input("x", tokens_by(k));
    let w = g
        .add_weight("fc.weight", random(&[n, k], 1.0 / (k as f64).sqrt(), 5))
        .expect("weight");
    let wt = g.add("fc.t", Op::Transpose, &[w]).expect("transpose");
    let y = g.add("fc", Op::MatMul, &[x, wt]).expect("matmul");
    g.add_output("y", y);
    g
}

/// `y = x @ W^T` with `W: [n, k]`, nothing fused.
fn gemm(k: usize, n: usize) -> Graph {
    let mut g = Graph::new(format!("gemm-{k}x{n}"));
    let x = g.add_input("x", tokens_by(k));
    let w = g
        .add_weight("w", random(&[n, k], 1.0 / (k as f64).sqrt(), 7))
        .expect("weight");
    let gemm = Gemm {
        a: MatLayout::N,
        b: MatLayout::T,
        dual: None,
        epilogue: Default::default(),
    };
    let y = g.add("y", Op::Gemm(gemm), &[x, w]).expect("gemm");
    g.add_output("y", y);
    g
}

#[allow(clippy::too_many_arguments)]
fn time(
    threads: Option<usize>,
    name: &str,
    mut g: Graph,
    sparsity: Vec<SparseWeight>,
    k: usize,
    flops: f64,
    tokens: usize,
    runs: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let report = Pipeline::default()
        .with_sparsity(sparsity)
        .run(&mut g, &PipelineOptions::default())?;
    let plan = lower_plan(&g, &report.provenance)?;
    let mut backend = CpuBackend::new()?;
    if let Some(n) = threads {
        backend = backend.with_threads(n);
    }
    let exe = backend.compile(&plan, g.weights())?;
    let inputs = BTreeMap::from([("x".to_string(), random(&[tokens, k], 1.0, 99))]);
    for _ in 0..3 {
        exe.run(&inputs)?;
    }
    let mut ms: Vec<(f64, Vec<(String, std::time::Duration)>)> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let out = exe.run_timed(&inputs);
            let e = t.elapsed().as_secs_f64() * 1e3;
            out.map(|(_, k)| (e, k))
        })
        .collect::<Result<_, _>>()?;
    ms.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (med, kernels) = &ms[ms.len() / 2];
    let per_kernel: Vec<String> = kernels
        .iter()
        .map(|(k, d)| format!("\"{k}\": {:.4}", d.as_secs_f64() * 1e3))
        .collect();
    println!(
        "{{\"name\": \"{name}\", \"kernels\": {}, \"ms\": {med:.4}, \"gflops\": {:.2}, \"runs\": {runs}, \"kernel_ms\": {{{}}}}}",
        plan.kernels.len(),
        flops / med / 1e6,
        per_kernel.join(", ")
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut tokens = 512;
    let mut runs = 30;
    let mut threads = None;
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let v = pair
            .get(1)
            .ok_or("a value must follow each flag")?
            .parse::<usize>()?;
        match pair[0].as_str() {
            "--tokens" => tokens = v,
            "--runs" => runs = v.max(1),
            "--threads" => threads = Some(v.max(1)),
            f => {
                return Err(
                    format!("unknown flag `{f}` (known: --tokens, --runs, --threads)").into(),
                )
            }
        }
    }
    let t = tokens as f64;
    let gemm_flops = |k: usize, n: usize| 2.0 * t * k as f64 * n as f64;
    time(
        threads,
        "mlp",
        gpt2_mlp(),
        vec![],
        D,
        gemm_flops(D, H) + gemm_flops(H, D),
        tokens,
        runs,
    )?;
    time(
        threads,
        "gemm_768x3072",
        gemm(D, H),
        vec![],
        D,
        gemm_flops(D, H),
        tokens,
        runs,
    )?;
    time(
        threads,
        "gemm_3072x768",
        gemm(H, D),
        vec![],
        H,
        gemm_flops(H, D),
        tokens,
        runs,
    )?;
    time(
        threads,
        "linear_4096_dense",
        linear(S, S),
        vec![],
        S,
        gemm_flops(S, S),
        tokens,
        runs,
    )?;
    for d in DENSITIES {
        let block = [SPARSE_BLOCK; 2];
        time(
            threads,
            &format!("linear_4096_d{d}"),
            linear(S, S),
            vec![SparseWeight::new("fc.weight", block, Some(d))],
            S,
            gemm_flops(S, S) * d,
            tokens,
            runs,
        )?;
    }
    Ok(())
}
