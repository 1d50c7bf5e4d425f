//! Hand-built plans that reach every template path: single and dual GEMMs in each dtype, every
//! epilogue step, both layouts of each operand, odd and unit dims, symbolic and flattened batch
//! dims, broadcasts and strided views in elementwise kernels. The snapshot tests of this crate and
//! the NVRTC tests of `mlpc-jit` run over [`all`]; [`sparse`] holds the block-sparse plans (block
//! shapes square, tall, wide and odd, single and dual, every dtype, both A layouts).

use mlpc_ir::{
    Activation, BlockPattern, Buffer, BufferId, BufferKind, DType, Dim, Dual, Epilogue,
    EpilogueChain, Gemm, Kernel, MatLayout, Op, Plan, Shape, SparseGemm, TensorType,
};
use smallvec::smallvec;
use std::sync::Arc;

/// Builds a [`Plan`] buffer by buffer and kernel by kernel.
pub struct PlanBuilder {
    plan: Plan,
}

fn dim(d: &str) -> Dim {
    d.parse::<u64>().map_or_else(|_| Dim::sym(d), Dim::Fixed)
}

/// A shape from dims written as numbers or symbol names, e.g. `["T", "768"]`.
pub fn shape(dims: &[&str]) -> Shape {
    dims.iter().map(|d| dim(d)).collect()
}

impl PlanBuilder {
    pub fn new(name: &str, dtype: DType) -> PlanBuilder {
        PlanBuilder {
            plan: Plan {
                name: name.to_string(),
                dtype,
                buffers: Vec::new(),
                kernels: Vec::new(),
                outputs: Vec::new(),
                guards: Vec::new(),
            },
        }
    }

    pub fn buffer(&mut self, name: &str, kind: BufferKind, ty: TensorType) -> BufferId {
        self.plan.buffers.push(Buffer {
            name: name.to_string(),
            kind,
            ty,
        });
        if kind == BufferKind::Output {
            self.plan
                .outputs
                .push((name.to_string(), self.plan.buffers.len() - 1));
        }
        self.plan.buffers.len() - 1
    }

    /// A row-major buffer of the plan's dtype.
    pub fn dense(&mut self, name: &str, kind: BufferKind, dims: &[&str]) -> BufferId {
        let ty = TensorType::contiguous(self.plan.dtype, shape(dims));
        self.buffer(name, kind, ty)
    }

    pub fn kernel(&mut self, name: &str, op: Op, args: &[BufferId], out: BufferId) -> &mut Self {
        self.plan.kernels.push(Kernel {
            name: name.to_string(),
            op,
            covers: vec![self.plan.buffers[out].name.clone()],
            args: args.to_vec(),
            out,
        });
        self
    }

    pub fn finish(self) -> Plan {
        self.plan
    }
}

fn gemm(a: MatLayout, b: MatLayout, epilogue: EpilogueChain) -> Op {
    Op::Gemm(Gemm {
        a,
        b,
        dual: None,
        epilogue,
    })
}

fn dual_gemm(gate: EpilogueChain, up: EpilogueChain, epilogue: EpilogueChain) -> Op {
    Op::Gemm(Gemm {
        a: MatLayout::N,
        b: MatLayout::T,
        dual: Some(Dual { gate, up }),
        epilogue,
    })
}

use BufferKind::{Input, Intermediate, Output, Weight};
use MatLayout::{N, T};

/// `y = x W^T + b`, bf16, x `[T, 768]`, W `[3072, 768]`.
pub fn linear_bias_bf16() -> Plan {
    let mut p = PlanBuilder::new("linear_bias_bf16", DType::Bf16);
    let x = p.dense("x", Input, &["T", "768"]);
    let w = p.dense("fc.weight", Weight, &["3072", "768"]);
    let b = p.dense("fc.bias", Weight, &["3072"]);
    let y = p.dense("y", Output, &["T", "3072"]);
    let op = gemm(N, T, smallvec![Epilogue::Bias { operand: 2 }]);
    p.kernel("gemm_bias_bf16_nt_0", op, &[x, w, b], y);
    p.finish()
}

/// `y = gelu_tanh(x W^T + b)`, bf16.
pub fn linear_gelu_tanh_bf16() -> Plan {
    let mut p = PlanBuilder::new("linear_gelu_tanh_bf16", DType::Bf16);
    let x = p.dense("x", Input, &["T", "768"]);
    let w = p.dense("fc.weight", Weight, &["3072", "768"]);
    let b = p.dense("fc.bias", Weight, &["3072"]);
    let y = p.dense("y", Output, &["T", "3072"]);
    let op = gemm(
        N,
        T,
        smallvec![
            Epilogue::Bias { operand: 2 },
            Epilogue::Act(Activation::GeluTanh)
        ],
    );
    p.kernel("gemm_bias_gelu_tanh_bf16_nt_0", op, &[x, w, b], y);
    p.finish()
}

/// A SwiGLU MLP with a residual, bf16: `y = (silu(x Wg^T) * (x Wu^T)) Wd^T + x`.
pub fn swiglu_residual_bf16() -> Plan {
    let mut p = PlanBuilder::new("swiglu_residual_bf16", DType::Bf16);
    let x = p.dense("x", Input, &["T", "512"]);
    let wg = p.dense("gate.weight", Weight, &["1376", "512"]);
    let wu = p.dense("up.weight", Weight, &["1376", "512"]);
    let wd = p.dense("down.weight", Weight, &["512", "1376"]);
    let h = p.dense("h", Intermediate, &["T", "1376"]);
    let y = p.dense("y", Output, &["T", "512"]);
    let gate = smallvec![Epilogue::Act(Activation::Silu)];
    p.kernel(
        "dual_gemm_silu_bf16_nt_0",
        dual_gemm(gate, smallvec![], smallvec![]),
        &[x, wg, wu],
        h,
    );
    let down = gemm(N, T, smallvec![Epilogue::Add { operand: 2 }]);
    p.kernel("gemm_add_bf16_nt_1", down, &[h, wd, x], y);
    p.finish()
}

/// `y = relu(x W^T + b) + x` in f16 with batch dims `[B, T, 512]` flattened into M.
pub fn batched_residual_f16() -> Plan {
    let mut p = PlanBuilder::new("batched_residual_f16", DType::F16);
    let x = p.dense("x", Input, &["B", "T", "512"]);
    let w = p.dense("fc.weight", Weight, &["512", "512"]);
    let b = p.dense("fc.bias", Weight, &["512"]);
    let y = p.dense("y", Output, &["B", "T", "512"]);
    let op = gemm(
        N,
        T,
        smallvec![
            Epilogue::Bias { operand: 2 },
            Epilogue::Act(Activation::Relu),
            Epilogue::Add { operand: 3 }
        ],
    );
    p.kernel("gemm_bias_relu_add_f16_nt_0", op, &[x, w, b, x], y);
    p.finish()
}

/// A GeGLU with biases and a gating product, f16: `y = (gelu(x Wg^T + bg) * (x Wu^T + bu)) * s`.
pub fn geglu_mul_f16() -> Plan {
    let mut p = PlanBuilder::new("geglu_mul_f16", DType::F16);
    let x = p.dense("x", Input, &["T", "256"]);
    let s = p.dense("s", Input, &["T", "384"]);
    let wg = p.dense("gate.weight", Weight, &["384", "256"]);
    let wu = p.dense("up.weight", Weight, &["384", "256"]);
    let bg = p.dense("gate.bias", Weight, &["384"]);
    let bu = p.dense("up.bias", Weight, &["384"]);
    let y = p.dense("y", Output, &["T", "384"]);
    let op = dual_gemm(
        smallvec![
            Epilogue::Bias { operand: 3 },
            Epilogue::Act(Activation::Gelu)
        ],
        smallvec![Epilogue::Bias { operand: 4 }],
        smallvec![Epilogue::Mul { operand: 5 }],
    );
    p.kernel(
        "dual_gemm_bias_gelu_bias_mul_f16_nt_0",
        op,
        &[x, wg, wu, bg, bu, s],
        y,
    );
    p.finish()
}

/// Shapes that fit no tile and no vector: M = 1, odd K = 7, N = 5, bf16, sigmoid.
pub fn tiny_odd_bf16() -> Plan {
    let mut p = PlanBuilder::new("tiny_odd_bf16", DType::Bf16);
    let x = p.dense("x", Input, &["1", "7"]);
    let w = p.dense("fc.weight", Weight, &["5", "7"]);
    let b = p.dense("fc.bias", Weight, &["5"]);
    let y = p.dense("y", Output, &["1", "5"]);
    let op = gemm(
        N,
        T,
        smallvec![
            Epilogue::Bias { operand: 2 },
            Epilogue::Act(Activation::Sigmoid)
        ],
    );
    p.kernel("gemm_bias_sigmoid_bf16_nt_0", op, &[x, w, b], y);
    p.finish()
}

/// Transposed layouts in bf16: A read from a row-major `[67, T]` input (`x^T`, row stride T, a
/// symbol) and B a row-major `[67, 33]` weight (n contiguous, odd row stride): `tanh(x^T W)`.
pub fn transposed_operands_bf16() -> Plan {
    let mut p = PlanBuilder::new("transposed_operands_bf16", DType::Bf16);
    let x = p.dense("x", Input, &["67", "T"]);
    let w = p.dense("w", Weight, &["67", "33"]);
    let y = p.dense("y", Output, &["T", "33"]);
    let op = gemm(T, N, smallvec![Epilogue::Act(Activation::Tanh)]);
    p.kernel("gemm_tanh_bf16_tn_0", op, &[x, w], y);
    p.finish()
}

/// The heaviest tensor-core instance: a dual GEMM with both operands in the transposed layouts
/// and an epilogue operand at every step, bf16: `y = relu(x^T Wg + bg) * (x^T Wu + bu) + r`, x
/// stored `[96, T]`, the weights row-major `[96, 80]`.
pub fn dual_transposed_bf16() -> Plan {
    let mut p = PlanBuilder::new("dual_transposed_bf16", DType::Bf16);
    let x = p.dense("x", Input, &["96", "T"]);
    let r = p.dense("r", Input, &["T", "80"]);
    let wg = p.dense("wg", Weight, &["96", "80"]);
    let wu = p.dense("wu", Weight, &["96", "80"]);
    let bg = p.dense("bg", Weight, &["80"]);
    let bu = p.dense("bu", Weight, &["80"]);
    let y = p.dense("y", Output, &["T", "80"]);
    let op = Op::Gemm(Gemm {
        a: T,
        b: N,
        dual: Some(Dual {
            gate: smallvec![
                Epilogue::Bias { operand: 3 },
                Epilogue::Act(Activation::Relu)
            ],
            up: smallvec![Epilogue::Bias { operand: 4 }],
        }),
        epilogue: smallvec![Epilogue::Add { operand: 5 }],
    });
    p.kernel(
        "dual_gemm_bias_relu_bias_add_bf16_tn_0",
        op,
        &[x, wg, wu, bg, bu, r],
        y,
    );
    p.finish()
}

/// An unfused matmul, f16: `y = x @ w` with `w` a row-major `[96, 40]` weight.
pub fn matmul_f16() -> Plan {
    let mut p = PlanBuilder::new("matmul_f16", DType::F16);
    let x = p.dense("x", Input, &["T", "96"]);
    let w = p.dense("w", Weight, &["96", "40"]);
    let y = p.dense("y", Output, &["T", "40"]);
    p.kernel("matmul_f16_0", Op::MatMul, &[x, w], y);
    p.finish()
}

/// The GPT-2 MLP in f32: `y = (gelu_tanh(x W1^T + b1)) W2^T + b2`, two kernels.
pub fn gpt2_mlp_f32() -> Plan {
    let mut p = PlanBuilder::new("gpt2_mlp_f32", DType::F32);
    let x = p.dense("x", Input, &["T", "768"]);
    let w1 = p.dense("fc1.weight", Weight, &["3072", "768"]);
    let b1 = p.dense("fc1.bias", Weight, &["3072"]);
    let w2 = p.dense("fc2.weight", Weight, &["768", "3072"]);
    let b2 = p.dense("fc2.bias", Weight, &["768"]);
    let h = p.dense("h", Intermediate, &["T", "3072"]);
    let y = p.dense("y", Output, &["T", "768"]);
    let fc1 = gemm(
        N,
        T,
        smallvec![
            Epilogue::Bias { operand: 2 },
            Epilogue::Act(Activation::GeluTanh)
        ],
    );
    p.kernel("gemm_bias_gelu_tanh_f32_nt_0", fc1, &[x, w1, b1], h);
    let fc2 = gemm(N, T, smallvec![Epilogue::Bias { operand: 2 }]);
    p.kernel("gemm_bias_f32_nt_1", fc2, &[h, w2, b2], y);
    p.finish()
}

/// A SwiGLU gate/up in f32 with odd K and a transposed activation input:
/// `y = silu(x^T Wg^T) * (x^T Wu^T)` with x stored `[101, T]`.
pub fn swiglu_f32() -> Plan {
    let mut p = PlanBuilder::new("swiglu_f32", DType::F32);
    let x = p.dense("x", Input, &["101", "T"]);
    let wg = p.dense("gate.weight", Weight, &["200", "101"]);
    let wu = p.dense("up.weight", Weight, &["200", "101"]);
    let y = p.dense("y", Output, &["T", "200"]);
    let op = Op::Gemm(Gemm {
        a: T,
        b: T,
        dual: Some(Dual {
            gate: smallvec![Epilogue::Act(Activation::Silu)],
            up: smallvec![],
        }),
        epilogue: smallvec![],
    });
    p.kernel("dual_gemm_silu_f32_tt_0", op, &[x, wg, wu], y);
    p.finish()
}

/// Elementwise kernels in `dtype`: `a = x + y` with `y` a transposed view (strides `[1, T]`),
/// `z` materialising the transpose of the `[64, T]` input `u`, `m = a * z`, `r = m + bias` (a
/// row broadcast) and `o = gelu(r)`.
pub fn elementwise(dtype: DType) -> Plan {
    let mut p = PlanBuilder::new(&format!("elementwise_{}", dtype.name()), dtype);
    let x = p.dense("x", Input, &["T", "64"]);
    let mut yt = TensorType::contiguous(dtype, shape(&["64", "T"]));
    yt.shape.swap(0, 1);
    yt.strides.swap(0, 1);
    let y = p.buffer("y", Input, yt);
    let u = p.dense("u", Input, &["64", "T"]);
    let bias = p.dense("bias", Weight, &["64"]);
    let a = p.dense("a", Intermediate, &["T", "64"]);
    let z = p.dense("z", Intermediate, &["T", "64"]);
    let m = p.dense("m", Intermediate, &["T", "64"]);
    let r = p.dense("r", Intermediate, &["T", "64"]);
    let o = p.dense("o", Output, &["T", "64"]);
    let d = dtype.name();
    p.kernel(&format!("add_{d}_0"), Op::Add, &[x, y], a);
    p.kernel(&format!("transpose_{d}_1"), Op::Transpose, &[u], z);
    p.kernel(&format!("mul_{d}_2"), Op::Mul, &[a, z], m);
    p.kernel(&format!("add_{d}_3"), Op::Add, &[m, bias], r);
    p.kernel(&format!("gelu_{d}_4"), Op::Act(Activation::Gelu), &[r], o);
    p.finish()
}

/// A GEMM whose B is written by the kernel before it, bf16: `h = relu(a Wa^T)`, `[1024, 768]`,
/// then `y = x h^T`. Its B is not constant through a run, so nothing of it may be read before the
/// kernel before has finished (no early launch of its small-M entries).
pub fn intermediate_b_bf16() -> Plan {
    let mut p = PlanBuilder::new("intermediate_b_bf16", DType::Bf16);
    let a = p.dense("a", Input, &["1024", "768"]);
    let wa = p.dense("fc.weight", Weight, &["768", "768"]);
    let h = p.dense("h", Intermediate, &["1024", "768"]);
    let x = p.dense("x", Input, &["T", "768"]);
    let y = p.dense("y", Output, &["T", "1024"]);
    let relu = gemm(N, T, smallvec![Epilogue::Act(Activation::Relu)]);
    p.kernel("gemm_relu_bf16_nt_0", relu, &[a, wa], h);
    p.kernel("gemm_bf16_nt_1", gemm(N, T, smallvec![]), &[x, h], y);
    p.finish()
}

/// Every sample plan.
pub fn all() -> Vec<Plan> {
    vec![
        linear_bias_bf16(),
        linear_gelu_tanh_bf16(),
        swiglu_residual_bf16(),
        batched_residual_f16(),
        geglu_mul_f16(),
        tiny_odd_bf16(),
        transposed_operands_bf16(),
        dual_transposed_bf16(),
        matmul_f16(),
        gpt2_mlp_f32(),
        swiglu_f32(),
        elementwise(DType::F32),
        elementwise(DType::Bf16),
    ]
}

/// A block pattern over an `[out, inp]` weight keeping the blocks where `keep(row, col)` holds.
pub fn block_pattern(
    block: [u32; 2],
    out: u64,
    inp: u64,
    keep: impl Fn(u32, u32) -> bool,
) -> BlockPattern {
    let rows = (out / u64::from(block[0])) as u32;
    let cols = (inp / u64::from(block[1])) as u32;
    let kept = (0..rows)
        .flat_map(|r| (0..cols).map(move |c| (r, c)))
        .filter(|&(r, c)| keep(r, c))
        .collect();
    BlockPattern {
        block,
        out,
        inp,
        kept,
    }
}

fn sparse_gemm(
    a: MatLayout,
    pattern: BlockPattern,
    dual: Option<Dual>,
    epilogue: EpilogueChain,
) -> Op {
    Op::SparseGemm(SparseGemm {
        gemm: Gemm {
            a,
            b: T,
            dual,
            epilogue,
        },
        pattern: Arc::new(pattern),
    })
}

/// A packed `[kept, rows, cols]` weight buffer for `pattern`.
fn packed(p: &mut PlanBuilder, name: &str, pattern: &BlockPattern) -> BufferId {
    let dims = pattern.packed_shape().map(|d| d.to_string());
    let dims: Vec<&str> = dims.iter().map(String::as_str).collect();
    p.dense(name, Weight, &dims)
}

/// `y = gelu_tanh(x W^T + b)`, bf16, 32x32 blocks of W `[128, 96]`; block row 1 keeps nothing.
pub fn bsr_linear_gelu_bf16() -> Plan {
    let pat = block_pattern([32, 32], 128, 96, |r, c| {
        r != 1 && (r + c) % 2 == 0 || r == 3
    });
    let mut p = PlanBuilder::new("bsr_linear_gelu_bf16", DType::Bf16);
    let x = p.dense("x", Input, &["T", "96"]);
    let w = packed(&mut p, "fc.weight.bsr", &pat);
    let b = p.dense("fc.bias", Weight, &["128"]);
    let y = p.dense("y", Output, &["T", "128"]);
    let op = sparse_gemm(
        N,
        pat,
        None,
        smallvec![
            Epilogue::Bias { operand: 2 },
            Epilogue::Act(Activation::GeluTanh)
        ],
    );
    p.kernel("bsr_gemm_bias_gelu_tanh_bf16_nt_b32x32", op, &[x, w, b], y);
    p.finish()
}

/// `y = (silu(x Wg^T) * (x Wu^T)) + r`, f16, 16x16 blocks, W `[48, 64]`, one pattern for both.
pub fn bsr_swiglu_residual_f16() -> Plan {
    let pat = block_pattern([16, 16], 48, 64, |r, c| (r * 3 + c) % 4 != 1);
    let mut p = PlanBuilder::new("bsr_swiglu_residual_f16", DType::F16);
    let x = p.dense("x", Input, &["T", "64"]);
    let wg = packed(&mut p, "gate.weight.bsr", &pat);
    let wu = packed(&mut p, "up.weight.bsr", &pat);
    let r = p.dense("r", Input, &["T", "48"]);
    let y = p.dense("y", Output, &["T", "48"]);
    let dual = Dual {
        gate: smallvec![Epilogue::Act(Activation::Silu)],
        up: smallvec![],
    };
    let op = sparse_gemm(N, pat, Some(dual), smallvec![Epilogue::Add { operand: 3 }]);
    p.kernel(
        "bsr_dual_gemm_silu_mul_add_f16_nt_b16x16",
        op,
        &[x, wg, wu, r],
        y,
    );
    p.finish()
}

/// Tall and wide blocks, bf16: 192x32 blocks (two CTAs per block row) of W `[384, 64]`, and 16x64
/// blocks (two k slices per block) of W `[64, 192]` reading a transposed A.
pub fn bsr_rectangular_bf16() -> Plan {
    let tall = block_pattern([192, 32], 384, 64, |r, c| r == 1 || c == 0);
    let wide = block_pattern([16, 64], 64, 384, |r, c| (r + c) % 3 != 0);
    let mut p = PlanBuilder::new("bsr_rectangular_bf16", DType::Bf16);
    let x = p.dense("x", Input, &["T", "64"]);
    let w1 = packed(&mut p, "w1.bsr", &tall);
    let h = p.dense("h", Output, &["T", "384"]);
    p.kernel(
        "bsr_gemm_relu_bf16_nt_b192x32",
        sparse_gemm(N, tall, None, smallvec![Epilogue::Act(Activation::Relu)]),
        &[x, w1],
        h,
    );
    let xt = p.dense("xt", Input, &["384", "T"]);
    let w2 = packed(&mut p, "w2.bsr", &wide);
    let y = p.dense("y", Output, &["T", "64"]);
    p.kernel(
        "bsr_gemm_bf16_tt_b16x64",
        sparse_gemm(T, wide, None, smallvec![]),
        &[xt, w2],
        y,
    );
    p.finish()
}

/// Blocks that are not multiples of 8 or 16, f16: 8x12 (scalar loads) with a residual.
pub fn bsr_odd_f16() -> Plan {
    let pat = block_pattern([8, 12], 24, 36, |r, c| r != c);
    let mut p = PlanBuilder::new("bsr_odd_f16", DType::F16);
    let x = p.dense("x", Input, &["T", "36"]);
    let w = packed(&mut p, "w.bsr", &pat);
    let r = p.dense("r", Input, &["T", "24"]);
    let y = p.dense("y", Output, &["T", "24"]);
    let op = sparse_gemm(N, pat, None, smallvec![Epilogue::Add { operand: 2 }]);
    p.kernel("bsr_gemm_add_f16_nt_b8x12", op, &[x, w, r], y);
    p.finish()
}

/// f32 on the FFMA pipes: 64x64 blocks with bias and relu; a dual GEMM of 32x32 blocks; 3x5
/// blocks (scalar loads) with a transposed A.
pub fn bsr_f32() -> Plan {
    let big = block_pattern([64, 64], 128, 256, |r, c| (r + c) % 2 == 1);
    let mid = block_pattern([32, 32], 128, 128, |r, c| r != 2 && c <= r);
    let odd = block_pattern([3, 5], 9, 130, |r, c| (r + c) % 2 == 0);
    let mut p = PlanBuilder::new("bsr_f32", DType::F32);
    let x = p.dense("x", Input, &["T", "256"]);
    let w1 = packed(&mut p, "w1.bsr", &big);
    let b1 = p.dense("b1", Weight, &["128"]);
    let h = p.dense("h", Intermediate, &["T", "128"]);
    p.kernel(
        "bsr_gemm_bias_relu_f32_nt_b64x64",
        sparse_gemm(
            N,
            big,
            None,
            smallvec![
                Epilogue::Bias { operand: 2 },
                Epilogue::Act(Activation::Relu)
            ],
        ),
        &[x, w1, b1],
        h,
    );
    let wg = packed(&mut p, "wg.bsr", &mid);
    let wu = packed(&mut p, "wu.bsr", &mid);
    let g = p.dense("g", Output, &["T", "128"]);
    let dual = Dual {
        gate: smallvec![Epilogue::Act(Activation::Gelu)],
        up: smallvec![],
    };
    p.kernel(
        "bsr_dual_gemm_gelu_mul_f32_nt_b32x32",
        sparse_gemm(N, mid, Some(dual), smallvec![]),
        &[h, wg, wu],
        g,
    );
    let ht = p.dense("ht", Input, &["130", "T"]);
    let w3 = packed(&mut p, "w3.bsr", &odd);
    let y = p.dense("y", Output, &["T", "9"]);
    p.kernel(
        "bsr_gemm_tanh_f32_tt_b3x5",
        sparse_gemm(T, odd, None, smallvec![Epilogue::Act(Activation::Tanh)]),
        &[ht, w3],
        y,
    );
    p.finish()
}

/// f32 block-sparse GEMMs the FP64 tensor-core kernel takes when chosen (tests/fp64_tensor.rs):
/// 32 x 32 blocks with bias and GELU (block row 1 keeps nothing), 8 x 4 blocks, and 24 x 8
/// blocks (a tile of 32 columns over 24 rows). Not in [`sparse`]: the default kernels of these
/// shapes are `bsr_f32`'s.
pub fn bsr_fp64_tensor_f32() -> Plan {
    let b32 = block_pattern([32, 32], 128, 256, |r, c| r != 1 && (r + 2 * c) % 3 != 0);
    let b8x4 = block_pattern([8, 4], 24, 128, |r, c| (r * 7 + c) % 4 == 1);
    let b24x8 = block_pattern([24, 8], 48, 24, |r, c| r + c != 1);
    let mut p = PlanBuilder::new("bsr_fp64_tensor_f32", DType::F32);
    let x = p.dense("x", Input, &["T", "256"]);
    let w1 = packed(&mut p, "w1.bsr", &b32);
    let b1 = p.dense("b1", Weight, &["128"]);
    let h = p.dense("h", Intermediate, &["T", "128"]);
    p.kernel(
        "bsr_gemm_bias_gelu_tanh_f32_nt_b32x32",
        sparse_gemm(
            N,
            b32,
            None,
            smallvec![
                Epilogue::Bias { operand: 2 },
                Epilogue::Act(Activation::GeluTanh)
            ],
        ),
        &[x, w1, b1],
        h,
    );
    let w2 = packed(&mut p, "w2.bsr", &b8x4);
    let y = p.dense("y", Intermediate, &["T", "24"]);
    p.kernel(
        "bsr_gemm_f32_nt_b8x4",
        sparse_gemm(N, b8x4, None, smallvec![]),
        &[h, w2],
        y,
    );
    let w3 = packed(&mut p, "w3.bsr", &b24x8);
    let z = p.dense("z", Output, &["T", "48"]);
    p.kernel(
        "bsr_gemm_relu_f32_nt_b24x8",
        sparse_gemm(N, b24x8, None, smallvec![Epilogue::Act(Activation::Relu)]),
        &[y, w3],
        z,
    );
    p.finish()
}

/// The block-sparse sample plans. Not in [`all`]: a checker of [`all`] on the GPU must first know
/// the `sparse_gemm` op.
pub fn sparse() -> Vec<Plan> {
    vec![
        bsr_linear_gelu_bf16(),
        bsr_swiglu_residual_f16(),
        bsr_rectangular_bf16(),
        bsr_odd_f16(),
        bsr_f32(),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_sample_plan_is_well_formed() {
        for p in super::all().into_iter().chain(super::sparse()) {
            p.check()
                .unwrap_or_else(|e| panic!("plan `{}`: {e:?}", p.name));
        }
    }
}
