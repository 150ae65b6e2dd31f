//! A lock per claimed name, so that deciding a claim (read its marker, check what
//! exists, write the marker) is one step for every operator sharing the broker.
//!
//! The management API has no conditional write, but RabbitMQ refuses to declare a queue
//! that exists with another value of an argument it compares. A lock is a classic,
//! non-durable queue in the pipeline's vhost, named after the claim's marker, whose
//! `x-dead-letter-exchange` argument holds the locker's UID: the first declare creates
//! it, a declare with another UID is refused (400, inequivalent argument) while it
//! exists, a declare with the same UID finds it. Its `x-expires` lets the broker remove
//! a lock whose holder died before releasing it. Nothing is ever routed to it.
//!
//! Locks are taken in the order of their names and, when one is held by someone else,
//! every lock taken is released before trying again, so two lockers of overlapping names
//! never wait for each other.

use std::time::{Duration, Instant};

use ring::digest::{SHA256, digest};
use serde_json::{Map, Value, json};

use super::error::TopologyError;
use super::management::Management;
use super::ownership::Claim;

/// What lock queues' names start with.
pub const LOCK_PREFIX: &str = "mailer.claim-lock.";
/// How long the broker keeps a lock nobody declares again: longer than any claim takes,
/// short enough that a locker that died holds nobody up for long.
const LOCK_EXPIRES: Duration = Duration::from_secs(30);
/// How long a locker waits between tries while another holds a lock.
const RETRY: Duration = Duration::from_millis(100);

/// The locks of some claims, held until [`release`](Self::release)d (or until the
/// broker expires them).
#[must_use = "release the locks"]
pub struct ClaimLocks<'a> {
    management: &'a Management,
    vhost: String,
    queues: Vec<String>,
}

/// The name of the lock of `claim`: the claim's marker hashed (a queue's name is at most
/// 255 bytes; a marker may be longer).
pub fn lock_name(claim: &Claim) -> String {
    let hash = digest(&SHA256, claim.marker().as_bytes());
    let hex: String = hash.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{LOCK_PREFIX}{hex}")
}

fn lock_arguments(holder: &str) -> Map<String, Value> {
    let Value::Object(arguments) = json!({
        "x-queue-type": "classic",
        "x-expires": LOCK_EXPIRES.as_millis() as u64,
        "x-dead-letter-exchange": holder,
    }) else {
        unreachable!("a JSON object literal")
    };
    arguments
}

impl Management {
    /// Takes the locks of `claims` in `vhost` (which must exist) for `holder` (a UID),
    /// waiting up to `wait` while others hold any of them.
    pub async fn lock_claims<'a>(
        &'a self,
        vhost: &str,
        claims: &[&Claim],
        holder: &str,
        wait: Duration,
    ) -> Result<ClaimLocks<'a>, TopologyError> {
        let mut names: Vec<String> = claims.iter().map(|c| lock_name(c)).collect();
        names.sort();
        names.dedup();
        let deadline = Instant::now() + wait;
        loop {
            let mut locks = ClaimLocks {
                management: self,
                vhost: vhost.to_string(),
                queues: Vec::new(),
            };
            let mut busy = None;
            for name in &names {
                match self.try_lock(vhost, name, holder).await {
                    Ok(true) => locks.queues.push(name.clone()),
                    Ok(false) => {
                        busy = Some(name.clone());
                        break;
                    }
                    Err(e) => {
                        locks.release().await;
                        return Err(e);
                    }
                }
            }
            let Some(busy) = busy else {
                return Ok(locks);
            };
            locks.release().await;
            if Instant::now() >= deadline {
                return Err(TopologyError::Refused {
                    action: format!("lock a claim in vhost {vhost:?} ({busy})"),
                    status: 503,
                    reason: format!(
                        "another claim of the same name has held its lock for over {}s",
                        wait.as_secs()
                    ),
                });
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    /// Declares the lock queue `name` for `holder`: `false` when another holds it. Sent
    /// as a plain PUT: a refusal is the expected answer to a lock held by another.
    async fn try_lock(&self, vhost: &str, name: &str, holder: &str) -> Result<bool, TopologyError> {
        let body = json!({
            "durable": false,
            "auto_delete": false,
            "arguments": lock_arguments(holder),
        });
        let action = format!("declare the lock queue {name:?} in vhost {vhost:?}");
        match self
            .put_json(&["queues", vhost, name], &body, &action)
            .await?
        {
            200..=299 => Ok(true),
            400 => Ok(false),
            status => Err(TopologyError::Refused {
                action,
                status,
                reason: "an unexpected answer".into(),
            }),
        }
    }
}

impl ClaimLocks<'_> {
    /// Removes the lock queues, all at once. One that cannot be removed expires by
    /// itself.
    pub async fn release(self) {
        let (management, vhost) = (self.management, self.vhost.as_str());
        let removals = self.queues.iter().map(|name| async move {
            let removed = management
                .bounded_write(management.api.delete_queue(vhost, name, true))
                .await;
            if let Err(e) = removed {
                tracing::warn!(vhost = %vhost, queue = %name, error = %e, "could not remove a claim lock; the broker expires it");
            }
        });
        futures::future::join_all(removals).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_named_by_its_claim_within_a_queue_names_length() {
        let long = Claim::Queue {
            vhost: "v".repeat(300),
            name: "q".repeat(300),
        };
        let name = lock_name(&long);
        assert!(name.starts_with(LOCK_PREFIX) && name.len() < 64, "{name}");
        let other = Claim::Exchange {
            vhost: "v".repeat(300),
            name: "q".repeat(300),
        };
        assert_ne!(lock_name(&other), name);
        assert_eq!(lock_name(&long), name);
    }
}
