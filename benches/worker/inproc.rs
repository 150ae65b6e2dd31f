//! The worker in this process: `Worker::run`, exactly as `mailer worker` runs it, timed
//! from the moment it consumes until its metrics count every request settled.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use mailer::provider::Provider;
use mailer::telemetry::Health;
use mailer::worker::Worker;
use mailer::worker::config::{RetryTiers, Timeouts};
use mailer::worker::metrics::{OutcomeLabel, WorkerMetrics};
use prometheus_client::registry::Registry;

use crate::broker::{BenchVhost, PREFETCH, USER};

/// How long one run may take before the bench gives up on it.
const RUN_LIMIT: Duration = Duration::from_secs(120);
/// How often the metrics are read while a run is under way.
const POLL: Duration = Duration::from_millis(2);

/// Runs a worker on `vhost`'s send queue until its metrics count `n` deliveries settled
/// with `outcome` (`Sent` or `Parked`), then stops it. Returns the time from consume-ok
/// to the last settle.
pub async fn run_worker(
    vhost: &BenchVhost,
    provider: Arc<dyn Provider>,
    n: usize,
    outcome: &str,
) -> Result<Duration> {
    let mut registry = Registry::default();
    let metrics = Arc::new(WorkerMetrics::register(&mut registry));
    let health = Health::new(Duration::from_secs(60));
    let t = &vhost.topology;
    let worker = Worker {
        amqp_url: vhost.amqp_url(),
        user: USER.into(),
        provider,
        max_attempts: mailer::mail::DEFAULT_MAX_ATTEMPTS,
        max_request_bytes: mailer::mail::DEFAULT_MAX_REQUEST_BYTES,
        prefetch: PREFETCH,
        queue: t.queue.clone(),
        retry_exchange: t.retry_exchange.clone(),
        retry_tiers: RetryTiers::one(&t.queue),
        dead_exchange: t.dead_exchange.clone(),
        send_key: t.queue.clone(),
        timeouts: Timeouts::default(),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = worker.run(metrics.clone(), health.clone(), async {
        let _ = stopped.await;
    });
    tokio::pin!(run);

    let measure = async {
        let deadline = Instant::now() + RUN_LIMIT;
        while !health.is_ready() {
            if Instant::now() > deadline {
                bail!("the worker did not start consuming");
            }
            tokio::time::sleep(POLL).await;
        }
        let started = Instant::now();
        loop {
            // Read from the counters: encoding the registry each time would cost the
            // worker's runs CPU that the bare loop's do not pay.
            let counts = settled(&metrics);
            let total: u64 = counts.values().sum();
            if total >= n as u64 {
                let took = started.elapsed();
                if counts.get(outcome).copied() != Some(n as u64) {
                    bail!("expected {n} deliveries {outcome}, the worker settled {counts:?}");
                }
                return Ok(took);
            }
            if Instant::now() > deadline {
                bail!("the worker settled only {counts:?} of {n} in {RUN_LIMIT:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    };
    let measured = tokio::select! {
        ended = &mut run => return Err(anyhow!("the worker stopped before it was done: {ended:?}")),
        measured = measure => measured,
    };
    let _ = stop.send(());
    run.await
        .map_err(|e| anyhow!("the worker failed to stop: {e}"))?;
    measured
}

/// `mailer_worker_deliveries_total` by outcome, those counted so far.
fn settled(metrics: &WorkerMetrics) -> BTreeMap<&'static str, u64> {
    OutcomeLabel::ALL
        .iter()
        .copied()
        .map(|outcome| (outcome.as_str(), metrics.settled_count(outcome)))
        .filter(|(_, count)| *count > 0)
        .collect()
}

/// `mailer_worker_deliveries_total` by outcome, from the Prometheus text format.
pub fn deliveries_in(text: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("mailer_worker_deliveries_total{outcome=\"") else {
            continue;
        };
        let Some((outcome, rest)) = rest.split_once('"') else {
            continue;
        };
        let value = rest.rsplit(' ').next().unwrap_or("");
        if let Ok(value) = value.parse::<f64>() {
            counts.insert(outcome.to_string(), value as u64);
        }
    }
    counts
}
