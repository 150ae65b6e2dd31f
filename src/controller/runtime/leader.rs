//! Leader election on a `coordination.k8s.io/v1` Lease: one replica reconciles, the
//! others stand by and take over when the leader stops renewing.
//!
//! The Lease is written with its `resourceVersion`, so of two replicas that both see it
//! free, the API server lets exactly one write succeed (the other gets 409 Conflict).
//!
//! Every call to the API server about the Lease has a timeout ([`LeaderElection::call_timeout`]):
//! a call that hangs must not keep a leader from noticing, by its renew deadline, that it
//! can no longer renew.
//!
//! Whether the holder stopped renewing is judged by this replica's own clock: how long
//! the Lease has stood unchanged since this replica first saw it so, not by comparing
//! the holder's `renewTime` with the local time, so clocks that disagree between nodes
//! can neither cut a live leader off nor keep a dead one in place.
//!
//! How leadership moves: a standby tries for the Lease until it leads
//! ([`wait_for_leadership`]); the leader renews it and steps down at its renew deadline
//! (two thirds of the Lease) when it could not renew ([`keep_leading`]), so it stops
//! acting well before a standby may take over (after the whole Lease, by the standby's
//! clock).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;

use crate::telemetry::Health;

/// What a replica should do about the Lease as it found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nobody holds it, or its holder let it expire: take it.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds it and renews it.
    StandBy { holder: String },
}

/// The verdict for `identity` from the Lease's spec (absent: no Lease yet), when this
/// replica has seen it unchanged for `unchanged_for`.
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, unchanged_for: Duration) -> Verdict {
    let Some(spec) = spec else {
        return Verdict::Acquire;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return Verdict::Acquire;
    }
    if holder == identity {
        return Verdict::Renew;
    }
    let duration =
        Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0));
    if unchanged_for > duration {
        Verdict::Acquire
    } else {
        Verdict::StandBy {
            holder: holder.to_string(),
        }
    }
}

/// What of a Lease changes on every renewal: who holds it and when they last renewed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LeaseMark {
    holder: Option<String>,
    renewed: Option<MicroTime>,
}

impl LeaseMark {
    fn of(spec: Option<&LeaseSpec>) -> Self {
        Self {
            holder: spec.and_then(|s| s.holder_identity.clone()),
            renewed: spec.and_then(|s| s.renew_time.clone()),
        }
    }
}

/// The Lease spec after `identity` acquires or renews `previous` at `now`.
pub fn next_spec(
    previous: Option<&LeaseSpec>,
    identity: &str,
    duration: Duration,
    now: Timestamp,
) -> LeaseSpec {
    let held = previous.is_some_and(|p| p.holder_identity.as_deref() == Some(identity));
    let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(i32::try_from(duration.as_secs()).unwrap_or(i32::MAX)),
        acquire_time: if held {
            previous.and_then(|p| p.acquire_time.clone())
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if held || previous.is_none() {
            transitions
        } else {
            transitions.saturating_add(1)
        }),
        ..LeaseSpec::default()
    }
}

/// Why a call about the Lease failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("the Kubernetes API failed to {action} the Lease: {source}")]
    Kube {
        action: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("the Kubernetes API did not {action} the Lease within {timeout:?}")]
    TimedOut {
        action: &'static str,
        timeout: Duration,
    },
}

/// One replica's side of the election.
pub struct LeaderElection {
    api: Api<Lease>,
    lease_name: String,
    identity: String,
    lease_duration: Duration,
    call_timeout: Duration,
    /// The Lease's last renewal as seen here, and when this replica first saw it.
    last_seen: Mutex<Option<(LeaseMark, Instant)>>,
}

impl LeaderElection {
    pub fn new(
        api: Api<Lease>,
        lease_name: &str,
        identity: &str,
        lease_duration: Duration,
    ) -> Self {
        Self {
            api,
            lease_name: lease_name.to_string(),
            identity: identity.to_string(),
            lease_duration,
            // Two calls per try (read, then write) fit well within the renew deadline
            // (two thirds of the Lease).
            call_timeout: lease_duration / 5,
            last_seen: Mutex::new(None),
        }
    }

    /// How long one call about the Lease may take.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// How long a leader may go without renewing before it steps down: two thirds of
    /// the Lease, so it stops acting well before a standby may take the Lease over.
    pub fn renew_deadline(&self) -> Duration {
        self.lease_duration * 2 / 3
    }

    /// `call`, failed with [`LeaseError::TimedOut`] when it takes longer than allowed.
    async fn call<T>(
        &self,
        action: &'static str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, LeaseError> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(result) => result.map_err(|source| LeaseError::Kube { action, source }),
            Err(_) => Err(LeaseError::TimedOut {
                action,
                timeout: self.call_timeout,
            }),
        }
    }

    /// How long the Lease has stood as `renewal` by this replica's clock.
    fn unchanged_for(&self, renewal: LeaseMark) -> Duration {
        let mut last_seen = self
            .last_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match last_seen.as_ref() {
            Some((seen, since)) if *seen == renewal => since.elapsed(),
            _ => {
                *last_seen = Some((renewal, Instant::now()));
                Duration::ZERO
            }
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Acquires or renews the Lease when this replica may; returns whether it leads now.
    /// Losing a race for the Lease is not an error: it means another replica leads.
    pub async fn try_lead(&self) -> Result<bool, LeaseError> {
        let found = self
            .call("read", self.api.get_opt(&self.lease_name))
            .await?;
        let previous = found.as_ref().and_then(|lease| lease.spec.as_ref());
        let unchanged_for = self.unchanged_for(LeaseMark::of(previous));
        match decide(previous, &self.identity, unchanged_for) {
            Verdict::StandBy { .. } => return Ok(false),
            Verdict::Acquire | Verdict::Renew => {}
        }
        let spec = next_spec(
            previous,
            &self.identity,
            self.lease_duration,
            Timestamp::now(),
        );
        let written = match found {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.lease_name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                self.call("create", self.api.create(&PostParams::default(), &lease))
                    .await
            }
            Some(mut lease) => {
                // Keeps metadata.resourceVersion: the write fails if anyone wrote since.
                lease.spec = Some(spec);
                let params = PostParams::default();
                let replace = self.api.replace(&self.lease_name, &params, &lease);
                self.call("renew", replace).await
            }
        };
        match written {
            Ok(_) => Ok(true),
            Err(LeaseError::Kube {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Who holds the Lease now, if anyone.
    pub async fn holder(&self) -> Result<Option<String>, LeaseError> {
        let lease = self
            .call("read", self.api.get_opt(&self.lease_name))
            .await?;
        Ok(lease
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty()))
    }

    /// Gives the Lease up, so a standby takes over at once instead of after it expires.
    pub async fn release(&self) -> Result<(), LeaseError> {
        let Some(mut lease) = self
            .call("read", self.api.get_opt(&self.lease_name))
            .await?
        else {
            return Ok(());
        };
        let ours = lease
            .spec
            .as_ref()
            .is_some_and(|s| s.holder_identity.as_deref() == Some(self.identity.as_str()));
        if !ours {
            return Ok(());
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.acquire_time = None;
            spec.renew_time = None;
        }
        let params = PostParams::default();
        let replace = self.api.replace(&self.lease_name, &params, &lease);
        self.call("release", replace).await?;
        Ok(())
    }
}

/// Why a leader stopped renewing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// It was told to stop (the controllers finished): it still holds the Lease.
    Stopped,
    /// Another replica holds the Lease, or the renew deadline passed: it leads no more.
    Lost,
}

/// Tries for the Lease every `retry` until it is ours (the instant the winning try
/// started) or `stop` (`None`). A standby is ready: it is doing its job, which is to wait.
pub async fn wait_for_leadership(
    election: &LeaderElection,
    retry: Duration,
    health: &Health,
    mut stop: watch::Receiver<bool>,
) -> Option<tokio::time::Instant> {
    loop {
        health.beat();
        let started = tokio::time::Instant::now();
        match election.try_lead().await {
            Ok(true) => {
                health.set_ready(false);
                return Some(started);
            }
            Ok(false) => {
                if !health.is_ready() {
                    let holder = election.holder().await.ok().flatten().unwrap_or_default();
                    tracing::info!(%holder, "standing by: another replica leads");
                }
                health.set_ready(true);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read or write the leader Lease");
                health.set_ready(false);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(retry) => {}
            _ = stop.wait_for(|stopped| *stopped) => return None,
        }
    }
}

/// Renews the Lease every `retry` from `renewed` (when the try that won or last renewed
/// it started) until `until` turns true. Returns [`Renewal::Lost`] the moment the renew
/// deadline passes without a renewal, even while a call is in flight, or when another
/// replica holds the Lease.
pub async fn keep_leading(
    election: &LeaderElection,
    retry: Duration,
    mut renewed: tokio::time::Instant,
    mut until: watch::Receiver<bool>,
) -> Renewal {
    let renew_deadline = election.renew_deadline();
    loop {
        let deadline = renewed + renew_deadline;
        tokio::select! {
            () = tokio::time::sleep(retry) => {}
            () = tokio::time::sleep_until(deadline) => return lost("its renew deadline passed"),
            _ = until.wait_for(|stop| *stop) => return Renewal::Stopped,
        }
        let started = tokio::time::Instant::now();
        tokio::select! {
            result = election.try_lead() => match result {
                Ok(true) => renewed = started,
                Ok(false) => return lost("another replica holds the Lease"),
                Err(e) => tracing::warn!(error = %e, "cannot renew the leader Lease"),
            },
            () = tokio::time::sleep_until(deadline) => return lost("its renew deadline passed"),
        }
    }
}

fn lost(why: &str) -> Renewal {
    tracing::error!(why, "lost the leader Lease: stopping every reconcile");
    Renewal::Lost
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn held_by(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(at(renewed))),
            acquire_time: Some(MicroTime(at(0))),
            lease_transitions: Some(2),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_free_or_abandoned_lease_is_taken_and_a_live_one_is_not() {
        let seconds = Duration::from_secs;
        assert_eq!(decide(None, "a", seconds(0)), Verdict::Acquire);
        assert_eq!(
            decide(Some(&LeaseSpec::default()), "a", seconds(0)),
            Verdict::Acquire
        );
        // Renewed long ago by the holder's clock, but just seen: the holder may be alive
        // with a clock behind ours, so it gets a full lease duration.
        let b = held_by("b", 90);
        assert_eq!(
            decide(Some(&b), "a", seconds(0)),
            Verdict::StandBy { holder: "b".into() }
        );
        assert_eq!(
            decide(Some(&b), "a", seconds(15)),
            Verdict::StandBy { holder: "b".into() }
        );
        assert_eq!(decide(Some(&b), "a", seconds(16)), Verdict::Acquire);
        assert_eq!(decide(Some(&b), "b", seconds(100)), Verdict::Renew);
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let b = held_by("b", 90);
        let taken = next_spec(Some(&b), "a", Duration::from_secs(15), at(120));
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        assert_eq!(taken.lease_transitions, Some(3));
        assert_eq!(taken.acquire_time, Some(MicroTime(at(120))));
        let renewed = next_spec(Some(&taken), "a", Duration::from_secs(15), at(125));
        assert_eq!(renewed.lease_transitions, Some(3));
        assert_eq!(renewed.acquire_time, Some(MicroTime(at(120))));
        assert_eq!(renewed.renew_time, Some(MicroTime(at(125))));
        assert_eq!(renewed.lease_duration_seconds, Some(15));
        let first = next_spec(None, "a", Duration::from_secs(15), at(1));
        assert_eq!(first.lease_transitions, Some(0));
    }
}
