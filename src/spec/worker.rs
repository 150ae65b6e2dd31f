//! `spec.worker`: the worker pods, what they run and where.
//!
//! The pod fields use Kubernetes' own types, so they read and validate exactly as they
//! do on a Deployment.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::SecretReference;
use crate::mail;
use crate::message::size::{self, LimitError};

/// The workers that consume mail requests and send them.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerSpec {
    /// How many worker pods run. Ignored while `autoscaling` is set: KEDA decides then.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// Attempts before a request that keeps failing for now is dead-lettered as
    /// `gave-up`.
    #[serde(default = "default_max_attempts")]
    #[schemars(range(min = 1))]
    pub max_attempts: u32,
    /// Unacknowledged deliveries each worker holds, and so sends, at once.
    #[serde(default = "default_prefetch")]
    #[schemars(range(min = 1))]
    pub prefetch: u16,
    /// The largest mail request the workers read, in bytes or as a quantity, e.g. `32Mi`
    /// (1Ki to 512Mi; 10Mi when absent). A larger request is dead-lettered as `too-large`.
    /// RabbitMQ refuses any message over its `max_message_size` (16 MiB by default on
    /// RabbitMQ 4, 128 MiB on 3.x), which the operator cannot change: raise it on the
    /// broker for larger requests. Each worker holds up to `prefetch` requests at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_request_size: Option<Quantity>,
    /// Where mail goes: a key of a Secret that holds the provider URL, e.g.
    /// `smtp://user:pass@smtp.example.com:587?tls=required`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderSpec>,
    /// The container image of the workers. By default the operator's own image, which
    /// holds the same `mailer` binary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
    /// When the kubelet pulls the image: `Always`, `IfNotPresent` or `Never`. Kubernetes'
    /// default when absent (`Always` for `:latest`, else `IfNotPresent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,
    /// Secrets with registry credentials to pull the image with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// CPU and memory requests and limits of the worker container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Labels a node must have for a worker pod to run on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Taints the worker pods tolerate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Node and pod affinity and anti-affinity of the worker pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Annotations added to the worker pods (e.g. for a service mesh or log shipper).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_annotations: Option<BTreeMap<String, String>>,
    /// The ServiceAccount the worker pods run as; the namespace's `default` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// How long a stopping worker may take to finish the mail it is sending before it is
    /// killed; the worker stops waiting a little earlier (up to 10s) to close cleanly.
    /// Mail cut off is not lost (it is redelivered) but may be sent twice.
    #[serde(default = "default_termination_grace_period_seconds")]
    #[schemars(range(min = 1))]
    pub termination_grace_period_seconds: i64,
    /// An existing RabbitMQ user for the workers: a Secret in the pipeline's namespace
    /// with the keys `username` and `password`; its permissions are left as they are
    /// (the workers need read on `queue` and write on `retryExchange` and `deadExchange`).
    /// When absent, the operator creates a user that may only read the send queue and
    /// write to the retry and dead exchanges, and keeps its generated password in a
    /// Secret it owns; setting this later removes that user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_secret: Option<SecretReference>,
    /// Scale the workers by the depth of the send queue, with KEDA (which must be
    /// installed: https://keda.sh). The operator makes a ScaledObject and a
    /// TriggerAuthentication named after the worker Deployment, and leaves the
    /// Deployment's replicas to KEDA's HorizontalPodAutoscaler. Without it, `replicas`
    /// workers run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingSpec>,
}

/// Scaling of the workers by the mail waiting in the send queue.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = kube::core::Rule::new("self.minReplicas <= self.maxReplicas")
    .message("minReplicas must not be above maxReplicas")
    .reason(kube::core::Reason::FieldValueInvalid))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AutoscalingSpec {
    /// The fewest workers. 0 stops every worker while the send queue is empty; the first
    /// mail then waits until KEDA looks again (every 30s by default) and starts one.
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = 0))]
    pub min_replicas: i32,
    /// The most workers.
    #[schemars(range(min = 1))]
    pub max_replicas: i32,
    /// Mail requests waiting in the send queue per worker: KEDA runs enough workers that
    /// each has at most this many waiting (between minReplicas and maxReplicas).
    #[serde(default = "default_messages_per_worker")]
    #[schemars(range(min = 1))]
    pub messages_per_worker: u32,
}

impl Default for WorkerSpec {
    fn default() -> Self {
        Self {
            replicas: default_replicas(),
            max_attempts: default_max_attempts(),
            prefetch: default_prefetch(),
            max_request_size: None,
            provider: None,
            image: None,
            image_pull_policy: None,
            image_pull_secrets: None,
            resources: None,
            node_selector: None,
            tolerations: None,
            affinity: None,
            pod_annotations: None,
            service_account_name: None,
            termination_grace_period_seconds: default_termination_grace_period_seconds(),
            user_secret: None,
            autoscaling: None,
        }
    }
}

impl WorkerSpec {
    /// The largest request the workers read, in bytes: `maxRequestSize`, or the default.
    pub fn max_request_bytes(&self) -> Result<usize, LimitError> {
        self.max_request_size
            .as_ref()
            .map_or(Ok(mail::DEFAULT_MAX_REQUEST_BYTES), |size| {
                size::parse_limit(&size.0)
            })
    }
}

/// When the kubelet pulls the worker image.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum ImagePullPolicy {
    /// Pull on every pod start.
    Always,
    /// Pull only when the node does not have the image.
    IfNotPresent,
    /// Never pull; the image must already be on the node.
    Never,
}

impl ImagePullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// Where the workers send mail.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderSpec {
    /// The Secret key that holds the provider URL: `smtp://`, `smtps://`, an HTTP API's
    /// (`ses://`, `sendgrid://`, `postmark://`, `mailgun://`), `file://` or `discard://`.
    pub url_secret_key_ref: SecretKeySelector,
    /// A CA certificate (PEM) the workers trust for TLS to the provider, besides the
    /// public CAs: a key of a Secret in the pipeline's namespace, e.g. the `ca.crt` of a
    /// cert-manager certificate, for an internal relay. Mounted read-only into the
    /// workers; changing it rolls them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_key_ref: Option<SecretKeySelector>,
    /// The most mails per second the whole pipeline sends, e.g. `14` for a new SES
    /// account; no limit when absent. Each worker pod sends at most `rateLimit / replicas`
    /// mails a second, or `rateLimit / autoscaling.maxReplicas` under autoscaling (the
    /// count KEDA may reach, so the pipeline stays under the limit however many pods run;
    /// with fewer pods it sends slower than it may). Over its share a worker waits before
    /// sending: it parks nothing and spends no attempt. The operator passes the share as
    /// `MAIL_RATE_LIMIT`, so changing this, `replicas` or `maxReplicas` rolls the workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub rate_limit: Option<u32>,
}

impl WorkerSpec {
    /// The mails per second each worker pod sends at most (`MAIL_RATE_LIMIT`): the
    /// provider's `rateLimit` shared by `replicas`, or by `autoscaling.maxReplicas`. `None`
    /// without a limit, or without pods.
    pub fn rate_per_replica(&self) -> Option<f64> {
        let rate = self.provider.as_ref()?.rate_limit?;
        let pods = match &self.autoscaling {
            Some(autoscaling) => autoscaling.max_replicas,
            None => self.replicas,
        };
        (pods > 0 && rate > 0).then(|| f64::from(rate) / f64::from(pods))
    }
}

/// One key of a Secret in the pipeline's namespace.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeySelector {
    /// The Secret's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The key within the Secret.
    #[schemars(length(min = 1))]
    pub key: String,
}

fn default_replicas() -> i32 {
    1
}
fn default_min_replicas() -> i32 {
    1
}
/// About what one worker sends in a few seconds with the default prefetch.
fn default_messages_per_worker() -> u32 {
    100
}
fn default_max_attempts() -> u32 {
    mail::DEFAULT_MAX_ATTEMPTS
}
fn default_prefetch() -> u16 {
    mail::DEFAULT_PREFETCH
}
/// Long enough for a full prefetch of mail to go out over a slow SMTP server.
fn default_termination_grace_period_seconds() -> i64 {
    120
}
