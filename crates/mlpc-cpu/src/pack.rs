//! Packing GEMM B operands into the panel layout the micro-kernel reads.
//!
//! A packed B is `ceil(N / nr)` panels, each `K x nr` values, row `k` of a panel holding
//! `B[k, p*nr .. p*nr + nr]` and zeros past `N`. The micro-kernel then streams one panel with
//! aligned full-width vector loads whatever the stored layout (`n` or `t`) was. The values are f32,
//! or B's own f16 / bf16: for weights always (half the bytes), for a run-time B where the GEMM's
//! panels stream from memory ([`crate::spec::panels_widened`]). The micro-kernel widens 16-bit
//! panels as it loads them (and where a GEMM task's share of them fits L2, its first rows store
//! them widened for the rest: `GemmSpec::store_wide`); bf16 panels interleave the two halves of
//! each row so that one load widens to two vectors ([`panel_pos`]). For the bf16 dot product
//! (`GemmSpec::bf16_dot`) bf16 panels pair their rows instead ([`pair_rows`]).
//! Weights are packed once when a plan is compiled; a B that is a run-time tensor is packed on
//! each run.
//!
//! A block-sparse B (`[kept, rows, cols]` blocks of the logical `[N, K]` weight) packs to the same
//! panels, but each panel holds only the k ranges where some block of the block rows it covers is
//! kept: its *segments*, maximal runs of kept block columns. The index ([`BsrLayout::index`], i64)
//! is `seg_ptr[panels + 1]` (the segments of panel `p` are `seg_ptr[p] .. seg_ptr[p + 1]`), then
//! per segment `k_start, len, offset` (the element offset of its first panel row). Inside a
//! segment the rows of columns whose own block is not kept are zero.

use mlpc_ir::{BlockPattern, DType, MatLayout};
use std::marker::PhantomData;

/// 64 bytes: one cache line, one 512-bit vector.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Element types an [`Aligned`] array may hold: plain data, every bit pattern a value, alignment
/// at most 64.
pub(crate) trait Plain: Copy {}
impl Plain for f32 {}
impl Plain for u8 {}

/// An array of `T` whose start is 64-byte aligned.
pub(crate) struct Aligned<T: Plain> {
    lines: Vec<Line>,
    len: usize,
    of: PhantomData<T>,
}

/// Packed B panels: the stored bytes of B's elements, rearranged.
pub(crate) type Panels = Aligned<u8>;

impl<T: Plain> Aligned<T> {
    pub fn zeroed(len: usize) -> Aligned<T> {
        let bytes = len * std::mem::size_of::<T>();
        Aligned {
            lines: vec![Line([0; 64]); bytes.div_ceil(64)],
            len,
            of: PhantomData,
        }
    }

    #[cfg(test)]
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `lines` holds at least `len * size_of::<T>()` initialised bytes at an alignment
        // of 64, at least `T`'s (`Plain`), and every bit pattern is a `T`.
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
pub(crate) fn widen(bytes: &[u8], dtype: DType) -> Aligned<f32> {
    use rayon::prelude::*;
    const CHUNK: usize = 64 * 1024;
    let size = dtype.size_bytes();
    let mut out = Aligned::<f32>::zeroed(bytes.len() / size);
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

/// Where column `c` of a panel row of `nr` columns is stored in panels of `to`. bf16 panels
/// (of an even `nr`) interleave the row's two halves, column `c < nr / 2` at `2c` and column
/// `nr / 2 + c` at `2c + 1`: the micro-kernel loads `nr / 2` pairs as 32-bit lanes and widens
/// the first half with a shift and the second with a mask (`Cg::load_packed_pair`).
#[inline]
pub(crate) fn panel_pos(c: usize, nr: usize, to: DType) -> usize {
    if interleaved(nr, to) {
        let h = nr / 2;
        if c < h {
            2 * c
        } else {
            2 * (c - h) + 1
        }
    } else {
        c
    }
}

/// Whether panels of `nr` columns of `to` interleave the halves of their rows ([`panel_pos`]).
#[inline]
pub(crate) fn interleaved(nr: usize, to: DType) -> bool {
    to == DType::Bf16 && nr.is_multiple_of(2)
}

/// Rewrites bf16 panels of `nr` columns, whose rows are in [`panel_pos`] order, so that each pair
/// of panel rows `2q`, `2q + 1` holds the pairs `(row 2q, row 2q + 1)` of every column `c` at
/// `2c`, `2c + 1`: the B operand of the bf16 dot product (`GemmSpec::bf16_dot`), each 32-bit
/// lane one column's two k values. The panels' runs of rows (a dense panel's K rows, a sparse
/// panel's segments) have even lengths there, so no pair straddles two runs.
pub(crate) fn pair_rows(panels: &mut Panels, nr: usize) {
    use rayon::prelude::*;
    const MAX_NR: usize = 128;
    assert!(
        nr <= MAX_NR,
        "panels of {nr} columns are wider than {MAX_NR}"
    );
    let pair = 2 * nr * 2;
    if pair == 0 {
        return;
    }
    panels
        .as_mut_slice()
        .par_chunks_mut(pair * 256)
        .for_each(|chunk| {
            let mut out = [0u8; 2 * MAX_NR * 2];
            for rows in chunk.chunks_exact_mut(pair) {
                for i in 0..2 {
                    for c in 0..nr {
                        let src = (i * nr + panel_pos(c, nr, DType::Bf16)) * 2;
                        let dst = (2 * c + i) * 2;
                        out[dst..dst + 2].copy_from_slice(&rows[src..src + 2]);
                    }
                }
                rows.copy_from_slice(&out[..pair]);
            }
        });
}

/// Writes the elements of `src` (of `from`) to `dst` as `to`: the same bytes, or (`to` f32)
/// widened exactly.
#[inline]
fn put(from: DType, to: DType, src: &[u8], dst: &mut [u8]) {
    if from == to {
        dst.copy_from_slice(src);
    } else {
        scatter(from, to, src, dst, 0, to.size_bytes());
    }
}

/// Writes element `i` of `src` (of `from`) as `to` at byte `at + i * stride` of `dst`: a run of
/// one stored row into a panel column.
#[inline]
fn scatter(from: DType, to: DType, src: &[u8], dst: &mut [u8], at: usize, stride: usize) {
    fn copy<const S: usize>(src: &[u8], dst: &mut [u8], mut at: usize, stride: usize) {
        for e in src.chunks_exact(S) {
            dst[at..at + S].copy_from_slice(e);
            at += stride;
        }
    }
    match (from == to, to.size_bytes()) {
        (true, 2) => copy::<2>(src, dst, at, stride),
        (true, _) => copy::<4>(src, dst, at, stride),
        (false, _) => {
            let mut at = at;
            from.for_each_f32(src, |x| {
                dst[at..at + 4].copy_from_slice(&x.to_le_bytes());
                at += stride;
            });
        }
    }
}

/// Packs the `[K, N]` operand stored in `bytes` as `dtype` (row-major `[K, N]` for layout `n`,
/// `[N, K]` for `t`) into `ceil(N / nr)` zero-padded panels of `K x nr` elements of `to` (`dtype`,
/// or f32 to widen a 16-bit B).
pub(crate) fn pack_b(
    bytes: &[u8],
    dtype: DType,
    to: DType,
    layout: MatLayout,
    k: usize,
    n: usize,
    nr: usize,
) -> Panels {
    use rayon::prelude::*;
    let (size, psize) = (dtype.size_bytes(), to.size_bytes());
    let panels = n.div_ceil(nr);
    let mut out = Panels::zeroed(panels * k * nr * psize);
    if k == 0 || nr == 0 {
        return out;
    }
    let row = nr * psize;
    // The panels in parallel: each is its own `k x nr` run of the output.
    out.as_mut_slice()
        .par_chunks_mut(k * row)
        .enumerate()
        .for_each(|(p, panel)| {
            let (c0, c1) = (p * nr, n.min((p + 1) * nr));
            let width = (c1 - c0) * size;
            match layout {
                // A panel row is a run of a row of B.
                MatLayout::N if !interleaved(nr, to) => {
                    for (kk, dst) in panel.chunks_exact_mut(row).enumerate() {
                        let src = (kk * n + c0) * size;
                        let dst = &mut dst[..(c1 - c0) * psize];
                        put(dtype, to, &bytes[src..src + width], dst);
                    }
                }
                // Interleaved panels (`panel_pos`): element by element.
                MatLayout::N => {
                    for (kk, dst) in panel.chunks_exact_mut(row).enumerate() {
                        for j in 0..c1 - c0 {
                            let src = (kk * n + c0 + j) * size;
                            let at = panel_pos(j, nr, to) * psize;
                            put(dtype, to, &bytes[src..src + size], &mut dst[at..at + psize]);
                        }
                    }
                }
                // A panel column is a run of a row of the stored B^T: tiles of `KT` k values,
                // each column's run read contiguously and written down its panel column (the
                // tile's `KT` panel rows stay in L1).
                MatLayout::T => {
                    const KT: usize = 64;
                    for k0 in (0..k).step_by(KT) {
                        let kt = KT.min(k - k0);
                        for (j, col) in (c0..c1).enumerate() {
                            let src = &bytes[(col * k + k0) * size..(col * k + k0 + kt) * size];
                            let at = k0 * row + panel_pos(j, nr, to) * psize;
                            scatter(dtype, to, src, panel, at, row);
                        }
                    }
                }
            }
        });
    out
}

/// Where the segments of each panel of a block-sparse B lie.
pub(crate) struct BsrLayout {
    pub index: Vec<i64>,
    /// Panel rows over all segments.
    rows: usize,
    panels: usize,
    nr: usize,
}

impl BsrLayout {
    /// The elements of the packed panels that panels `p0..p1` occupy (a panel's segments, and
    /// consecutive panels, are consecutive there).
    pub fn elements(&self, p0: usize, p1: usize) -> std::ops::Range<usize> {
        let segments = self.index[self.panels] as usize;
        let start = |p: usize| {
            let s = self.index[p] as usize;
            if s < segments {
                self.index[self.panels + 1 + 3 * s + 2] as usize
            } else {
                self.rows * self.nr
            }
        };
        start(p0)..start(p1)
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
///
/// Block by block: each kept block's rows (contiguous in `bytes`) are copied a row at a time
/// into the panel columns they belong to. The panels are packed in parallel, each into its own
/// run of the output (a panel's segments are consecutive there).
pub(crate) fn pack_bsr(
    bytes: &[u8],
    dtype: DType,
    to: DType,
    p: &BlockPattern,
    layout: &BsrLayout,
    nr: usize,
) -> Panels {
    use rayon::prelude::*;
    let n = p.out as usize;
    let [br, bc] = p.block.map(|d| d as usize);
    let grid_cols = p.block_cols() as usize;
    let (size, psize) = (dtype.size_bytes(), to.size_bytes());
    // Kept block index of each (block row, block col), or none.
    let mut slot = vec![u32::MAX; p.block_rows() as usize * grid_cols];
    for (i, &(r, c)) in p.kept.iter().enumerate() {
        slot[r as usize * grid_cols + c as usize] = i as u32;
    }
    let panels = n.div_ceil(nr);
    let segments = |panel: usize| {
        let (s0, s1) = (
            layout.index[panel] as usize,
            layout.index[panel + 1] as usize,
        );
        (s0..s1).map(move |s| {
            let at = panels + 1 + 3 * s;
            (
                layout.index[at] as usize,
                layout.index[at + 1] as usize,
                layout.index[at + 2] as usize,
            )
        })
    };
    let mut out = Panels::zeroed(layout.rows * nr * psize);
    // Each panel's own rows, in panel order, with the offset its first segment starts at.
    let mut parts = Vec::with_capacity(panels);
    let mut rest = out.as_mut_slice();
    for panel in 0..panels {
        let rows: usize = segments(panel).map(|(_, len, _)| len).sum();
        let start = segments(panel).next().map_or(0, |(_, _, off)| off);
        let (head, tail) = rest.split_at_mut(rows * nr * psize);
        parts.push((panel, start, head));
        rest = tail;
    }
    parts.into_par_iter().for_each(|(panel, start, dst)| {
        let (c0, c1) = (panel * nr, ((panel + 1) * nr).min(n));
        for (k0, len, off) in segments(panel) {
            // Segments are whole block columns (`bsr_layout`).
            for c in k0 / bc..(k0 + len) / bc {
                let row0 = off - start + (c * bc - k0) * nr;
                for r in c0 / br..=(c1 - 1) / br {
                    let b = slot[r * grid_cols + c];
                    if b == u32::MAX {
                        continue;
                    }
                    for col in c0.max(r * br)..c1.min((r + 1) * br) {
                        let src = (b as usize * br + (col - r * br)) * bc * size;
                        let run = &bytes[src..src + bc * size];
                        let at = (row0 + panel_pos(col - c0, nr, to)) * psize;
                        scatter(dtype, to, run, dst, at, nr * psize);
                    }
                }
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f32 values of panels packed from f32.
    fn f32s(p: &Panels) -> Vec<f32> {
        p.as_slice()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

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
        // Panel 0's segments hold elements 0..8 (4 rows of 2), panel 1's 8..12.
        assert_eq!(l.elements(0, 1), 0..8);
        assert_eq!(l.elements(1, 2), 8..12);
        assert_eq!(l.elements(0, 2), 0..12);
        assert_eq!(l.elements(2, 2), 12..12);
        let blocks: Vec<u8> = (0..12).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let packed = pack_bsr(&blocks, DType::F32, DType::F32, &p, &l, 2);
        // Block 0 = [[0, 1], [2, 3]] at rows n 0-1, k 0-1: panel row k holds W[0][k], W[1][k].
        assert_eq!(
            f32s(&packed),
            &[0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0, 8.0, 10.0, 9.0, 11.0]
        );
        // Panels straddling block rows take the union, zero where a column's block is dropped.
        let l = bsr_layout(&p, 4);
        assert_eq!(l.index, vec![0, 1, 0, 6, 0]);
        let packed = pack_bsr(&blocks, DType::F32, DType::F32, &p, &l, 4);
        assert_eq!(
            &f32s(&packed)[..8],
            &[0.0, 2.0, 0.0, 0.0, 1.0, 3.0, 0.0, 0.0]
        );
        assert_eq!(&f32s(&packed)[8..12], &[0.0, 0.0, 8.0, 10.0]);
    }

    #[test]
    fn both_layouts_pack_to_the_same_panels() {
        // B = [[0, 1, 2], [3, 4, 5]] as [K=2, N=3], panels of 2 columns.
        let b_n: Vec<u8> = (0..6).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let b_t: Vec<u8> = [0, 3, 1, 4, 2, 5]
            .iter()
            .flat_map(|&v| (v as f32).to_le_bytes())
            .collect();
        let pn = pack_b(&b_n, DType::F32, DType::F32, MatLayout::N, 2, 3, 2);
        let pt = pack_b(&b_t, DType::F32, DType::F32, MatLayout::T, 2, 3, 2);
        assert_eq!(f32s(&pn), &[0.0, 1.0, 3.0, 4.0, 2.0, 0.0, 5.0, 0.0]);
        assert_eq!(pn.as_slice(), pt.as_slice());
        assert_eq!(pn.as_ptr() as usize % 64, 0);
    }

    /// Panels of both layouts and every dtype against their definition, element by element: k
    /// past a tile of 64 and not a multiple of it, a last panel past N, bit patterns of all
    /// kinds (NaN payloads kept: panels hold the stored bytes).
    #[test]
    fn panels_are_their_definition() {
        let (k, n, nr) = (150, 70, 32);
        for dtype in DType::ALL {
            let size = dtype.size_bytes();
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let bytes: Vec<u8> = (0..k * n * size)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            for (layout, to) in [MatLayout::N, MatLayout::T]
                .into_iter()
                .flat_map(|l| [(l, dtype), (l, DType::F32)])
            {
                let packed = pack_b(&bytes, dtype, to, layout, k, n, nr);
                let got = packed.as_slice();
                assert_eq!(got.len(), n.div_ceil(nr) * k * nr * to.size_bytes());
                for p in 0..n.div_ceil(nr) {
                    for kk in 0..k {
                        for j in 0..nr {
                            let col = p * nr + j;
                            let want = match (col < n, layout) {
                                (false, _) => 0.0,
                                (true, MatLayout::N) => load_f32(&bytes, dtype, kk * n + col),
                                (true, MatLayout::T) => load_f32(&bytes, dtype, col * k + kk),
                            };
                            let at = p * k * nr + kk * nr + panel_pos(j, nr, to);
                            assert_eq!(
                                load_f32(got, to, at).to_bits(),
                                want.to_bits(),
                                "{dtype} as {to} {layout:?} panel {p} k {kk} column {j}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Block-sparse panels of every dtype against their definition, element by element: square
    /// and rectangular blocks, panels narrower and wider than a block row and not a multiple of
    /// it, a last panel past N, patterns with empty block rows, a single block and every block.
    #[test]
    fn sparse_panels_are_their_definition() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for (block, grid) in [([2, 2], [5, 7]), ([3, 5], [7, 4]), ([16, 8], [3, 6])] {
            let [br, bc] = block;
            let all: Vec<(u32, u32)> = (0..grid[0])
                .flat_map(|r| (0..grid[1]).map(move |c| (r, c)))
                .collect();
            let patterns = [
                all.iter().copied().filter(|_| next() % 3 == 0).collect(),
                vec![(grid[0] - 1, 1)],
                all.clone(),
                all.iter()
                    .copied()
                    .filter(|&(r, _)| r % 2 == 1)
                    .collect::<Vec<_>>(),
            ];
            for kept in patterns {
                let p = BlockPattern {
                    block,
                    out: u64::from(br * grid[0]),
                    inp: u64::from(bc * grid[1]),
                    kept,
                };
                let (n, bcs) = (p.out as usize, p.block_cols() as usize);
                let (br, bc) = (br as usize, bc as usize);
                let mut slot = vec![None; p.block_rows() as usize * bcs];
                for (i, &(r, c)) in p.kept.iter().enumerate() {
                    slot[r as usize * bcs + c as usize] = Some(i);
                }
                for dtype in DType::ALL {
                    let size = dtype.size_bytes();
                    let bytes: Vec<u8> = (0..p.kept.len() * br * bc * size)
                        .map(|_| next() as u8)
                        .collect();
                    for (nr, to) in [2, 3, 16, 32]
                        .into_iter()
                        .flat_map(|nr| [(nr, dtype), (nr, DType::F32)])
                    {
                        let l = bsr_layout(&p, nr);
                        let got = pack_bsr(&bytes, dtype, to, &p, &l, nr);
                        let got = got.as_slice();
                        assert_eq!(got.len(), l.rows * nr * to.size_bytes());
                        let panels = n.div_ceil(nr);
                        for panel in 0..panels {
                            for s in l.index[panel] as usize..l.index[panel + 1] as usize {
                                let at = panels + 1 + 3 * s;
                                let [k0, len, off] = [0, 1, 2].map(|i| l.index[at + i] as usize);
                                for kk in 0..len {
                                    for j in 0..nr {
                                        let (col, k) = (panel * nr + j, k0 + kk);
                                        let want = match slot
                                            .get((col / br) * bcs + k / bc)
                                            .copied()
                                            .flatten()
                                        {
                                            Some(b) if col < n => load_f32(
                                                &bytes,
                                                dtype,
                                                b * br * bc + (col % br) * bc + k % bc,
                                            ),
                                            _ => 0.0,
                                        };
                                        let at = off + kk * nr + panel_pos(j, nr, to);
                                        let v = load_f32(got, to, at);
                                        assert!(
                                            v.to_bits() == want.to_bits(),
                                            "{dtype:?} as {to} {block:?} nr {nr} panel {panel} k {k} \
                                             column {j}: {v} for {want}"
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
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
