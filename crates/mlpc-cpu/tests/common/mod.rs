//! Shared test support: graphs with fused GEMM nodes, their one-kernel-per-node plans, random
//! tensors, and the comparison against the reference interpreter.

#![allow(dead_code)]

use mlpc_cpu::{CpuBackend, CpuExecutable};
use mlpc_ir::{
    interpret, relative_error_floored, Buffer, BufferKind, DType, Dim, Graph, HostTensor, Kernel,
    Op, Plan, Shape, TensorType,
};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

/// Relative Frobenius tolerance per dtype, as the project's tests use everywhere.
pub fn tolerance(dt: DType) -> f64 {
    match dt {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        DType::Bf16 => 1e-2,
    }
}

pub fn random(dt: DType, shape: &[usize], seed: u64) -> HostTensor {
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    HostTensor::from_f64(dt, shape.to_vec(), &v).unwrap()
}

pub fn dims(ds: &[Dim]) -> Shape {
    ds.iter().cloned().collect()
}

pub fn fixed(ds: &[usize]) -> Shape {
    ds.iter().map(|&d| Dim::Fixed(d as u64)).collect()
}

/// One kernel per compute node, one buffer per node; transposes become `transpose` kernels that
/// materialise their view. Enough for graphs whose GEMMs are already fused.
pub fn plan_of(g: &Graph) -> Plan {
    let order = g.topo_order().unwrap();
    let mut buffers = Vec::new();
    let mut kernels = Vec::new();
    let mut id_of = BTreeMap::new();
    for n in order {
        let node = g.node(n);
        let kind = match node.op {
            Op::Input => BufferKind::Input,
            Op::Weight => BufferKind::Weight,
            _ if g.is_output(n) => BufferKind::Output,
            _ => BufferKind::Intermediate,
        };
        let ty = match kind {
            BufferKind::Input => node.ty.clone(),
            _ => TensorType::contiguous(node.ty.dtype, node.ty.shape.clone()),
        };
        id_of.insert(n, buffers.len());
        buffers.push(Buffer {
            name: node.name.clone(),
            kind,
            ty,
        });
        if !node.op.is_leaf() {
            kernels.push(Kernel {
                name: format!("{}_{}", node.op.mnemonic(), node.name),
                op: node.op.clone(),
                covers: vec![node.name.clone()],
                args: g.operands(n).iter().map(|o| id_of[o]).collect(),
                out: id_of[&n],
            });
        }
    }
    let plan = Plan {
        name: g.name.clone(),
        dtype: buffers
            .first()
            .map(|b: &Buffer| b.ty.dtype)
            .unwrap_or(DType::F32),
        outputs: g
            .outputs()
            .iter()
            .map(|o| (o.name.clone(), id_of[&o.node]))
            .collect(),
        buffers,
        kernels,
        guards: Vec::new(),
    };
    plan.check().unwrap();
    plan
}

pub fn compile(g: &Graph) -> CpuExecutable {
    CpuBackend::new()
        .unwrap()
        .compile(&plan_of(g), g.weights())
        .unwrap()
}

/// Runs `g` on the CPU backend and the interpreter; returns the worst relative error and asserts
/// it is within the dtype's tolerance. The reference's mean square is floored at 1
/// ([`relative_error_floored`]): the data are of order 1, and a single output near zero must not
/// blow its rounding up.
pub fn check(g: &Graph, inputs: &BTreeMap<String, HostTensor>) -> f64 {
    let exe = compile(g);
    check_exe(&exe, g, inputs)
}

pub fn check_exe(exe: &CpuExecutable, g: &Graph, inputs: &BTreeMap<String, HostTensor>) -> f64 {
    let want = interpret(g, inputs).unwrap();
    let got = exe.run(inputs).unwrap();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    let mut worst: f64 = 0.0;
    for (name, w) in &want {
        let o = &got[name];
        assert_eq!(o.dtype(), w.dtype(), "output `{name}` dtype");
        assert_eq!(o.shape(), w.shape(), "output `{name}` shape");
        let err = relative_error_floored(&o.to_f64(), &w.to_f64());
        let tol = tolerance(w.dtype());
        assert!(
            err <= tol,
            "graph `{}` output `{name}`: relative error {err:e} > {tol:e}",
            g.name
        );
        worst = worst.max(err);
    }
    worst
}
