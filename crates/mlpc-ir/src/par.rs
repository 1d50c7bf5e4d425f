//! How many cores a piece of work in this crate is split over.

/// The cores to split `work` (in whatever unit the caller counts) over: every available one
/// from `from` on, else one, so that small work never pays for threads.
pub(crate) fn cores_for(work: usize, from: usize) -> usize {
    if work < from {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |t| t.get())
    }
}
