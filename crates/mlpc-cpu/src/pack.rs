//! Packing GEMM B operands into the panel layout the micro-kernel reads.
//!
//! A packed B is `ceil(N / nr)` panels, each `K x nr` f32 values, row `k` of a panel holding
//! `B[k, p*nr .. p*nr + nr]` and zeros past `N`. The micro-kernel then streams one panel with
//! aligned full-width vector loads whatever the stored layout (`n` or `t`) and dtype were. Weights
//! are packed once when a plan is compiled; a B that is a run-time tensor is packed on each run.
//!
//! A block-sparse B (`[kept, rows, cols]` blocks of the logical `[N, K]` weight) packs to the same
//! panels, but each panel holds only the k ranges where some block of the block rows it covers is
//! kept: its *segments*, maximal runs of kept block columns. The index ([`BsrLayout::index`], i64)
//! is `seg_ptr[panels + 1]` (the segments of panel `p` are `seg_ptr[p] .. seg_ptr[p + 1]`), then
//! per segment `k_start, len, offset` (the f32 offset of its first panel row). Inside a segment the
//! rows of columns whose own block is not kept are zero.
//!
//! A weight stored in 16 bits keeps its type in its panels ([`Panels::Half`]): half the bytes of
//! f32 panels, and of what a decode step streams. Each GEMM task widens the panels it multiplies
//! into an f32 copy the size of its L2 share ([`Panels::widen_range`]) and runs the f32 micro-kernel
//! on that copy, so every element is widened once per task (the m / mc row blocks of a GEMM), not
//! once per use.

use mlpc_ir::{BlockPattern, DType, MatLayout};
use std::marker::PhantomData;

/// 64 bytes: one cache line, one 512-bit vector.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// An element type of an [`Aligned`] array: plain bits, every pattern valid, at most 64-byte
/// alignment.
pub(crate) trait Elem: Copy + Default + Send + Sync + 'static {}
impl Elem for f32 {}
impl Elem for u16 {}

/// An array of `T` whose start is 64-byte aligned.
pub(crate) struct Aligned<T: Elem> {
    lines: Vec<Line>,
    len: usize,
    _t: PhantomData<T>,
}

pub(crate) type AlignedF32 = Aligned<f32>;

impl<T: Elem> Aligned<T> {
    pub fn zeroed(len: usize) -> Aligned<T> {
        Aligned {
            lines: vec![Line::default(); (len * std::mem::size_of::<T>()).div_ceil(64)],
            len,
            _t: PhantomData,
        }
    }

    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `lines` holds at least `len * size_of::<T>()` bytes, 64-byte aligned (more than
        // `T` needs), and every bit pattern is a valid `T` (`Elem`).
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<T>(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<T>(), self.len) }
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.lines.as_ptr().cast()
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

/// A weight's packed panels: f32, or the 16-bit type the weight is stored in.
pub(crate) enum Panels {
    F32(AlignedF32),
    /// Raw f16 / bf16 bits, widened per task at run time.
    Half(Aligned<u16>, DType),
}

impl Panels {
    /// Packs weight `bytes` of `dtype`: in 16 bits where the weight is (`pack_u16`), else in
    /// f32 (`pack_f32`), each [`pack_b_with`] or [`pack_bsr_with`] over the element getter it is
    /// given.
    pub fn of(
        bytes: &[u8],
        dtype: DType,
        pack_f32: impl FnOnce(&dyn Fn(usize) -> f32) -> AlignedF32,
        pack_u16: impl FnOnce(&dyn Fn(usize) -> u16) -> Aligned<u16>,
    ) -> Panels {
        match dtype {
            DType::F32 => Panels::F32(pack_f32(&|i| load_f32(bytes, dtype, i))),
            DType::F16 | DType::Bf16 => Panels::Half(
                pack_u16(&|i| u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])),
                dtype,
            ),
        }
    }

    pub fn is_half(&self) -> bool {
        matches!(self, Panels::Half(..))
    }

    pub fn as_ptr(&self) -> *const u8 {
        match self {
            Panels::F32(p) => p.as_ptr(),
            Panels::Half(p, _) => p.as_ptr(),
        }
    }

    /// Elements `range` of the panels, widened (exactly) or copied into `dst`.
    pub fn widen_range(&self, range: std::ops::Range<usize>, dst: &mut [f32]) {
        match self {
            Panels::F32(p) => dst.copy_from_slice(&p.as_slice()[range]),
            Panels::Half(p, dt) => {
                let src = &p.as_slice()[range];
                match dt {
                    DType::Bf16 => {
                        for (d, &b) in dst.iter_mut().zip(src) {
                            *d = f32::from_bits(u32::from(b) << 16);
                        }
                    }
                    _ => {
                        for (d, &b) in dst.iter_mut().zip(src) {
                            *d = half::f16::from_bits(b).to_f32();
                        }
                    }
                }
            }
        }
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

/// Every element of `bytes` (little-endian `dtype`) widened to f32, exactly: a GEMM's f16 / bf16
/// A operand, once per run (`GemmSpec::widen_a`). In parallel, in chunks of 64 Ki elements.
pub(crate) fn widen(bytes: &[u8], dtype: DType) -> AlignedF32 {
    use rayon::prelude::*;
    const CHUNK: usize = 64 * 1024;
    let size = dtype.size_bytes();
    let mut out = AlignedF32::zeroed(bytes.len() / size);
    out.as_mut_slice()
        .par_chunks_mut(CHUNK)
        .zip(bytes.par_chunks(CHUNK * size))
        .for_each(|(dst, src)| {
            for (i, v) in dst.iter_mut().enumerate() {
                *v = load_f32(src, dtype, i);
            }
        });
    out
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
    pack_b_with(&|i| load_f32(bytes, dtype, i), layout, k, n, nr)
}

/// [`pack_b`] of the operand whose element `i` (in its stored order) is `get(i)`.
pub(crate) fn pack_b_with<T: Elem>(
    get: &dyn Fn(usize) -> T,
    layout: MatLayout,
    k: usize,
    n: usize,
    nr: usize,
) -> Aligned<T> {
    let panels = n.div_ceil(nr);
    let mut out = Aligned::<T>::zeroed(panels * k * nr);
    let dst = out.as_mut_slice();
    match layout {
        MatLayout::N => {
            for kk in 0..k {
                for col in 0..n {
                    let (p, j) = (col / nr, col % nr);
                    dst[p * k * nr + kk * nr + j] = get(kk * n + col);
                }
            }
        }
        MatLayout::T => {
            for col in 0..n {
                let (p, j) = (col / nr, col % nr);
                let panel = &mut dst[p * k * nr..(p + 1) * k * nr];
                for kk in 0..k {
                    panel[kk * nr + j] = get(col * k + kk);
                }
            }
        }
    }
    out
}

/// Where the segments of each panel of a block-sparse B lie.
pub(crate) struct BsrLayout {
    pub index: Vec<i64>,
    /// Panel rows over all segments.
    rows: usize,
    /// Panels (`ceil(N / nr)`).
    panels: usize,
    nr: usize,
}

impl BsrLayout {
    /// The element offset where panel `p`'s segments start (the end of all of them for
    /// `p = panels`): panels lie one after another, so panels `p0 .. p1` are the elements
    /// `panel_start(p0) .. panel_start(p1)`.
    pub fn panel_start(&self, p: usize) -> usize {
        let seg = self.index[p] as usize;
        let segs = self.index[self.panels] as usize;
        if seg < segs {
            self.index[self.panels + 1 + 3 * seg + 2] as usize
        } else {
            self.rows * self.nr
        }
    }
}

/// The segments of every panel of `nr` columns of the logical `[N, K]` weight of `p`.
pub(crate) fn bsr_layout(p: &BlockPattern, nr: usize) -> BsrLayout {
    let n = p.out as usize;
    let [br, bc] = p.block.map(|d| d as usize);
    let row_ptr = p.row_ptr();
    let panels = n.div_ceil(nr);
    let mut seg_ptr = Vec::with_capacity(panels + 1);
    let mut segs: Vec<i64> = Vec::new();
    let mut rows = 0usize;
    seg_ptr.push(0i64);
    for panel in 0..panels {
        let (c0, c1) = (panel * nr, ((panel + 1) * nr).min(n));
        let mut cols: Vec<u32> = (c0 / br..=(c1 - 1) / br)
            .flat_map(|r| p.kept[row_ptr[r] as usize..row_ptr[r + 1] as usize].iter())
            .map(|&(_, c)| c)
            .collect();
        cols.sort_unstable();
        cols.dedup();
        let mut i = 0;
        while i < cols.len() {
            let mut j = i + 1;
            while j < cols.len() && cols[j] == cols[j - 1] + 1 {
                j += 1;
            }
            let (k0, len) = (cols[i] as usize * bc, (j - i) * bc);
            segs.extend([k0 as i64, len as i64, (rows * nr) as i64]);
            rows += len;
            i = j;
        }
        seg_ptr.push((segs.len() / 3) as i64);
    }
    seg_ptr.extend(segs);
    BsrLayout {
        index: seg_ptr,
        rows,
        panels,
        nr,
    }
}

/// Packs the `[kept, rows, cols]` blocks in `bytes` into the panels of `layout`.
pub(crate) fn pack_bsr(
    bytes: &[u8],
    dtype: DType,
    p: &BlockPattern,
    layout: &BsrLayout,
    nr: usize,
) -> AlignedF32 {
    pack_bsr_with(&|i| load_f32(bytes, dtype, i), p, layout, nr)
}

/// [`pack_bsr`] of the blocks whose element `i` (in their stored order) is `get(i)`.
pub(crate) fn pack_bsr_with<T: Elem>(
    get: &dyn Fn(usize) -> T,
    p: &BlockPattern,
    layout: &BsrLayout,
    nr: usize,
) -> Aligned<T> {
    let n = p.out as usize;
    let [br, bc] = p.block.map(|d| d as usize);
    let grid_cols = p.block_cols() as usize;
    // Kept block index of each (block row, block col), or none.
    let mut slot = vec![u32::MAX; p.block_rows() as usize * grid_cols];
    for (i, &(r, c)) in p.kept.iter().enumerate() {
        slot[r as usize * grid_cols + c as usize] = i as u32;
    }
    let panels = n.div_ceil(nr);
    let mut out = Aligned::<T>::zeroed(layout.rows * nr);
    let dst = out.as_mut_slice();
    for panel in 0..panels {
        let (s0, s1) = (
            layout.index[panel] as usize,
            layout.index[panel + 1] as usize,
        );
        for s in s0..s1 {
            let at = panels + 1 + 3 * s;
            let (k0, len, off) = (
                layout.index[at] as usize,
                layout.index[at + 1] as usize,
                layout.index[at + 2] as usize,
            );
            for kk in 0..len {
                let k = k0 + kk;
                for j in 0..nr {
                    let col = panel * nr + j;
                    if col >= n {
                        break;
                    }
                    let b = slot[(col / br) * grid_cols + k / bc];
                    if b != u32::MAX {
                        let src = b as usize * br * bc + (col % br) * bc + k % bc;
                        dst[off + kk * nr + j] = get(src);
                    }
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
    fn sparse_panels_hold_the_kept_k_ranges() {
        // [N=4, K=6] in 2x2 blocks; kept: (0, 0), (0, 2), (1, 1). Panels of 2 columns = one block
        // row each: panel 0 has segments k 0..2 and 4..6, panel 1 has k 2..4.
        let p = BlockPattern {
            block: [2, 2],
            out: 4,
            inp: 6,
            kept: vec![(0, 0), (0, 2), (1, 1)],
        };
        let l = bsr_layout(&p, 2);
        assert_eq!(l.index, vec![0, 2, 3, 0, 2, 0, 4, 2, 4, 2, 2, 8]);
        let blocks: Vec<u8> = (0..12).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let packed = pack_bsr(&blocks, DType::F32, &p, &l, 2);
        // Block 0 = [[0, 1], [2, 3]] at rows n 0-1, k 0-1: panel row k holds W[0][k], W[1][k].
        assert_eq!(
            packed.as_slice(),
            &[0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0, 8.0, 10.0, 9.0, 11.0]
        );
        // Panels straddling block rows take the union, zero where a column's block is dropped.
        let l = bsr_layout(&p, 4);
        assert_eq!(l.index, vec![0, 1, 0, 6, 0]);
        let packed = pack_bsr(&blocks, DType::F32, &p, &l, 4);
        assert_eq!(
            &packed.as_slice()[..8],
            &[0.0, 2.0, 0.0, 0.0, 1.0, 3.0, 0.0, 0.0]
        );
        assert_eq!(&packed.as_slice()[8..12], &[0.0, 0.0, 8.0, 10.0]);
    }

    /// Panels kept in 16 bits hold the raw bits where f32 panels hold the values, and widen to
    /// them over any run of whole panels (`panel_start`), dense or sparse.
    #[test]
    fn half_panels_widen_to_the_f32_panels() {
        let p = BlockPattern {
            block: [2, 2],
            out: 6,
            inp: 6,
            kept: vec![(0, 0), (0, 2), (2, 1), (2, 2)],
        };
        let values: Vec<f32> = (0..36).map(|v| v as f32 * 0.5 - 3.0).collect();
        for dt in [DType::Bf16, DType::F16] {
            let bits: Vec<u16> = values
                .iter()
                .map(|&v| match dt {
                    DType::Bf16 => half::bf16::from_f32(v).to_bits(),
                    _ => half::f16::from_f32(v).to_bits(),
                })
                .collect();
            let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
            let l = bsr_layout(&p, 2);
            // Block row 1 keeps nothing: panel 1 has no segments.
            assert_eq!(l.panel_start(1), l.panel_start(2));
            let sparse = Panels::of(
                &bytes,
                dt,
                |get| pack_bsr_with(get, &p, &l, 2),
                |get| pack_bsr_with(get, &p, &l, 2),
            );
            let dense = Panels::of(
                &bytes,
                dt,
                |get| pack_b_with(get, MatLayout::T, 6, 6, 2),
                |get| pack_b_with(get, MatLayout::T, 6, 6, 2),
            );
            let runs = [(0, 3), (0, 1), (1, 3), (2, 3), (1, 1)];
            let cases = [
                (
                    sparse,
                    pack_bsr(&bytes, dt, &p, &l, 2),
                    runs.map(|(p0, p1)| l.panel_start(p0)..l.panel_start(p1)),
                ),
                (
                    dense,
                    pack_b(&bytes, dt, MatLayout::T, 6, 6, 2),
                    runs.map(|(p0, p1)| p0 * 12..p1 * 12),
                ),
            ];
            for (panels, want, ranges) in cases {
                assert!(panels.is_half());
                for r in ranges {
                    let mut got = vec![f32::NAN; r.len()];
                    panels.widen_range(r.clone(), &mut got);
                    assert_eq!(got, &want.as_slice()[r.clone()], "{dt:?} elements {r:?}");
                }
            }
        }
        let f32_bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let f = Panels::of(
            &f32_bytes,
            DType::F32,
            |get| pack_b_with(get, MatLayout::N, 6, 6, 4),
            |get| pack_b_with(get, MatLayout::N, 6, 6, 4),
        );
        assert!(!f.is_half());
        let mut got = vec![0.0; 48];
        f.widen_range(0..48, &mut got);
        assert_eq!(
            got,
            pack_b(&f32_bytes, DType::F32, MatLayout::N, 6, 6, 4).as_slice()
        );
    }

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

    #[test]
    fn widening_is_exact_across_chunks() {
        // More than one chunk of 64 Ki elements, every 16-bit pattern of both types (NaNs keep
        // their payload bits, as the kernels' own widening does).
        let bits: Vec<u16> = (0..=u16::MAX).chain(0..=999).collect();
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        for dt in [DType::Bf16, DType::F16] {
            let wide = widen(&bytes, dt);
            assert_eq!(wide.as_slice().len(), bits.len());
            assert_eq!(wide.as_ptr() as usize % 64, 0);
            for (i, (&w, &b)) in wide.as_slice().iter().zip(&bits).enumerate() {
                let want = match dt {
                    DType::Bf16 => half::bf16::from_bits(b).to_f32(),
                    _ => half::f16::from_bits(b).to_f32(),
                };
                assert!(
                    w.to_bits() == want.to_bits() || (w.is_nan() && want.is_nan()),
                    "{dt:?} element {i}: {w} for {want}"
                );
            }
        }
        let f32s: Vec<u8> = [1.5f32, -0.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(widen(&f32s, DType::F32).as_slice(), &[1.5, -0.0]);
    }
}
