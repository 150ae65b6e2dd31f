//! `mailer worker`'s loop run in the test's process, with a provider of the test's own.

use std::sync::Arc;
use std::time::Duration;

use mailer::provider::Provider;
use mailer::telemetry::Health;
use mailer::worker::config::{RetryTiers, Timeouts};
use mailer::worker::metrics::WorkerMetrics;
use mailer::worker::{Worker, WorkerError};
use prometheus_client::registry::Registry;

/// A worker running in this process, with a provider of the test's own.
pub struct InProcess {
    pub registry: Arc<Registry>,
    pub health: Arc<Health>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub run: tokio::task::JoinHandle<Result<(), WorkerError>>,
}

impl InProcess {
    pub fn start(amqp_url: &str, provider: Arc<dyn Provider>, prefetch: u16) -> Self {
        Self::start_tiered(amqp_url, provider, prefetch, RetryTiers::one("mail.send"))
    }

    /// [`start`](Self::start) for a pipeline of delay tiers (`RetryTiers::of_topology`).
    pub fn start_tiered(
        amqp_url: &str,
        provider: Arc<dyn Provider>,
        prefetch: u16,
        retry_tiers: RetryTiers,
    ) -> Self {
        let mut registry = Registry::default();
        let metrics = Arc::new(WorkerMetrics::register(&mut registry));
        let health = Health::new(Duration::from_secs(60));
        let worker = Worker {
            amqp_url: amqp_url.to_string(),
            user: "guest".into(),
            provider,
            max_attempts: 5,
            max_request_bytes: mailer::mail::DEFAULT_MAX_REQUEST_BYTES,
            prefetch,
            queue: "mail.send".into(),
            retry_exchange: "mail.retry".into(),
            retry_tiers,
            dead_exchange: "mail.dead".into(),
            send_key: "mail.send".into(),
            timeouts: Timeouts::default(),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(worker.run(metrics, health.clone(), async {
            let _ = stopped.await;
        }));
        Self {
            registry: Arc::new(registry),
            health,
            stop: Some(stop),
            run,
        }
    }

    /// `mailer_worker_deliveries_total{outcome}` now.
    pub fn settled(&self, outcome: &str) -> u64 {
        settled(&self.registry, outcome)
    }

    pub async fn stop(mut self) -> Result<(), WorkerError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), self.run)
            .await
            .expect("the worker stops within 30s")
            .expect("the worker's task")
    }
}

/// `mailer_worker_deliveries_total{outcome}` in `registry` now.
pub fn settled(registry: &Registry, outcome: &str) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
    let series = format!("mailer_worker_deliveries_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}
