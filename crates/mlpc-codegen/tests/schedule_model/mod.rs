//! What the CPU models of the Hopper kernels' synchronisation (`wgmma_schedule.rs`,
//! `bsr_schedule.rs`) share: an mbarrier with the PTX semantics of its parity wait, and the
//! generator of their interleavings.

/// An mbarrier: phases completed so far, arrivals in the current one.
#[derive(Clone, Debug)]
pub struct MBarrier {
    completed: u64,
    arrived: u32,
    expected: u32,
}

impl MBarrier {
    /// A barrier whose phases complete after `expected` arrivals (`mbarrier.init`).
    pub fn new(expected: u32) -> MBarrier {
        MBarrier {
            completed: 0,
            arrived: 0,
            expected,
        }
    }

    /// `mbarrier.try_wait.parity`: true once the phase of parity `parity` has completed, i.e.
    /// while the current (incomplete) phase has the other parity. A wait names its phase by
    /// parity only, so it also passes on a phase two (four, ...) laps older.
    pub fn passed(&self, parity: u64) -> bool {
        self.completed & 1 != parity
    }

    /// One arrival; the last of a phase completes it.
    pub fn arrive(&mut self) {
        self.arrived += 1;
        if self.arrived == self.expected {
            self.arrived = 0;
            self.completed += 1;
        }
    }
}

/// A small deterministic generator for the interleavings (xorshift64).
pub struct XorShift(u64);

impl XorShift {
    /// A generator for interleaving number `seed`.
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A number below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}
