//! A model of `GemmWgmmaTma`'s synchronisation, run on the CPU under many random interleavings:
//! the producer, the copy engine completing copies in any order, and the consumer warpgroups of
//! the cooperative and the ping-pong schedules, with the PTX semantics of what they wait on
//! (an mbarrier wait names a phase by its parity only; a named barrier completes when its thread
//! count has arrived, whoever arrived). Each step of the model is a line of the template,
//! checked to still be there, so a change to the protocol must change both.
//!
//! Checked for every interleaving: each consumer reads exactly the slice it expects, the copy
//! engine never overwrites a stage a consumer still reads, a named barrier never gets two
//! arrivals of the same warpgroup in one generation, and every actor finishes (no deadlock).
//! The model without the ping-pong ordering (the first version of the schedule, which failed on
//! the GPU) must be caught by these checks.

mod schedule_model;

use schedule_model::{MBarrier, XorShift};
use std::collections::VecDeque;

const TEMPLATE: &str = include_str!("../../../kernels-templates/gemm_wgmma.cuh");

/// The template lines the model transcribes.
const TRANSCRIBED: &[&str] = &[
    // Producer: every slice of the CTA's tiles in order; wait for the stage to be released,
    // then the copies, counted on the stage's `full` barrier.
    "for (i64 t = blockIdx.x; t < tiles; t += gridDim.x) {",
    "mbar_wait(empty + 8 * stage, phase ^ 1);",
    "mbar_arrive_expect_tx(bar, kStageBytes);",
    // Barrier counts: one arrival (with the bytes) on `full`; on `empty`, every consumer thread
    // that reads the stage.
    "mbar_init(full + 8 * s, 1);",
    "mbar_init(empty + 8 * s, Cfg::kPingpong ? 128 : kConsumers * 128);",
    // Consumers: their tiles and where their slices start in the ring.
    "const i64 first = blockIdx.x + (Cfg::kPingpong ? (i64)wg * gridDim.x : 0);",
    "const i64 step = (i64)gridDim.x * (Cfg::kPingpong ? 2 : 1);",
    "i64 slice = Cfg::kPingpong ? (i64)wg * ktiles : 0;",
    "int stage = (int)(slice % STAGES);",
    "u32 phase = (u32)((slice / STAGES) & 1);",
    "if (Cfg::kPingpong && t != blockIdx.x) named_sync<256>(1 + wg);",
    "mbar_wait(full + 8 * stage, phase);",
    "wait<1>();",
    "if (prev >= 0) mbar_arrive(empty + 8 * prev);",
    "if (Cfg::kPingpong && t + gridDim.x < tiles) named_arrive<256>(2 - wg);",
    "wait<0>();",
    "slice += ktiles * (Cfg::kPingpong ? 2 : 1);",
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
    /// Tiles of this CTA.
    tiles: u64,
    pingpong: bool,
    /// The ping-pong main loops take turns (the named barriers).
    ordered: bool,
}

/// Runs one interleaving chosen by `seed`; `Err` says what went wrong.
fn simulate(shape: Shape, seed: u64) -> Result<(), String> {
    let Shape {
        stages,
        ktiles,
        tiles,
        pingpong,
        ordered,
    } = shape;
    let consumers: u64 = 2;
    let s = stages as usize;
    let mut full = vec![MBarrier::new(1); s];
    let empty_count = if pingpong { 1 } else { consumers as u32 };
    let mut empty = vec![MBarrier::new(empty_count); s];
    // What each stage holds (the slice last copied there) and how many warpgroups read it.
    let mut data: Vec<Option<u64>> = vec![None; s];
    let mut readers = vec![0u32; s];
    // Named barriers 1 and 2: a pending arrival.
    let mut named = [false; 3];

    // Producer position (next slice to issue) and the copies in flight (stage, slice).
    let total = tiles * ktiles;
    let mut next = 0u64;
    let mut in_flight: Vec<(usize, u64)> = Vec::new();
    let mut programs: Vec<VecDeque<Op>> = (0..consumers)
        .map(|wg| consumer_program(wg, pingpong, ordered, tiles, ktiles, stages).into())
        .collect();

    let mut rng = XorShift::new(seed);
    loop {
        // Every actor that can take a step now: 0 = producer, 1 = a copy landing, 2.. = consumers.
        let mut ready = Vec::new();
        if next < total {
            let stage = (next % stages) as usize;
            let parity = (next / stages) & 1;
            if empty[stage].passed(parity ^ 1) {
                ready.push(0);
            }
        }
        if !in_flight.is_empty() {
            ready.push(1);
        }
        for (wg, prog) in programs.iter().enumerate() {
            let can = match prog.front() {
                None => false,
                Some(Op::Sync(id)) => named[*id],
                Some(Op::Arrive(_)) | Some(Op::Release { .. }) => true,
                Some(Op::WaitFull { stage, parity, .. }) => full[*stage].passed(*parity),
            };
            if can {
                ready.push(2 + wg);
            }
        }
        if ready.is_empty() {
            let done =
                next == total && in_flight.is_empty() && programs.iter().all(|p| p.is_empty());
            return if done {
                Ok(())
            } else {
                Err(format!(
                    "deadlock: producer at slice {next} of {total}, consumers waiting on {:?}",
                    programs
                        .iter()
                        .map(|p| p.front().copied())
                        .collect::<Vec<_>>()
                ))
            };
        }
        match ready[rng.below(ready.len())] {
            0 => {
                // `mbar_arrive_expect_tx` and the copies: the phase completes when they land.
                in_flight.push(((next % stages) as usize, next));
                next += 1;
            }
            1 => {
                let (stage, slice) = in_flight.remove(rng.below(in_flight.len()));
                if readers[stage] > 0 {
                    return Err(format!(
                        "slice {slice} overwrote stage {stage} while a consumer still reads slice {:?}",
                        data[stage]
                    ));
                }
                data[stage] = Some(slice);
                full[stage].arrive();
            }
            actor => {
                let wg = actor - 2;
                let op = programs[wg]
                    .pop_front()
                    .expect("a ready consumer has a step");
                match op {
                    Op::Sync(id) => named[id] = false,
                    Op::Arrive(id) => {
                        if named[id] {
                            return Err(format!(
                                "warpgroup {wg} arrived on named barrier {id} twice in one generation"
                            ));
                        }
                        named[id] = true;
                    }
                    Op::WaitFull { stage, slice, .. } => {
                        if data[stage] != Some(slice) {
                            return Err(format!(
                                "warpgroup {wg} expected slice {slice} in stage {stage}, read {:?}",
                                data[stage]
                            ));
                        }
                        readers[stage] += 1;
                    }
                    Op::Release { stage } => {
                        readers[stage] -= 1;
                        empty[stage].arrive();
                    }
                }
            }
        }
    }
}

fn shapes(pingpong: bool, ordered: bool) -> Vec<Shape> {
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
                });
            }
        }
    }
    out
}

#[test]
fn both_schedules_are_race_free_under_random_interleavings() {
    for pingpong in [false, true] {
        for shape in shapes(pingpong, true) {
            for seed in 0..200 {
                if let Err(e) = simulate(shape, seed) {
                    panic!("{shape:?}, seed {seed}: {e}");
                }
            }
        }
    }
}

#[test]
fn the_model_catches_ping_pong_without_the_ordering() {
    // Without the named barriers, the second warpgroup waits on a stage's `full` barrier one
    // lap early and passes on the older phase: some interleaving must expose it.
    let caught = shapes(true, false)
        .into_iter()
        .filter(|s| s.tiles >= 2 && s.ktiles > s.stages)
        .any(|shape| (0..200).any(|seed| simulate(shape, seed).is_err()));
    assert!(caught, "the model accepts the unordered ping-pong schedule");
}
