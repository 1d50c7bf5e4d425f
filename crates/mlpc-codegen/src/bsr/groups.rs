//! Which block rows each group of `GemmBsrWgmma` computes ([`Groups`]: consecutive ones, or ones
//! chosen to keep blocks in the same columns, annealed and, where it pays, balanced by a cost
//! model of a step and a kept block), and the steps of each group's k loop ([`GroupSteps`]:
//! windows of block columns, or pairs of a group's kept columns, each with the mask of the rows
//! that keep them), as the kernel's generated lists hold them.

use super::WgmmaBsr;
use mlpc_ir::BlockPattern;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// How [`GroupSteps::pairs`] pairs a group's kept columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PairOrder {
    /// Two by two in increasing order.
    Natural,
    /// Within each run of [`BALANCE_RUN`] of them in increasing order, the column its group's
    /// rows keep most with the one they keep least, and so on ([`balanced_pairs`]).
    Balanced,
}

/// The columns of a group's union that [`PairOrder::Balanced`] pairs among: a run short enough
/// that the pairs' A pieces stay near each other (pairs balanced over the whole union measured
/// 3.7 % slower at density 0.1, runs of 16 0.7 %: docs/perf-notes.md, block-sparse variants 38
/// and 39).
const BALANCE_RUN: usize = 16;

/// The union's columns (increasing) in the order of balanced pairs: each run of
/// [`BALANCE_RUN`] columns sorted by how many of `kept`'s blocks they hold, the most paired with
/// the fewest (which minimises the largest pair of the run), the pairs by their first column,
/// a run's odd column last.
fn balanced_pairs(union: &[u32], kept: &[(u32, u32, u32)]) -> Vec<u32> {
    let mut count = HashMap::<u32, usize>::new();
    for k in kept {
        *count.entry(k.0).or_default() += 1;
    }
    let mut out = Vec::with_capacity(union.len());
    for run in union.chunks(BALANCE_RUN) {
        let mut by_count = run.to_vec();
        by_count.sort_by_key(|c| (std::cmp::Reverse(count.get(c).copied().unwrap_or(0)), *c));
        let n = by_count.len();
        let mut pairs: Vec<(u32, u32)> = (0..n / 2)
            .map(|i| {
                let (a, b) = (by_count[i], by_count[n - 1 - i]);
                (a.min(b), a.max(b))
            })
            .collect();
        pairs.sort_unstable();
        out.extend(pairs.iter().flat_map(|&(a, b)| [a, b]));
        if n % 2 == 1 {
            out.push(by_count[n / 2]);
        }
    }
    out
}

/// Per group: (block column, slot in the group, packed index) of each of its kept blocks.
fn kept_by_group<'a>(
    pattern: &'a BlockPattern,
    groups: &'a Groups,
) -> impl Iterator<Item = Vec<(u32, u32, u32)>> + use<'a> {
    let row_ptr = pattern.row_ptr();
    (0..groups.count(pattern)).map(move |j| {
        groups
            .slots(pattern, j)
            .flat_map(|(i, r)| {
                (row_ptr[r as usize]..row_ptr[r as usize + 1])
                    .map(move |at| (pattern.kept[at as usize].1, i, at))
            })
            .collect()
    })
}

/// Which block rows each group of `GemmBsrWgmma` computes, `g` slots a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Groups {
    /// Group j: block rows `j g .. j g + g` (the last group fewer).
    Consecutive { g: u32 },
    /// Group j: block rows `rows[j g .. j g + g]`; an empty slot holds the block row count and
    /// follows the filled ones (the template's `Rows`).
    Listed { g: u32, rows: Vec<u32> },
}

impl Groups {
    /// Slots a group.
    pub fn g(&self) -> u32 {
        match self {
            Groups::Consecutive { g } | Groups::Listed { g, .. } => *g,
        }
    }

    /// The number of groups: as many as consecutive groups of `g` need.
    pub fn count(&self, pattern: &BlockPattern) -> u32 {
        (pattern.block_rows() as u32).div_ceil(self.g())
    }

    /// (slot, block row) of group `j`'s filled slots, in slot order.
    pub fn slots<'a>(
        &'a self,
        pattern: &BlockPattern,
        j: u32,
    ) -> impl Iterator<Item = (u32, u32)> + 'a {
        let rows = pattern.block_rows() as u32;
        let g = self.g();
        (0..g).filter_map(move |i| {
            let r = match self {
                Groups::Consecutive { .. } => j * g + i,
                Groups::Listed { rows, .. } => rows[(j * g + i) as usize],
            };
            (r < rows).then_some((i, r))
        })
    }

    /// Groups of `g` block rows chosen to share kept blocks: the fewer units (block columns,
    /// or windows of two neighbouring ones: `unit`) a group's rows keep between them, the fewer
    /// steps its k loop takes and the fewer A pieces it copies. Greedy (each group seeded with
    /// the free row keeping most units, then the free row adding fewest new ones, ties to the
    /// lower row), then improved by exchanging rows between two groups while that lowers their
    /// units' sum, for a few passes. The groups start at the consecutive form's sizes (the last
    /// one the remainder); each group's rows increase. On a random mask of 128 x 128 blocks this
    /// takes about 6 % / 19 % fewer steps at density 0.25 / 0.1 (docs/perf-notes.md,
    /// block-sparse variant 35). Then annealed ([`anneal`]); with `balanced`, then balanced
    /// ([`balance`]: the costliest group's modelled cycles lowered by moving rows into free
    /// slots or exchanging them, at the price of a few more steps). A pure function of its
    /// arguments, kept for the process (the configuration's choice and every table generated
    /// from it ask for the same groups, and the annealing takes tens of milliseconds on a 4096 x
    /// 4096 weight).
    pub fn by_overlap(pattern: &BlockPattern, g: u32, unit: StepUnit, balanced: bool) -> Groups {
        type Memo = HashMap<(BlockPattern, u32, StepUnit, bool), Groups>;
        static MEMO: OnceLock<Mutex<Memo>> = OnceLock::new();
        let memo = MEMO.get_or_init(|| Mutex::new(HashMap::new()));
        let key = (pattern.clone(), g, unit, balanced);
        if let Some(groups) = memo.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return groups;
        }
        let groups = Groups::overlapping(pattern, g, unit, balanced);
        if let Ok(mut m) = memo.lock() {
            // A compile asks for a few patterns; a long-lived process embedding the compiler
            // keeps at most the last few dozen.
            if m.len() >= 64 {
                m.clear();
            }
            m.insert(key, groups.clone());
        }
        groups
    }

    /// [`Groups::by_overlap`].
    fn overlapping(pattern: &BlockPattern, g: u32, step_unit: StepUnit, balanced: bool) -> Groups {
        let unit = step_unit.width();
        let rows = pattern.block_rows() as usize;
        let units = (pattern.block_cols() as usize).div_ceil(unit as usize);
        let words = units.div_ceil(64).max(1);
        let mut sets = vec![vec![0u64; words]; rows];
        for &(r, c) in &pattern.kept {
            let u = (c / unit) as usize;
            sets[r as usize][u / 64] |= 1 << (u % 64);
        }
        let g = g as usize;
        let union = |members: &[usize]| {
            let mut u = vec![0u64; words];
            for &r in members {
                u.iter_mut().zip(&sets[r]).for_each(|(a, b)| *a |= b);
            }
            u
        };
        let ones = |v: &[u64]| v.iter().map(|w| w.count_ones()).sum::<u32>();
        // Greedy.
        let mut free: Vec<bool> = vec![true; rows];
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for _ in 0..rows.div_ceil(g) {
            let Some(seed) = (0..rows)
                .filter(|&r| free[r])
                .max_by_key(|&r| (ones(&sets[r]), std::cmp::Reverse(r)))
            else {
                break;
            };
            free[seed] = false;
            let mut members = vec![seed];
            let mut u = sets[seed].clone();
            while members.len() < g {
                let added = |r: usize| -> u32 {
                    sets[r]
                        .iter()
                        .zip(&u)
                        .map(|(a, b)| (a & !b).count_ones())
                        .sum()
                };
                let Some(next) = (0..rows)
                    .filter(|&r| free[r])
                    .min_by_key(|&r| (added(r), r))
                else {
                    break;
                };
                free[next] = false;
                members.push(next);
                u.iter_mut().zip(&sets[next]).for_each(|(a, b)| *a |= b);
            }
            groups.push(members);
        }
        // Exchanges, by the units of two groups after one row of each changes places
        // ([`UnitSummary::after`]).
        let summary = |members: &[usize]| UnitSummary::of(&sets, members);
        let after = |info: &UnitSummary, x: usize, y: usize| info.after(&sets, Some(x), Some(y));
        let mut info: Vec<_> = groups.iter().map(|m| summary(m)).collect();
        for _ in 0..4 {
            let mut improved = false;
            for a in 0..groups.len() {
                for b in a + 1..groups.len() {
                    for i in 0..groups[a].len() {
                        for j in 0..groups[b].len() {
                            let (x, y) = (groups[a][i], groups[b][j]);
                            let before = info[a].units() + info[b].units();
                            if after(&info[a], x, y) + after(&info[b], y, x) < before {
                                groups[a][i] = y;
                                groups[b][j] = x;
                                info[a] = summary(&groups[a]);
                                info[b] = summary(&groups[b]);
                                improved = true;
                            }
                        }
                    }
                }
            }
            if !improved {
                break;
            }
        }
        anneal(&mut groups, &sets);
        if balanced {
            let row_ptr = pattern.row_ptr();
            let blocks: Vec<u64> = row_ptr.windows(2).map(|w| u64::from(w[1] - w[0])).collect();
            balance(&mut groups, &sets, &blocks, g, step_unit);
        }
        debug_assert!(groups.iter().all(|m| ones(&union(m)) == summary(m).units()));
        let mut slots = Vec::with_capacity(groups.len() * g);
        for mut members in groups {
            members.sort_unstable();
            slots.extend(members.iter().map(|&r| r as u32));
            slots.extend(std::iter::repeat_n(rows as u32, g - members.len()));
        }
        Groups::Listed {
            g: g as u32,
            rows: slots,
        }
    }
}

/// Improves groups of block rows (`sets[r]`: the units row r keeps, as a bitset) by simulated
/// annealing: exchanges of two rows of two random groups, taken when they lower the two groups'
/// units or, with probability exp(-rise / t), when they raise them, the temperature t falling
/// linearly from 1 to 0; the best grouping seen is kept. Deterministic (a fixed xorshift seed).
/// Where the exchanges of [`Groups::by_overlap`] stop (no single exchange lowers the sum), this
/// leaves that local minimum: on a random mask of 128 x 128 blocks at density 0.1, about 4 %
/// fewer kept columns than the exchanges alone (docs/perf-notes.md, block-sparse variant 36).
fn anneal(groups: &mut [Vec<usize>], sets: &[Vec<u64>]) {
    let n = groups.len();
    let members: usize = groups.iter().map(Vec::len).sum();
    if n < 2 || members < 3 {
        return;
    }
    let words = sets.first().map_or(0, Vec::len);
    // The units group `m` keeps, with member `at` replaced by row `with` where `swap` says so.
    let units = |m: &[usize], swap: Option<(usize, usize)>| -> u32 {
        let row = |i: usize, r: usize| match swap {
            Some((at, with)) if at == i => with,
            _ => r,
        };
        (0..words)
            .map(|w| {
                let u = m
                    .iter()
                    .enumerate()
                    .fold(0u64, |u, (i, &r)| u | sets[row(i, r)][w]);
                u.count_ones()
            })
            .sum()
    };
    let mut cost: Vec<u32> = groups.iter().map(|m| units(m, None)).collect();
    let mut sum: u32 = cost.iter().sum();
    let (mut best, mut best_groups) = (sum, groups.to_vec());
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |below: usize| -> usize {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) % below as u64) as usize
    };
    let iterations = (8000 * members).min(2_000_000);
    for it in 0..iterations {
        let a = next(n);
        let b = (a + 1 + next(n - 1)) % n;
        let (i, j) = (next(groups[a].len()), next(groups[b].len()));
        let (x, y) = (groups[a][i], groups[b][j]);
        let (ca, cb) = (
            units(&groups[a], Some((i, y))),
            units(&groups[b], Some((j, x))),
        );
        let rise = (ca + cb) as f64 - (cost[a] + cost[b]) as f64;
        let t = 1.0 - it as f64 / iterations as f64;
        let take = rise <= 0.0 || {
            let u = next(1 << 20) as f64 / (1 << 20) as f64;
            t > 0.0 && u < (-rise / t).exp()
        };
        if take {
            groups[a][i] = y;
            groups[b][j] = x;
            sum = sum + ca + cb - cost[a] - cost[b];
            (cost[a], cost[b]) = (ca, cb);
            if sum < best {
                best = sum;
                best_groups.clone_from_slice(groups);
            }
        }
    }
    groups.clone_from_slice(&best_groups);
}

/// What a step of a group's k loop copies an A piece for: the units [`Groups::by_overlap`]
/// counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum StepUnit {
    /// One block column a step.
    Columns,
    /// A window of two neighbouring block columns a step.
    Windows,
    /// Two of the group's kept block columns a step, wherever they lie ([`GroupSteps::pairs`]).
    Pairs,
}

impl StepUnit {
    /// The unit of a slice form: `wb` block columns a step, with `pairs` two kept ones.
    pub fn of(wb: u32, pairs: bool) -> StepUnit {
        match (wb, pairs) {
            (2, false) => StepUnit::Windows,
            (2, true) => StepUnit::Pairs,
            _ => StepUnit::Columns,
        }
    }

    /// Block columns a unit.
    fn width(self) -> u32 {
        match self {
            StepUnit::Windows => 2,
            StepUnit::Columns | StepUnit::Pairs => 1,
        }
    }

    /// The steps that `units` units take.
    fn steps(self, units: u32) -> u32 {
        match self {
            StepUnit::Pairs => units.div_ceil(2),
            StepUnit::Columns | StepUnit::Windows => units,
        }
    }
}

/// The units a group of block rows keeps (`sets[r]`: row r's units as a bitset), and those
/// exactly one of its rows keeps: enough to count its units after a row leaves or joins.
struct UnitSummary {
    kept: Vec<u64>,
    once: Vec<u64>,
}

impl UnitSummary {
    fn of(sets: &[Vec<u64>], members: &[usize]) -> UnitSummary {
        let words = sets.first().map_or(0, Vec::len);
        let (mut kept, mut once) = (vec![0u64; words], vec![0u64; words]);
        for &r in members {
            for (w, &s) in sets[r].iter().enumerate() {
                once[w] = (once[w] & !s) | (s & !kept[w]);
                kept[w] |= s;
            }
        }
        UnitSummary { kept, once }
    }

    /// The group's units.
    fn units(&self) -> u32 {
        self.kept.iter().map(|w| w.count_ones()).sum()
    }

    /// The group's units with row `out` gone and row `into` added (either optional): |U| -
    /// |out & once & !into| + |into & !U|.
    fn after(&self, sets: &[Vec<u64>], out: Option<usize>, into: Option<usize>) -> u32 {
        let lost: u32 = out.map_or(0, |x| {
            (0..self.kept.len())
                .map(|w| {
                    let y = into.map_or(0, |y| sets[y][w]);
                    (sets[x][w] & self.once[w] & !y).count_ones()
                })
                .sum()
        });
        let won: u32 = into.map_or(0, |y| {
            (0..self.kept.len())
                .map(|w| (sets[y][w] & !self.kept[w]).count_ones())
                .sum()
        });
        self.units() - lost + won
    }
}

/// The cost model of a group's tile in `GemmBsrWgmma` (cycles of an H200 SM): a fixed part a
/// step (a slice: the `full` wait, the A fragments, the mask's tests) and a part a kept block
/// (its wgmmas and its branch); docs/perf-notes.md, block-sparse variants 18, 41 and 42. Only
/// their ratio steers [`balance`] and the choice of listed groups.
const STEP_CYCLES: u64 = 540;
/// See [`STEP_CYCLES`].
const BLOCK_CYCLES: u64 = 60;
/// A tile's epilogue in the same model (about 2 us a 128 x 352 tile: docs/perf-notes.md,
/// block-sparse variant 32): a constant a work item in [`GroupSteps::walk_costs`].
const TILE_CYCLES: u64 = 3500;

/// Evens out the groups' modelled costs ([`STEP_CYCLES`] a step, [`BLOCK_CYCLES`] a kept block;
/// `blocks[r]`: the kept blocks of row r, `sets[r]` its units as a bitset). The persistent CTAs
/// take a few tiles each, every row tile's groups in turn, so the costliest groups set the
/// busiest CTA's time: on the 4096^2 weight at density 0.5 the group of seven rows that
/// eleven-row groups leave costs 0.81 of the others in the model, the costliest 1.04 of their
/// mean. Repeatedly takes the costliest group and, of the moves of one of its rows into another
/// group's free slot and the exchanges of one of its rows with another group's, the one that
/// brings both groups below its cost and adds least to their sum; stops where none does (each
/// move lowers the sorted costs, so it ends). Group sizes change only through free slots (at
/// most `g` rows a group).
fn balance(groups: &mut [Vec<usize>], sets: &[Vec<u64>], blocks: &[u64], g: usize, unit: StepUnit) {
    let cost =
        |units: u32, kept: u64| STEP_CYCLES * u64::from(unit.steps(units)) + BLOCK_CYCLES * kept;
    let kept = |m: &[usize]| m.iter().map(|&r| blocks[r]).sum::<u64>();
    let mut info: Vec<_> = groups.iter().map(|m| UnitSummary::of(sets, m)).collect();
    let mut costs: Vec<u64> = groups
        .iter()
        .zip(&info)
        .map(|(m, i)| cost(i.units(), kept(m)))
        .collect();
    let members: usize = groups.iter().map(Vec::len).sum();
    for _ in 0..4 * members {
        let Some(h) = (0..groups.len()).max_by_key(|&j| (costs[j], std::cmp::Reverse(j))) else {
            return;
        };
        // (added to the sum, the larger cost, group, row of h, row of b or a free slot).
        let mut best: Option<(i64, u64, usize, usize, Option<usize>)> = None;
        for b in (0..groups.len()).filter(|&b| b != h) {
            let (kh, kb) = (kept(&groups[h]), kept(&groups[b]));
            for i in 0..groups[h].len() {
                let x = groups[h][i];
                let free = (groups[b].len() < g && groups[h].len() > 1).then_some(None);
                for j in (0..groups[b].len()).map(Some).chain(free) {
                    let y = j.map(|j| groups[b][j]);
                    let yb = y.map_or(0, |y| blocks[y]);
                    let ch = cost(info[h].after(sets, Some(x), y), kh - blocks[x] + yb);
                    let cb = cost(info[b].after(sets, y, Some(x)), kb - yb + blocks[x]);
                    let larger = ch.max(cb);
                    if larger >= costs[h] {
                        continue;
                    }
                    let added = (ch + cb) as i64 - (costs[h] + costs[b]) as i64;
                    if best.is_none_or(|best| (added, larger) < (best.0, best.1)) {
                        best = Some((added, larger, b, i, j));
                    }
                }
            }
        }
        let Some((_, _, b, i, j)) = best else {
            return;
        };
        let x = groups[h][i];
        match j {
            Some(j) => {
                groups[h][i] = groups[b][j];
                groups[b][j] = x;
            }
            None => {
                groups[h].remove(i);
                groups[b].push(x);
            }
        }
        for k in [h, b] {
            info[k] = UnitSummary::of(sets, &groups[k]);
            costs[k] = cost(info[k].units(), kept(&groups[k]));
        }
    }
}

/// The k loop of every group of block rows ([`Groups`]), as `GemmBsrWgmma` reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GroupSteps {
    /// `groups + 1` offsets: group j's steps are `grp_ptr[j] .. grp_ptr[j + 1]`.
    pub grp_ptr: Vec<u32>,
    /// Per step: `(block column << mask_bits) | mask`, bit `w * g + i` of the mask set when block row
    /// `j * g + i` keeps block column `column + w` (`w < wb`: a step is a window of `wb` block
    /// columns, the first a multiple of `wb`). Columns increase within a group.
    pub step_info: Vec<u32>,
    /// [`GroupSteps::pairs`]: per step, its second block column (mask bits `g + i`); empty
    /// otherwise.
    pub step_col1: Vec<u32>,
    /// Per step: the offset in `step_blk` of its first kept block.
    pub step_first: Vec<u32>,
    /// The packed index (position in `pattern.kept`) of each kept block, step by step, in
    /// increasing mask bit within a step.
    pub step_blk: Vec<u32>,
    /// Low bits of `step_info` that hold the mask (16, or the mask's own width where it is
    /// wider, the template's `kMaskBits`); the column is above them.
    pub mask_bits: u32,
}

impl Default for GroupSteps {
    /// No group.
    fn default() -> GroupSteps {
        GroupSteps {
            grp_ptr: vec![0],
            step_info: Vec::new(),
            step_col1: Vec::new(),
            step_first: Vec::new(),
            step_blk: Vec::new(),
            mask_bits: 16,
        }
    }
}

impl GroupSteps {
    /// The mask bits of step info for masks of `bits` bits (the template's `kMaskBits`).
    pub fn mask_bits_for(bits: u32) -> u32 {
        bits.max(16)
    }

    /// Step `s`'s (first) block column.
    #[cfg(test)]
    pub fn column(&self, s: usize) -> u32 {
        self.step_info[s] >> self.mask_bits
    }

    /// Step `s`'s row mask.
    pub fn mask(&self, s: usize) -> u32 {
        self.step_info[s] & ((1 << self.mask_bits) - 1)
    }

    /// Every step's row mask, in order.
    pub fn masks(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.step_info.len()).map(|s| self.mask(s))
    }

    /// The steps of `pattern` cut into `groups`, over windows of `wb` block columns
    /// (`wb * g <= 24`); block columns must be below 32768.
    pub fn new(pattern: &BlockPattern, groups: &Groups, wb: u32) -> GroupSteps {
        let g = groups.g();
        debug_assert!(
            wb >= 1 && g >= 1 && g * wb <= 24,
            "a step's mask has at most 24 bits"
        );
        let mut s = GroupSteps {
            mask_bits: GroupSteps::mask_bits_for(g * wb),
            ..GroupSteps::default()
        };
        for kept in kept_by_group(pattern, groups) {
            // (window, mask bit, packed index): in window order then bit order.
            let placed = kept
                .iter()
                .map(|&(c, i, at)| (c / wb, (c % wb) * g + i, at))
                .collect();
            s.push_group(placed, |window| (window * wb, None));
        }
        s
    }

    /// The steps of `pattern` cut into `groups` (`2 * g <= 24`), over pairs of block columns:
    /// the kept columns of a group (its union), in increasing order, two by two (the last alone,
    /// its second column the same, when they are odd). Step info as for windows of two,
    /// `step_info` naming the first column and `step_col1` the second: bit `w * g + i` of the
    /// mask is set when the block row of slot `i` keeps the pair's column `w`.
    pub fn pairs(pattern: &BlockPattern, groups: &Groups, order: PairOrder) -> GroupSteps {
        let g = groups.g();
        debug_assert!(g >= 1 && 2 * g <= 24, "a step's mask has at most 24 bits");
        let mut s = GroupSteps {
            mask_bits: GroupSteps::mask_bits_for(2 * g),
            ..GroupSteps::default()
        };
        for kept in kept_by_group(pattern, groups) {
            let mut union: Vec<u32> = kept.iter().map(|k| k.0).collect();
            union.sort_unstable();
            union.dedup();
            // The union's columns in pair order: column `union[pos]` is column pos % 2 of pair
            // pos / 2.
            let order = match order {
                PairOrder::Natural => union.clone(),
                PairOrder::Balanced => balanced_pairs(&union, &kept),
            };
            let pos_of: HashMap<u32, u32> = order
                .iter()
                .enumerate()
                .map(|(pos, &c)| (c, pos as u32))
                .collect();
            // (pair, mask bit, packed index): in pair order then bit order.
            let placed = kept
                .iter()
                .map(|&(c, i, at)| {
                    let pos = pos_of.get(&c).copied().unwrap_or_default();
                    (pos / 2, (pos % 2) * g + i, at)
                })
                .collect();
            let union = order;
            s.push_group(placed, |pair| {
                let first = union[2 * pair as usize];
                let second = union.get(2 * pair as usize + 1).unwrap_or(&first);
                (first, Some(*second))
            });
        }
        s
    }

    /// The kept blocks of step `s`, as packed indices in mask-bit order.
    pub fn blocks(&self, s: usize) -> &[u32] {
        let end = self
            .step_first
            .get(s + 1)
            .map_or(self.step_blk.len(), |&e| e as usize);
        &self.step_blk[self.step_first[s] as usize..end]
    }

    /// The smallest cap on a step's kept blocks that [`GroupSteps::split_above`] meets with at
    /// most `percent` % more steps.
    pub fn cap_within(&self, percent: usize) -> u32 {
        let counts: Vec<u32> = self.masks().map(u32::count_ones).collect();
        let most = counts.iter().copied().max().unwrap_or(1).max(1);
        let extra = |cap: u32| -> usize {
            counts
                .iter()
                .map(|n| n.div_ceil(cap).saturating_sub(1) as usize)
                .sum()
        };
        (1..=most)
            .find(|&cap| 100 * extra(cap) <= percent * counts.len())
            .unwrap_or(most)
    }

    /// These steps with each step of more than `cap` kept blocks split into as few steps of the
    /// same block columns as keep at most `cap` each, its mask bits in consecutive runs of
    /// nearly equal length (the split steps copy the same A piece again).
    pub fn split_above(&self, cap: u32) -> GroupSteps {
        let cap = cap.max(1);
        let low = (1u32 << self.mask_bits) - 1;
        let mut out = GroupSteps {
            mask_bits: self.mask_bits,
            ..GroupSteps::default()
        };
        for j in 0..self.grp_ptr.len().saturating_sub(1) {
            for s in self.grp_ptr[j] as usize..self.grp_ptr[j + 1] as usize {
                let bits: Vec<u32> = (0..self.mask_bits)
                    .filter(|b| self.mask(s) >> b & 1 == 1)
                    .collect();
                let blocks = self.blocks(s);
                let n = bits.len() as u32;
                let parts = n.div_ceil(cap).max(1);
                let mut at = 0u32;
                for k in 0..parts {
                    let take = (n - at).div_ceil(parts - k);
                    let run = at as usize..(at + take) as usize;
                    let mask = bits[run.clone()].iter().fold(0u32, |m, b| m | (1 << b));
                    out.step_info.push((self.step_info[s] & !low) | mask);
                    out.step_col1.extend(self.step_col1.get(s).copied());
                    out.step_first.push(out.step_blk.len() as u32);
                    out.step_blk.extend_from_slice(&blocks[run]);
                    at += take;
                }
            }
            out.grp_ptr.push(out.step_info.len() as u32);
        }
        out
    }

    /// Appends one group: a step per run of equal steps in `placed` (step, mask bit, packed
    /// index; sorted here), whose block columns `columns(step)` gives (the first, and the
    /// second of a pair).
    fn push_group(
        &mut self,
        mut placed: Vec<(u32, u32, u32)>,
        columns: impl Fn(u32) -> (u32, Option<u32>),
    ) {
        placed.sort_unstable();
        for chunk in placed.chunk_by(|x, y| x.0 == y.0) {
            let mask = chunk.iter().fold(0u32, |m, &(_, bit, _)| m | (1 << bit));
            let (first, second) = columns(chunk[0].0);
            // The template reads the column as a signed int above the mask: the selection keeps
            // the block columns below that (`wide_group_cols`, `select_wgmma_cols`).
            debug_assert!(
                first < 1 << (31 - self.mask_bits),
                "block column {first} does not fit above a {}-bit mask",
                self.mask_bits
            );
            self.step_info.push((first << self.mask_bits) | mask);
            self.step_col1.extend(second);
            self.step_first.push(self.step_blk.len() as u32);
            self.step_blk.extend(chunk.iter().map(|&(_, _, at)| at));
        }
        self.grp_ptr.push(self.step_info.len() as u32);
    }

    /// The steps `cfg` walks.
    pub fn of(pattern: &BlockPattern, cfg: &WgmmaBsr) -> GroupSteps {
        let groups = cfg.groups(pattern);
        if cfg.pairs {
            match cfg.pair_cap {
                Some(cap) => {
                    GroupSteps::pairs(pattern, &groups, PairOrder::Balanced).split_above(cap)
                }
                None => GroupSteps::pairs(pattern, &groups, PairOrder::Natural),
            }
        } else {
            GroupSteps::new(pattern, &groups, cfg.wb)
        }
    }

    /// Group `j`'s modelled cycles ([`STEP_CYCLES`] a step, [`BLOCK_CYCLES`] a kept block).
    fn cost(&self, j: usize) -> u64 {
        let (a, b) = (self.grp_ptr[j], self.grp_ptr[j + 1]);
        let kept: u64 = (a as usize..b as usize)
            .map(|s| u64::from(self.mask(s).count_ones()))
            .sum();
        STEP_CYCLES * u64::from(b - a) + BLOCK_CYCLES * kept
    }

    /// The costliest group's modelled cycles ([`GroupSteps::cost`]): what sets the busiest
    /// persistent CTA's time where each takes a few tiles.
    pub fn costliest(&self) -> u64 {
        (0..self.grp_ptr.len().saturating_sub(1))
            .map(|j| self.cost(j))
            .max()
            .unwrap_or(0)
    }

    /// The groups in the order the persistent CTAs take them within each row tile
    /// (`grp_order`): costliest first by the model ([`GroupSteps::cost`]), ties in group order,
    /// so that the walk's snake pairs costly groups with cheap ones by what they cost rather
    /// than by their steps alone (docs/perf-notes.md, block-sparse variant 45).
    pub fn order(&self) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.grp_ptr.len() as u32 - 1).collect();
        order.sort_by_key(|&j| (std::cmp::Reverse(self.cost(j as usize)), j));
        order
    }

    /// Each work item's modelled cycles by its position in a row tile ([`GroupSteps::order`]):
    /// its group's [`GroupSteps::cost`] and a tile's epilogue. What `mlpc_codegen::walk_table`
    /// assigns the persistent CTAs' items by.
    pub fn walk_costs(&self) -> Vec<u32> {
        self.order()
            .iter()
            .map(|&j| u32::try_from(self.cost(j as usize) + TILE_CYCLES).unwrap_or(u32::MAX))
            .collect()
    }
}
