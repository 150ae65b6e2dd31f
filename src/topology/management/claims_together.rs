//! The claims of work running at once (the controller's reconciles of many pipelines),
//! gathered per vhost and decided together under one lock.
//!
//! A claim is decided under a lock ([`crate::topology::claim_lock`]): the markers and
//! the objects are read, and the markers written, while no one else claims the same
//! names. Taken claim by claim, that is a lock queue declared and deleted, a marker and
//! an object read per name: most of what a first pass of many pipelines asks of the
//! broker beyond their topologies. So the claims of a vhost's reconciles running at once
//! go in one batch ([`super::batches`]): its locks are taken once (the vhost's, and a
//! workers' user's per user), every marker is read in one request and what exists in
//! two, each claim is decided in turn on what was read and what the claims before it in
//! the batch took ([`crate::topology::claims::decide`]), and the marker of each pipeline
//! that may go ahead is written, one per pipeline. Each reconcile learns the outcome of
//! its own claims: one refused does not refuse the others.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{join_all, try_join_all};
use serde::Deserialize;
use tokio::sync::oneshot;

use super::Management;
use super::batches::VhostBatches;
use super::counting::tally_writes;
use crate::topology::claims::{ClaimAsk, ClaimError, Found, Take, decide};
use crate::topology::error::TopologyError;
use crate::topology::ownership::Claim;

/// One reconcile's claims in a batch, and where its outcome goes.
pub(in crate::topology) struct Submission {
    ask: ClaimAsk,
    /// The number of markers written and removed, or why not.
    done: oneshot::Sender<Result<usize, ClaimError>>,
}

/// Takes `ask`'s claims in `vhost` (the pipeline's, for its exchanges and queues)
/// together with those other work of `management` asks for in the same vhost within
/// `window` of the first (or until the vhost's batch before is decided, if later),
/// waiting up to `lock_wait` for the locks; returns once its markers are written, or
/// with why they may not be.
pub async fn claim_together(
    management: &Arc<Management>,
    vhost: &str,
    ask: ClaimAsk,
    window: Duration,
    lock_wait: Duration,
) -> Result<(), ClaimError> {
    let marks = ask.claims.len();
    let (done, outcome) = oneshot::channel::<Result<usize, ClaimError>>();
    VhostBatches::submit(
        management,
        |management| &management.claim_batches,
        vhost,
        Submission { ask, done },
        window,
        move |management, vhost, batch| async move {
            decide_batch(&management, &vhost, batch, lock_wait).await;
        },
    );
    let writes = outcome.await.unwrap_or_else(|_| {
        Err(ClaimError::Broker(TopologyError::Refused {
            action: format!("claim {marks} names in vhost {vhost:?}"),
            status: 0,
            reason: "the batch that held the claims ended before deciding them".into(),
        }))
    })?;
    // Written by the batch's task: counted for the work that asked for them.
    tally_writes(writes);
    Ok(())
}

async fn decide_batch(
    management: &Arc<Management>,
    vhost: &str,
    batch: Vec<Submission>,
    lock_wait: Duration,
) {
    let claims: Vec<&Claim> = batch.iter().flat_map(|s| &s.ask.claims).collect();
    let started = Instant::now();
    // Every locker of these names takes the same locks, in the same order.
    let holder = batch.first().map(|s| s.ask.owner.uid.clone());
    let locks = management
        .lock_claims(&claims, holder.as_deref().unwrap_or_default(), lock_wait)
        .await;
    let locks = match locks {
        Ok(locks) => locks,
        Err(e) => {
            for submission in batch {
                let _ = submission.done.send(Err(e.clone().into()));
            }
            return;
        }
    };
    let found = read_found(management, vhost, &claims, Instant::now()).await;
    let outcomes = match found {
        Ok(mut found) => {
            let decided: Vec<Result<Take, ClaimError>> = batch
                .iter()
                .map(|submission| {
                    let take = decide(&submission.ask, &found)?;
                    found.took(&take, &submission.ask.owner);
                    Ok(take)
                })
                .collect();
            let writes = batch
                .iter()
                .zip(decided)
                .map(|(submission, decided)| write_take(management, &submission.ask, decided));
            join_all(writes).await
        }
        Err(e) => batch.iter().map(|_| Err(e.clone().into())).collect(),
    };
    locks.release().await;
    tracing::debug!(vhost, pipelines = batch.len(), claims = claims.len(), took = ?started.elapsed(), "claims decided together");
    for (submission, outcome) in batch.into_iter().zip(outcomes) {
        let _ = submission.done.send(outcome);
    }
}

/// Writes what a claim that may go ahead takes: its pipeline's marker, then the markers
/// that marker stands for now. Returns the number of writes.
async fn write_take(
    management: &Management,
    ask: &ClaimAsk,
    decided: Result<Take, ClaimError>,
) -> Result<usize, ClaimError> {
    let take = decided?;
    management
        .set_pipeline_claims(&ask.owner, &take.holds)
        .await?;
    try_join_all(
        take.clear
            .iter()
            .map(|marker| management.clear_owner(marker)),
    )
    .await?;
    Ok(1 + take.clear.len())
}

/// Every marker, and which of `claims` with none exist: read under the locks, taken at
/// `locked_at` (the markers by a read that may be shared with other vhosts' batches,
/// [`Management::markers_read_after`]). The markers and the names of the vhost's
/// exchanges and queues are read at once (a vhost not made yet lists none), whether or
/// not a marker names each claim: waiting for the markers first would put a read's time
/// into every batch, and the claims of a batch are nearly always of names no marker
/// names yet.
async fn read_found(
    management: &Arc<Management>,
    vhost: &str,
    claims: &[&Claim],
    locked_at: Instant,
) -> Result<Found, TopologyError> {
    let of_kind = |kind: fn(&Claim) -> bool| {
        claims
            .iter()
            .any(|claim| kind(claim) && claim.vhost() == Some(vhost))
    };
    let names_if = |wanted: bool, kind: &'static str| async move {
        match wanted {
            true => management.names_in(vhost, kind).await,
            false => Ok(Vec::new()),
        }
    };
    let (markers, exchanges, queues) = tokio::try_join!(
        management.markers_read_after(locked_at),
        names_if(
            of_kind(|c| matches!(c, Claim::Exchange { .. })),
            "exchanges"
        ),
        names_if(of_kind(|c| matches!(c, Claim::Queue { .. })), "queues"),
    )?;
    let mut existing = BTreeSet::new();
    let exchanges = exchanges.into_iter().map(|name| Claim::Exchange {
        vhost: vhost.to_string(),
        name,
    });
    let queues = queues.into_iter().map(|name| Claim::Queue {
        vhost: vhost.to_string(),
        name,
    });
    existing.extend(exchanges.chain(queues));
    for claim in claims {
        // A user is in no vhost; an exchange or queue of another vhost is no batch's.
        let elsewhere = claim.vhost().is_none_or(|of| of != vhost);
        if elsewhere && markers.owner(claim).is_none() && management.claimed_exists(claim).await? {
            existing.insert((*claim).clone());
        }
    }
    Ok(Found::new(markers, existing))
}

/// An exchange or queue as a list of names answers.
#[derive(Deserialize)]
struct Named {
    name: String,
}

impl Management {
    /// The names of every exchange (`kind` = `"exchanges"`) or queue (`"queues"`) of
    /// `vhost`: one request, without the statistics the broker would gather for each.
    async fn names_in(&self, vhost: &str, kind: &str) -> Result<Vec<String>, TopologyError> {
        let listed: Option<Vec<Named>> = self
            .get_json_with(
                &[kind, vhost],
                &[("columns", "name"), ("disable_stats", "true")],
                &format!("list the {kind} of vhost {vhost:?}"),
            )
            .await?;
        Ok(listed
            .unwrap_or_default()
            .into_iter()
            .map(|named| named.name)
            .collect())
    }
}
