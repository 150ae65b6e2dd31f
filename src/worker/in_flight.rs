//! The deliveries the consume loop is processing, and when each started.
//!
//! A small request is processed by the loop's own task: its work is a few microseconds
//! between awaits, and handing it to a task of its own would cost more (a spawn, and a
//! wake across threads at each step) than the work itself. A large one runs on a task of
//! its own, so that reading and encoding it (milliseconds of CPU per MiB) happens beside
//! the others, on another core, and never holds the loop. Either way a slow send holds
//! no other delivery: every delivery in flight is polled as soon as it can go on.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::task::JoinHandle;
use tracing::warn;

use super::delivery::SettleError;

/// The largest request body processed by the loop's own task; a larger one gets a task of
/// its own. 64 KiB takes well under a millisecond to read.
pub const INLINE_UP_TO: usize = 64 * 1024;

type Settled = Result<(), SettleError>;

/// The deliveries being processed.
pub struct InFlight {
    deliveries: FuturesUnordered<Started>,
}

/// One delivery's work, and when it started.
struct Started {
    since: Instant,
    work: Work,
}

enum Work {
    /// Polled by the consume loop's task.
    Inline(Pin<Box<dyn Future<Output = Settled> + Send>>),
    /// On a task of its own, aborted when this is dropped.
    Spawned(JoinHandle<Settled>),
}

impl Future for Started {
    type Output = Settled;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Settled> {
        match &mut self.work {
            Work::Inline(work) => work.as_mut().poll(cx),
            Work::Spawned(task) => Pin::new(task).poll(cx).map(|joined| {
                joined.unwrap_or_else(|e| {
                    // A task is only aborted when the worker stops; a panic is caught
                    // inside.
                    warn!(error = %e, "a delivery's task ended abnormally");
                    Ok(())
                })
            }),
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Work::Spawned(task) = &self.work {
            task.abort();
        }
    }
}

impl InFlight {
    pub fn new() -> Self {
        Self {
            deliveries: FuturesUnordered::new(),
        }
    }

    /// Starts processing a delivery of `body_len` bytes: in the loop's task, or on a task
    /// of its own when it is larger than [`INLINE_UP_TO`].
    pub fn start(&mut self, body_len: usize, work: impl Future<Output = Settled> + Send + 'static) {
        // A delivery's future is kilobytes (8 KiB in a debug build): boxed, it is built
        // once and moved as a pointer.
        let work = Box::pin(work);
        let work = if body_len > INLINE_UP_TO {
            Work::Spawned(tokio::spawn(work))
        } else {
            Work::Inline(work)
        };
        self.deliveries.push(Started {
            since: Instant::now(),
            work,
        });
    }

    /// The next finished delivery's failure, if it had one; `None` when none is in flight.
    /// Polling it is what moves the deliveries processed in the loop's task.
    pub async fn next(&mut self) -> Option<Option<SettleError>> {
        self.deliveries.next().await.map(Result::err)
    }

    pub fn is_empty(&self) -> bool {
        self.deliveries.is_empty()
    }

    /// Whether every delivery in flight at `now` is younger than `bound`.
    pub fn progressing(&self, bound: Duration, now: Instant) -> bool {
        self.deliveries
            .iter()
            .all(|started| now.saturating_duration_since(started.since) <= bound)
    }

    /// Abandons every delivery in flight, and waits until those on tasks of their own are
    /// gone; returns how many there were.
    pub async fn abandon(&mut self) -> usize {
        let abandoned = self.deliveries.len();
        for mut started in std::mem::take(&mut self.deliveries) {
            if let Work::Spawned(task) = &mut started.work {
                task.abort();
                let _ = task.await;
            }
        }
        abandoned
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// Sets its flag when dropped.
    struct DropFlag(Arc<AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A delivery that never ends, and the flag it sets when it is dropped.
    fn endless() -> (
        impl Future<Output = Settled> + Send + 'static,
        Arc<AtomicBool>,
    ) {
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = DropFlag(dropped.clone());
        let work = async move {
            let _flag = flag;
            std::future::pending::<Settled>().await
        };
        (work, dropped)
    }

    #[tokio::test]
    async fn a_delivery_in_flight_longer_than_the_bound_is_no_progress() {
        let mut in_flight = InFlight::new();
        let bound = Duration::from_secs(1);
        assert!(
            in_flight.progressing(bound, Instant::now()),
            "none in flight"
        );
        in_flight.start(0, std::future::pending());
        let now = Instant::now();
        assert!(in_flight.progressing(bound, now));
        assert!(!in_flight.progressing(bound, now + Duration::from_secs(2)));
        assert_eq!(in_flight.abandon().await, 1);
        assert!(in_flight.progressing(bound, now + Duration::from_secs(2)));
    }

    #[tokio::test]
    async fn abandoning_drops_every_delivery_inline_or_on_its_own_task() {
        let mut in_flight = InFlight::new();
        let (small, small_dropped) = endless();
        let (large, large_dropped) = endless();
        in_flight.start(INLINE_UP_TO, small);
        in_flight.start(INLINE_UP_TO + 1, large);
        // Let the spawned one start, so that its future lives on its task.
        tokio::task::yield_now().await;
        assert!(!small_dropped.load(Ordering::SeqCst));
        assert!(!large_dropped.load(Ordering::SeqCst));
        assert_eq!(in_flight.abandon().await, 2);
        assert!(in_flight.is_empty());
        assert!(small_dropped.load(Ordering::SeqCst), "the inline one");
        assert!(
            large_dropped.load(Ordering::SeqCst),
            "the spawned one, by the time abandon returns"
        );
    }

    #[tokio::test]
    async fn both_kinds_report_their_outcome() {
        let mut in_flight = InFlight::new();
        in_flight.start(10, async { Ok(()) });
        in_flight.start(INLINE_UP_TO + 1, async { Err(SettleError::AckRefused) });
        let mut failures = 0;
        while let Some(failure) = in_flight.next().await {
            failures += usize::from(failure.is_some());
        }
        assert_eq!(failures, 1);
    }
}
