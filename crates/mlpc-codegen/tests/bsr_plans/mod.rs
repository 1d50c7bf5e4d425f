//! Block-sparse plans for the Hopper kernel's tests: every block shape it takes (square 16, 32,
//! 64; tall, wide and a 48-wide slice), plain and dual, and the edge densities (an empty block
//! row, an empty group, a single kept block, every block kept).

use mlpc_codegen::samples::PlanBuilder;
use mlpc_ir::{
    Activation, BlockPattern, BufferKind, DType, Dual, Epilogue, EpilogueChain, Gemm, MatLayout,
    Op, Plan, SparseGemm,
};
use smallvec::smallvec;
use std::sync::Arc;

/// The pattern of `block` blocks over an `[out, inp]` weight that keeps `(r, c)` when `keep` says
/// so.
/// Block (r, c) kept by a hash of its position, with probability `below / 256`.
fn scattered(r: u32, c: u32, below: u32) -> bool {
    (r.wrapping_mul(2654435761) ^ c.wrapping_mul(40503)).wrapping_mul(2246822519) >> 24 < below
}

pub fn pattern(
    block: [u32; 2],
    out: u64,
    inp: u64,
    mut keep: impl FnMut(u32, u32) -> bool,
) -> BlockPattern {
    let rows = (out / u64::from(block[0])) as u32;
    let cols = (inp / u64::from(block[1])) as u32;
    let kept = (0..rows)
        .flat_map(|r| (0..cols).map(move |c| (r, c)))
        .filter(|&(r, c)| keep(r, c))
        .collect();
    let p = BlockPattern {
        block,
        out,
        inp,
        kept,
    };
    p.check().unwrap();
    p
}

/// One sparse GEMM kernel `y = epi(x W^T)` (or its dual form) over `x [T, inp]`, with a bias
/// when `bias` and a residual `r [T, out]` when `residual`.
pub fn plan(
    name: &str,
    dtype: DType,
    pat: BlockPattern,
    dual: bool,
    bias: bool,
    residual: bool,
) -> Plan {
    plan_with_a(name, dtype, pat, dual, bias, residual, MatLayout::N)
}

/// `plan` with the activation stored as `a` says: `x [T, inp]` for `N`, `xt [inp, T]` read
/// transposed for `T`.
pub fn plan_with_a(
    name: &str,
    dtype: DType,
    pat: BlockPattern,
    dual: bool,
    bias: bool,
    residual: bool,
    a: MatLayout,
) -> Plan {
    let (out, inp) = (pat.out.to_string(), pat.inp.to_string());
    let packed: Vec<String> = pat.packed_shape().iter().map(|d| d.to_string()).collect();
    let packed: Vec<&str> = packed.iter().map(String::as_str).collect();
    let mut p = PlanBuilder::new(name, dtype);
    let x = match a {
        MatLayout::N => p.dense("x", BufferKind::Input, &["T", &inp]),
        MatLayout::T => p.dense("xt", BufferKind::Input, &[&inp, "T"]),
    };
    let mut args = vec![x, p.dense("w.bsr", BufferKind::Weight, &packed)];
    if dual {
        args.push(p.dense("w_up.bsr", BufferKind::Weight, &packed));
    }
    let mut epilogue: EpilogueChain = smallvec![];
    if bias {
        epilogue.push(Epilogue::Bias {
            operand: args.len(),
        });
        args.push(p.dense("bias", BufferKind::Weight, &[&out]));
    }
    if !dual {
        epilogue.push(Epilogue::Act(Activation::GeluTanh));
    }
    if residual {
        epilogue.push(Epilogue::Add {
            operand: args.len(),
        });
        args.push(p.dense("r", BufferKind::Input, &["T", &out]));
    }
    let y = p.dense("y", BufferKind::Output, &["T", &out]);
    let op = Op::SparseGemm(SparseGemm {
        gemm: Gemm {
            a,
            b: MatLayout::T,
            dual: dual.then(|| Dual {
                gate: smallvec![Epilogue::Act(Activation::Silu)],
                up: smallvec![],
            }),
            epilogue,
        },
        pattern: Arc::new(pat),
    });
    p.kernel(name, op, &args, y);
    p.finish()
}

/// The plans: (block shape, weight, pattern, dual) chosen to reach every configuration.
pub fn all() -> Vec<Plan> {
    use DType::{Bf16, F16};
    vec![
        // 32x32, 12 block rows: two groups of 6 (wide groups spread the rows evenly); block
        // row 1 keeps nothing and block row 9 keeps a single block.
        plan(
            "b32x32_bias_gelu",
            Bf16,
            pattern([32, 32], 384, 256, |r, c| {
                r != 1 && (r != 9 || c == 5) && (r * 3 + c) % 4 != 0
            }),
            false,
            true,
            false,
        ),
        // 32x32, 22 block rows, K = 4096: two groups of 11 (a 22-bit mask), and the short-grid
        // entry's three groups of 8, 8 and 6; a residual. The rows fall into nine classes of
        // equal rows, so both entries list their groups' rows by overlap (stores from
        // registers).
        plan(
            "b32x32_wide_groups",
            Bf16,
            pattern([32, 32], 704, 4096, |r, c| (r * 7 + c) % 9 < 3),
            false,
            false,
            true,
        ),
        // The same shape at about 16 % density: the groups of 11 take windows (consecutive rows,
        // stores by the copy engine), the short grid's groups of 8 pairs of kept columns, whose
        // A boxes (32 wide, not 64) come through a tensor map of their own, over rows listed by
        // overlap (the bias loaded a block row at a time); a bias.
        plan(
            "b32x32_wide_groups_pairs",
            Bf16,
            pattern([32, 32], 704, 4096, |r, c| scattered(r, c, 41)),
            false,
            true,
            false,
        ),
        // The same shape at about density 0.48, at most 17 kept blocks a window step of the
        // groups of 11: two staging buffers would leave the ring 3 stages, so the groups of 11
        // store through one (and 4 stages); the short grid's 13 slots keep two, and its groups
        // (8, 8 and 6 rows) are listed as 7, 7 and 8, balanced by their modelled cost; a bias.
        plan(
            "b32x32_wide_groups_one_staging",
            Bf16,
            pattern([32, 32], 704, 4096, |r, c| scattered(r, c, 124)),
            false,
            true,
            false,
        ),
        // The same shape at about density 0.8: a window step of 11 rows keeps up to all 22
        // blocks, whose slots would leave the ring 3 stages, so the kernel's own entry takes
        // groups of 8 (4 stages) and has no short grid; their rows (8, 8 and 6) are listed as 7,
        // 8 and 7, balanced by their modelled cost; a bias.
        plan(
            "b32x32_dense_groups_of_eight",
            Bf16,
            pattern([32, 32], 704, 4096, |r, c| scattered(r, c, 205)),
            false,
            true,
            false,
        ),
        // 16x16 (G = 16), dual with a residual.
        plan(
            "b16x16_dual_residual",
            F16,
            pattern([16, 16], 256, 128, |r, c| (r + 2 * c) % 3 != 1),
            true,
            false,
            true,
        ),
        // 32x32 (G = 8), eleven block rows in seven classes of equal rows: the groups are
        // listed by overlap (the second with empty slots), their accumulators start at the
        // bias, and each block row is stored in a box of its own; a bias and a residual.
        plan(
            "b32x32_listed_bias",
            Bf16,
            pattern([32, 32], 352, 1024, |r, c| (r * 5 + c) % 7 < 2),
            false,
            true,
            true,
        ),
        // 32x32 dual (the portable kernel's dual 32-column tiles).
        plan(
            "b32x32_dual",
            Bf16,
            pattern([32, 32], 128, 64, |r, c| (r + c) % 2 == 0),
            true,
            false,
            false,
        ),
        // 16x32 dual with the activation stored transposed (the portable kernel's dual
        // 16-column tiles over 32-deep k slices of a transposed A, which need its 256-thread
        // budget).
        plan_with_a(
            "b16x32_dual_transposed_a",
            Bf16,
            pattern([16, 32], 64, 128, |r, c| (r + c) % 2 == 0),
            true,
            false,
            false,
            MatLayout::T,
        ),
        // 64x64 (G = 4): every block kept.
        plan(
            "b64x64_full",
            Bf16,
            pattern([64, 64], 256, 512, |_, _| true),
            false,
            true,
            true,
        ),
        // 64x64 dual (G = 2): the second group keeps nothing.
        plan(
            "b64x64_dual_empty_group",
            Bf16,
            pattern([64, 64], 256, 192, |r, c| r < 2 && (r + c) % 2 == 0),
            true,
            true,
            false,
        ),
        // A single kept block of the whole weight.
        plan(
            "b32x32_single_block",
            F16,
            pattern([32, 32], 128, 128, |r, c| (r, c) == (2, 3)),
            false,
            false,
            false,
        ),
        // Rectangular: 32x64 (BK 64, G 8), 64x32, a 16x48 (48-wide slices of 32B atoms) and
        // 16x128 (two 64-wide slices per block).
        plan(
            "b32x64",
            Bf16,
            pattern([32, 64], 256, 512, |r, c| (r + c) % 3 == 0),
            false,
            true,
            false,
        ),
        plan(
            "b64x32_dual",
            F16,
            pattern([64, 32], 128, 128, |r, c| r != c),
            true,
            false,
            false,
        ),
        plan(
            "b16x48",
            Bf16,
            pattern([16, 48], 96, 192, |r, c| (r * c) % 2 == 0),
            false,
            false,
            true,
        ),
        plan(
            "b16x128",
            Bf16,
            pattern([16, 128], 64, 256, |r, c| r % 2 == c),
            false,
            true,
            false,
        ),
        // Tall: 192x32, one block row per CTA.
        plan(
            "b192x32",
            F16,
            pattern([192, 32], 384, 64, |r, c| r == 1 || c == 0),
            false,
            false,
            false,
        ),
        // 8x16 (G = 16, 8-wide wgmma).
        plan(
            "b8x16",
            Bf16,
            pattern([8, 16], 64, 64, |r, c| (r + c) % 2 == 0),
            false,
            true,
            false,
        ),
        // Slots that fill a part of a swizzle period, the stage padded to whole ones: one 16x16
        // block row (one 512-byte slot), and 24x16 blocks (768-byte slots, which fill periods
        // in fours) in groups of eight rows whose steps keep up to five blocks, with short-grid
        // entries of five and two rows.
        plan(
            "b16x16_one_row",
            Bf16,
            pattern([16, 16], 16, 64, |_, c| c != 2),
            false,
            false,
            false,
        ),
        plan(
            "b24x16_padded_stages",
            F16,
            pattern([24, 16], 192, 256, |r, c| (r + 3 * c) % 8 < 5),
            false,
            true,
            false,
        ),
    ]
}
