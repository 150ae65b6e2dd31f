//! `mailer controller`: the operator. It reconciles every MailerPipeline into its
//! RabbitMQ topology, the workers' RabbitMQ user and a worker Deployment, and reports
//! what it found in the pipeline's status.
//!
//! Only the replica that holds the leader Lease reconciles. `/readyz` answers ready
//! while a replica stands by (the Lease is readable and held by another) and, once it
//! leads, when its caches of pipelines have synced; `/livez` follows a heartbeat of the
//! main loop.

pub mod apply;
pub mod autoscaling;
pub mod cleanup;
pub mod connection;
pub mod context;
pub mod converge;
pub mod deployment;
pub mod desired;
pub mod error;
pub mod leader;
pub mod meta;
pub mod metrics;
pub mod ownership;
pub mod quantity;
pub mod reasons;
pub mod reconcile;
pub mod references;
pub mod report;
pub mod resolve;
pub mod ssa;
pub mod status;
pub mod tenancy;
pub mod validate;
pub mod watch;
pub mod worker_user;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use prometheus_client::registry::Registry;
use tokio::sync::watch as signal;

pub use context::{Context, Settings};
pub use error::Error;
pub use reconcile::{FINALIZER, error_policy, reconcile};

use crate::telemetry::{Health, spawn_server};
use leader::LeaderElection;
use metrics::Metrics;

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
}

/// Runs the operator until SIGTERM or Ctrl-C, or until it loses the Lease (it then
/// exits with an error, to be restarted as a standby).
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
    tokio::spawn(async move {
        wait_for_termination().await;
        tracing::info!("shutting down: finishing the reconciles in flight");
        let _ = stop_tx.send(true);
    });

    let election = options.leader.as_ref().map(|l| {
        let api: Api<Lease> = Api::namespaced(client.clone(), &l.lease_namespace);
        (
            LeaderElection::new(api, &l.lease_name, &l.identity, l.lease_duration),
            l.retry_period,
        )
    });
    if let Some((election, retry)) = &election {
        if !wait_for_leadership(election, *retry, &health, stop.clone()).await {
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
    let (lost_tx, lost) = signal::channel(false);
    let renewing = async {
        if let (Some((election, retry)), Some(leader)) = (&election, &options.leader) {
            keep_leading(
                election,
                *retry,
                leader.lease_duration,
                lost_tx,
                stop.clone(),
            )
            .await;
        }
    };
    let running = watch::run_controllers(
        client,
        &options.namespaces,
        ctx,
        &health,
        stop.clone(),
        lost.clone(),
    );
    tokio::join!(running, renewing);
    metrics.set_leader(false);
    health.set_ready(false);
    let lost_lease = *lost.borrow();
    if let Some((election, _)) = &election
        && let Err(e) = election.release().await
    {
        tracing::warn!(error = %e, "could not release the leader Lease; a standby takes over when it expires");
    }
    if lost_lease {
        anyhow::bail!("lost the leader Lease to another replica; restarting as a standby");
    }
    Ok(())
}

/// Tries for the Lease every `retry` until it is ours (`true`) or shutdown (`false`).
/// A standby is ready: it is doing its job, which is to wait.
async fn wait_for_leadership(
    election: &LeaderElection,
    retry: Duration,
    health: &Health,
    mut stop: signal::Receiver<bool>,
) -> bool {
    loop {
        health.beat();
        match election.try_lead().await {
            Ok(true) => {
                health.set_ready(false);
                return true;
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
            _ = stop.wait_for(|stopped| *stopped) => return false,
        }
    }
}

/// Renews the Lease every `retry` until shutdown; returns early (and says so on `lost`)
/// once another replica holds it, or when it could not be renewed for `lease_duration`.
async fn keep_leading(
    election: &LeaderElection,
    retry: Duration,
    lease_duration: Duration,
    lost: signal::Sender<bool>,
    mut stop: signal::Receiver<bool>,
) {
    let mut last_renewed = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep(retry) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        match election.try_lead().await {
            Ok(true) => last_renewed = tokio::time::Instant::now(),
            Ok(false) => break,
            Err(e) => {
                tracing::warn!(error = %e, "cannot renew the leader Lease");
                if last_renewed.elapsed() >= lease_duration {
                    break;
                }
            }
        }
    }
    tracing::error!("lost the leader Lease; stopping reconciles");
    let _ = lost.send(true);
}

/// Resolves on SIGTERM (what Kubernetes sends) or Ctrl-C.
async fn wait_for_termination() {
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(term) => term,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the controller");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
