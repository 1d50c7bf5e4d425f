//! The whole compiler path on the CPU: graph → default pass pipeline → `lower_plan` → mlpc-cpu,
//! against the reference interpreter on the optimised graph. Canonical MLPs with their kernel
//! counts, and random MLP graphs (proptest): odd and prime dims, activation chains, transposes
//! anywhere legal, optional bias, residual and gating, every dtype.

#![cfg(feature = "llvm")]

mod common;

use common::{check_exe, random};
use mlpc_cpu::CpuBackend;
use mlpc_ir::{Activation, DType, Dim, Graph, HostTensor, NodeId, Op, Shape, TensorType};
use mlpc_passes::{lower_plan, Pipeline, PipelineOptions};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use std::collections::BTreeMap;

/// Optimises `g`, lowers it, runs it on the CPU against the interpreter; returns the kernel count.
fn check_pipeline(mut g: Graph, inputs: &BTreeMap<String, HostTensor>) -> usize {
    let report = Pipeline::default()
        .run(&mut g, &PipelineOptions::default())
        .unwrap_or_else(|e| panic!("{e}\n{g}"));
    let plan = lower_plan(&g, &report.provenance).unwrap();
    let exe = CpuBackend::new()
        .unwrap()
        .compile(&plan, g.weights())
        .unwrap();
    check_exe(&exe, &g, inputs);
    plan.kernels.len()
}

fn tokens(d: usize, dt: DType) -> TensorType {
    let s: Shape = [Dim::sym("T"), Dim::Fixed(d as u64)].into_iter().collect();
    TensorType::contiguous(dt, s)
}

struct Gen {
    g: Graph,
    dt: DType,
    rng: Pcg64,
    next: usize,
}

impl Gen {
    fn name(&mut self, base: &str) -> String {
        self.next += 1;
        format!("{base}{}", self.next)
    }

    fn op(&mut self, base: &str, op: Op, args: &[NodeId]) -> NodeId {
        let n = self.name(base);
        self.g.add(n, op, args).unwrap_or_else(|e| panic!("{e}"))
    }

    fn weight(&mut self, shape: &[usize]) -> NodeId {
        let n = self.name("w");
        let seed = self.rng.gen();
        let scale = 1.0 / (*shape.last().unwrap_or(&1) as f64).sqrt();
        let t = random(self.dt, shape, seed);
        let v: Vec<f64> = t.to_f64().iter().map(|x| x * scale).collect();
        self.g
            .add_weight(
                n,
                HostTensor::from_f64(self.dt, shape.to_vec(), &v).unwrap(),
            )
            .unwrap()
    }

    fn dim(&mut self) -> usize {
        *[
            1, 2, 3, 7, 13, 16, 31, 32, 33, 47, 64, 97, 128, 131, 257, 300,
        ]
        .choose(&mut self.rng)
        .unwrap()
    }

    /// `h @ rhs` for a `[inf, outf]` right operand in one of the forms a model can state.
    fn linear(&mut self, h: NodeId, inf: usize, outf: usize) -> NodeId {
        let rhs = match self.rng.gen_range(0..3) {
            0 => {
                let w = self.weight(&[outf, inf]);
                self.op("wt", Op::Transpose, &[w])
            }
            1 => self.weight(&[inf, outf]),
            _ => {
                let w = self.weight(&[inf, outf]);
                let t = self.op("wt", Op::Transpose, &[w]);
                self.op("wtt", Op::Transpose, &[t])
            }
        };
        let mut y = self.op("mm", Op::MatMul, &[h, rhs]);
        if self.rng.gen_bool(0.6) {
            let b = self.weight(&[outf]);
            y = if self.rng.gen_bool(0.5) {
                self.op("bias", Op::Add, &[y, b])
            } else {
                self.op("bias", Op::Add, &[b, y])
            };
        }
        y
    }

    fn acts(&mut self, mut h: NodeId) -> NodeId {
        for _ in 0..self.rng.gen_range(0..=2) {
            let a = *Activation::ALL.choose(&mut self.rng).unwrap();
            h = self.op(a.name(), Op::Act(a), &[h]);
        }
        h
    }
}

fn random_mlp(seed: u64) -> (Graph, BTreeMap<String, HostTensor>) {
    let mut rng = Pcg64::seed_from_u64(seed);
    let dt = *DType::ALL.choose(&mut rng).unwrap();
    let mut gen = Gen {
        g: Graph::new(format!("random_{seed}")),
        dt,
        rng,
        next: 0,
    };
    let d0 = gen.dim();
    let x = gen.g.add_input("x", tokens(d0, dt));
    let (mut h, mut d) = (x, d0);
    for _ in 0..gen.rng.gen_range(1..=3) {
        let out = gen.dim();
        let y = if gen.rng.gen_bool(0.3) {
            // Gated: act(h Wg) * (h Wu), either operand order.
            let g = gen.linear(h, d, out);
            let g = gen.acts(g);
            let u = gen.linear(h, d, out);
            if gen.rng.gen_bool(0.5) {
                gen.op("gate", Op::Mul, &[g, u])
            } else {
                gen.op("gate", Op::Mul, &[u, g])
            }
        } else {
            let y = gen.linear(h, d, out);
            gen.acts(y)
        };
        h = if out == d && gen.rng.gen_bool(0.5) {
            gen.op("res", Op::Add, &[y, h])
        } else {
            y
        };
        d = out;
    }
    let y = if gen.rng.gen_bool(0.2) {
        gen.op("yt", Op::Transpose, &[h])
    } else {
        h
    };
    gen.g.add_output("y", y);
    let t = gen.rng.gen_range(1..=40);
    let xs = random(dt, &[t, d0], seed ^ 0x5eed);
    (gen.g, BTreeMap::from([("x".to_string(), xs)]))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_mlps_match_the_interpreter(seed in any::<u64>()) {
        let (g, inputs) = random_mlp(seed);
        check_pipeline(g, &inputs);
    }
}

#[test]
fn fixed_random_mlps() {
    for seed in 0..12 {
        let (g, inputs) = random_mlp(seed);
        check_pipeline(g, &inputs);
    }
}

/// `fc2(act(fc1(x)))` or the gated form, written the way nn.Linear lowers.
fn canonical(
    name: &str,
    dt: DType,
    gated: Option<Activation>,
    layers: &[(usize, Option<Activation>)],
) -> Graph {
    let mut gen = Gen {
        g: Graph::new(name),
        dt,
        rng: Pcg64::seed_from_u64(3),
        next: 0,
    };
    let x = gen.g.add_input("x", tokens(layers[0].0, dt));
    let mut h = x;
    let mut d = layers[0].0;
    if let Some(a) = gated {
        let hid = layers[1].0;
        let wg = gen.weight(&[hid, d]);
        let wgt = gen.op("wgt", Op::Transpose, &[wg]);
        let g = gen.op("g", Op::MatMul, &[h, wgt]);
        let g = gen.op("act", Op::Act(a), &[g]);
        let wu = gen.weight(&[hid, d]);
        let wut = gen.op("wut", Op::Transpose, &[wu]);
        let u = gen.op("u", Op::MatMul, &[h, wut]);
        h = gen.op("gu", Op::Mul, &[g, u]);
        d = hid;
    }
    let start = usize::from(gated.is_some());
    for &(out, act) in &layers[start + 1..] {
        let w = gen.weight(&[out, d]);
        let wt = gen.op("wt", Op::Transpose, &[w]);
        h = gen.op("mm", Op::MatMul, &[h, wt]);
        if gated.is_none() {
            let b = gen.weight(&[out]);
            h = gen.op("bias", Op::Add, &[h, b]);
        }
        if let Some(a) = act {
            h = gen.op("act", Op::Act(a), &[h]);
        }
        d = out;
    }
    gen.g.add_output("y", h);
    gen.g
}

#[test]
fn canonical_models_fuse_and_match() {
    use Activation::*;
    for dt in DType::ALL {
        let cases: Vec<(Graph, usize)> = vec![
            (
                canonical("one_linear", dt, None, &[(40, None), (72, None)]),
                1,
            ),
            (
                canonical(
                    "linear_gelu_linear",
                    dt,
                    None,
                    &[(40, None), (72, Some(GeluTanh)), (40, None)],
                ),
                2,
            ),
            (
                canonical(
                    "three_linears",
                    dt,
                    None,
                    &[(40, None), (72, Some(Relu)), (72, Some(Tanh)), (40, None)],
                ),
                3,
            ),
            (
                canonical(
                    "geglu",
                    dt,
                    Some(GeluTanh),
                    &[(40, None), (72, None), (40, None)],
                ),
                2,
            ),
            (
                canonical(
                    "swiglu",
                    dt,
                    Some(Silu),
                    &[(40, None), (72, None), (40, None)],
                ),
                2,
            ),
        ];
        for (g, kernels) in cases {
            let name = g.name.clone();
            let inputs = BTreeMap::from([("x".to_string(), random(dt, &[19, 40], 4))]);
            assert_eq!(check_pipeline(g, &inputs), kernels, "{name} {dt}");
        }
    }
}
