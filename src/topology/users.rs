//! A pipeline's own RabbitMQ user: created with least privilege, checked without a
//! write when it already is as asked, and removed with the pipeline.
//!
//! RabbitMQ never returns a password, only its salted hash, so whether the user's
//! password is still the one the operator keeps is decided by hashing that password with
//! the stored salt, the way the broker does.

use std::collections::HashMap;
use std::fmt;
use std::sync::{MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use rabbitmq_http_client::password_hashing::{
    HashingAlgorithm, base64_encoded_salted_password_hash, salt,
};
use rabbitmq_http_client::requests::{Permissions as PermissionParams, UserParams};

use super::desired::{exact_alternatives, exact_pattern};
use super::error::TopologyError;
use super::management::Management;
use crate::spec::TopologySpec;

/// What a user may do in one vhost, as three regular expressions over resource names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    /// Which exchanges and queues the user may declare or delete.
    pub configure: String,
    /// Which exchanges the user may publish to.
    pub write: String,
    /// Which queues the user may consume from.
    pub read: String,
}

impl Permissions {
    /// Least privilege for a worker: consume from the send queue, publish to the retry
    /// and dead exchanges, declare nothing. The patterns are anchored and escaped, so
    /// `mail.send` does not also grant `mail-send` or `mail.send.retry`.
    pub fn for_worker(topology: &TopologySpec) -> Self {
        Self {
            configure: "^$".to_string(),
            write: exact_alternatives(&[&topology.retry_exchange, &topology.dead_exchange]),
            read: exact_pattern(&topology.queue),
        }
    }
}

/// A user who should exist with `password`, no tags, and `permissions` on `vhost`.
#[derive(Clone, Copy)]
pub struct UserGrant<'a> {
    pub username: &'a str,
    pub password: &'a str,
    pub vhost: &'a str,
    pub permissions: &'a Permissions,
}

impl fmt::Debug for UserGrant<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserGrant")
            .field("username", &self.username)
            .field("password", &crate::redact::MASK)
            .field("vhost", &self.vhost)
            .field("permissions", self.permissions)
            .finish()
    }
}

/// One write made to bring a user to its grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserChange {
    CreateUser(String),
    /// The user existed with another password or with tags; both were set again.
    ResetUser(String),
    SetPermissions {
        user: String,
        vhost: String,
    },
    /// A user made before and no longer used.
    DeleteUser(String),
    /// The user's permissions on a vhost it no longer uses.
    RemovePermissions {
        user: String,
        vhost: String,
    },
}

impl fmt::Display for UserChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CreateUser(user) => write!(f, "create user {user:?}"),
            Self::ResetUser(user) => write!(f, "reset the password and tags of user {user:?}"),
            Self::SetPermissions { user, vhost } => {
                write!(f, "set the permissions of user {user:?} on vhost {vhost:?}")
            }
            Self::DeleteUser(user) => write!(f, "delete user {user:?}"),
            Self::RemovePermissions { user, vhost } => {
                write!(
                    f,
                    "remove the permissions of user {user:?} on vhost {vhost:?}"
                )
            }
        }
    }
}

impl Management {
    /// Makes the user exist as `grant` says and returns what was changed: nothing, and no
    /// write, when it already did. The vhost must exist.
    pub async fn ensure_user(
        &self,
        grant: &UserGrant<'_>,
    ) -> Result<Vec<UserChange>, TopologyError> {
        let user = grant.username;
        let mut changes = Vec::new();
        let existing = match self.read(self.api.get_user(user)).await {
            Ok(found) => Some(found),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(self.error(&format!("read user {user:?}"), e)),
        };
        let in_order = existing.as_ref().is_some_and(|found| {
            found.tags.is_empty()
                && found
                    .password_hash
                    .as_ref()
                    .is_some_and(|hash| password_matches(hash.as_str(), grant.password))
        });
        if !in_order {
            let hash = base64_encoded_salted_password_hash(
                &salt(),
                grant.password,
                &HashingAlgorithm::SHA256,
            );
            let params = UserParams {
                name: user,
                password_hash: &hash,
                tags: "",
            };
            self.bounded_write(self.api.create_user(&params))
                .await
                .map_err(|e| self.error(&format!("create user {user:?}"), e))?;
            changes.push(match existing {
                None => UserChange::CreateUser(user.to_string()),
                Some(_) => UserChange::ResetUser(user.to_string()),
            });
        }

        let wanted = grant.permissions;
        let current = match self.read(self.api.get_permissions(grant.vhost, user)).await {
            Ok(p) => Some(Permissions {
                configure: p.configure,
                write: p.write,
                read: p.read,
            }),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(self.error(&format!("read the permissions of {user:?}"), e)),
        };
        if current.as_ref() != Some(wanted) {
            let params = PermissionParams {
                user,
                vhost: grant.vhost,
                configure: &wanted.configure,
                write: &wanted.write,
                read: &wanted.read,
            };
            self.bounded_write(self.api.declare_permissions(&params))
                .await
                .map_err(|e| self.error(&format!("set the permissions of {user:?}"), e))?;
            changes.push(UserChange::SetPermissions {
                user: user.to_string(),
                vhost: grant.vhost.to_string(),
            });
        }
        Ok(changes)
    }

    /// Grants the operator's own user (this client's) full permissions on `vhost` when
    /// the vhost exists and the user has none there: the grant made when the vhost was
    /// created may have failed, and is re-checked on every pass, or at most every
    /// `max_age` once found (work running at once shares the finding, as it shares
    /// definitions). Permissions someone set on purpose are left as they are. Returns
    /// whether it granted them; `false` too when the user may not read permissions (it
    /// is not an administrator).
    pub async fn ensure_own_grant(
        &self,
        vhost: &str,
        max_age: Duration,
    ) -> Result<bool, TopologyError> {
        let found_within = |at: &Instant| at.elapsed() < max_age;
        if self.own_grants().get(vhost).is_some_and(found_within) {
            return Ok(false);
        }
        let user = self.endpoint().username.clone();
        match self.read(self.api.get_permissions(vhost, &user)).await {
            Ok(_) => {
                self.own_grants().insert(vhost.to_string(), Instant::now());
                return Ok(false);
            }
            Err(e) if e.is_forbidden() => return Ok(false),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(self.error(&format!("read the permissions of {user:?}"), e)),
        }
        match self.read(self.api.get_vhost(vhost)).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => return Ok(false),
            Err(e) => return Err(self.error(&format!("read vhost {vhost:?}"), e)),
        }
        self.bounded_write(self.api.grant_full_permissions(&user, vhost))
            .await
            .map_err(|e| self.error(&format!("grant {user:?} permissions on {vhost:?}"), e))?;
        self.own_grants().insert(vhost.to_string(), Instant::now());
        Ok(true)
    }

    /// By vhost, when this client's user was last found (or made) granted there.
    pub(in crate::topology) fn own_grants(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        self.own_grants
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes `user`'s permissions on `vhost`; `false` when it had none.
    pub async fn remove_permissions(&self, user: &str, vhost: &str) -> Result<bool, TopologyError> {
        match self.read(self.api.get_permissions(vhost, user)).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => return Ok(false),
            Err(e) => return Err(self.error(&format!("read the permissions of {user:?}"), e)),
        }
        self.bounded_write(self.api.clear_permissions(vhost, user, true))
            .await
            .map_err(|e| self.error(&format!("remove the permissions of {user:?}"), e))?;
        Ok(true)
    }

    /// Removes a user; `false` when there was none.
    pub async fn delete_user(&self, username: &str) -> Result<bool, TopologyError> {
        match self.read(self.api.get_user(username)).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => return Ok(false),
            Err(e) => return Err(self.error(&format!("read user {username:?}"), e)),
        }
        self.bounded_write(self.api.delete_user(username, true))
            .await
            .map_err(|e| self.error(&format!("delete user {username:?}"), e))?;
        Ok(true)
    }
}

/// Whether `password`, salted and hashed as RabbitMQ does (a 4-byte salt followed by
/// SHA-256 or SHA-512 of salt and password, in base64), gives `stored_hash`.
pub fn password_matches(stored_hash: &str, password: &str) -> bool {
    const SALT_BYTES: usize = 4;
    let Ok(decoded) = BASE64.decode(stored_hash) else {
        return false;
    };
    let algorithm = match decoded.len().checked_sub(SALT_BYTES) {
        Some(32) => HashingAlgorithm::SHA256,
        Some(64) => HashingAlgorithm::SHA512,
        _ => return false,
    };
    base64_encoded_salted_password_hash(&decoded[..SALT_BYTES], password, &algorithm) == stored_hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_may_read_the_send_queue_and_write_the_retry_and_dead_exchanges_only() {
        let p = Permissions::for_worker(&TopologySpec::default());
        assert_eq!(p.configure, "^$");
        assert_eq!(p.write, r"^(mail\.retry|mail\.dead)$");
        assert_eq!(p.read, r"^mail\.send$");
    }

    #[test]
    fn a_stored_hash_is_checked_with_its_own_salt() {
        for algorithm in [HashingAlgorithm::SHA256, HashingAlgorithm::SHA512] {
            let hash = base64_encoded_salted_password_hash(&[1, 2, 3, 4], "s3cret", &algorithm);
            assert!(password_matches(&hash, "s3cret"));
            assert!(!password_matches(&hash, "s3cret!"));
        }
        assert!(!password_matches("not base64!", "s3cret"));
        assert!(!password_matches(&BASE64.encode([0u8; 10]), "s3cret"));
    }

    #[test]
    fn a_grant_never_shows_its_password() {
        let permissions = Permissions::for_worker(&TopologySpec::default());
        let grant = UserGrant {
            username: "u",
            password: "hunter2",
            vhost: "v",
            permissions: &permissions,
        };
        assert!(!format!("{grant:?}").contains("hunter2"));
    }
}
