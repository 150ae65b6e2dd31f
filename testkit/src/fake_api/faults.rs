//! Faults a test injects: an API server that stops answering requests to some paths
//! (they hang until released), as a network partition or an overloaded server would, or
//! answers them late (and counts how many wait at once).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use super::FakeApi;

#[derive(Default)]
pub struct Faults {
    /// Path prefixes whose requests hang.
    stalled: Mutex<Vec<String>>,
    /// Path prefixes whose writes fail with 500.
    failing: Mutex<Vec<String>>,
    /// Bumped whenever stalls are released.
    released: watch::Sender<u64>,
    /// Path prefixes whose requests are answered after a delay.
    slow: Mutex<Vec<(String, Duration)>>,
    /// How many slowed requests are waiting now, and the most that waited at once.
    slowed_now: AtomicUsize,
    slowed_most: AtomicUsize,
}

impl FakeApi {
    /// From now on, requests whose path starts with `prefix` get no answer until
    /// [`release_stalls`](Self::release_stalls) (they are recorded when they arrive).
    pub fn stall(&self, prefix: &str) {
        self.faults()
            .stalled
            .lock()
            .unwrap()
            .push(prefix.to_string());
    }

    /// Answers the stalled requests, and those to come.
    pub fn release_stalls(&self) {
        let faults = self.faults();
        faults.stalled.lock().unwrap().clear();
        faults.released.send_modify(|n| *n += 1);
    }

    /// From now on, writes (anything but GET) to paths starting with `prefix` fail with
    /// 500 Internal Server Error, until [`release_failures`](Self::release_failures).
    pub fn fail(&self, prefix: &str) {
        self.faults()
            .failing
            .lock()
            .unwrap()
            .push(prefix.to_string());
    }

    pub fn release_failures(&self) {
        self.faults().failing.lock().unwrap().clear();
    }

    /// From now on, requests whose path starts with `prefix` are answered `delay` late.
    pub fn slow_down(&self, prefix: &str, delay: Duration) {
        self.faults()
            .slow
            .lock()
            .unwrap()
            .push((prefix.to_string(), delay));
    }

    /// The most slowed requests that waited at once.
    pub fn most_slowed_at_once(&self) -> usize {
        self.faults().slowed_most.load(Ordering::SeqCst)
    }

    /// Waits the delay of `path`, if it is slowed.
    pub(super) async fn wait_if_slow(&self, path: &str) {
        let faults = self.faults();
        let delay = {
            let slow = faults.slow.lock().unwrap();
            slow.iter()
                .find(|(prefix, _)| path.starts_with(prefix.as_str()))
                .map(|(_, delay)| *delay)
        };
        if let Some(delay) = delay {
            let now = faults.slowed_now.fetch_add(1, Ordering::SeqCst) + 1;
            faults.slowed_most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            faults.slowed_now.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Whether a write to `path` is to fail.
    pub(super) fn write_fails(&self, method: &str, path: &str) -> bool {
        method != "GET"
            && self
                .faults()
                .failing
                .lock()
                .unwrap()
                .iter()
                .any(|prefix| path.starts_with(prefix.as_str()))
    }

    /// Waits while `path` is stalled.
    pub(super) async fn wait_while_stalled(&self, path: &str) {
        let faults = self.faults();
        let mut released = faults.released.subscribe();
        loop {
            let stalled = {
                let stalled = faults.stalled.lock().unwrap();
                stalled
                    .iter()
                    .any(|prefix| path.starts_with(prefix.as_str()))
            };
            if !stalled || released.changed().await.is_err() {
                return;
            }
        }
    }
}
