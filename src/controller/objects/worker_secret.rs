//! The RabbitMQ user the workers connect as, and the Secret that hands it to them.
//!
//! Unless `spec.worker.userSecret` names an existing user, the operator makes one per
//! pipeline, with a generated password that it keeps in a Secret the pipeline owns. The
//! password is generated once: later reconciles read it back from that Secret. Either
//! way the Secret holds the full AMQP URL the workers use (`MAIL_AMQP_URL`).

use std::fmt;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use ring::rand::{SecureRandom, SystemRandom};

use crate::amqp::address::AmqpAddress;
use crate::controller::error::Error;
use crate::controller::kube::secrets::secret_value;
use crate::controller::objects::meta::owned_meta;
use crate::spec::MailerPipeline;

pub const USERNAME_KEY: &str = "username";
pub const PASSWORD_KEY: &str = "password";
/// The key of the full AMQP URL, with credentials and vhost.
pub const URL_KEY: &str = "url";
/// On the worker Secret, for people: `"true"` when the operator created the user. The
/// operator never reads it back: what it made is what its owner markers in the broker
/// say (the Secret is the tenant's to write).
pub const MANAGED_ANNOTATION: &str = "mailer.dev/user-managed";

const PASSWORD_LENGTH: usize = 32;
const PASSWORD_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// The user the workers connect as, as validated: the one `spec.worker.userSecret`
/// names with its password, or the operator's own with the password its Secret keeps
/// (none for a new one: the desired phase makes one, see [`WorkerUser::credentials`]).
#[derive(Clone, PartialEq, Eq)]
pub struct WorkerUser {
    pub username: String,
    pub password: Option<String>,
    /// Whether the operator creates, repairs and deletes this user.
    pub managed: bool,
}

impl WorkerUser {
    /// The user with a password: its own, or one `generate` makes.
    pub fn credentials(&self, generate: impl FnOnce() -> String) -> WorkerCredentials {
        WorkerCredentials {
            username: self.username.clone(),
            password: self.password.clone().unwrap_or_else(generate),
            managed: self.managed,
        }
    }
}

impl fmt::Debug for WorkerUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerUser")
            .field("username", &self.username)
            .field(
                "password",
                &self.password.as_ref().map(|_| crate::redact::MASK),
            )
            .field("managed", &self.managed)
            .finish()
    }
}

/// The user the workers connect as, with its password.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkerCredentials {
    pub username: String,
    pub password: String,
    /// Whether the operator creates, repairs and deletes this user.
    pub managed: bool,
}

impl fmt::Debug for WorkerCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerCredentials")
            .field("username", &self.username)
            .field("password", &crate::redact::MASK)
            .field("managed", &self.managed)
            .finish()
    }
}

/// The name of the Secret the pipeline owns that holds the workers' broker URL.
pub fn secret_name(pipeline: &MailerPipeline) -> String {
    format!("{}-worker-amqp", pipeline.name_any())
}

/// The user the operator makes for a pipeline: `mailer-worker.<cluster>.<namespace>.<name>`.
/// Cluster names (`--cluster-name`) and namespaces hold no dots, so names of different
/// pipelines never collide, also when operators of several clusters share a broker.
pub fn managed_username(cluster: &str, pipeline: &MailerPipeline) -> String {
    format!(
        "mailer-worker.{cluster}.{}.{}",
        pipeline.namespace().unwrap_or_default(),
        pipeline.name_any()
    )
}

/// The operator's user, with the password `existing` (its worker Secret) keeps for it:
/// only one kept for this very user name.
pub fn managed_user(
    cluster: &str,
    pipeline: &MailerPipeline,
    existing: Option<&Secret>,
) -> WorkerUser {
    let username = managed_username(cluster, pipeline);
    let kept = existing
        .filter(|secret| secret_value(secret, USERNAME_KEY).as_deref() == Some(&username))
        .and_then(|secret| secret_value(secret, PASSWORD_KEY))
        .filter(|password| !password.is_empty());
    WorkerUser {
        password: kept,
        username,
        managed: true,
    }
}

/// A random password of letters and digits, from the operating system's generator.
pub fn generate_password() -> String {
    let random = SystemRandom::new();
    let mut password = String::with_capacity(PASSWORD_LENGTH);
    let mut bytes = [0u8; 64];
    while password.len() < PASSWORD_LENGTH {
        if random.fill(&mut bytes).is_err() {
            // The system generator does not fail on any platform ring supports; should it,
            // an empty fill is retried rather than weakening the password.
            continue;
        }
        // Bytes at or above the largest multiple of the alphabet's length are skipped, so
        // every character is equally likely.
        let limit = (256 / PASSWORD_ALPHABET.len() * PASSWORD_ALPHABET.len()) as u8;
        for byte in bytes.iter().filter(|b| **b < limit) {
            if password.len() == PASSWORD_LENGTH {
                break;
            }
            password.push(char::from(
                PASSWORD_ALPHABET[usize::from(*byte) % PASSWORD_ALPHABET.len()],
            ));
        }
    }
    password
}

/// The workers' AMQP URL: the broker's AMQP address, the workers' credentials, the vhost.
pub fn amqp_url(amqp: &AmqpAddress, credentials: &WorkerCredentials, vhost: &str) -> String {
    amqp.url(&credentials.username, &credentials.password, vhost)
}

/// The Secret the pipeline owns with the workers' user and URL.
pub fn desired_secret(
    pipeline: &MailerPipeline,
    credentials: &WorkerCredentials,
    amqp_url: &str,
) -> Result<Secret, Error> {
    let mut metadata = owned_meta(pipeline, secret_name(pipeline))?;
    metadata.annotations = Some(
        [(
            MANAGED_ANNOTATION.to_string(),
            credentials.managed.to_string(),
        )]
        .into(),
    );
    let entry = |key: &str, value: &str| (key.to_string(), ByteString(value.as_bytes().to_vec()));
    Ok(Secret {
        metadata,
        type_: Some("Opaque".to_string()),
        data: Some(
            [
                entry(USERNAME_KEY, &credentials.username),
                entry(PASSWORD_KEY, &credentials.password),
                entry(URL_KEY, amqp_url),
            ]
            .into(),
        ),
        ..Secret::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline() -> MailerPipeline {
        crate::controller::fixtures::pipeline("{}")
    }

    #[test]
    fn the_password_is_generated_once_and_then_kept() {
        let p = pipeline();
        let new = managed_user("default", &p, None);
        assert_eq!(new.username, "mailer-worker.default.prod.shop");
        assert_eq!(new.password, None);
        assert!(new.managed);
        let first = new.credentials(|| "generated".into());
        assert_eq!(first.password, "generated");
        let secret = desired_secret(&p, &first, "amqp://x").unwrap();
        let again = managed_user("default", &p, Some(&secret))
            .credentials(|| panic!("must not regenerate"));
        assert_eq!(again, first);
    }

    #[test]
    fn a_secret_for_another_user_does_not_lend_its_password() {
        let p = pipeline();
        let other = WorkerCredentials {
            username: "someone-else".into(),
            password: "theirs".into(),
            managed: false,
        };
        let secret = desired_secret(&p, &other, "amqp://x").unwrap();
        let user = managed_user("default", &p, Some(&secret));
        assert_eq!(user.password, None);
    }

    #[test]
    fn the_secret_holds_the_url_and_is_owned_by_the_pipeline() {
        let p = pipeline();
        let creds = managed_user("default", &p, None).credentials(|| "pw".into());
        let endpoint =
            crate::topology::ManagementEndpoint::with_credentials("http://rmq:15672", "admin", "a")
                .unwrap();
        let url = amqp_url(&endpoint.amqp_address(), &creds, "shop/eu");
        assert_eq!(
            url,
            "amqp://mailer%2Dworker%2Edefault%2Eprod%2Eshop:pw@rmq:5672/shop%2Feu"
        );
        let secret = desired_secret(&p, &creds, &url).unwrap();
        assert_eq!(secret.metadata.name.as_deref(), Some("shop-worker-amqp"));
        assert_eq!(
            secret_value(&secret, URL_KEY).as_deref(),
            Some(url.as_str())
        );
        let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("MailerPipeline", Some(true))
        );
        assert_eq!(
            secret.metadata.annotations.unwrap()[MANAGED_ANNOTATION],
            "true"
        );
        assert!(!format!("{creds:?}").contains("pw\""));
    }

    #[test]
    fn generated_passwords_are_long_alphanumeric_and_different() {
        let a = generate_password();
        let b = generate_password();
        assert_eq!(a.len(), PASSWORD_LENGTH);
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }
}
