//! Faults a test injects: an API server that stops answering requests to some paths
//! (they hang until released), as a network partition or an overloaded server would.

use std::sync::Mutex;

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
