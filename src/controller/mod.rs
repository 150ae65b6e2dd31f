//! `mailer controller`: the operator. It reconciles every MailerPipeline into its
//! RabbitMQ topology, the workers' RabbitMQ user and a worker Deployment, and reports
//! what it found in the pipeline's status.
//!
//! Only the replica that holds the leader Lease reconciles. `/readyz` answers ready
//! while a replica stands by (the Lease is readable and held by another) and, once it
//! leads, when its caches of pipelines have synced; `/livez` follows a heartbeat of the
//! main loop.

pub mod broker;
pub mod context;
pub mod error;
#[cfg(test)]
pub mod fixtures;
pub mod key;
pub mod kube;
pub mod metrics;
pub mod objects;
pub mod reasons;
pub mod reconcile;
pub mod runtime;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ::kube::Client;
use ::kube::api::Api;
use k8s_openapi::api::coordination::v1::Lease;
use prometheus_client::registry::Registry;
use tokio::sync::watch as signal;

pub use context::{Context, Settings};
pub use error::Error;
pub use reconcile::{FINALIZER, error_policy, reconcile};

use crate::telemetry::{Health, spawn_server};
use metrics::Metrics;
use runtime::leader::LeaderElection;
use runtime::leader::{Renewal, keep_leading, wait_for_leadership};
use runtime::signalled;

/// How long the main loop may go without a heartbeat before `/livez` fails.
const STALL_AFTER: Duration = Duration::from_secs(60);

/// Leader election settings.
#[derive(Debug, Clone)]
pub struct LeaderOptions {
    pub lease_namespace: String,
    pub lease_name: String,
    /// This replica's name in the Lease, e.g. its pod name.
    pub identity: String,
    /// How long a Lease holds without renewal; a standby takes over after it.
    pub lease_duration: Duration,
    /// How often the leader renews, and a standby tries.
    pub retry_period: Duration,
}

/// How `mailer controller` runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The namespaces to watch; all when empty.
    pub namespaces: Vec<String>,
    pub settings: Settings,
    pub metrics_addr: SocketAddr,
    /// `None` runs without an election (a single replica, or local development).
    pub leader: Option<LeaderOptions>,
    /// After SIGTERM, how long reconciles in flight may take before they are aborted;
    /// shorter than the Lease, so the leader still holds it when it releases it.
    pub drain_timeout: Duration,
}

/// Runs the operator until SIGTERM or Ctrl-C, or until it loses the Lease (it then
/// exits with an error, to be restarted as a standby).
///
/// On SIGTERM no new reconcile starts, those in flight get `drain_timeout` to finish and
/// are then aborted; the leader renews the Lease meanwhile and releases it only once no
/// reconcile runs, so a standby never acts beside it. When the Lease is lost, every
/// reconcile in flight is aborted at once.
pub async fn run(options: Options) -> anyhow::Result<()> {
    crate::install_crypto_provider();
    let client = Client::try_default().await.map_err(|e| {
        anyhow::anyhow!(
            "cannot find the Kubernetes API ({e}); in a pod the controller uses its service account, elsewhere KUBECONFIG"
        )
    })?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let health = Health::new(STALL_AFTER);
    let _server = spawn_server(options.metrics_addr, Arc::new(registry), health.clone())
        .await
        .map_err(|e| anyhow::anyhow!("cannot serve metrics on {}: {e}", options.metrics_addr))?;

    let (stop_tx, stop) = signal::channel(false);
    let terminated = crate::telemetry::stop_signal()
        .map_err(|e| anyhow::anyhow!("cannot listen for SIGTERM and SIGINT: {e}"))?;
    tokio::spawn(async move {
        terminated.await;
        let _ = stop_tx.send(true);
    });

    let election = options.leader.as_ref().map(|l| {
        let api: Api<Lease> = Api::namespaced(client.clone(), &l.lease_namespace);
        (
            LeaderElection::new(api, &l.lease_name, &l.identity, l.lease_duration),
            l.retry_period,
        )
    });
    let mut acquired = None;
    if let Some((election, retry)) = &election {
        acquired = wait_for_leadership(election, *retry, &health, stop.clone()).await;
        if acquired.is_none() {
            return Ok(());
        }
        tracing::info!(identity = election.identity(), "leading: reconciling");
    }
    metrics.set_leader(true);

    let ctx = Arc::new(Context::new(
        client.clone(),
        metrics.clone(),
        options.settings.clone(),
        options.leader.as_ref().map(|l| l.identity.clone()),
    ));
    let (abort_tx, abort) = signal::channel(false);
    let (done_tx, done) = signal::channel(false);
    let renewing = async {
        let (Some((election, retry)), Some(at)) = (&election, acquired) else {
            return Renewal::Stopped;
        };
        let renewal = keep_leading(election, *retry, at, done.clone()).await;
        if renewal == Renewal::Lost {
            metrics.set_leader(false);
            let _ = abort_tx.send(true);
        }
        renewal
    };
    let draining = async {
        let (mut stop, mut done) = (stop.clone(), done.clone());
        tokio::select! {
            () = signalled(&mut stop) => {}
            () = signalled(&mut done) => return,
        }
        let drain = options.drain_timeout;
        tracing::info!(
            ?drain,
            "shutting down: no new reconciles; waiting for those in flight"
        );
        tokio::select! {
            () = tokio::time::sleep(drain) => {
                tracing::warn!(?drain, "reconciles still in flight after the drain timeout: aborting them");
                let _ = abort_tx.send(true);
            }
            () = signalled(&mut done) => {}
        }
    };
    let running = async {
        let namespaces = &options.namespaces;
        runtime::watch::run_controllers(
            client,
            namespaces,
            ctx,
            &health,
            stop.clone(),
            abort.clone(),
        )
        .await;
        let _ = done_tx.send(true);
    };
    let (renewal, (), ()) = tokio::join!(renewing, running, draining);
    metrics.set_leader(false);
    health.set_ready(false);
    if renewal == Renewal::Lost {
        anyhow::bail!("lost the leader Lease; restarting as a standby");
    }
    if let Some((election, _)) = &election
        && let Err(e) = election.release().await
    {
        tracing::warn!(error = %e, "could not release the leader Lease; a standby takes over when it expires");
    }
    Ok(())
}
