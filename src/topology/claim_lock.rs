//! A lock per vhost whose names are claimed (and per workers' user claimed), so that
//! deciding claims (read their markers, check what exists, write the markers) is one
//! step for every operator sharing the broker. A lock covers a vhost rather than each
//! name in it so that the claims of many pipelines of a vhost are decided under one
//! ([`super::management::claims_together`]).
//!
//! The management API has no conditional write, but RabbitMQ refuses to declare a queue
//! that exists with another value of an argument it compares. A lock is a classic,
//! non-durable queue named after the claim's marker, whose `x-dead-letter-exchange`
//! argument holds the locker's UID: the first declare creates it, a declare with another
//! UID is refused (400, inequivalent argument) while it exists, a declare with the same
//! UID finds it. Its `x-expires` lets the broker remove a lock whose holder died before
//! releasing it. Nothing is ever routed to it.
//!
//! Locks live in a vhost of their own ([`CLAIM_LOCK_VHOST`]), made at a client's first claim,
//! which no pipeline may use: RabbitMQ matches every queue declared in a vhost against
//! each of the vhost's policies, so locks declared among a thousand pipelines' policies
//! cost the broker more with each pipeline (see `docs/benchmarks.md`), while in a vhost
//! without policies each costs the same. And no tenant, who holds permissions on its own
//! vhosts only, can declare a lock to hold another's claim up.
//!
//! Locks are taken one by one in the order of their names and, when one is held by
//! someone else, every lock taken is released before trying again, so two lockers of
//! overlapping names never wait for each other, and the one that holds the first name
//! they share goes on. (Tried all at once, two such lockers can each take some of the
//! other's names, release, and meet again round after round: a test of two controllers
//! claiming at once saw both give up after 10 s on RabbitMQ 4.0.)

use std::time::{Duration, Instant};

use ring::digest::{SHA256, digest};
use serde_json::{Map, Value, json};

use super::error::TopologyError;
use super::management::Management;
use super::ownership::{Claim, MARKER_PREFIX, part as vhost_part};
use crate::mail::CLAIM_LOCK_VHOST;

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
    queues: Vec<String>,
}

/// The name of the lock `claim` is decided under: its vhost's for an exchange or a queue
/// (the claims of a vhost are decided a batch at a time, see
/// [`super::management::claims_together`]), its own for a workers' user. Hashed: a
/// queue's name is at most 255 bytes, a vhost's or a user's may be longer.
pub fn lock_name(claim: &Claim) -> String {
    let locked = match claim.vhost() {
        Some(vhost) => format!("{MARKER_PREFIX}vhost|{}", vhost_part(vhost)),
        None => claim.marker(),
    };
    let hash = digest(&SHA256, locked.as_bytes());
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
    /// Takes the locks of `claims` for `holder` (a UID), waiting up to `wait` while
    /// others hold any of them.
    pub async fn lock_claims<'a>(
        &'a self,
        claims: &[&Claim],
        holder: &str,
        wait: Duration,
    ) -> Result<ClaimLocks<'a>, TopologyError> {
        self.ensure_lock_vhost().await?;
        let mut names: Vec<String> = claims.iter().map(|c| lock_name(c)).collect();
        names.sort();
        names.dedup();
        let deadline = Instant::now() + wait;
        loop {
            let mut locks = ClaimLocks {
                management: self,
                queues: Vec::new(),
            };
            let mut busy = None;
            for name in &names {
                match self.try_lock(name, holder).await {
                    Ok(true) => locks.queues.push(name.clone()),
                    Ok(false) => {
                        busy = Some(name.clone());
                        break;
                    }
                    Err(e) => {
                        locks.release().await;
                        // The vhost may have been removed: made again at the next claim.
                        *self.lock_vhost_ready.lock().await = false;
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
                    action: format!("lock a claim ({busy} in vhost {CLAIM_LOCK_VHOST:?})"),
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

    /// Makes the locks' vhost and grants this client's user its permissions there, once
    /// per client (again after a lock could not be declared). Both writes leave what
    /// exists as it is.
    async fn ensure_lock_vhost(&self) -> Result<(), TopologyError> {
        let mut ready = self.lock_vhost_ready.lock().await;
        if *ready {
            return Ok(());
        }
        self.create_vhost_granted(
            CLAIM_LOCK_VHOST,
            "claim locks of the mailer operator; holds no pipeline",
        )
        .await
        .map_err(|e| {
            let user = &self.endpoint().username;
            self.error(
                &format!("create vhost {CLAIM_LOCK_VHOST:?} and grant {user:?} permissions there"),
                e,
            )
        })?;
        *ready = true;
        Ok(())
    }

    /// Declares the lock queue `name` for `holder`: `false` when another holds it. Sent
    /// as a plain PUT: a refusal is the expected answer to a lock held by another.
    async fn try_lock(&self, name: &str, holder: &str) -> Result<bool, TopologyError> {
        let body = json!({
            "durable": false,
            "auto_delete": false,
            "arguments": lock_arguments(holder),
        });
        let action = format!("declare the lock queue {name:?} in vhost {CLAIM_LOCK_VHOST:?}");
        match self
            .put_json(&["queues", CLAIM_LOCK_VHOST, name], &body, &action)
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
        let management = self.management;
        let removals = self.queues.iter().map(|name| async move {
            let removed = management
                .bounded_write(management.api.delete_queue(CLAIM_LOCK_VHOST, name, true))
                .await;
            if let Err(e) = removed {
                tracing::warn!(vhost = CLAIM_LOCK_VHOST, queue = %name, error = %e, "could not remove a claim lock; the broker expires it");
            }
        });
        futures::future::join_all(removals).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_named_by_its_claims_vhost_or_user_within_a_queue_names_length() {
        let long = Claim::Queue {
            vhost: "v".repeat(300),
            name: "q".repeat(300),
        };
        let name = lock_name(&long);
        assert!(name.starts_with(LOCK_PREFIX) && name.len() < 64, "{name}");
        // The claims of one vhost share its lock; another vhost's and a user's differ.
        let same_vhost = Claim::Exchange {
            vhost: "v".repeat(300),
            name: "x".into(),
        };
        assert_eq!(lock_name(&same_vhost), name);
        let other_vhost = Claim::Queue {
            vhost: "w".into(),
            name: "q".repeat(300),
        };
        assert_ne!(lock_name(&other_vhost), name);
        let user = Claim::User {
            name: "v".repeat(300),
        };
        assert_ne!(lock_name(&user), name);
        assert_ne!(
            lock_name(&Claim::User { name: "w".into() }),
            lock_name(&other_vhost),
            "a user named as a vhost has a lock of its own"
        );
    }
}
