//! Counting the requests one piece of work makes to the management API, whichever
//! client it goes through ([`counted`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The requests one piece of work made to the management API, counted by [`counted`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Requests {
    pub reads: usize,
    pub writes: usize,
}

#[derive(Default)]
struct Tally {
    reads: AtomicUsize,
    writes: AtomicUsize,
}

tokio::task_local! {
    /// The tally of the [`counted`] scope the current task is in, if any.
    static TALLY: Arc<Tally>;
}

/// Runs `work` and counts the requests it makes to the management API through any
/// client, shared ones included: what [`super::Management::writes`] cannot tell once a client
/// serves several pipelines at once. Work spawned onto other tasks is not counted.
pub async fn counted<F: Future>(work: F) -> (F::Output, Requests) {
    let tally = Arc::new(Tally::default());
    let output = TALLY.scope(tally.clone(), work).await;
    let requests = Requests {
        reads: tally.reads.load(Ordering::Relaxed),
        writes: tally.writes.load(Ordering::Relaxed),
    };
    (output, requests)
}

/// Counts `writes` in the tally of the [`counted`] scope the current task is in, if any:
/// those of its own client, and those made on its behalf by another task (a batch of
/// policies or claims written together), which no client counts for it.
pub(super) fn tally_writes(writes: usize) {
    let _ = TALLY.try_with(|tally| tally.writes.fetch_add(writes, Ordering::Relaxed));
}

/// Counts a read in the tally of the [`counted`] scope the current task is in, if any.
pub(super) fn tally_read() {
    let _ = TALLY.try_with(|tally| tally.reads.fetch_add(1, Ordering::Relaxed));
}
