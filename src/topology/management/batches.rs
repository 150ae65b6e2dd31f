//! Work of a client's callers running at once, gathered per vhost and done a batch at a
//! time: the policies of many reconciles ([`super::together`]) and their claims
//! ([`super::claims_together`]).
//!
//! The first submission for a vhost opens its batch and starts the batch's task; others
//! join while the batch is open: for a short window, and for as long as the vhost's
//! batch before is still being done (one batch at a time per vhost: two at once only
//! slow each other down). The task runs on its own, so a caller that stops waiting does
//! not cancel the work of the others.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::Management;

/// The open batch of each vhost, and who does a batch of the vhost now.
pub(in crate::topology) struct VhostBatches<S> {
    open: Mutex<HashMap<String, Vec<S>>>,
    doers: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl<S> Default for VhostBatches<S> {
    fn default() -> Self {
        Self {
            open: Mutex::default(),
            doers: Mutex::default(),
        }
    }
}

impl<S: Send + 'static> VhostBatches<S> {
    fn open(&self) -> MutexGuard<'_, HashMap<String, Vec<S>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn doer(&self, vhost: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut doers = self.doers.lock().unwrap_or_else(PoisonError::into_inner);
        doers.entry(vhost.to_string()).or_default().clone()
    }

    /// Whether `vhost` has a batch open or being done.
    pub(in crate::topology) fn busy(&self, vhost: &str) -> bool {
        if self.open().contains_key(vhost) {
            return true;
        }
        self.doers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(vhost)
            .is_some_and(|doer| doer.try_lock().is_err())
    }

    /// Adds `submission` to `vhost`'s open batch, opening it if there is none: then,
    /// after `window` and once the vhost's batch before is done, `batches(&management)`'s
    /// batch of `vhost` is taken and given to `work`, on a task of its own.
    pub(in crate::topology) fn submit<W, F>(
        &self,
        management: &Arc<Management>,
        batches: fn(&Management) -> &Self,
        vhost: &str,
        submission: S,
        window: Duration,
        work: W,
    ) where
        W: FnOnce(Arc<Management>, String, Vec<S>) -> F + Send + 'static,
        F: Future<Output = ()> + Send,
    {
        {
            let mut open = self.open();
            if let Some(batch) = open.get_mut(vhost) {
                batch.push(submission);
                return;
            }
            open.insert(vhost.to_string(), vec![submission]);
        }
        let management = management.clone();
        let vhost = vhost.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(window).await;
            let this = batches(&management);
            // The batch stays open, gathering more, while the one before is done.
            let doer = this.doer(&vhost);
            let _doing = doer.lock().await;
            let batch = this.open().remove(&vhost).unwrap_or_default();
            work(management.clone(), vhost, batch).await;
        });
    }
}
