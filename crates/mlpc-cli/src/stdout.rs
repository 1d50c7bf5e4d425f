//! Standard output that a reader who stops reading does not turn into a panic.
//!
//! `print!` panics when stdout is a pipe whose reader has gone (`mlpc compile --explain | head`):
//! Rust ignores `SIGPIPE`, so the write fails with `BrokenPipe`. Here such a write is dropped,
//! and so is every later one, while the command goes on to finish its work (files are still
//! written, the exit status still says whether it succeeded). Any other write error (a full disk
//! behind a redirect) is reported once on stderr and makes the command exit with status 1.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU8, Ordering};

const OPEN: u8 = 0;
const CLOSED_BY_READER: u8 = 1;
const FAILED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(OPEN);

/// Writes `args` to stdout unless an earlier write found it closed or failing.
pub(crate) fn emit(args: fmt::Arguments<'_>) {
    if STATE.load(Ordering::Relaxed) != OPEN {
        return;
    }
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == io::ErrorKind::BrokenPipe {
            STATE.store(CLOSED_BY_READER, Ordering::Relaxed);
        } else {
            STATE.store(FAILED, Ordering::Relaxed);
            eprintln!("error: cannot write to standard output: {e}");
        }
    }
}

/// Whether a write to stdout failed for a reason other than its reader leaving.
pub(crate) fn failed() -> bool {
    STATE.load(Ordering::Relaxed) == FAILED
}

/// `print!` through [`emit`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::stdout::emit(format_args!($($arg)*))
    };
}

/// `println!` through [`emit`].
macro_rules! outln {
    () => {
        $crate::stdout::emit(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::stdout::emit(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {out, outln};
