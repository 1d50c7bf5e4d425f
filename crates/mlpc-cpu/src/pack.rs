//! Packing GEMM B operands into the panel layout the micro-kernel reads.
//!
//! A packed B is `ceil(N / nr)` panels, each `K x nr` f32 values, row `k` of a panel holding
//! `B[k, p*nr .. p*nr + nr]` and zeros past `N`. The micro-kernel then streams one panel with
//! aligned full-width vector loads whatever the stored layout (`n` or `t`) and dtype were. Weights
//! are packed once when a plan is compiled; a B that is a run-time tensor is packed on each run.

use mlpc_ir::{DType, MatLayout};

/// 64 bytes: one cache line, one 512-bit vector.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// An f32 array whose start is 64-byte aligned.
pub(crate) struct AlignedF32 {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedF32 {
    pub fn zeroed(len: usize) -> AlignedF32 {
        AlignedF32 {
            lines: vec![Line::default(); len.div_ceil(16)],
            len,
        }
    }

    #[cfg(test)]
    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: `Line` is 16 f32s with no padding, and `lines` holds at least `len` of them.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), self.len) }
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.lines.as_ptr().cast()
    }
}

/// Element `i` of little-endian `bytes` of `dtype`, widened to f32 (exactly).
#[inline]
pub(crate) fn load_f32(bytes: &[u8], dtype: DType, i: usize) -> f32 {
    match dtype {
        DType::F32 => f32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ]),
        DType::F16 => half::f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
        DType::Bf16 => half::bf16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
    }
}

/// Packs the `[K, N]` operand stored in `bytes` (row-major `[K, N]` for layout `n`, `[N, K]` for
/// `t`) into `ceil(N / nr)` zero-padded panels of `K x nr` f32.
pub(crate) fn pack_b(
    bytes: &[u8],
    dtype: DType,
    layout: MatLayout,
    k: usize,
    n: usize,
    nr: usize,
) -> AlignedF32 {
    let panels = n.div_ceil(nr);
    let mut out = AlignedF32::zeroed(panels * k * nr);
    let dst = out.as_mut_slice();
    match layout {
        MatLayout::N => {
            for kk in 0..k {
                for col in 0..n {
                    let (p, j) = (col / nr, col % nr);
                    dst[p * k * nr + kk * nr + j] = load_f32(bytes, dtype, kk * n + col);
                }
            }
        }
        MatLayout::T => {
            for col in 0..n {
                let (p, j) = (col / nr, col % nr);
                let panel = &mut dst[p * k * nr..(p + 1) * k * nr];
                for kk in 0..k {
                    panel[kk * nr + j] = load_f32(bytes, dtype, col * k + kk);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_pack_to_the_same_panels() {
        // B = [[0, 1, 2], [3, 4, 5]] as [K=2, N=3], panels of 2 columns.
        let b_n: Vec<u8> = (0..6).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let b_t: Vec<u8> = [0, 3, 1, 4, 2, 5]
            .iter()
            .flat_map(|&v| (v as f32).to_le_bytes())
            .collect();
        let pn = pack_b(&b_n, DType::F32, MatLayout::N, 2, 3, 2);
        let pt = pack_b(&b_t, DType::F32, MatLayout::T, 2, 3, 2);
        assert_eq!(pn.as_slice(), &[0.0, 1.0, 3.0, 4.0, 2.0, 0.0, 5.0, 0.0]);
        assert_eq!(pn.as_slice(), pt.as_slice());
        assert_eq!(pn.as_ptr() as usize % 64, 0);
    }
}
