//! Shape, dtype and stride inference: the type each op produces from its operands' types, or a
//! message saying why the operands do not fit.

use crate::op::{Epilogue, EpilogueChain, Gemm, MatLayout, Op, SparseGemm};
use crate::types::{Dim, Shape, TensorType};

fn dims(s: &[Dim]) -> String {
    let v: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", v.join(","))
}

fn out(t: &TensorType, shape: Shape) -> Result<TensorType, String> {
    TensorType::try_contiguous(t.dtype, shape.clone())
        .ok_or_else(|| format!("the element count of {} overflows", dims(&shape)))
}

fn same_dtype(tys: &[&TensorType]) -> Result<(), String> {
    if let Some(first) = tys.first() {
        for t in &tys[1..] {
            if t.dtype != first.dtype {
                return Err(format!(
                    "operand dtypes differ: {} and {}",
                    first.dtype, t.dtype
                ));
            }
        }
    }
    Ok(())
}

/// The result type of `op` applied to operands of types `tys`.
pub fn infer(op: &Op, tys: &[&TensorType]) -> Result<TensorType, String> {
    if tys.len() != op.arity() {
        return Err(format!(
            "expects {} operand(s), got {}",
            op.arity(),
            tys.len()
        ));
    }
    same_dtype(tys)?;
    match op {
        Op::Input | Op::Weight => {
            Err("inputs and weights take their type from the model, not from operands".into())
        }
        Op::Transpose => {
            let t = tys[0];
            if t.rank() < 2 {
                return Err(format!("transpose needs rank >= 2, got {}", dims(&t.shape)));
            }
            let mut r = t.clone();
            let n = r.rank();
            r.shape.swap(n - 2, n - 1);
            r.strides.swap(n - 2, n - 1);
            Ok(r)
        }
        Op::MatMul => {
            matmul_shape(tys[0], MatLayout::N, tys[1], MatLayout::N).and_then(|s| out(tys[0], s))
        }
        Op::Add => {
            let (a, b) = (tys[0], tys[1]);
            if a.shape == b.shape {
                return out(a, a.shape.clone());
            }
            if let Some(s) = row_broadcast(a, b).or_else(|| row_broadcast(b, a)) {
                return out(a, s);
            }
            Err(format!(
                "shapes {} and {} neither match nor broadcast a [N] row vector over the last dim",
                dims(&a.shape),
                dims(&b.shape)
            ))
        }
        Op::Mul => {
            let (a, b) = (tys[0], tys[1]);
            if a.shape != b.shape {
                return Err(format!(
                    "shapes {} and {} differ (mul is elementwise)",
                    dims(&a.shape),
                    dims(&b.shape)
                ));
            }
            out(a, a.shape.clone())
        }
        Op::Act(_) => out(tys[0], tys[0].shape.clone()),
        Op::Gemm(g) => gemm_type(g, tys),
        Op::SparseGemm(s) => sparse_gemm_type(s, tys),
    }
}

/// A sparse GEMM types as the dense GEMM it stands for: each packed B operand must be
/// `[kept, rows, cols]` of the pattern, and is then seen as the dense `[N, K]` weight.
fn sparse_gemm_type(s: &SparseGemm, tys: &[&TensorType]) -> Result<TensorType, String> {
    let p = &s.pattern;
    p.check()
        .map_err(|m| format!("invalid block pattern: {m}"))?;
    if s.gemm.b != MatLayout::T {
        return Err("a sparse GEMM reads its weight as [N, K] (layout t)".to_string());
    }
    let packed: Shape = p.packed_shape().into_iter().map(Dim::Fixed).collect();
    let dense = TensorType::try_contiguous(
        tys[0].dtype,
        Shape::from_iter([Dim::Fixed(p.out), Dim::Fixed(p.inp)]),
    )
    .ok_or_else(|| format!("the element count of [{}, {}] overflows", p.out, p.inp))?;
    let mut seen: Vec<&TensorType> = tys.to_vec();
    for (slot, t) in seen
        .iter_mut()
        .enumerate()
        .take(s.gemm.matrix_operands())
        .skip(1)
    {
        if t.shape != packed {
            return Err(format!(
                "packed weight operand {slot} has shape {}, expected {} (kept blocks, rows, cols)",
                dims(&t.shape),
                dims(&packed)
            ));
        }
        if !t.is_contiguous() {
            return Err(format!("packed weight operand {slot} is not row-major"));
        }
        *t = &dense;
    }
    gemm_type(&s.gemm, &seen)
}

/// If `v` is a `[N]` row vector matching the last dim of `t`, the broadcast shape.
fn row_broadcast(t: &TensorType, v: &TensorType) -> Option<Shape> {
    (v.rank() == 1 && t.rank() >= 1 && t.shape.last() == v.shape.first()).then(|| t.shape.clone())
}

/// The output shape of `A @ B` with the given operand layouts.
fn matmul_shape(
    a: &TensorType,
    al: MatLayout,
    b: &TensorType,
    bl: MatLayout,
) -> Result<Shape, String> {
    if b.rank() != 2 {
        return Err(format!(
            "right operand must be a matrix, got {}",
            dims(&b.shape)
        ));
    }
    let (bk, bn) = match bl {
        MatLayout::N => (&b.shape[0], &b.shape[1]),
        MatLayout::T => (&b.shape[1], &b.shape[0]),
    };
    let (lead, ak): (&[Dim], &Dim) = match al {
        MatLayout::N => {
            if a.rank() < 1 {
                return Err("left operand is a scalar".into());
            }
            (&a.shape[..a.rank() - 1], &a.shape[a.rank() - 1])
        }
        MatLayout::T => {
            if a.rank() != 2 {
                return Err(format!(
                    "a transposed left operand must be a matrix, got {}",
                    dims(&a.shape)
                ));
            }
            (std::slice::from_ref(&a.shape[1]), &a.shape[0])
        }
    };
    if ak != bk {
        return Err(format!(
            "inner dims differ: left {} has K={}, right {} has K={}",
            dims(&a.shape),
            ak,
            dims(&b.shape),
            bk
        ));
    }
    let mut s: Shape = lead.iter().cloned().collect();
    s.push(bn.clone());
    Ok(s)
}

fn gemm_type(g: &Gemm, tys: &[&TensorType]) -> Result<TensorType, String> {
    let shape = matmul_shape(tys[0], g.a, tys[1], g.b)?;
    if g.dual.is_some() {
        let up = matmul_shape(tys[0], g.a, tys[2], g.b)?;
        if up != shape {
            return Err(format!(
                "gate and up products differ in shape: {} vs {}",
                dims(&shape),
                dims(&up)
            ));
        }
    }
    let n = shape.last().cloned().unwrap_or(Dim::Fixed(1));
    let mut used = vec![false; tys.len()];
    let chains: Vec<&EpilogueChain> = match &g.dual {
        Some(d) => vec![&d.gate, &d.up, &g.epilogue],
        None => vec![&g.epilogue],
    };
    for step in chains.into_iter().flatten() {
        let Some(i) = step.operand() else { continue };
        if i < g.matrix_operands() || i >= tys.len() {
            return Err(format!(
                "epilogue step {step:?} names operand {i}, outside the epilogue operands"
            ));
        }
        if std::mem::replace(&mut used[i], true) {
            return Err(format!("epilogue operand {i} is used twice"));
        }
        let t = tys[i];
        match step {
            Epilogue::Bias { .. } => {
                if t.shape[..] != [n.clone()][..] {
                    return Err(format!(
                        "bias operand {i} has shape {}, expected [{n}]",
                        dims(&t.shape)
                    ));
                }
            }
            Epilogue::Add { .. } | Epilogue::Mul { .. } => {
                if t.shape != shape {
                    return Err(format!(
                        "epilogue operand {i} has shape {}, expected {}",
                        dims(&t.shape),
                        dims(&shape)
                    ));
                }
            }
            Epilogue::Act(_) => {}
        }
    }
    out(tys[0], shape)
}
