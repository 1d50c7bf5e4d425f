//! The reference interpreter: the oracle every backend is checked against.
//!
//! Semantics: every value is held in f64. A node's result is rounded to its dtype when it is
//! stored, as an unfused framework would store it; inside a fused [`Gemm`] the accumulator and the
//! epilogue stay in f64 and only the final result is rounded, as a fused kernel keeps them in
//! registers. Views (transpose) only change strides. Products accumulate in f64. A sparse GEMM
//! sums over its kept blocks only (a dropped block contributes nothing) and is otherwise the
//! dense GEMM with its fused epilogue.
//!
//! Memory: a product reads a weight as stored, widening a few of its columns to f64 at a time
//! (a transposed weight is read in place, not copied); other ops widen the weights they read
//! (biases, packed blocks) while they run. A computed value is dropped after its last reader. So
//! a weight is never held in f64 whole by a product, and a model's weights never all at once;
//! only [`interpret_perturbed`] widens each product's A operand whole (a weight too, where it is
//! the left operand) to move its terms, while that product runs.

use crate::graph::{Graph, NodeId};
use crate::inputs::{bind_inputs, InputError};
use crate::op::{BlockPattern, Epilogue, Gemm, MatLayout, Op, SparseGemm};
use crate::tensor::HostTensor;
use crate::types::{Bindings, DType};
use crate::verify::{verify, VerifyErrors};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone, thiserror::Error)]
pub enum InterpError {
    #[error(transparent)]
    Invalid(#[from] VerifyErrors),
    #[error(transparent)]
    Input(#[from] InputError),
    #[error("node `{node}`: a dimension is not bound by the inputs ({bindings})")]
    Unbound { node: String, bindings: String },
    #[error("node `{node}`: {elements} elements do not fit in memory")]
    TooLarge { node: String, elements: u64 },
}

/// A value's elements: f64 (computed values and inputs), or a weight as stored, widened to f64
/// where it is read.
#[derive(Clone, Debug)]
enum Data {
    F64(Arc<Vec<f64>>),
    Stored(Arc<HostTensor>),
}

impl Data {
    fn len(&self) -> usize {
        match self {
            Data::F64(v) => v.len(),
            Data::Stored(t) => t.numel(),
        }
    }

    fn get(&self, i: usize) -> f64 {
        match self {
            Data::F64(v) => v[i],
            Data::Stored(t) => t.get(i),
        }
    }
}

/// A strided array.
#[derive(Clone, Debug)]
struct Value {
    shape: Vec<usize>,
    strides: Vec<usize>,
    data: Data,
}

impl Value {
    fn contiguous(shape: Vec<usize>, data: Vec<f64>) -> Value {
        Value::row_major(shape, Data::F64(Arc::new(data)))
    }

    fn row_major(shape: Vec<usize>, data: Data) -> Value {
        let mut strides = vec![1; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        Value {
            shape,
            strides,
            data,
        }
    }

    fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the data is the elements in row-major order, exactly.
    fn is_contiguous(&self) -> bool {
        let mut stride = 1;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != stride {
                return false;
            }
            stride *= d;
        }
        self.data.len() == stride
    }

    /// The elements in row-major order.
    fn dense(&self) -> Vec<f64> {
        if self.is_contiguous() {
            return match &self.data {
                Data::F64(v) => v.to_vec(),
                Data::Stored(t) => t.to_f64(),
            };
        }
        let n = self.numel();
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0usize; self.shape.len()];
        for _ in 0..n {
            let off: usize = idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum();
            out.push(self.data.get(off));
            for ax in (0..idx.len()).rev() {
                idx[ax] += 1;
                if idx[ax] < self.shape[ax] {
                    break;
                }
                idx[ax] = 0;
            }
        }
        out
    }
}

/// A `[rows, cols]` matrix operand after applying its layout: `data` holds it row-major, or
/// with `by_cols` column-major (element `(r, c)` at `data[c * rows + r]`: its transpose
/// row-major). Borrowed from the value where the value is stored either way (a weight, or its
/// transpose view), copied otherwise.
struct Mat<'a> {
    rows: usize,
    cols: usize,
    by_cols: bool,
    data: MatData<'a>,
}

/// A matrix operand's elements: f64, or a weight as stored (widened where it is read).
enum MatData<'a> {
    F64(Cow<'a, [f64]>),
    Stored(&'a HostTensor),
}

impl Mat<'_> {
    /// `v` as the logical matrix of a GEMM operand: leading dims flatten into rows; `T` reads the
    /// stored matrix transposed.
    fn of(v: &Value, layout: MatLayout) -> Mat<'_> {
        let cols_stored = *v.shape.last().unwrap_or(&1);
        // A 2-D view that is the transpose of contiguous data (a transposed weight).
        let transposed_view =
            v.shape.len() == 2 && v.strides == [1, v.shape[0]] && v.data.len() == v.numel();
        let in_place = |by_cols| {
            let data = match &v.data {
                Data::F64(d) => MatData::F64(Cow::Borrowed(d.as_slice())),
                Data::Stored(t) => MatData::Stored(t),
            };
            (data, by_cols)
        };
        let (data, by_cols) = if v.is_contiguous() {
            in_place(false)
        } else if transposed_view {
            in_place(true)
        } else {
            (MatData::F64(Cow::Owned(v.dense())), false)
        };
        // Each form holds exactly the value's elements.
        let rows_stored = v.numel().checked_div(cols_stored).unwrap_or(0);
        match layout {
            MatLayout::N => Mat {
                rows: rows_stored,
                cols: cols_stored,
                by_cols,
                data,
            },
            MatLayout::T => Mat {
                rows: cols_stored,
                cols: rows_stored,
                by_cols: !by_cols,
                data,
            },
        }
    }

    /// The matrix row-major, in f64.
    fn row_major(&self) -> Cow<'_, [f64]> {
        let data = match &self.data {
            MatData::F64(d) => Cow::Borrowed(d.as_ref()),
            MatData::Stored(t) => Cow::Owned(t.to_f64()),
        };
        if !self.by_cols {
            return data;
        }
        let mut t = vec![0.0; data.len()];
        for c in 0..self.cols {
            for r in 0..self.rows {
                t[r * self.cols + c] = data[c * self.rows + r];
            }
        }
        Cow::Owned(t)
    }
}

/// `A @ B` in f64. Each output element sums its products in order of k, whatever the blocking,
/// threading and widening below, so the result does not depend on the machine. Rows go in
/// blocks of [`ROW_BLOCK`] (each row or column of B is read once per block instead of once per
/// row), and large products split their rows over the available cores, or their columns where
/// the rows are too few to share (a product of a few tokens). A weight as stored is widened to
/// f64 a few columns at a time ([`WIDEN_ELEMENTS`]), never whole.
fn matmul(a: &Mat, b: &Mat) -> Vec<f64> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let mut out = vec![0.0; m * n];
    if n == 0 || m == 0 {
        return out;
    }
    let a = a.row_major();
    let cores = crate::par::cores_for(m * k * n, PARALLEL_WORK);
    let threads = cores.min(m.div_ceil(ROW_BLOCK));
    if threads > 1 {
        // Whole row blocks per thread.
        let rows_per = m.div_ceil(threads).div_ceil(ROW_BLOCK) * ROW_BLOCK;
        let a = &a;
        std::thread::scope(|scope| {
            for (t, chunk) in out.chunks_mut(rows_per * n).enumerate() {
                let dst = Dst {
                    data: chunk,
                    ld: n,
                    c0: 0,
                };
                scope.spawn(move || product_cols(a, k, b, t * rows_per, 0..n, dst));
            }
        });
        return out;
    }
    let threads = cores.min(n.div_ceil(COL_BLOCK));
    if threads <= 1 {
        let dst = Dst {
            data: &mut out,
            ld: n,
            c0: 0,
        };
        product_cols(&a, k, b, 0, 0..n, dst);
        return out;
    }
    // Ranges of columns per thread, each into its own buffer, then into place.
    let cols_per = n.div_ceil(threads);
    let a = &a;
    let parts = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .step_by(cols_per)
            .map(|j0| {
                let cols = j0..n.min(j0 + cols_per);
                scope.spawn(move || {
                    let mut part = vec![0.0; m * cols.len()];
                    let dst = Dst {
                        data: &mut part,
                        ld: cols.len(),
                        c0: 0,
                    };
                    product_cols(a, k, b, 0, cols.clone(), dst);
                    (cols, part)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect::<Vec<_>>()
    });
    for (cols, part) in parts {
        for (row, src) in out.chunks_mut(n).zip(part.chunks(cols.len())) {
            row[cols.clone()].copy_from_slice(src);
        }
    }
    out
}

/// Rows of A multiplied together against each row (or column) of B.
const ROW_BLOCK: usize = 8;
/// The fewest columns of B a thread takes where a product's columns are split.
const COL_BLOCK: usize = 64;
/// Multiply-adds from which a product is split over threads.
const PARALLEL_WORK: usize = 1 << 24;
/// About how many elements of a stored B are widened to f64 at a time (2 MiB); at least
/// [`WIDEN_COLS`] columns, so that A is streamed no more often than B would be whole.
const WIDEN_ELEMENTS: usize = 1 << 18;
const WIDEN_COLS: usize = 16;

/// Where [`matmul_rows`] writes: `data` holds whole rows of `ld` elements, and a product's
/// columns land from column `c0` of each.
struct Dst<'a> {
    data: &'a mut [f64],
    ld: usize,
    c0: usize,
}

/// B `[k, n]` in f64 as [`matmul_rows`] reads it: row-major, or with `by_cols` column-major.
#[derive(Clone, Copy)]
struct F64Cols<'a> {
    data: &'a [f64],
    by_cols: bool,
    n: usize,
}

/// Rows `row0 ..` (as many as `dst` holds) and columns `cols` of `A @ B` into `dst` (zeros), A
/// row-major with `k` columns. A stored B is widened a chunk of `cols` at a time, each chunk
/// against every row.
fn product_cols(a: &[f64], k: usize, b: &Mat, row0: usize, cols: std::ops::Range<usize>, dst: Dst) {
    let t = match &b.data {
        MatData::F64(d) => {
            let b = F64Cols {
                data: d,
                by_cols: b.by_cols,
                n: b.cols,
            };
            return matmul_rows(a, k, b, row0, cols, dst);
        }
        MatData::Stored(t) => t,
    };
    let Dst { data: out, ld, c0 } = dst;
    let per = (WIDEN_ELEMENTS / k.max(1)).max(WIDEN_COLS);
    let mut buf = vec![0.0; per.min(cols.len()) * k];
    for j0 in cols.clone().step_by(per) {
        let w = per.min(cols.end - j0);
        let buf = &mut buf[..w * k];
        if b.by_cols {
            // Columns j0 .. j0 + w of B: one run of the stored (transposed) weight.
            t.widen_into(j0 * k, buf);
        } else {
            for (p, row) in buf.chunks_mut(w).enumerate() {
                t.widen_into(p * b.cols + j0, row);
            }
        }
        let chunk = F64Cols {
            data: buf,
            by_cols: b.by_cols,
            n: w,
        };
        let dst = Dst {
            data: &mut *out,
            ld,
            c0: c0 + (j0 - cols.start),
        };
        matmul_rows(a, k, chunk, row0, 0..w, dst);
    }
}

/// Rows `row0 ..` (as many as `dst` holds) and columns `cols` of `A @ B` into `dst` (zeros), A
/// row-major with `k` columns. Each element adds its products to 0 in order of k, however B is
/// stored. The same code, compiled for AVX2 where the CPU has it: wider vectors for the same
/// multiplies and adds in the same order (never fused), so the same bits.
fn matmul_rows(
    a: &[f64],
    k: usize,
    b: F64Cols,
    row0: usize,
    cols: std::ops::Range<usize>,
    dst: Dst,
) {
    let Dst { data: out, ld, c0 } = dst;
    // With B by columns, a chunk of columns at a time, so that the kernel's copy of them
    // stays small.
    let per = if b.by_cols {
        (WIDEN_ELEMENTS / k.max(1)).max(WIDEN_COLS)
    } else {
        cols.len().max(1)
    };
    for j0 in cols.clone().step_by(per) {
        let chunk = j0..cols.end.min(j0 + per);
        let dst = Dst {
            data: &mut *out,
            ld,
            c0: c0 + (j0 - cols.start),
        };
        #[cfg(target_arch = "x86_64")]
        if !portable_only() && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            unsafe { matmul_rows_avx2(a, k, b, row0, chunk, dst) };
            continue;
        }
        matmul_rows_portable(a, k, b, row0, chunk, dst, quad);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn matmul_rows_avx2(
    a: &[f64],
    k: usize,
    b: F64Cols,
    row0: usize,
    cols: std::ops::Range<usize>,
    dst: Dst,
) {
    matmul_rows_portable(a, k, b, row0, cols, dst, |at, bq| quad_avx2(at, bq))
}

/// [`quad`] in AVX2 vectors: each row half of a block times a broadcast element of B.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quad_avx2(interleaved: &[[f64; ROW_BLOCK]], bq: &[[f64; 4]]) -> [[f64; ROW_BLOCK]; 4] {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_pd(); 2]; 4];
    for (at, bv) in interleaved.iter().zip(bq) {
        let half = [
            _mm256_set_pd(at[3], at[2], at[1], at[0]),
            _mm256_set_pd(at[7], at[6], at[5], at[4]),
        ];
        for (acc, &v) in acc.iter_mut().zip(bv) {
            let v = _mm256_set1_pd(v);
            for (acc, &h) in acc.iter_mut().zip(&half) {
                *acc = _mm256_add_pd(*acc, _mm256_mul_pd(h, v));
            }
        }
    }
    let mut out = [[0.0; ROW_BLOCK]; 4];
    for (out, acc) in out.iter_mut().zip(&acc) {
        for (out, &v) in out.chunks_mut(4).zip(acc) {
            let (lo, hi) = (_mm256_castpd256_pd128(v), _mm256_extractf128_pd::<1>(v));
            out[0] = _mm_cvtsd_f64(lo);
            out[1] = _mm_cvtsd_f64(_mm_unpackhi_pd(lo, lo));
            out[2] = _mm_cvtsd_f64(hi);
            out[3] = _mm_cvtsd_f64(_mm_unpackhi_pd(hi, hi));
        }
    }
    out
}

/// A block of rows of A (interleaved) against four columns of B (interleaved): each element's
/// products summed in order of k.
#[inline(always)]
fn quad(interleaved: &[[f64; ROW_BLOCK]], bq: &[[f64; 4]]) -> [[f64; ROW_BLOCK]; 4] {
    let mut acc = [[0.0f64; ROW_BLOCK]; 4];
    for (at, bv) in interleaved.iter().zip(bq) {
        for r in 0..ROW_BLOCK {
            acc[0][r] += at[r] * bv[0];
            acc[1][r] += at[r] * bv[1];
            acc[2][r] += at[r] * bv[2];
            acc[3][r] += at[r] * bv[3];
        }
    }
    acc
}

/// Whether products keep to the portable code (the tests compare it with the AVX2 build).
#[cfg(test)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn portable_only() -> bool {
    tests::PORTABLE_ONLY.load(std::sync::atomic::Ordering::Relaxed)
}
#[cfg(not(test))]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn portable_only() -> bool {
    false
}

/// [`matmul_rows`]' code for one chunk of columns, inlined into each build of it.
#[inline(always)]
fn matmul_rows_portable(
    a: &[f64],
    k: usize,
    b: F64Cols,
    row0: usize,
    cols: std::ops::Range<usize>,
    dst: Dst,
    quad_kernel: impl Fn(&[[f64; ROW_BLOCK]], &[[f64; 4]]) -> [[f64; ROW_BLOCK]; 4],
) {
    let Dst { data: out, ld, c0 } = dst;
    let w = cols.len();
    // With B by columns: the block's rows of A interleaved (element p of each side by side, rows
    // past the block's last zero), so that each element of B multiplies them all at once; and
    // B's columns four by four interleaved likewise, so that each k reads one run of four.
    let mut interleaved = if b.by_cols {
        vec![[0.0f64; ROW_BLOCK]; k]
    } else {
        Vec::new()
    };
    let mut bq = Vec::new();
    if b.by_cols && k > 0 {
        bq = vec![[0.0f64; 4]; (w / 4) * k];
        for (q, run) in bq.chunks_mut(k).enumerate() {
            for c in 0..4 {
                let j = cols.start + 4 * q + c;
                for (x, &v) in run.iter_mut().zip(&b.data[j * k..(j + 1) * k]) {
                    x[c] = v;
                }
            }
        }
    }
    for (blk, rows) in out.chunks_mut(ROW_BLOCK * ld).enumerate() {
        let first = row0 + blk * ROW_BLOCK;
        let a_rows: Vec<&[f64]> = (0..rows.len() / ld)
            .map(|r| &a[(first + r) * k..(first + r + 1) * k])
            .collect();
        if b.by_cols {
            for (p, at) in interleaved.iter_mut().enumerate() {
                for (r, x) in at.iter_mut().enumerate() {
                    *x = a_rows.get(r).map_or(0.0, |arow| arow[p]);
                }
            }
            let mut store = |jj: usize, acc: &[f64; ROW_BLOCK]| {
                for (r, x) in acc.iter().take(a_rows.len()).enumerate() {
                    rows[r * ld + c0 + jj] = *x;
                }
            };
            // Four columns of B (interleaved in `bq`) at a time against the block's rows.
            let quads = w / 4;
            for q in 0..quads {
                let acc = quad_kernel(&interleaved, &bq[q * k..(q + 1) * k]);
                for (c, acc) in acc.iter().enumerate() {
                    store(4 * q + c, acc);
                }
            }
            let pairs = w / 2;
            for pair in 2 * quads..pairs {
                let j = cols.start + 2 * pair;
                let (b0, b1) = (
                    &b.data[j * k..(j + 1) * k],
                    &b.data[(j + 1) * k..(j + 2) * k],
                );
                let (mut acc0, mut acc1) = ([0.0f64; ROW_BLOCK], [0.0f64; ROW_BLOCK]);
                for ((at, &v0), &v1) in interleaved.iter().zip(b0).zip(b1) {
                    for r in 0..ROW_BLOCK {
                        acc0[r] += at[r] * v0;
                        acc1[r] += at[r] * v1;
                    }
                }
                store(2 * pair, &acc0);
                store(2 * pair + 1, &acc1);
            }
            if w % 2 == 1 {
                let j = cols.end - 1;
                let mut acc = [0.0f64; ROW_BLOCK];
                for (at, &v) in interleaved.iter().zip(&b.data[j * k..(j + 1) * k]) {
                    for r in 0..ROW_BLOCK {
                        acc[r] += at[r] * v;
                    }
                }
                store(w - 1, &acc);
            }
            continue;
        }
        for p in 0..k {
            let brow = &b.data[p * b.n + cols.start..p * b.n + cols.end];
            for (arow, row) in a_rows.iter().zip(rows.chunks_mut(ld)) {
                let av = arow[p];
                for (o, &bv) in row[c0..c0 + w].iter_mut().zip(brow) {
                    *o += av * bv;
                }
            }
        }
    }
}

fn round_all(dtype: DType, v: &mut [f64]) {
    for x in v {
        *x = dtype.round(*x);
    }
}

/// Applies an epilogue chain in f64 to a row-major `[rows, n]` accumulator.
fn apply_chain(acc: &mut [f64], n: usize, steps: &[Epilogue], operands: &[Vec<f64>]) {
    for step in steps {
        match *step {
            Epilogue::Bias { operand } => {
                let b = &operands[operand];
                for (i, x) in acc.iter_mut().enumerate() {
                    *x += b[i % n];
                }
            }
            Epilogue::Add { operand } => acc
                .iter_mut()
                .zip(&operands[operand])
                .for_each(|(x, r)| *x += r),
            Epilogue::Mul { operand } => acc
                .iter_mut()
                .zip(&operands[operand])
                .for_each(|(x, r)| *x *= r),
            Epilogue::Act(a) => acc.iter_mut().for_each(|x| *x = a.eval(*x)),
        }
    }
}

/// `A @ B` where `B^T` (`[N, K]`) is block-sparse: `packed` holds the kept blocks of `pattern`.
/// Only kept blocks are visited, so a dropped block adds nothing (not even `0 * inf`).
fn sparse_matmul(a: &Mat, pattern: &BlockPattern, packed: &[f64]) -> Vec<f64> {
    let (m, k, n) = (a.rows, a.cols, pattern.out as usize);
    let a_data = a.row_major();
    let [br, bc] = pattern.block.map(|d| d as usize);
    let mut out = vec![0.0; m * n];
    for (i, &(r, c)) in pattern.kept.iter().enumerate() {
        let block = &packed[i * br * bc..(i + 1) * br * bc];
        let (n0, k0) = (r as usize * br, c as usize * bc);
        for row in 0..m {
            let arow = &a_data[row * k + k0..row * k + k0 + bc];
            for (j, wrow) in block.chunks_exact(bc).enumerate() {
                let dot: f64 = arow.iter().zip(wrow).map(|(x, w)| x * w).sum();
                out[row * n + n0 + j] += dot;
            }
        }
    }
    out
}

fn gemm(g: &Gemm, vals: &[&Value]) -> Vec<f64> {
    gemm_with(
        g,
        vals,
        |a, v| matmul(a, &Mat::of(v, g.b)),
        |v| Mat::of(v, g.b).cols,
    )
}

fn sparse_gemm(s: &SparseGemm, vals: &[&Value]) -> Vec<f64> {
    gemm_with(
        &s.gemm,
        vals,
        |a, v| sparse_matmul(a, &s.pattern, &v.dense()),
        |_| s.pattern.out as usize,
    )
}

/// The GEMM `g` with `product(A, B operand)` for each matrix product and `cols(B operand)` = N.
fn gemm_with(
    g: &Gemm,
    vals: &[&Value],
    product: impl Fn(&Mat, &Value) -> Vec<f64>,
    cols: impl Fn(&Value) -> usize,
) -> Vec<f64> {
    let a = Mat::of(vals[0], g.a);
    // Epilogue operands, dense; the matrix operand slots stay empty.
    let dense: Vec<Vec<f64>> = vals
        .iter()
        .enumerate()
        .map(|(i, v)| {
            if i < g.matrix_operands() {
                Vec::new()
            } else {
                v.dense()
            }
        })
        .collect();
    let n = cols(vals[1]);
    let mut acc = product(&a, vals[1]);
    if let Some(d) = &g.dual {
        apply_chain(&mut acc, n, &d.gate, &dense);
        let mut up = product(&a, vals[2]);
        apply_chain(&mut up, n, &d.up, &dense);
        acc.iter_mut().zip(&up).for_each(|(x, u)| *x *= u);
    }
    apply_chain(&mut acc, n, &g.epilogue, &dense);
    acc
}

/// Evaluates a node on operand values; returns the row-major result before rounding.
fn eval(op: &Op, vals: &[&Value], out_shape: &[usize]) -> Vec<f64> {
    match op {
        Op::Input | Op::Weight | Op::Transpose => {
            unreachable!("leaves and views are handled by the caller")
        }
        Op::MatMul => matmul(
            &Mat::of(vals[0], MatLayout::N),
            &Mat::of(vals[1], MatLayout::N),
        ),
        Op::Add | Op::Mul => {
            let (a, b) = (vals[0].dense(), vals[1].dense());
            let numel: usize = out_shape.iter().product();
            let f = |x: f64, y: f64| if matches!(op, Op::Add) { x + y } else { x * y };
            // One side may be a row vector broadcast over the rows of the other.
            (0..numel)
                .map(|i| f(a[i % a.len()], b[i % b.len()]))
                .collect()
        }
        Op::Act(act) => vals[0].dense().into_iter().map(|x| act.eval(x)).collect(),
        Op::Gemm(g) => gemm(g, vals),
        Op::SparseGemm(s) => sparse_gemm(s, vals),
    }
}

fn concrete(g: &Graph, id: NodeId, b: &Bindings) -> Result<Vec<usize>, InterpError> {
    let node = g.node(id);
    let shape = node
        .ty
        .concrete_shape(b)
        .ok_or_else(|| InterpError::Unbound {
            node: node.name.clone(),
            bindings: b.to_string(),
        })?;
    let elements = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
    match elements {
        // The node's f64 buffer asked of the allocator and given back at once: a size the
        // machine cannot hold is refused here instead of aborting the process in the kernel's
        // own allocation (pages are neither touched nor committed by the probe).
        Some(e) if e <= (isize::MAX as u64) / 8 && can_allocate::<f64>(e as usize) => Ok(shape),
        e => Err(InterpError::TooLarge {
            node: node.name.clone(),
            elements: e.unwrap_or(u64::MAX),
        }),
    }
}

/// Whether the allocator grants `len` elements of `T` now (the reservation is released again).
fn can_allocate<T>(len: usize) -> bool {
    Vec::<T>::new().try_reserve_exact(len).is_ok()
}

/// Runs the graph on `inputs` (by input name) and returns every output by output name, in the
/// outputs' dtype. Every value is computed in f64 and rounded to its node's storage type, as the
/// graph defines it.
pub fn interpret(
    g: &Graph,
    inputs: &BTreeMap<String, HostTensor>,
) -> Result<BTreeMap<String, HostTensor>, InterpError> {
    interpret_rounding(g, inputs, Rounding::Stored)
}

/// [`interpret`] without the roundings of the values between the inputs and the outputs: every
/// value stays in f64 and only the outputs are rounded to their storage type. The graph's math
/// with its inputs and weights as stored, i.e. what the roundings of [`interpret`] (and those of
/// fused kernels, which round fewer values) are measured against.
pub fn interpret_unrounded(
    g: &Graph,
    inputs: &BTreeMap<String, HostTensor>,
) -> Result<BTreeMap<String, HostTensor>, InterpError> {
    interpret_rounding(g, inputs, Rounding::Unrounded)
}

/// [`interpret_unrounded`] with every value between the inputs and the outputs multiplied by
/// `1 + e`, `e` drawn uniformly from `[-u, u]` for each element (`u` the unit roundoff of the
/// value's storage type, [`DType::unit_roundoff`], for an activation at least
/// `activation_error`; the draws a hash of `seed`, the node and the element): roundings of
/// random direction and the largest size, at every value the graph stores. Each product's terms
/// move too, by up to `sqrt(K)` f32 unit roundoffs (`perturb_terms`), as an f32 sum's
/// roundings move them. How far a few such runs land from [`interpret_unrounded`] measures how
/// much roundings of that size move each output, i.e. its conditioning, which a single rounded
/// run ([`interpret`]) samples only once.
pub fn interpret_perturbed(
    g: &Graph,
    inputs: &BTreeMap<String, HostTensor>,
    seed: u64,
    activation_error: f64,
) -> Result<BTreeMap<String, HostTensor>, InterpError> {
    interpret_rounding(
        g,
        inputs,
        Rounding::Perturbed {
            seed,
            activation_error,
        },
    )
}

/// What [`interpret_rounding`] does to each computed value.
#[derive(Clone, Copy)]
enum Rounding {
    /// Rounded to its storage type, as the graph defines it.
    Stored,
    /// Left in f64.
    Unrounded,
    /// Multiplied by a random `1 + e`, `|e|` at most the storage type's unit roundoff (an
    /// activation's at least `activation_error`); each product's terms moved too.
    Perturbed { seed: u64, activation_error: f64 },
}

/// A uniform draw from `[-1, 1)` for element `i` of node `node` (SplitMix64's finaliser over
/// the three).
fn draw(seed: u64, node: usize, i: usize) -> f64 {
    let mut z = seed
        ^ (node as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (i as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    // The top 53 bits as a fraction of 2^53, onto [-1, 1).
    (z >> 11) as f64 * (2.0 / (1u64 << 53) as f64) - 1.0
}

/// For a product: its A operand replaced by a copy with every element multiplied by `1 + e`,
/// `|e|` at most `sqrt(K)` f32 unit roundoffs, so that each of an output's K terms moves as an
/// f32 accumulation's roundings move it (each partial sum rounded: a random walk over the terms
/// after it). Relative to the terms, not to the sum: a sum that cancels keeps their errors.
fn perturb_terms(op: &Op, args: &mut [Value], seed: u64, node: usize) {
    let layout = match op {
        Op::MatMul => MatLayout::N,
        Op::Gemm(g) | Op::SparseGemm(SparseGemm { gemm: g, .. }) => g.a,
        _ => return,
    };
    let Some(a) = args.first_mut() else { return };
    let k = Mat::of(a, layout).cols;
    let e = DType::F32.unit_roundoff() * (k as f64).sqrt();
    let mut data = a.dense();
    // Draws of their own: the node's output takes `seed` itself.
    let seed = seed ^ 0x5851_f42d_4c95_7f2d;
    for (i, x) in data.iter_mut().enumerate() {
        *x *= 1.0 + e * draw(seed, node, i);
    }
    *a = Value::contiguous(a.shape.clone(), data);
}

fn interpret_rounding(
    g: &Graph,
    inputs: &BTreeMap<String, HostTensor>,
    rounding: Rounding,
) -> Result<BTreeMap<String, HostTensor>, InterpError> {
    verify(g)?;
    let bindings = bind_inputs(g, inputs.keys().map(|k| k.as_str()), |n| {
        inputs.get(n).map(|t| (t.dtype(), t.shape().to_vec()))
    })?;
    let order = g.topo_order().map_err(|_| unreachable_cycle(g))?;
    // The node whose value `id` reads: itself, or the node under its chain of views.
    let base = |mut id: NodeId| {
        while g.node(id).op == Op::Transpose {
            id = g.operands(id)[0];
        }
        id
    };
    // Computed values are dropped after their last reader (an op reading them or a view of
    // them), unless an output is (a view of) them. Weights and views are not held: each reader
    // reads the graph's weight as stored (a product widens a few columns at a time, other ops
    // a copy that lives as long as the op).
    let mut readers: BTreeMap<NodeId, usize> = BTreeMap::new();
    for &id in &order {
        if !matches!(g.node(id).op, Op::Input | Op::Weight | Op::Transpose) {
            for o in g.operands(id) {
                *readers.entry(base(o)).or_default() += 1;
            }
        }
    }
    let kept: std::collections::BTreeSet<NodeId> =
        g.outputs().iter().map(|o| base(o.node)).collect();
    let mut vals: BTreeMap<NodeId, Value> = BTreeMap::new();
    for &id in &order {
        let node = g.node(id);
        let v = match &node.op {
            Op::Input => {
                // bind_inputs checked presence, dtype and shape.
                let t = &inputs[&node.name];
                Value::contiguous(concrete(g, id, &bindings)?, t.to_f64())
            }
            Op::Weight | Op::Transpose => continue,
            op => {
                let shape = concrete(g, id, &bindings)?;
                let ops = g.operands(id);
                let mut args = ops
                    .iter()
                    .map(|&o| read(g, o, &vals, &bindings))
                    .collect::<Result<Vec<Value>, _>>()?;
                if let Rounding::Perturbed { seed, .. } = rounding {
                    perturb_terms(op, &mut args, seed, id.index());
                }
                let mut data = eval(op, &args.iter().collect::<Vec<_>>(), &shape);
                drop(args);
                for &o in &ops {
                    let b = base(o);
                    let left = readers.get_mut(&b).map(|n| {
                        *n -= 1;
                        *n
                    });
                    if left == Some(0) && !kept.contains(&b) {
                        vals.remove(&b);
                    }
                }
                match rounding {
                    Rounding::Stored => round_all(node.ty.dtype, &mut data),
                    Rounding::Unrounded => {}
                    Rounding::Perturbed {
                        seed,
                        activation_error,
                    } => {
                        let mut u = node.ty.dtype.unit_roundoff();
                        if matches!(op, Op::Act(_)) {
                            u = u.max(activation_error);
                        }
                        for (i, x) in data.iter_mut().enumerate() {
                            *x *= 1.0 + u * draw(seed, id.index(), i);
                        }
                    }
                }
                Value::contiguous(shape, data)
            }
        };
        vals.insert(id, v);
    }
    let mut out = BTreeMap::new();
    for o in g.outputs() {
        let v = read(g, o.node, &vals, &bindings)?;
        let dtype = g.node(o.node).ty.dtype;
        // Shapes and lengths agree by construction, so this cannot fail.
        let t = HostTensor::from_f64(dtype, v.shape.clone(), &v.dense())
            .map_err(|_| unreachable_cycle(g))?;
        out.insert(o.name.clone(), t);
    }
    Ok(out)
}

/// The value of node `id` for a reader: a computed or input value from `vals` (shared), a
/// weight as stored (shared), or a view of either.
fn read(
    g: &Graph,
    id: NodeId,
    vals: &BTreeMap<NodeId, Value>,
    bindings: &Bindings,
) -> Result<Value, InterpError> {
    let node = g.node(id);
    Ok(match &node.op {
        Op::Weight => {
            let data = match g.weight(&node.name) {
                Some(w) => Data::Stored(Arc::clone(w)),
                None => Data::F64(Arc::default()),
            };
            Value::row_major(concrete(g, id, bindings)?, data)
        }
        Op::Transpose => {
            let mut v = read(g, g.operands(id)[0], vals, bindings)?;
            let r = v.shape.len();
            v.shape.swap(r - 2, r - 1);
            v.strides.swap(r - 2, r - 1);
            v
        }
        // Evaluated before its readers (topological order), and kept until the last of them.
        _ => vals.get(&id).cloned().ok_or_else(|| unreachable_cycle(g))?,
    })
}

fn unreachable_cycle(g: &Graph) -> InterpError {
    InterpError::Invalid(VerifyErrors {
        graph: g.name.clone(),
        errors: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{Activation, Dual, Epilogue, Gemm};
    use crate::types::{Dim, Shape, TensorType};
    use smallvec::smallvec;

    /// Set while a test runs products on the portable code only.
    pub(super) static PORTABLE_ONLY: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);

    /// The blocked, threaded product sums in the same order as the textbook loop: bit for bit
    /// the same, at sizes below and above the threading threshold, with ragged row blocks and
    /// every remainder of the columns taken four at a time, non-finite values included; on the
    /// AVX2 build of the code where the CPU has AVX2, and on the portable one.
    #[test]
    fn matmul_is_the_textbook_loop_bit_for_bit() {
        // The AVX2 build where the CPU has it, then the portable code.
        for portable in [false, true] {
            PORTABLE_ONLY.store(portable, std::sync::atomic::Ordering::Relaxed);
            matmul_is_the_textbook_loop();
        }
        PORTABLE_ONLY.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    fn matmul_is_the_textbook_loop() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        for (m, k, n) in [
            (0, 3, 4),
            (1, 1, 1),
            (37, 19, 23),
            (13, 33, 2),
            (5, 7, 30),
            (301, 257, 229),
            (9, 4096, 600),
            (3, 4096, 1400),
            (1, 16384, 1100),
        ] {
            let a: Vec<f64> = (0..m * k).map(|_| next()).collect();
            // B's values are f32's, so that B can be stored as a weight too.
            let mut b: Vec<f64> = (0..k * n).map(|_| (next() * 1e3) as f32 as f64).collect();
            if n > 2 && k > 1 {
                b[1] = f64::INFINITY;
                b[n + 2] = f64::NAN;
            }
            let mut want = vec![0.0; m * n];
            for i in 0..m {
                for p in 0..k {
                    for j in 0..n {
                        want[i * n + j] += a[i * k + p] * b[p * n + j];
                    }
                }
            }
            // B row-major, and column-major (a transposed weight, read in place); in f64, and
            // as a stored f32 weight (widened a chunk of columns at a time).
            let b_by_cols: Vec<f64> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            for (by_cols, data) in [(false, b), (true, b_by_cols)] {
                let stored = HostTensor::from_f64(DType::F32, vec![data.len()], &data).unwrap();
                let a = Mat {
                    rows: m,
                    cols: k,
                    by_cols: false,
                    data: MatData::F64(Cow::Borrowed(&a)),
                };
                let b = |data| Mat {
                    rows: k,
                    cols: n,
                    by_cols,
                    data,
                };
                for (form, b) in [
                    ("f64", b(MatData::F64(Cow::Borrowed(&data)))),
                    ("stored", b(MatData::Stored(&stored))),
                ] {
                    let got = matmul(&a, &b);
                    assert_eq!(got.len(), want.len());
                    for (g, w) in got.iter().zip(&want) {
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "[{m}, {k}] x [{k}, {n}] {by_cols} {form}"
                        );
                    }
                }
            }
        }
        const {
            assert!(
                301 * 257 * 229 > PARALLEL_WORK && 3 * 4096 * 1400 > PARALLEL_WORK,
                "cases must take the threaded paths, by rows and by columns"
            );
            assert!(
                600 % (WIDEN_ELEMENTS / 4096) != 0 && 1100 % WIDEN_COLS != 0,
                "stored weights must be widened in several chunks, the last a short one"
            );
        };
    }

    fn t(shape: &[usize], v: &[f64]) -> HostTensor {
        HostTensor::from_f64(DType::F32, shape.to_vec(), v).unwrap()
    }

    #[test]
    fn linear_with_bias_and_gelu() {
        // y = gelu(x W^T + b), x [2,3], W [2,3]
        let mut g = Graph::new("lin");
        let s: Shape = smallvec![Dim::sym("T"), Dim::Fixed(3)];
        let x = g.add_input("x", TensorType::contiguous(DType::F32, s));
        let w = g
            .add_weight("w", t(&[2, 3], &[1.0, 0.0, -1.0, 0.5, 0.5, 0.5]))
            .unwrap();
        let b = g.add_weight("b", t(&[2], &[0.25, -0.25])).unwrap();
        let wt = g.add("wt", Op::Transpose, &[w]).unwrap();
        let h = g.add("h", Op::MatMul, &[x, wt]).unwrap();
        let hb = g.add("hb", Op::Add, &[h, b]).unwrap();
        let y = g.add("y", Op::Act(Activation::Relu), &[hb]).unwrap();
        g.add_output("y", y);
        let inputs = BTreeMap::from([(
            "x".to_string(),
            t(&[2, 3], &[1.0, 2.0, 3.0, -1.0, -2.0, -3.0]),
        )]);
        let out = interpret(&g, &inputs).unwrap();
        // row 0: [1-3, 3] + b = [-1.75, 2.75] -> relu [0, 2.75]; row 1: [2, -3] + b -> [2.25, 0]
        assert_eq!(out["y"].to_f64(), vec![0.0, 2.75, 2.25, 0.0]);
    }

    /// `interpret` rounds every value to its node's type, `interpret_unrounded` only the outputs:
    /// in bf16, 1 + 2^-9 rounds to 1 (its ulp at 1 is 2^-7), so (x + c) + d with d = -1 is 0
    /// as the graph defines it and 2^-9 in its unrounded math; an output read straight from an
    /// input is the same in both.
    #[test]
    fn unrounded_interpretation_rounds_only_the_outputs() {
        let bf16 = |shape: &[usize], v: &[f64]| {
            HostTensor::from_f64(DType::Bf16, shape.to_vec(), v).unwrap()
        };
        let mut g = Graph::new("round");
        let s: Shape = smallvec![Dim::Fixed(1), Dim::Fixed(2)];
        let x = g.add_input("x", TensorType::contiguous(DType::Bf16, s));
        let c = g.add_weight("c", bf16(&[2], &[0.001953125, 0.5])).unwrap();
        let d = g.add_weight("d", bf16(&[2], &[-1.0, -1.0])).unwrap();
        let h = g.add("h", Op::Add, &[x, c]).unwrap();
        let y = g.add("y", Op::Add, &[h, d]).unwrap();
        g.add_output("y", y);
        g.add_output("x", x);
        let inputs = BTreeMap::from([("x".to_string(), bf16(&[1, 2], &[1.0, 1.0]))]);
        let rounded = interpret(&g, &inputs).unwrap();
        let unrounded = interpret_unrounded(&g, &inputs).unwrap();
        assert_eq!(rounded["y"].to_f64(), vec![0.0, 0.5]);
        assert_eq!(unrounded["y"].to_f64(), vec![0.001953125, 0.5]);
        assert_eq!(rounded["x"], unrounded["x"]);
        assert_eq!(unrounded["y"].dtype(), DType::Bf16);
    }

    /// `interpret_perturbed` moves each stored value by at most its type's unit roundoff and a
    /// product's terms by at most sqrt(K) f32 unit roundoffs, relative to the terms: a sum that
    /// cancels to 2^-20 of its terms moves by up to 2^20 times as much relative to itself. The
    /// same seed draws the same run; other seeds others.
    #[test]
    fn perturbed_interpretation_moves_values_and_product_terms() {
        let mut g = Graph::new("cancel");
        let s: Shape = smallvec![Dim::Fixed(1), Dim::Fixed(2)];
        let x = g.add_input("x", TensorType::contiguous(DType::F32, s));
        let w = g.add_weight("w", t(&[1, 2], &[1.0, 1.0])).unwrap();
        let wt = g.add("wt", Op::Transpose, &[w]).unwrap();
        let y = g.add("y", Op::MatMul, &[x, wt]).unwrap();
        let q = g.add("q", Op::Mul, &[x, x]).unwrap();
        g.add_output("y", y);
        g.add_output("q", q);
        let small = f64::powi(2.0, -20);
        let inputs = BTreeMap::from([("x".to_string(), t(&[1, 2], &[1.0, small - 1.0]))]);
        let exact = interpret_unrounded(&g, &inputs).unwrap();
        assert_eq!(exact["y"].to_f64(), vec![small]);
        let u = DType::F32.unit_roundoff();
        let mut largest: f64 = 0.0;
        for seed in 0..8 {
            let p = interpret_perturbed(&g, &inputs, seed, 0.0).unwrap();
            assert_eq!(p, interpret_perturbed(&g, &inputs, seed, 0.0).unwrap());
            let moved = (p["y"].to_f64()[0] - small).abs() / small;
            // Two terms of size 1, each moved by up to sqrt(2) u; then y's own rounding.
            assert!(moved <= 2.0 * 2f64.sqrt() * u / small + 3.0 * u, "{moved}");
            largest = largest.max(moved);
            for (a, b) in p["q"].to_f64().iter().zip(exact["q"].to_f64()) {
                assert!((a / b - 1.0).abs() <= 2.0 * u, "{a} {b}");
            }
        }
        assert!(largest > 0.01, "{largest}");
        assert_ne!(
            interpret_perturbed(&g, &inputs, 0, 0.0).unwrap()["y"],
            interpret_perturbed(&g, &inputs, 1, 0.0).unwrap()["y"]
        );
    }

    /// Values dropped after their last reader are not needed again: an intermediate read twice
    /// and an output through a view, a weight read by two ops and through a view, the input an
    /// output too.
    #[test]
    fn values_outlive_every_reader_and_outputs() {
        let mut g = Graph::new("reuse");
        let s: Shape = smallvec![Dim::Fixed(2), Dim::Fixed(2)];
        let x = g.add_input("x", TensorType::contiguous(DType::F32, s));
        let w = g
            .add_weight("w", t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]))
            .unwrap();
        let wt = g.add("wt", Op::Transpose, &[w]).unwrap();
        let h = g.add("h", Op::MatMul, &[x, wt]).unwrap(); // x W^T
        let k = g.add("k", Op::MatMul, &[h, w]).unwrap(); // h W
        let m = g.add("m", Op::Mul, &[h, k]).unwrap();
        let ht = g.add("ht", Op::Transpose, &[h]).unwrap();
        g.add_output("m", m);
        g.add_output("ht", ht);
        g.add_output("x", x);
        let xv = [1.0, 0.0, 0.0, 1.0];
        let out = interpret(&g, &BTreeMap::from([("x".to_string(), t(&[2, 2], &xv))])).unwrap();
        // h = W^T = [[1, 3], [2, 4]]; k = h W = [[10, 14], [14, 20]].
        assert_eq!(out["ht"].to_f64(), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(out["m"].to_f64(), vec![10.0, 42.0, 28.0, 80.0]);
        assert_eq!(out["x"].to_f64(), xv.to_vec());
    }

    #[test]
    fn fused_dual_gemm_matches_unfused() {
        let mut g = Graph::new("glu");
        let x = g.add_input(
            "x",
            TensorType::contiguous(DType::F32, smallvec![Dim::Fixed(2), Dim::Fixed(2)] as Shape),
        );
        let wg = g
            .add_weight("wg", t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]))
            .unwrap();
        let wu = g
            .add_weight("wu", t(&[2, 2], &[0.5, -1.0, 1.5, 2.0]))
            .unwrap();
        let fused = Gemm {
            a: MatLayout::N,
            b: MatLayout::T,
            dual: Some(Dual {
                gate: smallvec![Epilogue::Act(Activation::Silu)],
                up: smallvec![],
            }),
            epilogue: smallvec![],
        };
        let y = g.add("y", Op::Gemm(fused), &[x, wg, wu]).unwrap();
        g.add_output("y", y);
        let xv = [0.3, -0.7, 1.1, 0.2];
        let out = interpret(&g, &BTreeMap::from([("x".to_string(), t(&[2, 2], &xv))])).unwrap()
            ["y"]
            .to_f64();
        let dot =
            |r: usize, w: &[f64], c: usize| xv[r * 2] * w[c * 2] + xv[r * 2 + 1] * w[c * 2 + 1];
        for r in 0..2 {
            for c in 0..2 {
                let want = Activation::Silu.eval(dot(r, &[1.0, 2.0, 3.0, 4.0], c))
                    * dot(r, &[0.5, -1.0, 1.5, 2.0], c);
                assert!((out[r * 2 + c] - DType::F32.round(want)).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn wrong_inputs_are_refused_by_name() {
        let mut g = Graph::new("id");
        let x = g.add_input(
            "x",
            TensorType::contiguous(DType::F32, smallvec![Dim::sym("T"), Dim::Fixed(2)] as Shape),
        );
        let y = g.add("y", Op::Act(Activation::Tanh), &[x]).unwrap();
        g.add_output("y", y);
        let err = interpret(
            &g,
            &BTreeMap::from([("x".to_string(), t(&[2, 3], &[0.0; 6]))]),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "input `x` has shape [2, 3]: dim 1 must be 2"
        );
        let err = interpret(&g, &BTreeMap::new()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "missing input `x`: the model expects f32[T,2]"
        );
    }
}
