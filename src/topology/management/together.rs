//! The policy writes of work running at once (the controller's reconciles of many
//! pipelines), gathered per vhost and written together.
//!
//! RabbitMQ sets each policy it is given against every queue of the vhost, so policies
//! written one by one by many reconciles cost more and more, while one definitions import
//! of them all costs far less ([`super::import`]). So a reconcile that has policies to
//! write for a vhost hands them to the vhost's open batch ([`super::batches`]) and waits
//! while the batch is written at once, in one import (in parts). Each reconcile learns
//! the outcome of its own policies: when the import fails as a whole (or this user may
//! not import), each submission's policies are PUT one by one, so one bad policy does
//! not fail the others. A pipeline made among others, which stops after its policies
//! anyway ([`crate::topology::apply_shared`]), hands them over rather than waiting: its
//! next reconcile finds them written (the client's kept definitions show what a batch
//! wrote) or writes them again and fails with the broker's reason. So the reconciles of
//! a first pass hold their slots only for their claims, and the vhost's policies go in
//! fewer, larger imports.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::oneshot;

use super::Management;
use super::batches::VhostBatches;
use super::counting::tally_writes;
use crate::topology::desired::Policy;
use crate::topology::diff::Change;
use crate::topology::error::TopologyError;

/// One reconcile's policies in a batch, and where its outcome goes.
pub(in crate::topology) struct Submission {
    policies: Vec<Policy>,
    /// The outcome, and how many submissions the batch held.
    done: oneshot::Sender<Result<usize, TopologyError>>,
}

/// Returns once `vhost` has had no policies or claims submitted or written through
/// `management` for `quiet`: the work that writes a vhost's policies ahead of its queues
/// (`defer_rest` of [`crate::topology::apply_shared`]) makes the queues after this. Work
/// still claiming names in the vhost will write policies next, so the vhost has not
/// settled while claims are decided there. `quiet` is asked again each time the vhost
/// is looked at: the caller may know that no more work is coming.
pub async fn policies_settled(management: &Management, vhost: &str, quiet: impl Fn() -> Duration) {
    loop {
        let policies = management.policy_batches.idle_for(vhost);
        let claims = management.claim_batches.idle_for(vhost);
        let quiet = quiet();
        match policies.zip(claims).map(|(p, c)| p.min(c)) {
            Some(idle) if idle >= quiet => return,
            Some(idle) => tokio::time::sleep((quiet - idle).min(SETTLE_LOOK_EVERY)).await,
            None => tokio::time::sleep(SETTLE_LOOK_EVERY).await,
        }
    }
}

/// How often [`policies_settled`] looks at a vhost still busy, or not quiet for long
/// enough yet.
const SETTLE_LOOK_EVERY: Duration = Duration::from_millis(25);

/// How a submission's policies were written among others'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// How many submissions the batch held (0 for no policies); for policies handed
    /// over (see [`put_policies_together`]), how many it held when these joined.
    pub batch: usize,
    /// How long the vhost had had no batch open or being written before these came;
    /// `None` when one was.
    pub idle_before: Option<Duration>,
}

impl Written {
    /// Whether other work wrote policies into the vhost with these, or within `recent`
    /// before them.
    pub fn among_others(&self, recent: Duration) -> bool {
        self.batch > 1 || self.idle_before.is_none_or(|idle| idle < recent)
    }
}

/// Writes `policies` into `vhost` together with those other work of `management`
/// submits for the same vhost within `window` of the first (or until the vhost's batch
/// before is written, if later); returns once they are written, with the outcome of
/// these alone and what they were written among.
///
/// With `hand_over: Some(recent)`, policies that join a batch among others' (it holds
/// others already, or the vhost had one within `recent` before) are left to it: this
/// returns at once, and the caller learns their outcome from the broker when it next
/// reads the vhost (this client's kept definitions show them once written; a batch that
/// fails to write them stops those serving). Work of many pipelines made at once then
/// holds no slot of its own while their policies are written.
pub async fn put_policies_together(
    management: &Arc<Management>,
    vhost: &str,
    policies: Vec<Policy>,
    window: Duration,
    hand_over: Option<Duration>,
) -> Result<Written, TopologyError> {
    if policies.is_empty() {
        return Ok(Written {
            batch: 0,
            idle_before: Some(Duration::MAX),
        });
    }
    let idle_before = management.policy_batches.idle_for(vhost);
    let count = policies.len();
    let (done, outcome) = oneshot::channel();
    let submission = Submission { policies, done };
    let joined = VhostBatches::submit(
        management,
        |management| &management.policy_batches,
        vhost,
        submission,
        window,
        |management, vhost, batch| async move {
            write_batch(&management, &vhost, batch).await;
        },
    );
    let joining = Written {
        batch: joined,
        idle_before,
    };
    if hand_over.is_some_and(|recent| joining.among_others(recent)) {
        // Asked for by this work, written by the batch's task.
        tally_writes(count);
        return Ok(joining);
    }
    let written = outcome.await.unwrap_or_else(|_| {
        Err(TopologyError::Refused {
            action: format!("write {count} policies into vhost {vhost:?}"),
            status: 0,
            reason: "the batch that held them ended before writing them".into(),
        })
    });
    if written.is_ok() {
        // Written by the batch's task: counted for the work that asked for them.
        tally_writes(count);
    }
    written.map(|batch| Written { batch, idle_before })
}

async fn write_batch(management: &Management, vhost: &str, batch: Vec<Submission>) {
    let submissions = batch.len();
    let all: Vec<&Policy> = batch.iter().flat_map(|s| s.policies.iter()).collect();
    let started = std::time::Instant::now();
    let imported = match management.import_policies(vhost, &all).await {
        Ok(imported) => imported,
        Err(e) => {
            tracing::warn!(vhost, policies = all.len(), error = %e, "importing the policies failed; writing them one by one");
            false
        }
    };
    tracing::debug!(vhost, submissions, policies = all.len(), imported, took = ?started.elapsed(), "policies written together");
    if imported {
        for policy in &all {
            tracing::info!(vhost = %vhost, policy = %policy.name, "topology changed: put policy");
        }
        for submission in batch {
            let _ = submission.done.send(Ok(submissions));
        }
        return;
    }
    // Each submission's policies one by one, each submission told its own outcome.
    join_all(batch.into_iter().map(|submission| async move {
        let written = async {
            for policy in &submission.policies {
                let change = Change::PutPolicy {
                    policy: policy.clone(),
                    previous: None,
                };
                management.write(vhost, &change).await?;
            }
            Ok(submissions)
        }
        .await;
        if let Err(Err(e)) = submission.done.send(written) {
            // Handed over: the work that submitted them writes them again when it next
            // finds them missing, and says why they fail then.
            tracing::warn!(vhost = %vhost, error = %e, "could not write policies handed over to their batch");
        }
    }))
    .await;
}
