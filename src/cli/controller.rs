//! `mailer controller`: its flags, and turning them into the operator's options.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, bail};

use crate::controller::context::{
    CLAIM_WINDOW, DEFAULT_CONCURRENCY, POLICY_WINDOW, QUEUE_DEPTH_INTERVAL,
};
use crate::controller::reconcile::apply::SHARED_DEFINITIONS_MAX_AGE;
use crate::controller::{LeaderOptions, Options, Settings};

/// Where the release images are published; the chart, `deploy/operator.yaml` and the
/// README name the same repository.
pub const IMAGE_REPOSITORY: &str = "ghcr.io/mailer-operator/mailer";
/// The release image of this build: [`IMAGE_REPOSITORY`] tagged with the crate version
/// (the chart's `appVersion`).
pub const DEFAULT_WORKER_IMAGE: &str =
    concat!("ghcr.io/mailer-operator/mailer:", env!("CARGO_PKG_VERSION"));

/// Where Kubernetes mounts the pod's namespace.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

#[derive(clap::Args, Debug)]
pub struct ControllerArgs {
    /// Namespaces to watch, comma-separated or repeated; all namespaces when absent.
    #[arg(long = "namespace", env = "MAILER_NAMESPACES", value_delimiter = ',')]
    namespaces: Vec<String>,
    /// How often every pipeline is compared with RabbitMQ, e.g. 5m or 30s; drift found
    /// then is repaired.
    #[arg(long, env = "MAILER_RESYNC_INTERVAL", default_value = "5m", value_parser = humantime::parse_duration)]
    resync_interval: Duration,
    /// How many pipelines are reconciled at once (per watched namespace): bounds the
    /// controller's memory and its load on the API server and the brokers at start and
    /// at each resync.
    #[arg(long, env = "MAILER_CONCURRENCY", default_value_t = DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// The worker image for pipelines that name none: normally the operator's own.
    #[arg(long, env = "MAILER_WORKER_IMAGE", default_value = DEFAULT_WORKER_IMAGE)]
    worker_image: String,
    /// This cluster's name, for operators of several clusters that share a broker: it is
    /// part of the workers' RabbitMQ user names and of the owner markers in the broker.
    /// Lowercase letters, digits and dashes; every cluster sharing a broker needs its own.
    #[arg(long, env = "MAILER_CLUSTER_NAME", default_value = "default")]
    cluster_name: String,
    /// Where /metrics, /livez and /readyz are served.
    #[arg(long, env = "MAILER_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Elect one active replica through a Lease; turn off only for a single replica.
    #[arg(long, env = "MAILER_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    /// The Lease's namespace; by default the pod's own.
    #[arg(long, env = "MAILER_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,
    /// The Lease's name.
    #[arg(long, env = "MAILER_LEASE_NAME", default_value = "mailer-operator")]
    lease_name: String,
    /// This replica's name in the Lease; by default the pod's name (POD_NAME or HOSTNAME).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// How long the Lease holds without renewal; a standby takes over after it.
    #[arg(long, env = "MAILER_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
    /// How often the leader renews the Lease and a standby tries for it.
    #[arg(long, env = "MAILER_LEASE_RETRY", default_value = "4s", value_parser = humantime::parse_duration)]
    lease_retry: Duration,
    /// On SIGTERM, how long reconciles in flight may take before they are aborted and
    /// the Lease released; shorter than --lease-duration.
    #[arg(long, env = "MAILER_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// How long after a pipeline's deletion a cleanup that failed for now (the broker
    /// unreachable) is retried before its finalizer is removed anyway, with an event
    /// that lists what was left.
    #[arg(long, env = "MAILER_CLEANUP_DEADLINE", default_value = "10m", value_parser = humantime::parse_duration)]
    cleanup_deadline: Duration,
}

impl ControllerArgs {
    pub fn into_options(self) -> Result<Options> {
        let valid_name = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
        if self.cluster_name.is_empty() || !self.cluster_name.chars().all(valid_name) {
            bail!(
                "--cluster-name (MAILER_CLUSTER_NAME) {:?} must be lowercase letters, digits and dashes",
                self.cluster_name
            );
        }
        if self.worker_image.trim().is_empty() {
            bail!("--worker-image (MAILER_WORKER_IMAGE) must name an image");
        }
        if self.resync_interval < Duration::from_secs(1) {
            bail!("--resync-interval must be at least 1s");
        }
        let leader = if self.leader_election {
            if self.drain_timeout >= self.lease_duration {
                bail!(
                    "--drain-timeout must be shorter than --lease-duration, so the leader still holds the Lease when it releases it"
                );
            }
            if self.lease_retry >= self.lease_duration {
                bail!(
                    "--lease-retry must be shorter than --lease-duration, or the Lease expires between renewals"
                );
            }
            let identity = self
                .identity
                .or_else(|| std::env::var("HOSTNAME").ok())
                .filter(|id| !id.is_empty());
            let Some(identity) = identity else {
                bail!("leader election needs this replica's name: set --identity or POD_NAME");
            };
            let lease_namespace = self
                .lease_namespace
                .or_else(|| std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE).ok())
                .map(|ns| ns.trim().to_string())
                .filter(|ns| !ns.is_empty());
            let Some(lease_namespace) = lease_namespace else {
                bail!(
                    "leader election needs the Lease's namespace: set --lease-namespace outside a pod"
                );
            };
            Some(LeaderOptions {
                lease_namespace,
                lease_name: self.lease_name,
                identity,
                lease_duration: self.lease_duration,
                retry_period: self.lease_retry,
            })
        } else {
            None
        };
        Ok(Options {
            namespaces: self
                .namespaces
                .into_iter()
                .filter(|ns| !ns.is_empty())
                .collect(),
            settings: Settings {
                worker_image: self.worker_image,
                resync_interval: self.resync_interval,
                concurrency: self.concurrency,
                cluster_name: self.cluster_name,
                queue_depth_interval: QUEUE_DEPTH_INTERVAL,
                definitions_max_age: SHARED_DEFINITIONS_MAX_AGE,
                cleanup_deadline: self.cleanup_deadline,
                policy_window: POLICY_WINDOW,
                claim_window: CLAIM_WINDOW,
            },
            metrics_addr: self.metrics_addr,
            leader,
            drain_timeout: self.drain_timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_worker_image_is_this_release() {
        assert_eq!(
            DEFAULT_WORKER_IMAGE,
            format!("{IMAGE_REPOSITORY}:{}", env!("CARGO_PKG_VERSION"))
        );
    }
}
