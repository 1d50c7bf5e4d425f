//! Prints the host assembly of a plain f32 GEMM kernel (x @ W^T, K = 768, N = 3072), to inspect
//! the micro-kernel: `cargo run --release -p mlpc-cpu --example asm`.

use mlpc_cpu::CpuBackend;
use mlpc_ir::{
    Buffer, BufferKind, DType, Dim, Gemm, HostTensor, Kernel, MatLayout, Op, Plan, Shape,
    TensorType,
};
use std::collections::BTreeMap;
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (k, n) = (768usize, 3072usize);
    let ty =
        |shape: Vec<Dim>| TensorType::contiguous(DType::F32, shape.into_iter().collect::<Shape>());
    let buffers = vec![
        Buffer {
            name: "x".into(),
            kind: BufferKind::Input,
            ty: ty(vec![Dim::sym("T"), Dim::Fixed(k as u64)]),
        },
        Buffer {
            name: "w".into(),
            kind: BufferKind::Weight,
            ty: ty(vec![Dim::Fixed(n as u64), Dim::Fixed(k as u64)]),
        },
        Buffer {
            name: "y".into(),
            kind: BufferKind::Output,
            ty: ty(vec![Dim::sym("T"), Dim::Fixed(n as u64)]),
        },
    ];
    let gemm = Gemm {
        a: MatLayout::N,
        b: MatLayout::T,
        dual: None,
        epilogue: Default::default(),
    };
    let plan = Plan {
        name: "gemm".into(),
        dtype: DType::F32,
        buffers,
        kernels: vec![Kernel {
            name: "gemm".into(),
            op: Op::Gemm(gemm),
            covers: vec![],
            args: vec![0, 1],
            out: 2,
        }],
        outputs: vec![("y".into(), 2)],
        guards: vec![],
    };
    let w = HostTensor::from_f64(DType::F32, vec![n, k], &vec![0.0; n * k])?;
    let weights = BTreeMap::from([("w".to_string(), Arc::new(w))]);
    let exe = CpuBackend::new()?
        .keep_assembly(true)
        .compile(&plan, &weights)?;
    println!("{}", exe.assembly().unwrap_or_default());
    Ok(())
}
