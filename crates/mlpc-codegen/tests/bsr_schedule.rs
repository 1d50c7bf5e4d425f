//! A model of `GemmBsrWgmma`'s synchronisation, run on the CPU under many random interleavings:
//! several producer warps (slice s filled by warp s % warps), the copy engine completing copies in
//! any order, and the two consumer warpgroups, each reading every slice and releasing a stage
//! `kInFlight` slices later, with the PTX semantics of an mbarrier wait (a phase is named by its
//! parity only). A persistent CTA runs several tiles on one ring: slice numbers run on across
//! them, and at the end of a tile the consumers wait for every wgmma and release the stages
//! they still hold. The lines the model follows are checked to still be in the template, so a change
//! to the protocol must change both (as `wgmma_schedule.rs` does for the dense kernel).
//!
//! Checked for every interleaving: each consumer reads exactly the slice it expects, the copy
//! engine never overwrites a stage whose wgmmas still run, and every actor finishes. Producer
//! warps up to the stage count pass, dividing it or not (the template takes a divisor, so that a
//! stage always belongs to one warp); more warps than stages must fail (a warp's slices are then
//! more than a lap apart, and its parity wait can pass a lap early). Also caught: a stage released
//! one slice early (while its wgmmas may still run), and consumers that keep every stage.

mod schedule_model;

use schedule_model::{MBarrier, XorShift};
use std::collections::VecDeque;

const TEMPLATE: &str = include_str!("../../../kernels-templates/gemm_bsr_wgmma.cuh");

const TRANSCRIBED: &[&str] = &[
    // Producer warps: slice s by warp s % kProducerWarps, at most STAGES; each walks its
    // own slices (the CTA's slice numbers run on across tiles), slice s in stage s % STAGES
    // with phase (s / STAGES) & 1, and waits for their stages.
    "static constexpr int kProducerWarps = STAGES >= 4 ? 4 : (STAGES % 2 == 0 ? 2 : 1);",
    "int sl = ((pw - before) % kProducerWarps + kProducerWarps) % kProducerWarps;",
    "for (; sl < slices; sl += kProducerWarps) {",
    "const int stage = (before + sl) % STAGES;",
    "const u32 phase = (u32)((before + sl) / STAGES) & 1u;",
    "before += slices;",
    "mbar_wait(empty + 8 * stage, phase ^ 1);",
    // Barrier counts: one arrival (with the bytes) on `full`; on `empty`, every consumer thread.
    "mbar_init(full + 8 * s, 1);",
    "mbar_init(empty + 8 * s, kConsumerThreads);",
    // Consumers: every slice in order; slice kt - kInFlight's stage released after slice kt.
    "static constexpr int kInFlight = STAGES >= 6 ? 2 : 1;",
    "mbar_wait(full + 8 * stage, phase);",
    "wait<kInFlight>();",
    "if (kt >= kInFlight) {",
    "const int done = stage >= kInFlight ? stage - kInFlight : stage + STAGES - kInFlight;",
    // The end of a tile: every wgmma done, the stages still held released, oldest first.
    "wait<0>();",
    "for (int i = slices < kInFlight ? slices : kInFlight; i > 0; --i) {",
    "const int held = stage >= i ? stage - i : stage + STAGES - i;",
    "mbar_arrive(empty + 8 * held);",
];

#[test]
fn the_model_transcribes_the_template() {
    for line in TRANSCRIBED {
        assert!(
            TEMPLATE.contains(line),
            "gemm_bsr_wgmma.cuh no longer says `{line}`: update this model with it"
        );
    }
}

/// A consumer step: wait on `full` and start the wgmmas reading `slice`; `wait<kInFlight>`
/// finding the wgmmas of `slice` complete; arriving on the `empty` barrier of `slice`'s stage.
#[derive(Clone, Copy, Debug)]
enum Op {
    WaitFull { slice: u64 },
    Done { slice: u64 },
    Release { slice: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Shape {
    stages: u64,
    /// Slices per tile, and the tiles the CTA runs one after the other.
    slices: u64,
    tiles: u64,
    warps: u64,
    in_flight: u64,
    /// The template releases the stage of the slice whose wgmmas `wait<kInFlight>` completed; a
    /// broken variant releases the next one.
    early_release: bool,
    /// A broken variant that keeps the stages of a tile's last slices (as a one-tile kernel
    /// may, since nothing refills them).
    keep_tail: bool,
}

/// The template's `kProducerWarps` and `kInFlight` for `stages`.
fn template_shape(stages: u64, slices: u64) -> Shape {
    Shape {
        stages,
        slices,
        tiles: 3,
        warps: if stages >= 4 {
            4
        } else if stages.is_multiple_of(2) {
            2
        } else {
            1
        },
        in_flight: if stages >= 6 { 2 } else { 1 },
        early_release: false,
        keep_tail: false,
    }
}

fn simulate(shape: Shape, seed: u64) -> Result<(), String> {
    let Shape {
        stages,
        slices: per_tile,
        tiles,
        warps,
        in_flight,
        early_release,
        keep_tail,
    } = shape;
    let slices = per_tile * tiles;
    let stage_of = |slice: u64| (slice % stages) as usize;
    let parity_of = |slice: u64| (slice / stages) & 1;
    let mut full = vec![MBarrier::new(1); stages as usize];
    let mut empty = vec![MBarrier::new(2); stages as usize];
    let mut data: Vec<Option<u64>> = vec![None; stages as usize];
    let mut readers = vec![0u32; stages as usize];
    // Each producer warp's next slice (its own: w, w + warps, ...), and the copies in flight.
    let mut next: Vec<u64> = (0..warps).collect();
    let mut landing: Vec<u64> = Vec::new();
    let mut program: VecDeque<Op> = VecDeque::new();
    for tile in 0..tiles {
        let first = tile * per_tile;
        for kt in 0..per_tile {
            program.push_back(Op::WaitFull { slice: first + kt });
            if kt >= in_flight {
                let done = first + kt - in_flight;
                program.push_back(Op::Done { slice: done });
                let release = if early_release { done + 1 } else { done };
                program.push_back(Op::Release { slice: release });
            }
        }
        // `wait<0>()` at the end of the tile, then the stages still held, oldest first.
        let tail = first + per_tile.saturating_sub(in_flight)..first + per_tile;
        program.extend(tail.clone().map(|slice| Op::Done { slice }));
        if !keep_tail {
            program.extend(tail.map(|slice| Op::Release { slice }));
        }
    }
    let mut consumers = [program.clone(), program];

    let mut rng = XorShift::new(seed);
    loop {
        // Ready actors: producer warps, a copy landing, consumers.
        let mut ready: Vec<usize> = Vec::new();
        for (w, &s) in next.iter().enumerate() {
            if s < slices && empty[stage_of(s)].passed(parity_of(s) ^ 1) {
                ready.push(w);
            }
        }
        let landing_actor = warps as usize;
        if !landing.is_empty() {
            ready.push(landing_actor);
        }
        for (c, prog) in consumers.iter().enumerate() {
            let can = match prog.front() {
                None => false,
                Some(Op::Done { .. }) | Some(Op::Release { .. }) => true,
                Some(Op::WaitFull { slice }) => full[stage_of(*slice)].passed(parity_of(*slice)),
            };
            if can {
                ready.push(landing_actor + 1 + c);
            }
        }
        if ready.is_empty() {
            let done = next.iter().all(|&s| s >= slices)
                && landing.is_empty()
                && consumers.iter().all(|p| p.is_empty());
            return if done {
                Ok(())
            } else {
                Err(format!(
                    "deadlock: producer warps at {next:?}, consumers waiting on {:?}",
                    consumers
                        .iter()
                        .map(|p| p.front().copied())
                        .collect::<Vec<_>>()
                ))
            };
        }
        let actor = ready[rng.below(ready.len())];
        if actor < landing_actor {
            landing.push(next[actor]);
            next[actor] += warps;
        } else if actor == landing_actor {
            let slice = landing.remove(rng.below(landing.len()));
            let stage = stage_of(slice);
            if readers[stage] > 0 {
                return Err(format!(
                    "slice {slice} overwrote stage {stage} while a consumer reads slice {:?}",
                    data[stage]
                ));
            }
            data[stage] = Some(slice);
            full[stage].arrive();
        } else {
            let c = actor - landing_actor - 1;
            match consumers[c]
                .pop_front()
                .expect("a ready consumer has a step")
            {
                Op::WaitFull { slice } => {
                    let stage = stage_of(slice);
                    if data[stage] != Some(slice) {
                        return Err(format!(
                            "consumer {c} expected slice {slice} in stage {stage}, read {:?}",
                            data[stage]
                        ));
                    }
                    readers[stage] += 1;
                }
                Op::Done { slice } => readers[stage_of(slice)] -= 1,
                Op::Release { slice } => empty[stage_of(slice)].arrive(),
            }
        }
    }
}

const SLICES: [u64; 6] = [1, 2, 3, 7, 16, 41];

#[test]
fn the_schedule_is_race_free_under_random_interleavings() {
    for stages in 2..=13 {
        for slices in SLICES {
            let shape = template_shape(stages, slices);
            for seed in 0..300 {
                if let Err(e) = simulate(shape, seed) {
                    panic!("{shape:?}, seed {seed}: {e}");
                }
            }
        }
    }
}

#[test]
fn producer_warps_up_to_the_stage_count_are_race_free() {
    for (stages, warps) in [
        (4, 3),
        (5, 2),
        (8, 3),
        (3, 3),
        (6, 5),
        (5, 5),
        (5, 4),
        (6, 4),
        (7, 4),
    ] {
        for slices in SLICES {
            let shape = Shape {
                warps,
                ..template_shape(stages, slices)
            };
            for seed in 0..300 {
                if let Err(e) = simulate(shape, seed) {
                    panic!("{shape:?}, seed {seed}: {e}");
                }
            }
        }
    }
}

#[test]
fn the_model_catches_more_producer_warps_than_stages() {
    let caught = [(3, 4), (2, 3), (5, 8)].into_iter().all(|(stages, warps)| {
        let shape = Shape {
            warps,
            ..template_shape(stages, 41)
        };
        (0..300).any(|seed| simulate(shape, seed).is_err())
    });
    assert!(caught, "the model accepts more producer warps than stages");
}

#[test]
fn the_model_catches_a_stage_released_early() {
    let shape = Shape {
        early_release: true,
        ..template_shape(8, 41)
    };
    assert!(
        (0..300).any(|seed| simulate(shape, seed).is_err()),
        "the model accepts a stage released while its wgmmas may run"
    );
}

#[test]
fn the_model_catches_stages_kept_at_the_end_of_a_tile() {
    let shape = Shape {
        keep_tail: true,
        ..template_shape(6, 7)
    };
    assert!(
        (0..20).all(|seed| simulate(shape, seed).is_err()),
        "the model accepts a tile's last stages never released"
    );
}

#[test]
fn the_model_catches_consumers_that_hold_every_stage() {
    let shape = Shape {
        in_flight: 3,
        ..template_shape(3, 16)
    };
    assert!(
        (0..20).all(|seed| simulate(shape, seed).is_err()),
        "the model accepts consumers that keep all three stages"
    );
}

/// With A in registers (`BsrWgmmaConfig`'s A_REGS) the consumers keep no slice in flight: each
/// waits for its own wgmmas and releases its own stage.
#[test]
fn the_a_registers_schedule_is_race_free() {
    for line in [
        "wgmma_detail::MmaRs<T, BR>::run(acc[g], f[ja], bsr_wgmma::desc_of<SWB>(b_lo));",
        "wait<0>();",
        "mbar_arrive(empty + 8 * stage);",
    ] {
        assert!(
            TEMPLATE.contains(line),
            "gemm_bsr_wgmma.cuh no longer says `{line}`: update this model with it"
        );
    }
    for stages in 2..=13 {
        for slices in SLICES {
            let shape = Shape {
                in_flight: 0,
                ..template_shape(stages, slices)
            };
            for seed in 0..300 {
                if let Err(e) = simulate(shape, seed) {
                    panic!("{shape:?}, seed {seed}: {e}");
                }
            }
        }
    }
}
