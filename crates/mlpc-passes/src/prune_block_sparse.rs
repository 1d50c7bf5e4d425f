//! `prune-block-sparse`: zeroes the dropped blocks of the weights selected for block sparsity.
//!
//! Configured with one [`SparseWeight`] per selected weight (the `sparsity` section of model.json:
//! weight name, `block = [rows, cols]` of the stored `[out, in]` weight, optional `density`).
//! Rewrites the weight *data* only, never the graph's structure:
//! - with a density `d`, the `B = (out / rows) * (in / cols)` blocks are ranked by their L2 norm
//!   (computed in f64), and the `round(d * B)` largest are kept (`round` takes halves away from
//!   zero); equal norms rank the lower row-major block index first. Every other block becomes zero.
//! - without a density the weight's all-zero blocks already define the pattern; the data is left
//!   as it is.
//! - two weights of one shape selected `with` each other (same block and density: the gate and
//!   up weights of a gated pair, whose dual GEMM runs the union of their patterns) are pruned
//!   together: both keep the same `round(d * B)` blocks, those whose squared norms summed over
//!   the two are largest, so the union is no larger than each.
//!
//! After: every selected weight is zero outside its kept blocks, so the graph computes the pruned
//! model exactly, whatever runs it; `lower-block-sparse` then finds the pattern as the set of
//! blocks that are not all zero. A weight that an earlier pass removed as dead is skipped. The
//! pass changes values (that is its purpose), so it runs first, before any pass that assumes
//! values are preserved.

use crate::pass::{Pass, PassError};
use crate::provenance::{Fate, Provenance};
use mlpc_ir::{Graph, HostTensor, Op};
use std::sync::{Arc, Mutex};

/// Block sparsity requested for one weight.
#[derive(Clone, Debug, PartialEq)]
pub struct SparseWeight {
    /// The weight's name (a weight node of the graph).
    pub weight: String,
    /// `[rows, cols]` of one block of the stored `[out, in]` weight.
    pub block: [u64; 2],
    /// Fraction of blocks kept, in (0, 1]; `None`: the all-zero blocks define the pattern.
    pub density: Option<f64>,
    /// A weight of the same shape pruned together with this one (with a density): both keep the
    /// same blocks, those of largest summed squared norm over the two. Its own spec names this
    /// weight back, with the same block and density.
    pub with: Option<String>,
}

impl SparseWeight {
    pub fn new(weight: impl Into<String>, block: [u64; 2], density: Option<f64>) -> SparseWeight {
        SparseWeight {
            weight: weight.into(),
            block,
            density,
            with: None,
        }
    }

    /// This spec, pruned together with `partner` (see [`SparseWeight::with`]).
    pub fn pruned_with(mut self, partner: impl Into<String>) -> SparseWeight {
        self.with = Some(partner.into());
        self
    }
}

/// Prunes the selected weights to their block pattern.
///
/// Where the graph holds a selected weight's only reference, its dropped blocks are zeroed in
/// place; where anyone else holds the same data (a clone of the graph, the framework that built
/// it), the graph gets a pruned copy and the data stay as they were.
///
/// The pass remembers what it pruned: each selected weight's data as a run found it (by
/// identity, the `Arc` the graph held) and the blocks it kept, not the pruned copy (or, for data
/// pruned in place, that they need nothing more). A later run of the same pass (or a clone of
/// it) over a graph that still holds those very weights prunes them to the same blocks again
/// without ranking a block: the compiler prunes the source graph's weights in place, and its
/// pipeline's run of the same pass over a copy of that graph finds them pruned. So the memory
/// holds no tensor of its own beyond the graphs'. A run forgets what no weight of its graph is
/// any more, so a pass run over one graph after another holds on to the last one's tensors
/// only.
#[derive(Clone, Debug, Default)]
pub struct PruneBlockSparse {
    specs: Vec<SparseWeight>,
    done: Arc<Mutex<Vec<Pruned>>>,
}

/// One weight a run of [`PruneBlockSparse`] pruned.
#[derive(Debug)]
struct Pruned {
    /// The index of the spec it was pruned for (its own or its partner's).
    spec: usize,
    /// The data the graph held.
    source: Arc<HostTensor>,
    /// The blocks kept (row-major indices, ascending); `None` where `source` needs no zeroing:
    /// every dropped block was zero already, or the run zeroed them in `source` itself (the
    /// graph held its only reference).
    kept: Option<Arc<[usize]>>,
}

impl PruneBlockSparse {
    pub fn new(specs: Vec<SparseWeight>) -> PruneBlockSparse {
        PruneBlockSparse {
            specs,
            done: Arc::default(),
        }
    }

    /// What an earlier run stored for each of `sources` (spec `i`'s weight, then its partner),
    /// if it pruned exactly these data for that spec: the same blocks zeroed again.
    fn recall(&self, i: usize, sources: &[Arc<HostTensor>]) -> Option<Vec<Arc<HostTensor>>> {
        let kept: Vec<Option<Arc<[usize]>>> = {
            let done = self.done.lock().unwrap_or_else(|e| e.into_inner());
            sources
                .iter()
                .map(|s| {
                    done.iter()
                        .find(|d| d.spec == i && Arc::ptr_eq(&d.source, s))
                        .map(|d| d.kept.clone())
                })
                .collect::<Option<_>>()?
        };
        let block = self.specs[i].block;
        sources
            .iter()
            .zip(kept)
            .map(|(s, kept)| match kept {
                None => Some(s.clone()),
                Some(kept) => {
                    let grid = block_grid(s.shape(), block).ok()?;
                    Some(Arc::new(zero_dropped(s, block, grid, &kept)))
                }
            })
            .collect()
    }

    pub fn specs(&self) -> &[SparseWeight] {
        &self.specs
    }

    /// Whether a run pruned these very data (by identity) for some spec and has not forgotten
    /// them since: a run over a graph that holds them zeroes the same blocks again, without
    /// ranking them.
    pub fn remembers(&self, data: &Arc<HostTensor>) -> bool {
        let done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        done.iter().any(|d| Arc::ptr_eq(&d.source, data))
    }
}

/// The grid of `[rows, cols]` blocks over a stored `[out, in]` matrix `shape`: `(block rows,
/// block cols)`, or a message saying why the block does not tile it.
pub(crate) fn block_grid(shape: &[usize], block: [u64; 2]) -> Result<(usize, usize), String> {
    let &[out, inp] = shape else {
        return Err(format!("the weight has shape {shape:?}, not [out, in]"));
    };
    let [br, bc] = block;
    if br == 0
        || bc == 0
        || br > u32::MAX as u64
        || bc > u32::MAX as u64
        || !(out as u64).is_multiple_of(br)
        || !(inp as u64).is_multiple_of(bc)
    {
        return Err(format!(
            "block [{br}, {bc}] does not divide the weight [{out}, {inp}]"
        ));
    }
    Ok((out / br as usize, inp / bc as usize))
}

/// A block's squared L2 norm, exact: every weight is an f32 value (the model dtypes are f32, f16
/// and bf16), so every square is an integer below 2^48 times a power of two from 2^-298 up, and
/// their sum is kept as a fixed-point integer of `NORM_LIMBS` 64-bit limbs (least significant
/// first) without rounding. Equal norms therefore compare equal whatever the order of their
/// elements (a block and its transpose), and ties go to the lower index as the spec says. The
/// variants order finite norms below infinite ones, and those below NaN.
#[derive(Clone, Debug, PartialEq, Eq)]
enum BlockNorm {
    Finite([u64; NORM_LIMBS]),
    Inf,
    NaN,
}

/// 506 bits of exponent range (2^-298 .. 2^208) plus 48 of a square plus 64 for the count of
/// elements: 618 bits.
const NORM_LIMBS: usize = 10;

impl BlockNorm {
    /// Adds `x^2` (the form [`Squares`] must agree with, element by element).
    #[cfg(test)]
    fn add_square(&mut self, x: f32) {
        let BlockNorm::Finite(limbs) = self else {
            if x.is_nan() {
                *self = BlockNorm::NaN;
            }
            return;
        };
        if x.is_nan() {
            *self = BlockNorm::NaN;
            return;
        }
        if x.is_infinite() {
            *self = BlockNorm::Inf;
            return;
        }
        // |x| = m * 2^(e - 149), with e = max(biased exponent, 1) - 1 (subnormals: e = 0).
        let bits = x.to_bits() & 0x7fff_ffff;
        let (exponent, fraction) = (bits >> 23, u64::from(bits & 0x7f_ffff));
        let m = if exponent == 0 {
            fraction
        } else {
            fraction | 1 << 23
        };
        let shift = 2 * (exponent.max(1) - 1) as usize; // x^2 = m^2 * 2^(shift - 298)
        let wide = u128::from(m * m) << (shift % 64);
        let mut carry = 0u128;
        for (k, part) in [wide as u64, (wide >> 64) as u64].into_iter().enumerate() {
            let sum = u128::from(limbs[shift / 64 + k]) + u128::from(part) + carry;
            limbs[shift / 64 + k] = sum as u64;
            carry = sum >> 64;
        }
        for limb in &mut limbs[shift / 64 + 2..] {
            if carry == 0 {
                break;
            }
            let sum = u128::from(*limb) + carry;
            *limb = sum as u64;
            carry = sum >> 64;
        }
    }
}

impl BlockNorm {
    /// Adds `other` to this norm (exactly; NaN above infinity above every sum of finite norms).
    fn add(&mut self, other: &BlockNorm) {
        match (&mut *self, other) {
            (BlockNorm::NaN, _) => {}
            (_, BlockNorm::NaN) => *self = BlockNorm::NaN,
            (BlockNorm::Inf, _) | (_, BlockNorm::Inf) => *self = BlockNorm::Inf,
            (BlockNorm::Finite(a), BlockNorm::Finite(b)) => {
                let mut carry = 0u128;
                for (x, y) in a.iter_mut().zip(b) {
                    let sum = u128::from(*x) + u128::from(*y) + carry;
                    *x = sum as u64;
                    carry = sum >> 64;
                }
            }
        }
    }
}

impl Ord for BlockNorm {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let rank = |n: &BlockNorm| match n {
            BlockNorm::Finite(_) => 0,
            BlockNorm::Inf => 1,
            BlockNorm::NaN => 2,
        };
        match (self, other) {
            (BlockNorm::Finite(a), BlockNorm::Finite(b)) => a.iter().rev().cmp(b.iter().rev()),
            _ => rank(self).cmp(&rank(other)),
        }
    }
}

impl PartialOrd for BlockNorm {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A block's sum of squares as it is read: for each f32 exponent the exact sum of the squared
/// significands with that exponent, folded into a [`BlockNorm`] once the block is read. One add
/// an element, where a [`BlockNorm`] takes several.
///
/// The adds go first to 64-bit partial sums, element `i` to table `i % LANES`, so that neighbours
/// of one exponent (most of them, in a weight) add to different words instead of each waiting
/// on the last one's add; the tables are spilled into the exact 128-bit sums before any of their
/// words can overflow.
struct Squares {
    /// `parts[l][e]`: a partial sum of `m^2` (`m < 2^24`), for `e` and `m` as in `sums`.
    parts: [[u64; 254]; LANES],
    /// Elements added to `parts` since they were last spilled.
    pending: usize,
    /// `sums[e]`: the sum of `m^2` over the elements `|x| = m * 2^(e - 149)` (`m < 2^24`), below
    /// 2^128 for any block of fewer than 2^80 elements.
    sums: [u128; 254],
    /// The range of `e` added to since the last fold (`lo > hi`: none).
    lo: usize,
    hi: usize,
    /// Infinity or NaN, once an element is one.
    special: Option<BlockNorm>,
}

/// Partial-sum tables of [`Squares`].
const LANES: usize = 4;

/// Elements [`Squares`] adds to its partial sums between spills: each square is below 2^48, so no
/// word of them reaches 2^64.
const SPILL_EVERY: usize = 1 << 16;

impl Squares {
    fn new() -> Squares {
        Squares {
            parts: [[0; 254]; LANES],
            pending: 0,
            sums: [0; 254],
            lo: usize::MAX,
            hi: 0,
            special: None,
        }
    }

    #[cfg(test)]
    fn add(&mut self, x: f32) {
        self.add_all(&[x]);
    }

    /// Adds the square of every element of `xs`.
    fn add_all(&mut self, xs: &[f32]) {
        for run in xs.chunks(SPILL_EVERY) {
            if self.pending + run.len() > SPILL_EVERY {
                self.spill();
            }
            self.pending += run.len();
            let (mut lo, mut hi) = (self.lo, self.hi);
            for (i, &x) in run.iter().enumerate() {
                let bits = x.to_bits() & 0x7fff_ffff;
                let exponent = bits >> 23;
                if exponent == 0xff {
                    if bits & 0x7f_ffff != 0 {
                        self.special = Some(BlockNorm::NaN);
                    } else if self.special.is_none() {
                        self.special = Some(BlockNorm::Inf);
                    }
                    continue;
                }
                let m = u64::from(bits & 0x7f_ffff | u32::from(exponent != 0) << 23);
                let e = (exponent.max(1) - 1) as usize;
                self.parts[i % LANES][e] += m * m;
                lo = lo.min(e);
                hi = hi.max(e);
            }
            (self.lo, self.hi) = (lo, hi);
        }
    }

    /// Moves the partial sums into `sums`.
    fn spill(&mut self) {
        for e in self.lo..=self.hi {
            for part in &mut self.parts {
                self.sums[e] += u128::from(std::mem::take(&mut part[e]));
            }
        }
        self.pending = 0;
    }

    /// The norm of what was added since the last fold; starts the next block.
    fn fold(&mut self) -> BlockNorm {
        self.spill();
        let mut limbs = [0u64; NORM_LIMBS];
        for e in self.lo..=self.hi {
            let sum = std::mem::take(&mut self.sums[e]);
            if sum == 0 {
                continue;
            }
            // sum * 2^(2e - 298): bit 2e of the fixed point.
            let (q, r) = (2 * e / 64, 2 * e % 64);
            let low = sum << r;
            let high = if r == 0 { 0 } else { (sum >> (128 - r)) as u64 };
            let mut carry = 0u128;
            for (k, limb) in limbs[q..].iter_mut().enumerate() {
                let part = match k {
                    0 => low as u64,
                    1 => (low >> 64) as u64,
                    2 => high,
                    _ if carry == 0 => break,
                    _ => 0,
                };
                let total = u128::from(*limb) + u128::from(part) + carry;
                *limb = total as u64;
                carry = total >> 64;
            }
        }
        (self.lo, self.hi) = (usize::MAX, 0);
        self.special.take().unwrap_or(BlockNorm::Finite(limbs))
    }
}

/// The squared L2 norm of every block, row-major over the block grid; the block rows in parallel.
fn block_norms(w: &HostTensor, block: [u64; 2], grid: (usize, usize)) -> Vec<BlockNorm> {
    use rayon::prelude::*;
    let mut norms = vec![BlockNorm::Finite([0; NORM_LIMBS]); grid.0 * grid.1];
    if norms.is_empty() || w.numel() == 0 {
        return norms;
    }
    let (dtype, es) = (w.dtype(), w.dtype().size_bytes());
    let [br, bc] = block.map(|d| d as usize);
    let row_bytes = w.shape()[1] * es;
    norms
        .par_chunks_mut(grid.1)
        .zip(w.bytes().par_chunks(br * row_bytes))
        .for_each(|(norms, rows)| {
            let mut squares = Box::new(Squares::new());
            // A block row's elements are widened a chunk at a time, then summed.
            const CHUNK: usize = 64;
            let mut chunk = [0f32; CHUNK];
            for (c, norm) in norms.iter_mut().enumerate() {
                for row in rows.chunks_exact(row_bytes) {
                    let segment = &row[c * bc * es..(c + 1) * bc * es];
                    for piece in segment.chunks(CHUNK * es) {
                        let mut at = 0;
                        dtype.for_each_f32(piece, |x| {
                            chunk[at] = x;
                            at += 1;
                        });
                        squares.add_all(&chunk[..at]);
                    }
                }
                *norm = squares.fold();
            }
        });
    norms
}

/// The kept blocks (row-major indices, ascending) of a weight under `block` and `density`.
///
/// With a density: the `round(density * blocks)` blocks of largest L2 norm, ties to the lower
/// index (a NaN norm ranks above every number). Without: the blocks that are not all zero.
pub fn kept_blocks(
    w: &HostTensor,
    block: [u64; 2],
    density: Option<f64>,
) -> Result<Vec<usize>, String> {
    let grid = block_grid(w.shape(), block)?;
    let Some(d) = density else {
        let nonzero = nonzero_blocks(w, block, grid);
        return Ok((0..nonzero.len()).filter(|&b| nonzero[b]).collect());
    };
    let mut kept = largest(&block_norms(w, block, grid), d)?;
    kept.sort_unstable();
    Ok(kept)
}

/// Whether each block (row-major over the block grid) holds an element other than +0 and -0
/// (NaN and infinity count as data): exactly the blocks whose norm is not 0, read without a
/// norm, as ORs of the elements' bits less their sign. The block rows in parallel.
fn nonzero_blocks(w: &HostTensor, block: [u64; 2], grid: (usize, usize)) -> Vec<bool> {
    use rayon::prelude::*;
    let mut nonzero = vec![false; grid.0 * grid.1];
    if nonzero.is_empty() || w.numel() == 0 {
        return nonzero;
    }
    let es = w.dtype().size_bytes();
    // Every bit but each element's sign, over eight bytes of little-endian elements.
    let magnitude: u64 = match es {
        4 => 0x7fff_ffff_7fff_ffff,
        _ => 0x7fff_7fff_7fff_7fff,
    };
    let [br, bc] = block.map(|d| d as usize);
    let row_bytes = w.shape()[1] * es;
    nonzero
        .par_chunks_mut(grid.1)
        .zip(w.bytes().par_chunks(br * row_bytes))
        .for_each(|(nonzero, rows)| {
            for (c, nz) in nonzero.iter_mut().enumerate() {
                let mut bits = 0u64;
                for row in rows.chunks_exact(row_bytes) {
                    let segment = &row[c * bc * es..(c + 1) * bc * es];
                    let words = segment.chunks_exact(8);
                    let tail = words.remainder();
                    for word in words {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(word);
                        bits |= u64::from_le_bytes(b) & magnitude;
                    }
                    // A segment is whole elements; one not a multiple of eight bytes ends in
                    // whole elements too, read as the low bytes of a word.
                    let mut b = [0u8; 8];
                    b[..tail.len()].copy_from_slice(tail);
                    bits |= u64::from_le_bytes(b) & magnitude;
                }
                *nz = bits != 0;
            }
        });
    nonzero
}

/// The `round(density * blocks)` blocks of largest norm, ascending (ties to the lower index).
fn largest(norms: &[BlockNorm], d: f64) -> Result<Vec<usize>, String> {
    if !(d > 0.0 && d <= 1.0) {
        return Err(format!("density {d} is not in (0, 1]"));
    }
    let count = ((d * norms.len() as f64).round() as usize).min(norms.len());
    let mut order: Vec<usize> = (0..norms.len()).collect();
    // Largest norm first (NaN above infinity above every number); equal norms by index.
    order.sort_by(|&a, &b| norms[b].cmp(&norms[a]).then(a.cmp(&b)));
    order.truncate(count);
    order.sort_unstable();
    Ok(order)
}

/// The kept blocks (row-major indices, ascending) of weights of one shape pruned together to
/// `density`: the `round(density * blocks)` blocks whose squared L2 norms, summed over the
/// weights, are largest (ties to the lower index).
pub fn kept_blocks_together(
    ws: &[&HostTensor],
    block: [u64; 2],
    density: f64,
) -> Result<Vec<usize>, String> {
    let Some(first) = ws.first() else {
        return Ok(Vec::new());
    };
    if let Some(other) = ws.iter().find(|w| w.shape() != first.shape()) {
        return Err(format!(
            "weights pruned together need one shape, not {:?} and {:?}",
            first.shape(),
            other.shape()
        ));
    }
    let grid = block_grid(first.shape(), block)?;
    let mut norms = block_norms(first, block, grid);
    for w in &ws[1..] {
        for (n, m) in norms.iter_mut().zip(block_norms(w, block, grid)) {
            n.add(&m);
        }
    }
    largest(&norms, density)
}

/// How the blocks of a weight lie in its bytes, for zeroing the dropped ones.
struct BlockBytes {
    /// Whether each block (row-major index) is kept.
    keep: Vec<bool>,
    /// Bytes of one block row (a block's height of whole rows of the weight).
    block_row: usize,
    /// Bytes of one row of the weight.
    row: usize,
    /// Bytes of one block's part of a row.
    piece: usize,
    /// Blocks a block row.
    cols: usize,
}

impl BlockBytes {
    /// `None` where the weight has no bytes to zero.
    fn new(
        w: &HostTensor,
        block: [u64; 2],
        grid: (usize, usize),
        kept: &[usize],
    ) -> Option<BlockBytes> {
        let mut keep = vec![false; grid.0 * grid.1];
        for &b in kept {
            keep[b] = true;
        }
        let es = w.dtype().size_bytes();
        let [br, bc] = block.map(|d| d as usize);
        let row = w.shape()[1] * es;
        (row > 0 && br > 0 && bc > 0).then_some(BlockBytes {
            keep,
            block_row: br * row,
            row,
            piece: bc * es,
            cols: grid.1,
        })
    }
}

/// Sets every block of `w` outside `kept` (row-major block indices) to zero, where it is;
/// whether any of them held a nonzero byte.
fn zero_dropped_in_place(
    w: &mut HostTensor,
    block: [u64; 2],
    grid: (usize, usize),
    kept: &[usize],
) -> bool {
    use rayon::prelude::*;
    let Some(l) = BlockBytes::new(w, block, grid, kept) else {
        return false;
    };
    // The block rows in parallel.
    w.bytes_mut()
        .par_chunks_mut(l.block_row)
        .zip(l.keep.par_chunks(l.cols))
        .map(|(rows, blocks)| {
            let mut nonzero = false;
            for row in rows.chunks_exact_mut(l.row) {
                for (kept, piece) in blocks.iter().zip(row.chunks_exact_mut(l.piece)) {
                    if !*kept {
                        nonzero |= piece.iter().any(|&b| b != 0);
                        piece.fill(0);
                    }
                }
            }
            nonzero
        })
        .reduce(|| false, |a, b| a || b)
}

/// `w` with every block outside `kept` (row-major block indices) set to zero.
fn zero_dropped(
    w: &HostTensor,
    block: [u64; 2],
    grid: (usize, usize),
    kept: &[usize],
) -> HostTensor {
    use rayon::prelude::*;
    // Zeros from the allocator (untouched until written), then the kept blocks copied in: the
    // block rows in parallel.
    let mut bytes = vec![0u8; w.bytes().len()];
    if let Some(l) = BlockBytes::new(w, block, grid, kept) {
        bytes
            .par_chunks_mut(l.block_row)
            .zip(w.bytes().par_chunks(l.block_row))
            .zip(l.keep.par_chunks(l.cols))
            .for_each(|((dst, src), blocks)| {
                for (d, s) in dst.chunks_exact_mut(l.row).zip(src.chunks_exact(l.row)) {
                    let pieces = d.chunks_exact_mut(l.piece).zip(s.chunks_exact(l.piece));
                    for (kept, (d, s)) in blocks.iter().zip(pieces) {
                        if *kept {
                            d.copy_from_slice(s);
                        }
                    }
                }
            });
    }
    // Same dtype, shape and length: this cannot fail.
    HostTensor::from_bytes(w.dtype(), w.shape().to_vec(), bytes).unwrap_or_else(|_| w.clone())
}

impl Pass for PruneBlockSparse {
    fn name(&self) -> &'static str {
        "prune-block-sparse"
    }

    fn description(&self) -> &'static str {
        "zero the blocks of selected weights outside their block-sparsity pattern (L2-norm ranking)"
    }

    fn run(&self, g: &mut Graph, prov: &mut Provenance) -> Result<bool, PassError> {
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|d| g.weights().values().any(|w| Arc::ptr_eq(w, &d.source)));
        let mut changed = false;
        for (i, spec) in self.specs.iter().enumerate() {
            let err = |message: String| PassError::Sparsity {
                weight: spec.weight.clone(),
                message,
            };
            // A second spec would prune the pruned weight again, with its own block (the
            // frontend refuses a weight two keys select; a model built in memory may not).
            if self.specs[..i].iter().any(|s| s.weight == spec.weight) {
                return Err(err(
                    "selected twice; one block shape and density a weight".into()
                ));
            }
            // Shared, not copied: the pruned copy is the only new one.
            let Some(w) = weight_node(g, &spec.weight) else {
                if prov.fate(&spec.weight) == Some(&Fate::Removed) {
                    continue;
                }
                return Err(err("the graph has no weight of this name".to_string()));
            };
            let partner = match &spec.with {
                None => None,
                Some(p) => {
                    let j = self.partner(i).map_err(err)?;
                    match weight_node(g, p) {
                        // Pruned together with its partner already.
                        Some(_) if j < i => continue,
                        Some(pw) => Some((p.clone(), pw)),
                        // Pruned alone, the weight would keep other blocks than in the reference
                        // (the source graph pruned, its dead partner included).
                        None if prov.fate(p) == Some(&Fate::Removed) => {
                            return Err(err(format!(
                                "it is pruned together with `{p}`, which no output needs \
                                 (`dce` removed it); a weight is pruned together only with a \
                                 live one"
                            )))
                        }
                        None => {
                            return Err(err(format!(
                                "it is pruned together with `{p}`, but the graph has no weight \
                                 of that name"
                            )))
                        }
                    }
                }
            };
            let Some(d) = spec.density else {
                // The pattern of all-zero blocks: nothing to prune, only the block to check.
                block_grid(w.shape(), spec.block).map_err(err)?;
                continue;
            };
            let names: Vec<String> = [spec.weight.clone()]
                .into_iter()
                .chain(partner.map(|(p, _)| p))
                .collect();
            let data: Vec<Arc<HostTensor>> =
                names.iter().filter_map(|n| g.weight(n).cloned()).collect();
            drop(w);
            if let Some(pruned) = self.recall(i, &data) {
                for (name, p) in names.into_iter().zip(pruned) {
                    if !g.weight(&name).is_some_and(|w| Arc::ptr_eq(w, &p)) {
                        g.set_weight_shared(name, p);
                        changed = true;
                    }
                }
                continue;
            }
            let kept = match &data[..] {
                [w, pw] => kept_blocks_together(&[w, pw], spec.block, d),
                _ => kept_blocks(&data[0], spec.block, Some(d)),
            }
            .map_err(err)?;
            let grid = block_grid(data[0].shape(), spec.block).map_err(err)?;
            let kept: Arc<[usize]> = kept.into();
            // Only the graph may hold the data for it to be zeroed in place.
            drop(data);
            let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
            for name in names {
                // The graph holds the only reference: the dropped blocks zeroed where they are,
                // and nothing to remember but that these data are pruned.
                if let Some(t) = g.weight_mut(&name) {
                    changed |= zero_dropped_in_place(t, spec.block, grid, &kept);
                    if let Some(w) = g.weight(&name) {
                        done.push(Pruned {
                            spec: i,
                            source: w.clone(),
                            kept: None,
                        });
                    }
                    continue;
                }
                // Shared (with the source graph, or with the other name of a pair that holds one
                // tensor): a pruned copy, unless no dropped block held a nonzero byte.
                let Some(w) = g.weight(&name).cloned() else {
                    continue;
                };
                let p = zero_dropped(&w, spec.block, grid, &kept);
                let same = p.bytes() == w.bytes();
                done.push(Pruned {
                    spec: i,
                    source: w,
                    kept: (!same).then(|| kept.clone()),
                });
                if !same {
                    g.set_weight(name, p);
                    changed = true;
                }
            }
        }
        Ok(changed)
    }
}

/// The data of the weight node `name`, if the graph has one.
fn weight_node(g: &Graph, name: &str) -> Option<Arc<HostTensor>> {
    let is_weight_node = g.find(name).is_some_and(|n| g.node(n).op == Op::Weight);
    g.weight(name).filter(|_| is_weight_node).cloned()
}

impl PruneBlockSparse {
    /// The index of the spec that spec `i` is pruned together with (its [`SparseWeight::with`]),
    /// which must name it back with the same block and density.
    fn partner(&self, i: usize) -> Result<usize, String> {
        let spec = &self.specs[i];
        let Some(p) = &spec.with else {
            return Err("it is pruned alone".to_string());
        };
        if *p == spec.weight {
            return Err("it cannot be pruned together with itself".to_string());
        }
        if spec.density.is_none() {
            return Err(format!(
                "it is pruned together with `{p}`, and so needs a density (the blocks of largest \
                 summed norm are kept)"
            ));
        }
        let Some(j) = self.specs.iter().position(|s| s.weight == *p) else {
            return Err(format!(
                "it is pruned together with `{p}`, which is not selected for block sparsity"
            ));
        };
        let other = &self.specs[j];
        if other.with.as_deref() != Some(spec.weight.as_str())
            || other.block != spec.block
            || other.density != spec.density
        {
            return Err(format!(
                "it is pruned together with `{p}`, whose spec must name it back with the same \
                 block and density"
            ));
        }
        Ok(j)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlpc_ir::DType;

    fn w(shape: [usize; 2], v: &[f64]) -> HostTensor {
        HostTensor::from_f64(DType::F32, shape.to_vec(), v).unwrap()
    }

    /// [`Squares`] folds to the norm that adding each square to a [`BlockNorm`] gives: over the
    /// whole f32 range (subnormals, the largest finite value, signs), with infinities and NaN,
    /// and for blocks of one element up to many, one accumulator reused as `block_norms` does.
    #[test]
    fn squares_fold_to_the_exact_norm() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_pcg::Pcg64::seed_from_u64(9);
        let mut squares = Squares::new();
        for block in 0..400 {
            let n = [1, 2, 7, 64, 1024][block % 5];
            let special = block % 13 == 0;
            let values: Vec<f32> = (0..n)
                .map(|i| match rng.gen_range(0..10) {
                    0 => f32::from_bits(rng.gen_range(1..0x80_0000)), // subnormal
                    1 => f32::MAX,
                    2 if special && i % 3 == 0 => f32::INFINITY,
                    3 if special && i % 5 == 0 => f32::NAN,
                    4 => 0.0,
                    _ => f32::from_bits(rng.gen_range(0..0x7f80_0000)),
                } * if rng.gen_bool(0.5) { -1.0 } else { 1.0 })
                .collect();
            let mut want = BlockNorm::Finite([0; NORM_LIMBS]);
            for &x in &values {
                want.add_square(x);
                squares.add(x);
            }
            assert_eq!(squares.fold(), want, "block {block}: {values:?}");
        }
    }

    #[test]
    fn ties_go_to_the_lower_row_major_index() {
        // 2x2 blocks of a [2, 8] weight: norms 1, 4, 1, 4 (blocks 0..3 along the row).
        let v = [
            1.0, 0.0, 2.0, 0.0, 0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
        ];
        let t = w([2, 8], &v);
        assert_eq!(kept_blocks(&t, [2, 2], Some(0.25)).unwrap(), vec![1]);
        assert_eq!(kept_blocks(&t, [2, 2], Some(0.5)).unwrap(), vec![1, 3]);
        assert_eq!(kept_blocks(&t, [2, 2], Some(0.75)).unwrap(), vec![0, 1, 3]);
        assert_eq!(
            kept_blocks(&t, [2, 2], Some(1.0)).unwrap(),
            vec![0, 1, 2, 3]
        );
        // Equal norms everywhere: the first blocks in row-major order.
        let ones = w([4, 4], &[1.0; 16]);
        assert_eq!(kept_blocks(&ones, [2, 2], Some(0.5)).unwrap(), vec![0, 1]);
        // Row-major means block row first: block (1, 0) has index 2, before (1, 1).
        let mut v = [0.0; 16];
        v[8] = 3.0; // block (1, 0)
        v[10] = 3.0; // block (1, 1)
        let t = w([4, 4], &v);
        assert_eq!(kept_blocks(&t, [2, 2], Some(0.25)).unwrap(), vec![2]);
    }

    #[test]
    fn equal_norms_tie_whatever_the_order_of_their_elements() {
        // Blocks [1, b, b, b, b] and [b, b, b, b, 1], b = 2^-27: equal norms, which a running f64
        // sum in element order rounds apart (1 + b^2 rounds to 1, b^2 + b^2 ... + 1 does not).
        let b = 2f64.powi(-27);
        let t = w([1, 10], &[1.0, b, b, b, b, b, b, b, b, 1.0]);
        assert_eq!(kept_blocks(&t, [1, 5], Some(0.5)).unwrap(), vec![0]);
        // A block and its transpose, of pseudo-random values.
        let a: Vec<f64> = (0..64u32)
            .map(|i| f64::from(i.wrapping_mul(2_654_435_761) >> 8) / 16_777_216.0 - 0.5)
            .collect();
        let mut v = vec![0.0; 8 * 16];
        for r in 0..8 {
            for c in 0..8 {
                v[r * 16 + c] = a[r * 8 + c];
                v[r * 16 + 8 + c] = a[c * 8 + r];
            }
        }
        let t = w([8, 16], &v);
        assert_eq!(kept_blocks(&t, [8, 8], Some(0.5)).unwrap(), vec![0]);
    }

    #[test]
    fn norms_are_ordered_across_the_whole_f32_range() {
        let tiny = f64::from(f32::from_bits(1)); // the smallest subnormal
        let huge = f64::from(f32::MAX);
        // One element a block: 0, tiny, 2 tiny, 1, huge, infinity, NaN, 1 + 2^-23.
        let v = [
            0.0,
            tiny,
            2.0 * tiny,
            1.0,
            huge,
            f64::INFINITY,
            f64::NAN,
            1.0 + 2f64.powi(-23),
        ];
        let t = w([1, 8], &v);
        let kept = |n: usize| kept_blocks(&t, [1, 1], Some(n as f64 / 8.0)).unwrap();
        assert_eq!(kept(1), vec![6]);
        assert_eq!(kept(2), vec![5, 6]);
        assert_eq!(kept(3), vec![4, 5, 6]);
        assert_eq!(kept(4), vec![4, 5, 6, 7]);
        assert_eq!(kept(5), vec![3, 4, 5, 6, 7]);
        assert_eq!(kept(6), vec![2, 3, 4, 5, 6, 7]);
        assert_eq!(kept(7), vec![1, 2, 3, 4, 5, 6, 7]);
        // Squares of the largest f32 summed over a 64 x 64 block do not overflow.
        let t = w([64, 128], &[huge; 64 * 128]);
        let mut v = vec![huge; 64 * 128];
        v[127] = 1.0; // block 1 is slightly smaller
        let smaller = w([64, 128], &v);
        assert_eq!(kept_blocks(&t, [64, 64], Some(0.5)).unwrap(), vec![0]);
        assert_eq!(kept_blocks(&smaller, [64, 64], Some(0.5)).unwrap(), vec![0]);
        v[0] = 1.0;
        v[127] = huge;
        let smaller = w([64, 128], &v);
        assert_eq!(kept_blocks(&smaller, [64, 64], Some(0.5)).unwrap(), vec![1]);
    }

    #[test]
    fn rounding_of_the_kept_count() {
        let t = w([2, 8], &[1.0; 16]);
        // 4 blocks: 0.375 * 4 = 1.5 rounds to 2; 0.3 * 4 = 1.2 rounds to 1; 0.1 * 4 = 0.4 to 0.
        assert_eq!(kept_blocks(&t, [2, 2], Some(0.375)).unwrap().len(), 2);
        assert_eq!(kept_blocks(&t, [2, 2], Some(0.3)).unwrap().len(), 1);
        assert_eq!(kept_blocks(&t, [2, 2], Some(0.1)).unwrap().len(), 0);
        assert!(kept_blocks(&t, [2, 2], Some(0.0)).is_err());
        assert!(kept_blocks(&t, [3, 2], Some(0.5))
            .unwrap_err()
            .contains("does not divide"));
    }

    #[test]
    fn without_density_the_zero_blocks_define_the_pattern() {
        let mut v = [0.0; 16];
        v[5] = -0.0;
        v[3] = 1e-30;
        v[12] = f64::NAN;
        let t = w([4, 4], &v);
        // Block 0 holds only zeros (one negative), block 1 a tiny value, block 2 a NaN.
        assert_eq!(kept_blocks(&t, [2, 2], None).unwrap(), vec![1, 2]);
        // A NaN norm ranks first.
        assert_eq!(kept_blocks(&t, [2, 2], Some(0.25)).unwrap(), vec![2]);
    }

    /// The all-zero blocks read from the elements' bits are those of norm 0, for every dtype and
    /// blocks whose rows are not whole eight-byte words: blocks of +0 and -0 only, or with one
    /// element that is the least subnormal, a NaN, an infinity or a normal value, anywhere.
    #[test]
    fn nonzero_blocks_are_those_of_a_nonzero_norm() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for dtype in DType::ALL {
            let es = dtype.size_bytes();
            let (sign, specials): (u32, [u32; 4]) = match es {
                4 => (0x8000_0000, [1, 0x7fc0_0001, 0x7f80_0000, 0x3f80_0000]),
                _ if dtype == DType::F16 => (0x8000, [1, 0x7e01, 0x7c00, 0x3c00]),
                _ => (0x8000, [1, 0x7fc1, 0x7f80, 0x3f80]),
            };
            for block in [[1, 1], [2, 3], [3, 5], [2, 7], [4, 8]] {
                let [br, bc] = block;
                let (rows, cols) = (br * 3, bc * 4);
                let mut bits = vec![0u32; rows * cols];
                for b in 0..12 {
                    let (r0, c0) = ((b / 4) * br, (b % 4) * bc);
                    for r in r0..r0 + br {
                        for c in c0..c0 + bc {
                            bits[r * cols + c] = if next() % 2 == 0 { sign } else { 0 };
                        }
                    }
                    if b % 3 != 0 {
                        let at = (r0 + next() as usize % br) * cols + c0 + next() as usize % bc;
                        let v = specials[next() as usize % 4];
                        bits[at] = v | if next() % 2 == 0 { sign } else { 0 };
                    }
                }
                let bytes: Vec<u8> = bits
                    .iter()
                    .flat_map(|&b| b.to_le_bytes()[..es].to_vec())
                    .collect();
                let t = HostTensor::from_bytes(dtype, vec![rows, cols], bytes).unwrap();
                let block = [br as u64, bc as u64];
                let zero = BlockNorm::Finite([0; NORM_LIMBS]);
                let want: Vec<bool> = block_norms(&t, block, (3, 4))
                    .iter()
                    .map(|n| *n != zero)
                    .collect();
                assert_eq!(
                    nonzero_blocks(&t, block, (3, 4)),
                    want,
                    "{dtype:?} {block:?}"
                );
                assert_eq!(
                    want.iter().filter(|&&n| n).count(),
                    8,
                    "{dtype:?} {block:?}"
                );
            }
        }
    }

    #[test]
    fn weights_pruned_together_keep_the_blocks_of_largest_summed_norm() {
        // Four 1 x 2 blocks. Norms of a: 25, 0, 4, 1; of b: 0, 16, 4, 25. Summed: 25, 16, 8, 26.
        let a = w([1, 8], &[3.0, 4.0, 0.0, 0.0, 2.0, 0.0, 0.0, 1.0]);
        let b = w([1, 8], &[0.0, 0.0, 4.0, 0.0, 0.0, 2.0, 3.0, 4.0]);
        assert_eq!(
            kept_blocks_together(&[&a, &b], [1, 2], 0.5).unwrap(),
            vec![0, 3]
        );
        assert_eq!(
            kept_blocks_together(&[&a, &b], [1, 2], 0.75).unwrap(),
            vec![0, 1, 3]
        );
        // Alone, each keeps other blocks.
        assert_eq!(kept_blocks(&a, [1, 2], Some(0.5)).unwrap(), vec![0, 2]);
        assert_eq!(kept_blocks(&b, [1, 2], Some(0.5)).unwrap(), vec![1, 3]);
        // Equal sums tie to the lower index; a NaN in either weight ranks its block first.
        let c = w([1, 8], &[0.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0]);
        let d = w([1, 8], &[3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(
            kept_blocks_together(&[&c, &d], [1, 2], 0.25).unwrap(),
            vec![0]
        );
        let e = w([1, 8], &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, f64::NAN, 0.0]);
        assert_eq!(
            kept_blocks_together(&[&a, &e], [1, 2], 0.25).unwrap(),
            vec![3]
        );
        // One shape, and a density in (0, 1].
        let wide = w([1, 4], &[1.0; 4]);
        assert!(kept_blocks_together(&[&a, &wide], [1, 2], 0.5)
            .unwrap_err()
            .contains("one shape"));
        assert!(kept_blocks_together(&[&a, &b], [1, 2], 0.0).is_err());
    }

    #[test]
    fn dropped_blocks_become_zero() {
        let t = w([2, 4], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let z = zero_dropped(&t, [1, 2], (2, 2), &[1, 2]);
        assert_eq!(z.to_f64(), vec![0.0, 0.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0]);
    }
}
