//! Graph builders shared by the tests: the canonical models and random weights and inputs.

#![allow(dead_code)]

use mlpc_ir::{Activation, Bindings, DType, Dim, Graph, HostTensor, NodeId, Op, Shape, TensorType};
use mlpc_passes::{Pass, Provenance};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use std::collections::BTreeMap;

/// Builds graphs with deterministic random weights.
pub struct Builder {
    pub g: Graph,
    pub dtype: DType,
    rng: Pcg64,
}

pub fn shape(dims: &[Dim]) -> Shape {
    dims.iter().cloned().collect()
}

pub fn t() -> Dim {
    Dim::sym("T")
}

pub fn d(n: u64) -> Dim {
    Dim::Fixed(n)
}

impl Builder {
    pub fn new(name: &str, dtype: DType, seed: u64) -> Builder {
        Builder {
            g: Graph::new(name),
            dtype,
            rng: Pcg64::seed_from_u64(seed),
        }
    }

    pub fn input(&mut self, name: &str, dims: &[Dim]) -> NodeId {
        self.g
            .add_input(name, TensorType::contiguous(self.dtype, shape(dims)))
    }

    /// A weight of uniform values in `[-1/sqrt(fan), 1/sqrt(fan)]`, `fan` the last dim.
    pub fn weight(&mut self, name: &str, dims: &[usize]) -> NodeId {
        let n: usize = dims.iter().product();
        let fan = *dims.last().unwrap_or(&1) as f64;
        let bound = 1.0 / fan.sqrt();
        let v: Vec<f64> = (0..n).map(|_| self.rng.gen_range(-bound..bound)).collect();
        let data = HostTensor::from_f64(self.dtype, dims.to_vec(), &v).unwrap();
        self.g.add_weight(name, data).unwrap()
    }

    pub fn op(&mut self, name: &str, op: Op, operands: &[NodeId]) -> NodeId {
        match self.g.add(name, op, operands) {
            Ok(n) => n,
            Err(e) => panic!("{e}\n{}", self.g),
        }
    }

    pub fn act(&mut self, name: &str, a: Activation, x: NodeId) -> NodeId {
        self.op(name, Op::Act(a), &[x])
    }

    /// `x @ W^T (+ b)` as nn.Linear lowers: `transpose` + `matmul` (+ `add`). Weight `{p}.weight`
    /// is `[out, in]`; the result node is `{p}` (or `{p}.bias_add` with a bias).
    pub fn linear(&mut self, p: &str, x: NodeId, inf: usize, outf: usize, bias: bool) -> NodeId {
        let w = self.weight(&format!("{p}.weight"), &[outf, inf]);
        let wt = self.op(&format!("{p}.weight.t"), Op::Transpose, &[w]);
        let h = self.op(p, Op::MatMul, &[x, wt]);
        if bias {
            let b = self.weight(&format!("{p}.bias"), &[outf]);
            self.op(&format!("{p}.add"), Op::Add, &[h, b])
        } else {
            h
        }
    }

    pub fn output(&mut self, name: &str, n: NodeId) {
        self.g.add_output(name, n);
    }

    pub fn finish(self) -> Graph {
        mlpc_ir::verify(&self.g).unwrap_or_else(|e| panic!("{e}\n{}", self.g));
        self.g
    }
}

/// Model dims of the canonical models (GPT-2 small's MLP).
pub const D: usize = 768;
pub const H: usize = 3072;

pub fn one_linear(dtype: DType, dm: usize, dh: usize) -> Graph {
    let mut b = Builder::new("linear", dtype, 1);
    let x = b.input("x", &[t(), d(dm as u64)]);
    let y = b.linear("fc", x, dm, dh, true);
    b.output("y", y);
    b.finish()
}

pub fn linear_gelu_linear(dtype: DType, dm: usize, dh: usize) -> Graph {
    let mut b = Builder::new("linear-gelu-linear", dtype, 2);
    let x = b.input("x", &[t(), d(dm as u64)]);
    let h = b.linear("fc1", x, dm, dh, true);
    let a = b.act("gelu", Activation::Gelu, h);
    let y = b.linear("fc2", a, dh, dm, true);
    b.output("y", y);
    b.finish()
}

pub fn three_linears(dtype: DType, dm: usize, dh: usize) -> Graph {
    let mut b = Builder::new("three-linears", dtype, 3);
    let x = b.input("x", &[t(), d(dm as u64)]);
    let h1 = b.linear("fc1", x, dm, dh, true);
    let a1 = b.act("relu", Activation::Relu, h1);
    let h2 = b.linear("fc2", a1, dh, dh, true);
    let a2 = b.act("tanh", Activation::Tanh, h2);
    let y = b.linear("fc3", a2, dh, dm, true);
    b.output("y", y);
    b.finish()
}

/// `down(act(x Wg^T) * (x Wu^T))`, no biases.
pub fn gated(name: &str, act: Activation, dtype: DType, dm: usize, dh: usize) -> Graph {
    let mut b = Builder::new(name, dtype, 4);
    let x = b.input("x", &[t(), d(dm as u64)]);
    let g = b.linear("gate_proj", x, dm, dh, false);
    let ga = b.act(act.name(), act, g);
    let u = b.linear("up_proj", x, dm, dh, false);
    let m = b.op("gated", Op::Mul, &[ga, u]);
    let y = b.linear("down_proj", m, dh, dm, false);
    b.output("y", y);
    b.finish()
}

pub fn geglu(dtype: DType, dm: usize, dh: usize) -> Graph {
    gated("geglu", Activation::GeluTanh, dtype, dm, dh)
}

pub fn swiglu(dtype: DType, dm: usize, dh: usize) -> Graph {
    gated("swiglu", Activation::Silu, dtype, dm, dh)
}

/// The canonical models with the kernel count the default pipeline must reach.
pub fn canonical(dm: usize, dh: usize) -> Vec<(Graph, usize)> {
    let dt = DType::Bf16;
    vec![
        (one_linear(dt, dm, dh), 1),
        (linear_gelu_linear(dt, dm, dh), 2),
        (three_linears(dt, dm, dh), 3),
        (geglu(dt, dm, dh), 2),
        (swiglu(dt, dm, dh), 2),
    ]
}

/// Random inputs for every model input, with every symbol bound from `bindings`.
pub fn random_inputs(g: &Graph, bindings: &Bindings, seed: u64) -> BTreeMap<String, HostTensor> {
    let mut rng = Pcg64::seed_from_u64(seed);
    g.inputs()
        .into_iter()
        .map(|i| {
            let n = g.node(i);
            let s = n.ty.concrete_shape(bindings).expect("unbound symbol");
            let v: Vec<f64> = (0..s.iter().product::<usize>())
                .map(|_| rng.gen_range(-1.0..1.0))
                .collect();
            (
                n.name.clone(),
                HostTensor::from_f64(n.ty.dtype, s, &v).unwrap(),
            )
        })
        .collect()
}

pub fn bind_t(v: u64) -> Bindings {
    let mut b = Bindings::new();
    b.bind(&std::sync::Arc::from("T"), v).unwrap();
    b
}

/// Largest relative Frobenius error over the outputs of `a` against `reference`, the reference's
/// mean square floored at 1 ([`mlpc_ir::relative_error_floored`]: inputs and weights are of order
/// 1, and an output that cancels to near zero must not blow its rounding up).
pub fn max_error(
    a: &BTreeMap<String, HostTensor>,
    reference: &BTreeMap<String, HostTensor>,
) -> f64 {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        reference.keys().collect::<Vec<_>>()
    );
    a.iter()
        .map(|(k, v)| {
            let r = &reference[k];
            assert_eq!(v.shape(), r.shape(), "output `{k}`");
            mlpc_ir::relative_error_floored(&v.to_f64(), &r.to_f64())
        })
        // NaN wins: `f64::max` would drop it, and an output of NaN would pass.
        .fold(0.0, |a, e| if e.is_nan() || e > a { e } else { a })
}

/// Runs one pass and verifies the result.
pub fn run_pass(p: &dyn Pass, g: &mut Graph, prov: &mut Provenance) -> bool {
    let changed = p.run(g, prov).unwrap();
    mlpc_ir::verify(g).unwrap_or_else(|e| panic!("after {}: {e}\n{g}", p.name()));
    changed
}

/// The same graph computed in f32: inputs retyped, weights widened exactly. An oracle for bf16
/// and f16 graphs, whose own roundings it does not have.
pub fn widened(g: &Graph) -> Graph {
    let mut w = Graph::new(g.name.clone());
    let mut map: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    for n in g.topo_order().unwrap() {
        let node = g.node(n);
        let new = match &node.op {
            Op::Input => w.add_input(
                node.name.clone(),
                TensorType::contiguous(DType::F32, node.ty.shape.clone()),
            ),
            Op::Weight => w
                .add_weight(
                    node.name.clone(),
                    g.weight(&node.name).unwrap().cast(DType::F32),
                )
                .unwrap(),
            op => {
                let ops: Vec<NodeId> = g.operands(n).iter().map(|o| map[o]).collect();
                w.add(node.name.clone(), op.clone(), &ops).unwrap()
            }
        };
        map.insert(n, new);
    }
    for o in g.outputs() {
        w.add_output(o.name.clone(), map[&o.node]);
    }
    w
}

/// Inputs of `g` converted to f32, for [`widened`].
pub fn widened_inputs(inputs: &BTreeMap<String, HostTensor>) -> BTreeMap<String, HostTensor> {
    inputs
        .iter()
        .map(|(k, v)| (k.clone(), v.cast(DType::F32)))
        .collect()
}
