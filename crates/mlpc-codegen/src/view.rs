//! How a kernel sees its operands: a tensor flattened to a matrix (leading dims into rows, as
//! nn.Linear flattens them), and the strides an elementwise kernel reads an operand with.

use mlpc_ir::{Dim, Extent, TensorType};

/// A tensor read as a `[rows, cols]` matrix: element `(r, c)` sits at
/// `r * row_stride + c * col_stride` elements from the base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatrixView {
    pub rows: Extent,
    pub cols: Extent,
    pub row_stride: Extent,
    pub col_stride: Extent,
}

impl MatrixView {
    /// The view with rows and columns swapped (a transposed read).
    pub fn transposed(&self) -> MatrixView {
        MatrixView {
            rows: self.cols.clone(),
            cols: self.rows.clone(),
            row_stride: self.col_stride.clone(),
            col_stride: self.row_stride.clone(),
        }
    }
}

pub fn is_one(e: &Extent) -> bool {
    e.as_constant() == Some(1)
}

fn is_fixed_one(d: &Dim) -> bool {
    d.fixed() == Some(1)
}

/// `ty` as a matrix: the last dim is the columns and the leading dims flatten into the rows. The
/// leading dims must be laid out so that one row stride walks all of them; dims of size 1 take no
/// part. A rank-1 tensor is a single row.
pub fn matrix_view(ty: &TensorType) -> Result<MatrixView, String> {
    let r = ty.rank();
    if r == 0 {
        return Err("a scalar is not a matrix".to_string());
    }
    let cols = Extent::of_dim(&ty.shape[r - 1]);
    let col_stride = ty.strides[r - 1].clone();
    let mut rows = Extent::constant(1);
    for d in &ty.shape[..r - 1] {
        rows = rows
            .checked_mul(&Extent::of_dim(d))
            .ok_or_else(|| "its row count overflows".to_string())?;
    }
    // Leading dims that are not 1, innermost last.
    let leading: Vec<usize> = (0..r - 1)
        .filter(|&i| !is_fixed_one(&ty.shape[i]))
        .collect();
    let row_stride =
        match leading.last() {
            None => Extent::constant(0),
            Some(&inner) => {
                for w in leading.windows(2) {
                    let (outer, next) = (w[0], w[1]);
                    let want = ty.strides[next].checked_mul(&Extent::of_dim(&ty.shape[next]));
                    if want.as_ref() != Some(&ty.strides[outer]) {
                        return Err(format!(
                        "its leading dims do not flatten into rows (dim {outer} has stride {}, \
                         expected {})",
                        ty.strides[outer],
                        want.map_or_else(|| "an overflowing product".to_string(), |e| e.to_string())
                    ));
                    }
                }
                ty.strides[inner].clone()
            }
        };
    Ok(MatrixView {
        rows,
        cols,
        row_stride,
        col_stride,
    })
}

/// The strides (one per dim of `out_shape`) with which an elementwise kernel reads `ty` at the
/// output's index: dims aligned on the right, a missing or size-1 dim broadcasts with stride 0.
/// `None` if `ty` does not broadcast to `out_shape`.
pub fn broadcast_strides(ty: &TensorType, out_shape: &[Dim]) -> Option<Vec<Extent>> {
    if ty.rank() > out_shape.len() {
        return None;
    }
    let skip = out_shape.len() - ty.rank();
    let mut strides = vec![Extent::constant(0); out_shape.len()];
    for (i, (d, s)) in ty.shape.iter().zip(&ty.strides).enumerate() {
        let od = &out_shape[skip + i];
        if d == od {
            strides[skip + i] = if is_fixed_one(d) {
                Extent::constant(0)
            } else {
                s.clone()
            };
        } else if is_fixed_one(d) {
            strides[skip + i] = Extent::constant(0);
        } else {
            return None;
        }
    }
    Some(strides)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlpc_ir::{DType, Shape};
    use smallvec::smallvec;

    fn sym(s: &str) -> Dim {
        Dim::sym(s)
    }

    #[test]
    fn leading_dims_flatten_into_rows() {
        let t = TensorType::contiguous(
            DType::Bf16,
            smallvec![sym("B"), sym("T"), Dim::Fixed(768)] as Shape,
        );
        let v = matrix_view(&t).unwrap();
        assert_eq!(v.rows.to_string(), "B*T");
        assert_eq!(v.cols.to_string(), "768");
        assert_eq!(v.row_stride.to_string(), "768");
        assert!(is_one(&v.col_stride));
    }

    #[test]
    fn a_transposed_view_keeps_its_strides() {
        // x^T of a row-major [768, T]: shape [T, 768], strides [1, T].
        let mut t =
            TensorType::contiguous(DType::F32, smallvec![Dim::Fixed(768), sym("T")] as Shape);
        t.shape.swap(0, 1);
        t.strides.swap(0, 1);
        let v = matrix_view(&t).unwrap();
        assert!(is_one(&v.row_stride));
        assert_eq!(v.col_stride.to_string(), "T");
        let tv = v.transposed();
        assert_eq!(tv.rows.to_string(), "768");
        assert_eq!(tv.row_stride.to_string(), "T");
    }

    #[test]
    fn non_flattening_leading_dims_are_refused() {
        // [B, T, 8] with B and T swapped in memory.
        let mut t = TensorType::contiguous(
            DType::F32,
            smallvec![sym("T"), sym("B"), Dim::Fixed(8)] as Shape,
        );
        t.shape.swap(0, 1);
        t.strides.swap(0, 1);
        let e = matrix_view(&t).unwrap_err();
        assert!(e.contains("do not flatten"), "{e}");
    }

    #[test]
    fn row_vectors_broadcast_with_zero_strides() {
        let out: Shape = smallvec![sym("T"), Dim::Fixed(64)];
        let bias = TensorType::contiguous(DType::F32, smallvec![Dim::Fixed(64)] as Shape);
        let s = broadcast_strides(&bias, &out).unwrap();
        assert_eq!(s, vec![Extent::constant(0), Extent::constant(1)]);
        let wrong = TensorType::contiguous(DType::F32, smallvec![Dim::Fixed(63)] as Shape);
        assert!(broadcast_strides(&wrong, &out).is_none());
    }
}
