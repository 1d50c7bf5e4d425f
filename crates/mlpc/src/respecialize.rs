//! Re-specialisation for the layout of device inputs, when the caller asks for it
//! ([`crate::Compiler::respecialize`]): like a framework's recompilation on new strides.
//!
//! The kernels are specialised for row-major inputs, and the guards refuse anything else. When an
//! input's strides describe a transposed view of row-major memory (its last two dims swapped, as
//! `x.t()` gives), a variant of the model is compiled whose input is that memory as it lies,
//! followed by a `transpose` view; `fold-transpose` then folds the view into the GEMM operand's
//! layout, so the variant reads the caller's memory directly with no copy. Variants are cached by
//! which inputs are transposed, at most `limit` of them; other stride patterns stay refused.

use crate::error::Error;
use mlpc_ir::{Graph, Op};

/// Whether `strides` are `want` on every dim that moves (a dim of extent 1 never does, so its
/// stride is irrelevant, as the guards treat it).
fn strides_match(shape: &[usize], want: &[usize], strides: &[usize]) -> bool {
    strides.len() == shape.len()
        && want
            .iter()
            .zip(strides)
            .zip(shape)
            .all(|((w, s), &n)| n == 1 || w == s)
}

/// Whether `strides` describe `shape` as a row-major tensor.
pub(crate) fn is_contiguous(shape: &[usize], strides: &[usize]) -> bool {
    strides_match(
        shape,
        &mlpc_runtime::TensorMeta::contiguous_strides(shape),
        strides,
    )
}

/// Whether `strides` describe `shape` as the transpose (last two dims swapped) of a row-major
/// tensor.
pub(crate) fn is_transposed_view(shape: &[usize], strides: &[usize]) -> bool {
    let r = shape.len();
    if r < 2 {
        return false;
    }
    let mut stored = shape.to_vec();
    stored.swap(r - 2, r - 1);
    let mut want = mlpc_runtime::TensorMeta::contiguous_strides(&stored);
    want.swap(r - 2, r - 1);
    strides_match(shape, &want, strides)
}

/// `g` with each named input replaced by its row-major storage (last two dims swapped) followed
/// by a transpose view named `<input>.view`, which takes over all its uses.
pub fn transpose_inputs(g: &Graph, names: &[String]) -> Result<Graph, Error> {
    let mut g = g.clone();
    for (i, name) in names.iter().enumerate() {
        if names[..i].contains(name) {
            return Err(Error::Respecialize(format!(
                "input `{name}` is listed twice"
            )));
        }
        let old = g
            .find(name)
            .filter(|&id| g.node(id).op == Op::Input)
            .ok_or_else(|| Error::Respecialize(format!("the model has no input `{name}`")))?;
        let mut ty = g.node(old).ty.clone();
        let r = ty.rank();
        if r < 2 {
            return Err(Error::Respecialize(format!(
                "input `{name}` has rank {r}: it cannot be transposed"
            )));
        }
        ty.shape.swap(r - 2, r - 1);
        ty.strides = mlpc_ir::contiguous_strides(&ty.shape).ok_or_else(|| {
            Error::Respecialize(format!("input `{name}`: element count overflows"))
        })?;
        let storage_name = g.fresh_name(&format!("{name}.storage"));
        let storage = g.add_input(storage_name, ty);
        let view_name = g.fresh_name(&format!("{name}.view"));
        let view = g
            .add(view_name, Op::Transpose, &[storage])
            .map_err(|e| Error::Respecialize(e.to_string()))?;
        g.replace_all_uses(old, view);
        g.remove(old);
        g.node_mut(storage).name = name.clone();
    }
    mlpc_ir::verify(&g)?;
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_transposed_views_only() {
        assert!(is_transposed_view(&[4, 768], &[1, 4]));
        assert!(is_transposed_view(&[2, 4, 768], &[3072, 1, 4]));
        assert!(!is_transposed_view(&[4, 768], &[768, 1]));
        assert!(!is_transposed_view(&[4, 768], &[1, 8]));
        assert!(!is_transposed_view(&[768], &[1]));
        // Size-1 dims' strides are irrelevant, as for the guards.
        assert!(is_transposed_view(&[1, 4, 768], &[7, 1, 4]));
    }

    #[test]
    fn contiguity_ignores_the_strides_of_size_one_dims() {
        assert!(is_contiguous(&[4, 768], &[768, 1]));
        assert!(is_contiguous(&[1, 768], &[1024, 1]));
        assert!(is_contiguous(&[4, 1], &[1, 4]));
        assert!(!is_contiguous(&[4, 768], &[1, 4]));
        assert!(!is_contiguous(&[4, 768], &[768]));
    }
}
