//! Work of a client's callers running at once, gathered per vhost and done a batch at a
//! time: the policies of many reconciles ([`super::together`]) and their claims
//! ([`super::claims_together`]).
//!
//! The first submission for a vhost opens its batch and starts the batch's task; others
//! join while the batch is open: until a short window has passed, or a tenth of it
//! without a new submission (work started together joins within that; waiting longer
//! would only delay it), and for as long as the vhost's batch before is still being done
//! (one batch at a time per vhost: two at once only slow each other down). The task runs
//! on its own, so a caller that stops waiting does not cancel the work of the others.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::Management;

/// A batch open for submissions.
struct Open<S> {
    submissions: Vec<S>,
    /// When the last one came.
    last: Instant,
}

/// The open batch of each vhost, who does a batch of the vhost now, and when each vhost
/// last had a submission or a batch done.
pub(in crate::topology) struct VhostBatches<S> {
    open: Mutex<HashMap<String, Open<S>>>,
    doers: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    last_busy: Mutex<HashMap<String, Instant>>,
}

impl<S> Default for VhostBatches<S> {
    fn default() -> Self {
        Self {
            open: Mutex::default(),
            doers: Mutex::default(),
            last_busy: Mutex::default(),
        }
    }
}

impl<S: Send + 'static> VhostBatches<S> {
    fn open(&self) -> MutexGuard<'_, HashMap<String, Open<S>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn doer(&self, vhost: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut doers = self.doers.lock().unwrap_or_else(PoisonError::into_inner);
        doers.entry(vhost.to_string()).or_default().clone()
    }

    fn busy_now(&self, vhost: &str) {
        let mut last = self
            .last_busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        last.insert(vhost.to_string(), Instant::now());
    }

    /// How long `vhost` has had no batch open or being done (since the client began,
    /// for a vhost that never had one); `None` while one is.
    pub(in crate::topology) fn idle_for(&self, vhost: &str) -> Option<Duration> {
        let doing = self
            .doers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(vhost)
            .is_some_and(|doer| doer.try_lock().is_err());
        if doing || self.open().contains_key(vhost) {
            return None;
        }
        let last = self
            .last_busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Some(last.get(vhost).map_or(Duration::MAX, Instant::elapsed))
    }

    /// Adds `submission` to the open batch of `vhost` in `batches(management)`, opening
    /// it if there is none: then, after `window` (or a tenth of it with no new
    /// submission) and once the vhost's batch before is done, the batch is taken and
    /// given to `work`, on a task of its own. Returns how many submissions the batch
    /// holds with this one (1: it opened the batch).
    pub(in crate::topology) fn submit<W, F>(
        management: &Arc<Management>,
        batches: fn(&Management) -> &Self,
        vhost: &str,
        submission: S,
        window: Duration,
        work: W,
    ) -> usize
    where
        W: FnOnce(Arc<Management>, String, Vec<S>) -> F + Send + 'static,
        F: Future<Output = ()> + Send,
    {
        let this = batches(management);
        this.busy_now(vhost);
        let opened = Instant::now();
        {
            let mut open = this.open();
            if let Some(batch) = open.get_mut(vhost) {
                batch.submissions.push(submission);
                batch.last = opened;
                return batch.submissions.len();
            }
            let batch = Open {
                submissions: vec![submission],
                last: opened,
            };
            open.insert(vhost.to_string(), batch);
        }
        let management = management.clone();
        let vhost = vhost.to_string();
        tokio::spawn(async move {
            let this = batches(&management);
            loop {
                let last = this.open().get(&vhost).map_or(opened, |batch| batch.last);
                let due = (last + window / 10).min(opened + window);
                if Instant::now() >= due {
                    break;
                }
                tokio::time::sleep_until(due).await;
            }
            // The batch stays open, gathering more, while the one before is done.
            let doer = this.doer(&vhost);
            let _doing = doer.lock().await;
            let batch = this.open().remove(&vhost);
            let submissions = batch.map(|batch| batch.submissions).unwrap_or_default();
            work(management.clone(), vhost.clone(), submissions).await;
            this.busy_now(&vhost);
        });
        1
    }
}
