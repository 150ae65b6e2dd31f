//! How leadership moves: a standby tries for the Lease until it leads; the leader renews
//! it and steps down at its renew deadline (two thirds of the Lease) when it could not
//! renew, so it stops acting well before a standby may take over (after the whole
//! Lease, by the standby's clock). Every call about the Lease has a timeout
//! ([`LeaderElection`]), so a hanging API server cannot hold a leader past its deadline.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::controller::runtime::leader::LeaderElection;
use crate::telemetry::Health;

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
) -> Option<Instant> {
    loop {
        health.beat();
        let started = Instant::now();
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
    mut renewed: Instant,
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
        let started = Instant::now();
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
