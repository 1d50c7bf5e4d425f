//! Differential testing: random MLP graphs compute the same values (reference interpreter) before
//! and after each pass, each pass alone, and the whole pipeline; every intermediate graph verifies;
//! the plan checks and is never worse than the unoptimised graph's plan.

mod common;

use common::*;
use mlpc_ir::{interpret, verify, Activation, Bindings, DType, Graph, NodeId, Op};
use mlpc_passes::{
    intermediate_bytes, lower_plan, Pipeline, PipelineOptions, PrintAfter, Provenance,
};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

const SMALL_DIMS: [usize; 14] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16, 17];
const LARGE_DIMS: [usize; 5] = [97, 128, 211, 257, 300];

struct Gen {
    b: Builder,
    rng: Pcg64,
    next: usize,
}

impl Gen {
    fn name(&mut self, base: &str) -> String {
        self.next += 1;
        format!("{base}{}", self.next)
    }

    fn dim(&mut self) -> usize {
        if self.rng.gen_bool(0.1) {
            *LARGE_DIMS.choose(&mut self.rng).unwrap()
        } else {
            *SMALL_DIMS.choose(&mut self.rng).unwrap()
        }
    }

    fn act(&mut self) -> Activation {
        *Activation::ALL.choose(&mut self.rng).unwrap()
    }

    fn op(&mut self, base: &str, op: Op, operands: &[NodeId]) -> NodeId {
        let n = self.name(base);
        self.b.op(&n, op, operands)
    }

    /// A `[in, out]` right operand: `transpose(W[out,in])`, `W[in,out]` itself, or
    /// `transpose(transpose(W[in,out]))`; sometimes a second, tied transpose of the same weight.
    fn rhs(&mut self, inf: usize, outf: usize) -> NodeId {
        match self.rng.gen_range(0..4) {
            0 | 1 => {
                let wn = self.name("w");
                let w = self.b.weight(&wn, &[outf, inf]);
                let t = self.op("wt", Op::Transpose, &[w]);
                if self.rng.gen_bool(0.15) {
                    // A tied copy; the first stays as a dead node or is merged by cse.
                    self.op("wt", Op::Transpose, &[w])
                } else {
                    t
                }
            }
            2 => {
                let wn = self.name("w");
                self.b.weight(&wn, &[inf, outf])
            }
            _ => {
                let wn = self.name("w");
                let w = self.b.weight(&wn, &[inf, outf]);
                let t1 = self.op("wt", Op::Transpose, &[w]);
                self.op("wtt", Op::Transpose, &[t1])
            }
        }
    }

    fn maybe_bias(&mut self, h: NodeId, outf: usize) -> NodeId {
        if !self.rng.gen_bool(0.5) {
            return h;
        }
        let bn = self.name("b");
        let bias = self.b.weight(&bn, &[outf]);
        if self.rng.gen_bool(0.5) {
            self.op("bias", Op::Add, &[h, bias])
        } else {
            self.op("bias", Op::Add, &[bias, h])
        }
    }

    fn acts(&mut self, mut h: NodeId, max: usize) -> NodeId {
        for _ in 0..self.rng.gen_range(0..=max) {
            let a = self.act();
            h = self.op(a.name(), Op::Act(a), &[h]);
        }
        h
    }

    fn either(&mut self, base: &str, op: Op, a: NodeId, b: NodeId) -> NodeId {
        if self.rng.gen_bool(0.5) {
            self.op(base, op, &[a, b])
        } else {
            self.op(base, op, &[b, a])
        }
    }
}

/// A random MLP and a binding of its symbol `T`.
fn random_graph(seed: u64) -> (Graph, Bindings) {
    let mut rng = Pcg64::seed_from_u64(seed);
    let dtype = if rng.gen_bool(0.5) {
        DType::F32
    } else {
        DType::Bf16
    };
    let tv = rng.gen_range(1..=8);
    let mut g = Gen {
        b: Builder::new("random", dtype, seed),
        rng,
        next: 0,
    };
    let d0 = g.dim();
    let batch = g.rng.gen_bool(0.2);
    let mut cur = match (batch, g.rng.gen_range(0..3)) {
        (false, 0) => {
            let xt = g.b.input("xt", &[d(d0 as u64), t()]);
            g.op("x", Op::Transpose, &[xt])
        }
        (true, 0) => {
            let xt = g.b.input("xt", &[d(2), d(d0 as u64), t()]);
            g.op("x", Op::Transpose, &[xt])
        }
        (false, _) => g.b.input("x", &[t(), d(d0 as u64)]),
        (true, _) => g.b.input("x", &[d(2), t(), d(d0 as u64)]),
    };
    let mut cur_dim = d0;
    let mut outputs = 0;
    for _ in 0..g.rng.gen_range(1..=3) {
        let outf = if g.rng.gen_bool(0.2) {
            cur_dim
        } else {
            g.dim()
        };
        let w = g.rhs(cur_dim, outf);
        let h = g.op("mm", Op::MatMul, &[cur, w]);
        let h = g.maybe_bias(h, outf);
        let mut h = g.acts(h, 2);
        if g.rng.gen_bool(0.3) {
            // Gated: another GEMM on the same input, meeting this one in a product.
            let w2 = g.rhs(cur_dim, outf);
            let u = g.op("up", Op::MatMul, &[cur, w2]);
            let u = g.maybe_bias(u, outf);
            let u = g.acts(u, 1);
            h = g.either("gated", Op::Mul, h, u);
        }
        h = g.acts(h, 1);
        if outf == cur_dim && g.rng.gen_bool(0.5) {
            h = g.either("res", Op::Add, h, cur);
        }
        if outf == cur_dim && g.rng.gen_bool(0.2) {
            h = g.either("prod", Op::Mul, h, cur);
        }
        if g.rng.gen_bool(0.1) {
            // A second use (an output) that blocks fusion past this point.
            outputs += 1;
            g.b.output(&format!("extra{outputs}"), h);
            h = g.acts(h, 1);
        }
        if g.rng.gen_bool(0.15) {
            // A view of an intermediate, read by an elementwise op or returned as is.
            let ht = g.op("ht", Op::Transpose, &[h]);
            outputs += 1;
            let v = if g.rng.gen_bool(0.5) {
                g.acts(ht, 1)
            } else {
                ht
            };
            g.b.output(&format!("view{outputs}"), v);
        }
        if g.rng.gen_bool(0.1) {
            // Dead code.
            let a = g.act();
            g.op("dead", Op::Act(a), &[h]);
        }
        cur = h;
        cur_dim = outf;
    }
    g.b.output("y", cur);
    (g.b.finish(), bind_t(tv))
}

fn is_f32(g: &Graph) -> bool {
    g.node(g.outputs()[0].node).ty.dtype == DType::F32
}

/// Compares an optimised graph's outputs `got` with the source graph's `want`.
///
/// f32: relative Frobenius error <= 1e-5. bf16: <= 2e-2; fusion removes intermediate roundings,
/// so where the source graph's own rounding noise exceeds that (a dot product that cancels, then
/// a chain of activations), both are measured against the graph computed in f32 instead, and the
/// optimised graph must be no more than twice as far from it as the source graph (a wrong fusion
/// is off by O(1), not by a few roundings).
struct Oracle {
    f32: bool,
    want: Outputs,
    exact: Option<Outputs>,
}

type Outputs = std::collections::BTreeMap<String, mlpc_ir::HostTensor>;

impl Oracle {
    fn new(g: &Graph, inputs: &Outputs) -> Oracle {
        let want = interpret(g, inputs).unwrap();
        let exact = (!is_f32(g)).then(|| interpret(&widened(g), &widened_inputs(inputs)).unwrap());
        Oracle {
            f32: is_f32(g),
            want,
            exact,
        }
    }

    /// `Err` with a description when `got` is too far from the source graph's values.
    fn check(&self, got: &Outputs) -> Result<(), String> {
        let err = max_error(got, &self.want);
        if self.f32 {
            return if err <= 1e-5 {
                Ok(())
            } else {
                Err(format!("f32 error {err} > 1e-5"))
            };
        }
        if err <= 2e-2 {
            return Ok(());
        }
        let exact = self.exact.as_ref().expect("bf16 oracle has f32 values");
        let (e_src, e_opt) = (max_error(&self.want, exact), max_error(got, exact));
        if e_opt <= (2.0 * e_src).max(2e-2) {
            Ok(())
        } else {
            Err(format!(
                "bf16 error {err} > 2e-2; against f32: source {e_src}, optimised {e_opt}"
            ))
        }
    }
}

/// The structural promises of the default pipeline.
fn assert_optimised_form(g: &Graph) {
    for n in g.node_ids() {
        let node = g.node(n);
        assert!(node.op != Op::MatMul, "matmul left: {}", g.node_text(n));
        let ops = g.operands(n);
        if node.op == Op::Transpose {
            assert!(g.node(ops[0]).op != Op::Transpose, "{}", g.node_text(n));
        }
        if let Op::Gemm(gm) = &node.op {
            for (slot, &o) in ops.iter().enumerate().take(gm.matrix_operands()) {
                let left_rank3 = slot == 0 && g.node(o).ty.rank() > 2;
                assert!(
                    g.node(o).op != Op::Transpose || left_rank3,
                    "transpose in front of a GEMM: {}",
                    g.node_text(n)
                );
            }
        }
    }
}

fn check(seed: u64) {
    let (g, bindings) = random_graph(seed);
    let inputs = random_inputs(&g, &bindings, seed ^ 0x5eed);
    let oracle = Oracle::new(&g, &inputs);
    let want = &oracle.want;
    let pipeline = Pipeline::default();

    // The default passes in sequence: exact until fusion, within tolerance after it.
    let mut cur = g.clone();
    let mut prov = Provenance::new(&g);
    let mut fused = false;
    for p in pipeline.passes() {
        p.run(&mut cur, &mut prov).unwrap();
        verify(&cur).unwrap_or_else(|e| panic!("after {}: {e}\n{g}\n{cur}", p.name()));
        fused |= p.name() == "fuse-epilogue";
        let got = interpret(&cur, &inputs).unwrap();
        if fused {
            if let Err(e) = oracle.check(&got) {
                panic!("after {}: {e}\n{g}\n{cur}", p.name());
            }
        } else {
            assert_eq!(&got, want, "after {}\n{g}\n{cur}", p.name());
        }
    }

    // Each pass alone on the source graph.
    for p in pipeline.passes() {
        let mut alone = g.clone();
        let mut prov = Provenance::new(&g);
        p.run(&mut alone, &mut prov).unwrap();
        verify(&alone).unwrap_or_else(|e| panic!("{} alone: {e}\n{g}\n{alone}", p.name()));
        if let Err(e) = oracle.check(&interpret(&alone, &inputs).unwrap()) {
            panic!("{} alone: {e}\n{g}\n{alone}", p.name());
        }
        lower_plan(&alone, &prov).unwrap().check().unwrap();
    }

    // The whole pipeline, verified after each pass, then lowered.
    let mut opt = g.clone();
    let opts = PipelineOptions {
        verify_each: true,
        print_after: PrintAfter::Nothing,
    };
    let report = pipeline.run(&mut opt, &opts).unwrap();
    assert_eq!(opt.to_string(), cur.to_string());
    if let Err(e) = oracle.check(&interpret(&opt, &inputs).unwrap()) {
        panic!("pipeline: {e}\n{g}\n{opt}");
    }
    assert_optimised_form(&opt);

    let plan = lower_plan(&opt, &report.provenance).unwrap();
    plan.check().unwrap();
    let unoptimised = lower_plan(&g, &Provenance::new(&g)).unwrap();
    assert!(
        plan.kernels.len() <= unoptimised.kernels.len(),
        "more kernels after optimising\n{g}\n{opt}"
    );
    let bytes = |p| intermediate_bytes(p).resolve(&bindings).unwrap();
    assert!(
        bytes(&plan) <= bytes(&unoptimised),
        "more bytes\n{g}\n{opt}"
    );
    // Every source node that still computes something is covered by exactly the kernels of the
    // nodes it resolves to.
    for k in &plan.kernels {
        assert!(!k.covers.is_empty(), "{}", k.name);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn passes_preserve_values(seed in any::<u64>()) {
        check(seed);
    }
}

/// A fixed sweep, so that failures reproduce without the proptest seed file.
#[test]
fn fixed_seeds() {
    for seed in 0..64 {
        check(seed);
    }
}
