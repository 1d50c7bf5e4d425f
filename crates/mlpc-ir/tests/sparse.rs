//! Block-sparse GEMMs in the IR: packing, typing, the text form, serialisation, and the reference
//! interpreter against the dense GEMM with the pruned weight.

use mlpc_ir::{
    interpret, verify, Activation, BlockPattern, DType, Dim, Dual, Epilogue, Gemm, Graph,
    HostTensor, MatLayout, Op, Shape, SparseGemm, TensorType,
};
use proptest::prelude::*;
use smallvec::smallvec;
use std::collections::BTreeMap;
use std::sync::Arc;

fn tensor(shape: &[usize], f: impl Fn(usize) -> f64) -> HostTensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(f).collect();
    HostTensor::from_f64(DType::F32, shape.to_vec(), &v).unwrap()
}

/// A pseudo-random but exactly representable value.
fn val(i: usize, salt: usize) -> f64 {
    (((i * 7919 + salt * 104_729) % 61) as f64 - 30.0) / 16.0
}

fn pattern(block: [u32; 2], out: u64, inp: u64, kept: &[(u32, u32)]) -> BlockPattern {
    BlockPattern {
        block,
        out,
        inp,
        kept: kept.to_vec(),
    }
}

fn x_type(k: u64) -> TensorType {
    TensorType::contiguous(DType::F32, smallvec![Dim::sym("T"), Dim::Fixed(k)] as Shape)
}

/// `y = epi(x @ W^T)` twice: densely with the unpacked weight, and as a sparse GEMM; returns both
/// outputs for `m` rows.
fn dense_and_sparse(
    p: &BlockPattern,
    dual: bool,
    epilogue: Vec<Epilogue>,
    m: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (n, k) = (p.out as usize, p.inp as usize);
    let dense_g = tensor(&[n, k], |i| val(i, 1));
    let dense_u = tensor(&[n, k], |i| val(i, 2));
    let packed_g = p.pack(&dense_g, false).unwrap();
    let packed_u = p.pack(&dense_u, false).unwrap();
    let pruned_g = p.unpack(&packed_g).unwrap();
    let pruned_u = p.unpack(&packed_u).unwrap();
    let gemm = Gemm {
        a: MatLayout::N,
        b: MatLayout::T,
        dual: dual.then(|| Dual {
            gate: smallvec![Epilogue::Act(Activation::Silu)],
            up: smallvec![],
        }),
        epilogue: epilogue.into_iter().collect(),
    };
    let run = |sparse: bool| {
        let mut g = Graph::new("s");
        let x = g.add_input("x", x_type(k as u64));
        let (wg, wu) = if sparse {
            (packed_g.clone(), packed_u.clone())
        } else {
            (pruned_g.clone(), pruned_u.clone())
        };
        let mut ops = vec![x, g.add_weight("wg", wg).unwrap()];
        if dual {
            ops.push(g.add_weight("wu", wu).unwrap());
        }
        if gemm.epilogue.iter().any(|s| s.operand().is_some()) {
            ops.push(g.add_weight("bias", tensor(&[n], |i| val(i, 3))).unwrap());
        }
        let op = if sparse {
            Op::SparseGemm(SparseGemm {
                gemm: gemm.clone(),
                pattern: Arc::new(p.clone()),
            })
        } else {
            Op::Gemm(gemm.clone())
        };
        let y = g.add("y", op, &ops).unwrap();
        g.add_output("y", y);
        verify(&g).unwrap();
        let inputs = BTreeMap::from([("x".to_string(), tensor(&[m, k], |i| val(i, 4)))]);
        interpret(&g, &inputs).unwrap()["y"].to_f64()
    };
    (run(false), run(true))
}

#[test]
fn packing_round_trips_in_both_orientations() {
    let p = pattern([2, 3], 4, 6, &[(0, 1), (1, 0), (1, 1)]);
    let w = tensor(&[4, 6], |i| i as f64 + 1.0);
    let packed = p.pack(&w, false).unwrap();
    assert_eq!(packed.shape(), [3, 2, 3]);
    // Block (0, 1): rows 0-1, cols 3-5.
    assert_eq!(&packed.to_f64()[..6], &[4.0, 5.0, 6.0, 10.0, 11.0, 12.0]);
    let back = p.unpack(&packed).unwrap().to_f64();
    for r in 0..4 {
        for c in 0..6 {
            let kept = p.kept.contains(&((r / 2) as u32, (c / 3) as u32));
            let want = if kept { (r * 6 + c + 1) as f64 } else { 0.0 };
            assert_eq!(back[r * 6 + c], want, "({r}, {c})");
        }
    }
    // The same weight stored transposed ([K, N]) packs to the same blocks.
    let wt = tensor(&[6, 4], |i| ((i % 4) * 6 + i / 4 + 1) as f64);
    assert_eq!(p.pack(&wt, true).unwrap(), packed);
    assert!(p.pack(&wt, false).is_none());
    assert_eq!(p.row_ptr(), vec![0, 1, 3]);
    assert_eq!(p.density(), 0.75);
}

/// A weight large enough to be packed on every core packs to its definition, each kept block's
/// elements in place, in both orientations; so does one of blocks that are not a whole number of
/// the cores' shares.
#[test]
fn large_weights_pack_to_their_definition() {
    for (block, n, k) in [([16u32, 16u32], 512usize, 1024usize), ([8, 24], 528, 1320)] {
        let [br, bc] = block.map(|d| d as usize);
        let kept: Vec<(u32, u32)> = (0..n / br)
            .flat_map(|r| (0..k / bc).map(move |c| (r as u32, c as u32)))
            .filter(|&(r, c)| (r * 7 + c * 3) % 5 < 3)
            .collect();
        let p = pattern(block, n as u64, k as u64, &kept);
        let w = tensor(&[n, k], |i| val(i, 9));
        let wt = tensor(&[k, n], |i| val((i % n) * k + i / n, 9));
        let packed = p.pack(&w, false).unwrap();
        assert!(packed.bytes().len() >= 1 << 20, "{block:?}: not large");
        let v = packed.to_f64();
        let dense = w.to_f64();
        for (b, &(r, c)) in kept.iter().enumerate() {
            for i in 0..br {
                for j in 0..bc {
                    let want = dense[(r as usize * br + i) * k + c as usize * bc + j];
                    assert_eq!(
                        v[(b * br + i) * bc + j],
                        want,
                        "{block:?} block {b} ({i}, {j})"
                    );
                }
            }
        }
        assert_eq!(p.pack(&wt, true).unwrap(), packed, "{block:?} transposed");
    }
}

#[test]
fn invalid_patterns_are_named() {
    let bad = |p: BlockPattern| p.check().unwrap_err();
    assert!(bad(pattern([3, 2], 4, 4, &[(0, 0)])).contains("does not divide"));
    assert!(bad(pattern([2, 2], 4, 4, &[])).contains("no block"));
    assert!(bad(pattern([2, 2], 4, 4, &[(1, 0), (0, 1)])).contains("not sorted"));
    assert!(bad(pattern([2, 2], 4, 4, &[(0, 0), (0, 0)])).contains("not sorted"));
    assert!(bad(pattern([2, 2], 4, 4, &[(0, 2)])).contains("outside the 2x2 grid"));
    assert!(bad(pattern([0, 2], 4, 4, &[(0, 0)])).contains("zero side"));
}

#[test]
fn text_form_and_verifier() {
    let p = pattern([2, 2], 4, 4, &[(0, 0), (1, 1)]);
    let mut g = Graph::new("t");
    let x = g.add_input("x", x_type(4));
    let w = g
        .add_weight("w.bsr", tensor(&[2, 2, 2], |i| i as f64))
        .unwrap();
    let b = g.add_weight("b", tensor(&[4], |_| 0.5)).unwrap();
    let op = Op::SparseGemm(SparseGemm {
        gemm: Gemm {
            a: MatLayout::N,
            b: MatLayout::T,
            dual: None,
            epilogue: smallvec![
                Epilogue::Bias { operand: 2 },
                Epilogue::Act(Activation::Relu)
            ],
        },
        pattern: Arc::new(p.clone()),
    });
    let y = g.add("y", op.clone(), &[x, w, b]).unwrap();
    g.add_output("y", y);
    verify(&g).unwrap();
    assert_eq!(
        g.node_text(y),
        "%y = sparse_gemm.nt %x, %w.bsr blocks=2x2 kept=2/4 then bias(%b), relu : f32[T,4]"
    );
    // The op survives serialisation (plans carry it).
    let json = serde_json::to_string(&op).unwrap();
    assert_eq!(serde_json::from_str::<Op>(&json).unwrap(), op);

    // A packed weight of the wrong shape, and a pattern that is not sorted.
    let w3 = g
        .add_weight("w3", tensor(&[3, 2, 2], |i| i as f64))
        .unwrap();
    let err = g.add("y3", op.clone(), &[x, w3, b]).unwrap_err();
    assert!(
        err.message.contains("has shape [3,2,2], expected [2,2,2]"),
        "{err}"
    );
    let mut unsorted = p.clone();
    unsorted.kept.reverse();
    let op2 = Op::SparseGemm(SparseGemm {
        gemm: match &op {
            Op::SparseGemm(s) => s.gemm.clone(),
            _ => unreachable!(),
        },
        pattern: Arc::new(unsorted),
    });
    let err = g.add("y4", op2, &[x, w, b]).unwrap_err();
    assert!(err.message.contains("invalid block pattern"), "{err}");
}

#[test]
fn empty_block_rows_give_the_epilogue_of_zero() {
    // Block row 1 (outputs 2, 3) keeps nothing: y = relu(0 + bias) there.
    let p = pattern([2, 2], 4, 4, &[(0, 0), (0, 1)]);
    let (dense, sparse) = dense_and_sparse(
        &p,
        false,
        vec![
            Epilogue::Bias { operand: 2 },
            Epilogue::Act(Activation::Relu),
        ],
        3,
    );
    assert_eq!(dense, sparse);
    for row in 0..3 {
        assert_eq!(sparse[row * 4 + 2], val(2, 3).max(0.0));
        assert_eq!(sparse[row * 4 + 3], val(3, 3).max(0.0));
    }
}

#[test]
fn dual_sparse_gemm_matches_dense() {
    let p = pattern([2, 4], 6, 8, &[(0, 1), (2, 0), (2, 1)]);
    let (dense, sparse) = dense_and_sparse(&p, true, vec![], 5);
    assert_eq!(dense, sparse);
}

fn arb_pattern() -> impl Strategy<Value = BlockPattern> {
    (1u32..4, 1u32..4, 1u64..4, 1u64..4)
        .prop_flat_map(|(br, bc, rows, cols)| {
            let blocks = (rows * cols) as usize;
            (
                Just((br, bc, rows, cols)),
                proptest::collection::vec(any::<bool>(), blocks),
                0..blocks,
            )
        })
        .prop_map(|((br, bc, rows, cols), mask, forced)| {
            let kept: Vec<(u32, u32)> = (0..rows * cols)
                .filter(|&i| mask[i as usize] || i as usize == forced)
                .map(|i| ((i / cols) as u32, (i % cols) as u32))
                .collect();
            pattern([br, bc], rows * u64::from(br), cols * u64::from(bc), &kept)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any mask (with at least one block; empty block rows included) gives the dense result of
    /// the pruned weight.
    #[test]
    fn sparse_equals_dense_with_the_pruned_weight(p in arb_pattern(), m in 1usize..5, dual in any::<bool>()) {
        let epi = if dual { vec![] } else { vec![Epilogue::Bias { operand: 2 }, Epilogue::Act(Activation::GeluTanh)] };
        let (dense, sparse) = dense_and_sparse(&p, dual, epi, m);
        prop_assert_eq!(dense, sparse);
    }
}
