//! Elementwise kernels: `add`, `mul`, activations, and `transpose` materialised as a strided copy,
//! as instantiations of `Elementwise` over rank <= 4 operands.
//!
//! Each operand is read at the output's index through strides: its own for a same-shape operand,
//! 0 on broadcast dims (a `[N]` row vector), swapped last two for the source of a transpose. The
//! access mode given to the template (`Dense`, `Row`, `Strided`) is the cheapest one that is exact
//! for those strides.

use crate::cpp::{self, Symbols};
use crate::view::broadcast_strides;
use crate::{dim_params, signature, CodegenError, Ctx, CudaKernel, Grid, Launch};
use mlpc_ir::{contiguous_strides, Dim, Extent, Op};

const THREADS: u32 = 256;
const MAX_RANK: usize = 4;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Dense,
    Row,
    Strided,
}

impl Access {
    fn cpp(self) -> &'static str {
        match self {
            Access::Dense => "mlpc::Access::Dense",
            Access::Row => "mlpc::Access::Row",
            Access::Strided => "mlpc::Access::Strided",
        }
    }
}

fn is_fixed_one(d: &Dim) -> bool {
    d.fixed() == Some(1)
}

/// The access mode that reads an operand with `strides` (per output dim) at the output's
/// row-major linear index.
fn classify(strides: &[Extent], shape: &[Dim]) -> Access {
    let zero = Extent::constant(0);
    let Some(dense) = contiguous_strides(shape) else {
        return Access::Strided;
    };
    // Size-1 dims never contribute to an offset.
    let same = |a: &Extent, b: &Extent, d: &Dim| is_fixed_one(d) || a == b;
    if strides
        .iter()
        .zip(&dense)
        .zip(shape)
        .all(|((s, c), d)| same(s, c, d))
    {
        return Access::Dense;
    }
    let r = shape.len();
    if r >= 1
        && strides[r - 1].as_constant() == Some(1)
        && strides[..r - 1]
            .iter()
            .zip(shape)
            .all(|(s, d)| same(s, &zero, d))
    {
        return Access::Row;
    }
    Access::Strided
}

pub fn generate(ctx: &Ctx<'_>) -> Result<CudaKernel, CodegenError> {
    let kname = ctx.name();
    let dtype = ctx.out.ty.dtype;
    let out_ty = &ctx.out.ty;
    let rank_err = |b: &mlpc_ir::Buffer| CodegenError::Rank {
        kernel: kname.clone(),
        buffer: b.name.clone(),
        rank: b.ty.rank(),
    };
    if out_ty.rank() > MAX_RANK {
        return Err(rank_err(ctx.out));
    }
    let shape: Vec<Dim> = out_ty.shape.to_vec();

    let (op_type, op_name, summary) = match &ctx.kernel.op {
        Op::Add => (
            "mlpc::AddOp".to_string(),
            "add",
            "out = in0 + in1".to_string(),
        ),
        Op::Mul => (
            "mlpc::MulOp".to_string(),
            "mul",
            "out = in0 * in1".to_string(),
        ),
        Op::Act(a) => (
            format!("mlpc::ActOp<{}>", cpp::act_kind(*a)),
            a.name(),
            format!("out = {}(in0)", a.name()),
        ),
        Op::Transpose => (
            "mlpc::CopyOp".to_string(),
            "copy",
            "out = in0 (materialised transpose)".to_string(),
        ),
        other @ (Op::Input | Op::Weight | Op::MatMul | Op::Gemm(_) | Op::SparseGemm(_)) => {
            return Err(CodegenError::UnsupportedOp {
                kernel: kname,
                op: other.mnemonic().to_string(),
            })
        }
    };

    // Strides of each input at the output's index.
    let mut in_strides: Vec<Vec<Extent>> = Vec::new();
    for b in &ctx.args {
        if b.ty.rank() > MAX_RANK {
            return Err(rank_err(b));
        }
        let strides = if matches!(ctx.kernel.op, Op::Transpose) {
            let r = b.ty.rank();
            let mut s = b.ty.shape.clone();
            if r >= 2 {
                s.swap(r - 2, r - 1);
            }
            if r < 2 || s.as_slice() != shape.as_slice() {
                return Err(CodegenError::Shape {
                    kernel: kname.clone(),
                    what: format!("the transpose of `{}`", b.name),
                    expected: ctx.out.ty.to_string(),
                    actual: b.ty.to_string(),
                });
            }
            let mut st = b.ty.strides.to_vec();
            st.swap(r - 2, r - 1);
            st
        } else {
            broadcast_strides(&b.ty, &shape).ok_or_else(|| CodegenError::Shape {
                kernel: kname.clone(),
                what: format!("the shape of `{}`", b.name),
                expected: format!("{} or a broadcast of it", ctx.out.ty),
                actual: b.ty.to_string(),
            })?
        };
        in_strides.push(strides);
    }
    let out_access = match classify(&out_ty.strides, &shape) {
        Access::Dense => Access::Dense,
        // A row pattern in the output would write one row over and over; only real
        // broadcasts of inputs are `Row`.
        Access::Row | Access::Strided => Access::Strided,
    };
    let in_access: Vec<Access> = in_strides.iter().map(|s| classify(s, &shape)).collect();
    let any_strided = out_access == Access::Strided || in_access.contains(&Access::Strided);
    let any_row = in_access.contains(&Access::Row);

    // Padded to rank 4 at the front: shape 1, stride 0.
    let pad = MAX_RANK - shape.len();
    let padded = |s: &[Extent]| -> Vec<Extent> {
        std::iter::repeat_n(Extent::constant(0), pad)
            .chain(s.iter().cloned())
            .collect()
    };
    let shape4: Vec<Extent> = std::iter::repeat_n(Extent::constant(1), pad)
        .chain(shape.iter().map(Extent::of_dim))
        .collect();

    let mut syms = Symbols::default();
    let n_in = ctx.args.len();
    let mut arg_names: Vec<String> = (0..n_in).map(|i| format!("in{i}")).collect();
    arg_names.push("out".to_string());
    let elem = cpp::elem_type(dtype);

    let mut body = Vec::new();
    body.push(format!("    mlpc::EwParams<{elem}, {n_in}> p;"));
    body.push("    p.out = out;".to_string());
    for i in 0..n_in {
        body.push(format!("    p.in[{i}] = in{i};"));
    }
    let mut assign = |syms: &mut Symbols, name: &str, v: &[Extent]| {
        for (d, e) in v.iter().enumerate() {
            body.push(format!("    {name}[{d}] = {};", syms.expr(e)));
        }
    };
    assign(&mut syms, "p.shape", &shape4);
    assign(&mut syms, "p.out_stride", &padded(&out_ty.strides));
    for (i, s) in in_strides.iter().enumerate() {
        assign(&mut syms, &format!("p.in_stride[{i}]"), &padded(s));
    }
    body.push("    Kernel::run(p);".to_string());

    let accesses: Vec<&str> = std::iter::once(out_access)
        .chain(in_access.iter().copied())
        .map(Access::cpp)
        .collect();
    let suffix = if any_strided {
        "strided"
    } else if any_row {
        "bcast"
    } else {
        "dense"
    };
    let entry = format!("mlpc_{op_name}_{}_{suffix}", dtype.name());
    let vec = 16 / dtype.size_bytes() as u32;

    let symbols = syms.into_sorted();
    let numel = out_ty.numel();
    let mut src = ctx.header(&summary, &arg_names);
    src.push_str("#include \"elementwise.cuh\"\n\n");
    src.push_str("namespace {\n");
    src.push_str(&format!(
        "using Kernel = mlpc::Elementwise<{elem}, {op_type}, {}>;\n",
        accesses.join(", ")
    ));
    src.push_str(&format!(
        "static_assert(Kernel::kThreads == {THREADS} && Kernel::kVec == {vec}, \"launch description\");\n"
    ));
    src.push_str("}  // namespace\n\n");
    src.push_str(&format!(
        "extern \"C\" __global__ void __launch_bounds__({THREADS}) {entry}(\n{}) {{\n",
        signature(elem, &arg_names, n_in, &symbols, &[])
    ));
    src.push_str(&body.join("\n"));
    src.push_str("\n}\n");

    let mut params = ctx.buffer_params();
    params.extend(dim_params(&symbols));
    Ok(CudaKernel {
        name: kname,
        entry,
        source: src,
        launch: Launch {
            block: [THREADS, 1, 1],
            smem_bytes: 0,
            early_launch: false,
            walk_costs: Vec::new(),
            grid: Grid::Elements {
                numel,
                per_block: THREADS * vec,
            },
        },
        params,
        small_m: None,
        relayouts: Vec::new(),
        short_grids: Vec::new(),
        tile_fixed_cols: 0,
    })
}
