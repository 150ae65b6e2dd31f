//! A worker process: its metrics and health served over HTTP, and its consume loop run
//! until SIGTERM or SIGINT.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use prometheus_client::registry::Registry;

use super::Worker;
use super::metrics::WorkerMetrics;
use crate::telemetry::{self, Health};

/// A worker whose main loop has not turned for this long is reported not live.
const STALL_AFTER: Duration = Duration::from_secs(60);

/// Serves `/metrics`, `/livez` and `/readyz` on `http_addr` and runs `worker` until a
/// signal stops it (`Ok`) or something fails that a restart may fix (`Err`).
pub async fn serve(worker: Worker, http_addr: SocketAddr) -> Result<()> {
    // Listening for the signals comes first, so that one arriving at any later moment,
    // connecting included, stops the worker as asked.
    let stop = telemetry::stop_signal().context("cannot listen for SIGTERM and SIGINT")?;
    let mut registry = Registry::default();
    let metrics = Arc::new(WorkerMetrics::register(&mut registry));
    let health = Health::new(STALL_AFTER);
    let server = telemetry::spawn_server(http_addr, Arc::new(registry), health.clone())
        .await
        .with_context(|| {
            format!("cannot serve metrics and health on {http_addr} (MAIL_HTTP_ADDR)")
        })?;
    let result = worker.run(metrics, health, stop).await;
    server.abort();
    Ok(result?)
}
