//! A model of `GemmWgmmaTma`'s synchronisation, run on the CPU under many random interleavings:
//! the producers, the copy engine completing copies in any order, and the consumer warpgroups of
//! the cooperative and the ping-pong schedules, alone or in clusters of two CTAs (each producer
//! copying half of the shared tile into both CTAs: A, or B and Bu with `SHARE_B`; the protocol is
//! the same, the model names the shared piece A), with the PTX semantics of what they wait on (an
//! mbarrier wait names a phase by its parity only; a named barrier completes when its thread
//! count has arrived, whoever arrived). Each step of the model is a line of the template,
//! checked to still be there, so a change to the protocol must change both.
//!
//! Checked for every interleaving: each consumer reads exactly the slice it expects in every
//! piece of its stage, the copy engine never overwrites a stage a consumer of the destination
//! CTA still reads, a named barrier never gets two arrivals of the same warpgroup in one
//! generation, and every actor finishes (no deadlock). The model without the ping-pong ordering
//! (the first version of the schedule, which failed on the GPU), and clusters whose `empty`
//! barriers count only their own consumers, must be caught by these checks.

mod schedule_model;

use schedule_model::{MBarrier, XorShift};
use std::collections::VecDeque;

const TEMPLATE: &str = include_str!("../../../kernels-templates/gemm_wgmma.cuh");

/// The template lines the model transcribes.
const TRANSCRIBED: &[&str] = &[
    // Producer: every slice of the cluster's tiles in order; wait for the stage to be released
    // (by both CTAs' consumers in a cluster), then the copies, counted on the stage's `full`
    // barrier: its half of A into every CTA of the cluster, its B into its own.
    "for (i64 w = MLPC_CID; w < items; w += MLPC_CLUSTERS) {",
    "mbar_wait(empty + 8 * stage, phase ^ 1);",
    "mbar_arrive_expect_tx(bar, kStageBytes);",
    "tma_load_2d_multicast(sa + rank * (kARows * 128), map_a, k0,",
    "tma_load_2d_multicast(sb, map_b, k0, n1, bar, kAll);",
    "tma_load_2d(sa + kTileABytes, map_b, k0, n0, bar);",
    // Barrier counts: one arrival (with the bytes) on `full`; on `empty`, every consumer thread
    // that reads the stage and, in a cluster, the peer's consumer warps.
    "mbar_init(full + 8 * s, 1);",
    "mbar_init(empty + 8 * s, kReaders + kPeerWarps);",
    "constexpr int kReaders = Cfg::kPingpong ? 128 : kConsumers * 128;",
    "constexpr int kPeerWarps = CLUSTER > 1 ? kReaders / 32 : 0;",
    "mbar_arrive(empty + 8 * s);",
    "if (lane == 0) mbar_arrive_cluster(empty + 8 * s, rank ^ 1u);",
    // Consumers: their work items (tiles, or with split K one range of a tile's k slices each:
    // the model gives every item of a CTA the same slice count, which split K keeps, as it gives
    // each CTA one item) and where their slices start in the ring.
    "const i64 first = MLPC_CID + (Cfg::kPingpong ? (i64)wg * MLPC_CLUSTERS : 0);",
    "const i64 step = MLPC_CLUSTERS * (Cfg::kPingpong ? 2 : 1);",
    "i64 slice = Cfg::kPingpong ? (i64)wg * item_slices(MLPC_CID) : 0;",
    "int stage = (int)(slice % STAGES);",
    "u32 phase = (u32)((slice / STAGES) & 1);",
    "if (Cfg::kPingpong && w != MLPC_CID) named_sync<256>(1 + wg);",
    "mbar_wait(full + 8 * stage, phase);",
    "wait<1>();",
    "if (prev >= 0) release(prev);",
    "if (Cfg::kPingpong && w + MLPC_CLUSTERS < items) named_arrive<256>(2 - wg);",
    "wait<0>();",
    "slice += (k_hi - k_lo) + (Cfg::kPingpong ? item_slices(w + MLPC_CLUSTERS) : 0);",
    "slice += ktiles * (Cfg::kPingpong ? 2 : 1);",
    // No CTA leaves while its peer can still arrive on its barriers.
    "cluster_sync();",
];

#[test]
fn the_model_transcribes_the_template() {
    for line in TRANSCRIBED {
        assert!(
            TEMPLATE.contains(line),
            "gemm_wgmma.cuh no longer says `{line}`: update this model with it"
        );
    }
}

/// A step of a consumer warpgroup's program.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// `named_sync<256>(id)`.
    Sync(usize),
    /// `named_arrive<256>(id)`.
    Arrive(usize),
    /// `mbar_wait(full + 8 * stage, phase)`, then the wgmmas read the stage, expecting `slice`.
    WaitFull {
        stage: usize,
        parity: u64,
        slice: u64,
    },
    /// `mbar_arrive(empty + 8 * stage)` after `wait<1>` / `wait<0>`: the wgmmas reading it are
    /// done.
    Release { stage: usize },
}

/// The program of consumer warpgroup `wg`: the template's consumer loop, unrolled.
fn consumer_program(
    wg: u64,
    pingpong: bool,
    ordered: bool,
    tiles: u64,
    ktiles: u64,
    stages: u64,
) -> Vec<Op> {
    let mut ops = Vec::new();
    let (first, step) = if pingpong { (wg, 2) } else { (0, 1) };
    let mut slice = if pingpong { wg * ktiles } else { 0 };
    let mut t = first;
    while t < tiles {
        let mut stage = (slice % stages) as usize;
        let mut parity = (slice / stages) & 1;
        if pingpong && ordered && t != 0 {
            ops.push(Op::Sync(1 + wg as usize));
        }
        let mut prev = None;
        for kt in 0..ktiles {
            ops.push(Op::WaitFull {
                stage,
                parity,
                slice: slice + kt,
            });
            if let Some(p) = prev {
                ops.push(Op::Release { stage: p });
            }
            prev = Some(stage);
            stage += 1;
            if stage as u64 == stages {
                stage = 0;
                parity ^= 1;
            }
        }
        if pingpong && ordered && t + 1 < tiles {
            ops.push(Op::Arrive(2 - wg as usize));
        }
        if let Some(p) = prev {
            ops.push(Op::Release { stage: p });
        }
        slice += ktiles * if pingpong { 2 } else { 1 };
        t += step;
    }
    ops
}

#[derive(Clone, Copy, Debug)]
struct Shape {
    stages: u64,
    ktiles: u64,
    /// Tiles of this CTA (of each CTA of a cluster).
    tiles: u64,
    pingpong: bool,
    /// The ping-pong main loops take turns (the named barriers).
    ordered: bool,
    /// CTAs per cluster (1 or 2).
    cluster: usize,
    /// In a cluster, each consumer also releases the stage on the peer's `empty` barrier.
    peer_release: bool,
}

/// A copy in flight: destination CTA, stage, slice, piece (the A part of source CTA `piece`,
/// or, at index `cluster`, the destination's own B tile).
type Copy = (usize, usize, u64, usize);

/// Runs one interleaving chosen by `seed`; `Err` says what went wrong.
fn simulate(shape: Shape, seed: u64) -> Result<(), String> {
    let Shape {
        stages,
        ktiles,
        tiles,
        pingpong,
        ordered,
        cluster,
        peer_release,
    } = shape;
    let consumers: u64 = 2;
    let s = stages as usize;
    let pieces = cluster + 1;
    // `full`: the producer's arrival with the byte count, then every piece landing (a landing
    // before the count is a negative transaction count in PTX, the same completion).
    let mut full = vec![vec![MBarrier::new(1 + pieces as u32); s]; cluster];
    let readers_per_cta = if pingpong { 1 } else { consumers as u32 };
    let peers = if peer_release { cluster as u32 - 1 } else { 0 };
    let mut empty = vec![vec![MBarrier::new(readers_per_cta * (1 + peers)); s]; cluster];
    // What each piece of each stage holds (the slice last copied there) and how many
    // warpgroups of that CTA read the stage.
    let mut data: Vec<Vec<Vec<Option<u64>>>> = vec![vec![vec![None; pieces]; s]; cluster];
    let mut readers = vec![vec![0u32; s]; cluster];
    // Named barriers 1 and 2 of each CTA: a pending arrival.
    let mut named = vec![[false; 3]; cluster];

    // Producer positions (next slice to issue) and the copies in flight.
    let total = tiles * ktiles;
    let mut next = vec![0u64; cluster];
    let mut in_flight: Vec<Copy> = Vec::new();
    // Consumer warpgroup `i` is warpgroup i % consumers of CTA i / consumers.
    let mut programs: Vec<VecDeque<Op>> = (0..cluster as u64 * consumers)
        .map(|i| consumer_program(i % consumers, pingpong, ordered, tiles, ktiles, stages).into())
        .collect();

    let mut rng = XorShift::new(seed);
    // Actors: 0 .. cluster = producers, cluster = a copy landing, cluster + 1 .. = consumers.
    let landing = cluster;
    loop {
        let mut ready = Vec::new();
        for (c, &n) in next.iter().enumerate() {
            if n < total {
                let stage = (n % stages) as usize;
                let parity = (n / stages) & 1;
                if empty[c][stage].passed(parity ^ 1) {
                    ready.push(c);
                }
            }
        }
        if !in_flight.is_empty() {
            ready.push(landing);
        }
        for (i, prog) in programs.iter().enumerate() {
            let c = i / consumers as usize;
            let can = match prog.front() {
                None => false,
                Some(Op::Sync(id)) => named[c][*id],
                Some(Op::Arrive(_)) | Some(Op::Release { .. }) => true,
                Some(Op::WaitFull { stage, parity, .. }) => full[c][*stage].passed(*parity),
            };
            if can {
                ready.push(landing + 1 + i);
            }
        }
        if ready.is_empty() {
            let done = next.iter().all(|&n| n == total)
                && in_flight.is_empty()
                && programs.iter().all(|p| p.is_empty());
            return if done {
                Ok(())
            } else {
                Err(format!(
                    "deadlock: producers at slices {next:?} of {total}, consumers waiting on {:?}",
                    programs
                        .iter()
                        .map(|p| p.front().copied())
                        .collect::<Vec<_>>()
                ))
            };
        }
        match ready[rng.below(ready.len())] {
            c if c < landing => {
                // `mbar_arrive_expect_tx`, then the copies: A's part of this CTA into every CTA
                // of the cluster, B into this one.
                let stage = (next[c] % stages) as usize;
                full[c][stage].arrive();
                for d in 0..cluster {
                    in_flight.push((d, stage, next[c], c));
                }
                in_flight.push((c, stage, next[c], cluster));
                next[c] += 1;
            }
            a if a == landing => {
                let (d, stage, slice, piece) = in_flight.remove(rng.below(in_flight.len()));
                if readers[d][stage] > 0 {
                    return Err(format!(
                        "slice {slice} (piece {piece}) overwrote stage {stage} of CTA {d} while a \
                         consumer still reads slice {:?}",
                        data[d][stage]
                    ));
                }
                data[d][stage][piece] = Some(slice);
                full[d][stage].arrive();
            }
            actor => {
                let i = actor - landing - 1;
                let c = i / consumers as usize;
                let op = programs[i]
                    .pop_front()
                    .expect("a ready consumer has a step");
                match op {
                    Op::Sync(id) => named[c][id] = false,
                    Op::Arrive(id) => {
                        if named[c][id] {
                            return Err(format!(
                                "warpgroup {i} arrived on named barrier {id} twice in one generation"
                            ));
                        }
                        named[c][id] = true;
                    }
                    Op::WaitFull { stage, slice, .. } => {
                        if data[c][stage].iter().any(|&d| d != Some(slice)) {
                            return Err(format!(
                                "warpgroup {i} expected slice {slice} in stage {stage} of CTA {c}, \
                                 read {:?}",
                                data[c][stage]
                            ));
                        }
                        readers[c][stage] += 1;
                    }
                    Op::Release { stage } => {
                        readers[c][stage] -= 1;
                        empty[c][stage].arrive();
                        if peer_release {
                            for d in (0..cluster).filter(|&d| d != c) {
                                empty[d][stage].arrive();
                            }
                        }
                    }
                }
            }
        }
    }
}

fn shapes(pingpong: bool, ordered: bool, cluster: usize, peer_release: bool) -> Vec<Shape> {
    let mut out = Vec::new();
    for stages in 2..=5 {
        for ktiles in [1, 2, 3, 5, 12] {
            for tiles in [1, 2, 3, 4, 7] {
                out.push(Shape {
                    stages,
                    ktiles,
                    tiles,
                    pingpong,
                    ordered,
                    cluster,
                    peer_release,
                });
            }
        }
    }
    out
}

#[test]
fn both_schedules_are_race_free_under_random_interleavings() {
    for cluster in [1, 2] {
        for pingpong in [false, true] {
            for shape in shapes(pingpong, true, cluster, true) {
                for seed in 0..200 {
                    if let Err(e) = simulate(shape, seed) {
                        panic!("{shape:?}, seed {seed}: {e}");
                    }
                }
            }
        }
    }
}

#[test]
fn the_model_catches_ping_pong_without_the_ordering() {
    // Without the named barriers, the second warpgroup waits on a stage's `full` barrier one
    // lap early and passes on the older phase: some interleaving must expose it.
    let caught = shapes(true, false, 1, true)
        .into_iter()
        .filter(|s| s.tiles >= 2 && s.ktiles > s.stages)
        .any(|shape| (0..200).any(|seed| simulate(shape, seed).is_err()));
    assert!(caught, "the model accepts the unordered ping-pong schedule");
}

#[test]
fn the_model_catches_clusters_without_the_peers_releases() {
    // With `empty` counting only its own consumers, a producer multicasts its half of A into
    // the peer's stage while the peer's consumers still read it: some interleaving must expose
    // it, in both schedules.
    for pingpong in [false, true] {
        let caught = shapes(pingpong, true, 2, false)
            .into_iter()
            .filter(|s| s.ktiles * s.tiles > s.stages)
            .any(|shape| (0..200).any(|seed| simulate(shape, seed).is_err()));
        assert!(
            caught,
            "the model accepts clusters without the peers' releases (ping-pong: {pingpong})"
        );
    }
}
