//! Pipelines made together in one vhost (a GitOps sync of hundreds, the first pass after
//! an install) write their policies ahead of their exchanges and queues.
//!
//! RabbitMQ sets each policy it is given against every exchange and queue of the vhost,
//! so the policies of the hundredth pipeline cost far more once the first ninety-nine
//! have their queues than in a vhost still empty. With `--concurrency` reconciles at a
//! time, the policies of later pipelines would always land among the queues of earlier
//! ones. So a pipeline whose policies join a batch with others', or come less than
//! [`AMONG_OTHERS_WITHIN`] after others (see [`crate::topology::apply_shared`]), hands
//! them to the batch and stops there; it is reconciled again once the vhost has had no
//! claims to decide and no policy to write for [`SETTLED_AFTER`], or for
//! [`SETTLED_WHEN_NONE_RUNS`] once no reconcile runs in the controller (its policies are
//! written by then, or found missing and written again): by then the pipelines
//! reconciled after it have written theirs, and the exchanges and queues of all of them
//! are made after every policy. That is two reconciles for such a pipeline, one for a
//! pipeline made alone.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::Stream;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

use crate::controller::key::PipelineKey;
use crate::controller::runtime::index::Guarded;
use crate::topology::Management;
use crate::topology::management::together::policies_settled;

/// How long a vhost has no claims to decide and no policies to write before the
/// pipelines that wrote their policies ahead make their exchanges and queues: longer
/// than a reconcile takes from its start to its claims, and from its claims to its
/// policies, so the reconciles still to run in a first pass keep it busy.
pub const SETTLED_AFTER: Duration = Duration::from_millis(250);

/// How long a vhost has no claims to decide and no policies to write before it has
/// settled while no reconcile runs in the controller: none is about to claim or write
/// there, so nothing more comes unless something changes (the end of a first pass).
pub const SETTLED_WHEN_NONE_RUNS: Duration = Duration::from_millis(50);

/// A pipeline whose policies go in a batch with others', or this soon after the vhost's
/// batch before, is made among others and goes ahead.
pub const AMONG_OTHERS_WITHIN: Duration = Duration::from_secs(1);

/// When a pipeline that went ahead is reconciled again if its vhost never settles (or
/// the controller that would reconcile it is gone): long beside a first pass's policies
/// (a pipeline that came back before the others had written theirs would make its
/// queues among them).
pub const AHEAD_AT_MOST: Duration = Duration::from_secs(300);

/// The pipelines waiting for their vhost's policies to settle, and how their controllers
/// are told to reconcile them again.
#[derive(Default)]
pub struct PoliciesAhead {
    waiting: Mutex<HashSet<PipelineKey>>,
    controllers: Mutex<Vec<Inbox>>,
    /// How many reconciles run now, in every controller of the process.
    running: AtomicUsize,
    /// The pipelines waiting for a vhost to settle, by broker client (its address) and
    /// vhost, with the controller each goes back to: one task looks at each vhost,
    /// however many pipelines wait for it (a thousand at the end of a first pass).
    settling: Mutex<HashMap<(usize, String), Vec<Waiting>>>,
}

/// A pipeline waiting for its vhost to settle, and where it is sent then.
type Waiting = (PipelineKey, mpsc::UnboundedSender<ObjectRef<Guarded>>);

/// A reconcile running, counted until dropped (see [`PoliciesAhead::reconciling`]).
pub struct Running<'a>(&'a AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where a controller takes pipelines to reconcile, and its scope (a namespace, or all).
struct Inbox {
    scope: Option<String>,
    sender: mpsc::UnboundedSender<ObjectRef<Guarded>>,
}

impl PoliciesAhead {
    /// Whether `key` may stop after its policies: not when it did so last time (its
    /// policies are then written, or the vhost is always busy).
    pub fn may_go_ahead(&self, key: &PipelineKey) -> bool {
        !self.waiting().contains(key)
    }

    /// `key` wrote its policies ahead into `vhost` of `management`: it is reconciled
    /// again once they have settled there.
    pub fn went_ahead(
        self: &Arc<Self>,
        key: &PipelineKey,
        management: &Arc<Management>,
        vhost: &str,
    ) {
        self.waiting().insert(key.clone());
        let controller = self
            .controllers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|inbox| inbox.scope.as_ref().is_none_or(|ns| *ns == key.namespace))
            .map(|inbox| inbox.sender.clone());
        let Some(controller) = controller else {
            return;
        };
        // The task holds the client, so its address names no other while it waits.
        let spot = (Arc::as_ptr(management) as usize, vhost.to_string());
        {
            let mut settling = self.settling();
            if let Some(waiting) = settling.get_mut(&spot) {
                waiting.push((key.clone(), controller));
                return;
            }
            settling.insert(spot.clone(), vec![(key.clone(), controller)]);
        }
        let (management, ahead) = (management.clone(), self.clone());
        tokio::spawn(async move {
            let quiet = || match ahead.running.load(Ordering::Relaxed) {
                0 => SETTLED_WHEN_NONE_RUNS,
                _ => SETTLED_AFTER,
            };
            policies_settled(&management, &spot.1, quiet).await;
            let settled = ahead.settling().remove(&spot).unwrap_or_default();
            for (key, controller) in settled {
                // Unless reconciled through meanwhile (its fallback requeue, a change of it).
                if ahead.waiting().contains(&key) {
                    let object = ObjectRef::new(&key.name).within(&key.namespace);
                    // A controller that stopped takes no more: nothing to tell.
                    let _ = controller.send(object);
                }
            }
        });
    }

    /// Counts a reconcile as running until the value returned is dropped: a vhost
    /// settles sooner while none runs.
    pub fn reconciling(&self) -> Running<'_> {
        self.running.fetch_add(1, Ordering::Relaxed);
        Running(&self.running)
    }

    /// `key` was reconciled through (or failed): it may go ahead again later.
    pub fn done(&self, key: &PipelineKey) {
        self.waiting().remove(key);
    }

    /// The pipelines of `scope` (a namespace, or all) to reconcile again, for its
    /// controller's `reconcile_on`.
    pub fn triggers(&self, scope: Option<&str>) -> impl Stream<Item = ObjectRef<Guarded>> + use<> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.controllers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Inbox {
                scope: scope.map(str::to_string),
                sender,
            });
        futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|object| (object, receiver))
        })
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashSet<PipelineKey>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn settling(&self) -> std::sync::MutexGuard<'_, HashMap<(usize, String), Vec<Waiting>>> {
        self.settling.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reconcile_counts_as_running_until_it_ends() {
        let ahead = PoliciesAhead::default();
        let first = ahead.reconciling();
        let second = ahead.reconciling();
        assert_eq!(ahead.running.load(Ordering::Relaxed), 2);
        drop(first);
        assert_eq!(ahead.running.load(Ordering::Relaxed), 1);
        drop(second);
        assert_eq!(
            ahead.running.load(Ordering::Relaxed),
            0,
            "none runs: settles sooner"
        );
    }
}
