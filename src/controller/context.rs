//! What every reconcile shares: the Kubernetes client, the event recorder, the metrics,
//! the settings, and each pipeline's count of failures in a row for its backoff.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::core::DeserializeGuard;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;

use super::meta::FIELD_MANAGER;
use super::metrics::Metrics;
use crate::spec::MailerPipeline;
use crate::text::truncate_bytes;

/// The first delay after a transient failure; it doubles with each failure in a row.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(5);
/// The longest delay after transient failures.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How the controller was told to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The worker image when a pipeline names none: the operator's own.
    pub worker_image: String,
    /// How often every pipeline is compared with RabbitMQ even when nothing changed in
    /// Kubernetes, and how long a pipeline that cannot work waits before it is tried
    /// again (a change of it, or of a Secret it names, tries it at once).
    pub resync_interval: Duration,
    /// `--cluster-name`: part of the workers' user names and of owner markers.
    pub cluster_name: String,
    /// The least time between two readings of a pipeline's queue depths (so between
    /// two status writes for depths alone); 30s.
    pub queue_depth_interval: Duration,
    /// How long after a pipeline's `deletionTimestamp` a cleanup that failed for now
    /// (the broker unreachable) is retried before the finalizer goes anyway.
    pub cleanup_deadline: Duration,
}

/// How often queue depths are read at most, per pipeline.
pub const QUEUE_DEPTH_INTERVAL: Duration = Duration::from_secs(30);

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    /// One recorder for the process, so repeats of an event about the same object
    /// version are counted in one Event (a series) instead of piling up.
    recorder: Recorder,
    pub metrics: Metrics,
    pub settings: Settings,
    failures: Mutex<HashMap<String, u32>>,
    /// The controllers' caches of pipelines (one per watched namespace, or one for all).
    stores: Mutex<Vec<Store<DeserializeGuard<MailerPipeline>>>>,
    /// When each pipeline's queue depths were last read.
    depths_read: Mutex<HashMap<String, Instant>>,
    /// When each pipeline's `DeadLettersGrew` was last published.
    dead_letters_told: Mutex<HashMap<String, Instant>>,
}

impl Context {
    pub fn new(
        client: Client,
        metrics: Metrics,
        settings: Settings,
        instance: Option<String>,
    ) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_string(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            settings,
            failures: Mutex::new(HashMap::new()),
            stores: Mutex::new(Vec::new()),
            depths_read: Mutex::new(HashMap::new()),
            dead_letters_told: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `key`'s queue depths are due to be read (and they count as read now).
    pub fn queue_depths_due(&self, key: &str) -> bool {
        due(&self.depths_read, key, self.settings.queue_depth_interval)
    }

    /// Whether `key`'s `DeadLettersGrew` may be published (and it counts as published
    /// now): at most once per resync interval.
    pub fn dead_letters_event_due(&self, key: &str) -> bool {
        due(&self.dead_letters_told, key, self.settings.resync_interval)
    }

    /// Forgets what is kept about `key`, a pipeline that is gone.
    pub fn forget(&self, key: &str) {
        for map in [&self.depths_read, &self.dead_letters_told] {
            lock(map).remove(key);
        }
        self.reset_backoff(key);
    }

    /// The delay before the next try of `key` after one more transient failure: 5s,
    /// 10s, 20s, … up to 5 minutes.
    pub fn next_backoff(&self, key: &str) -> Duration {
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = failures.entry(key.to_string()).or_insert(0);
        let delay = backoff_after(*count);
        *count = count.saturating_add(1);
        delay
    }

    /// Adds a controller's cache of pipelines to what [`Self::known_pipelines`] reads.
    pub fn register_store(&self, store: Store<DeserializeGuard<MailerPipeline>>) {
        self.stores
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(store);
    }

    /// Every pipeline in the controllers' caches (that could be read).
    pub fn known_pipelines(&self) -> Vec<Arc<MailerPipeline>> {
        self.stores
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .flat_map(Store::state)
            .filter_map(|guard| guard.0.as_ref().ok().cloned().map(Arc::new))
            .collect()
    }

    /// Forgets `key`'s failures after a success.
    pub fn reset_backoff(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
    }

    /// Publishes an event about `regarding`; a failure to publish is logged, since an
    /// event is never worth failing a reconcile for. A repeat (same type, reason and
    /// action about the same object version) within minutes is folded into the first
    /// as a series, which keeps the first note; the log has every note.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(truncate_bytes(note, 1000)),
            action: action.to_string(),
            secondary: None,
        };
        tracing::info!(
            reason,
            note = event.note.as_deref().unwrap_or_default(),
            "event"
        );
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(error = %e, reason, "could not publish an event");
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether `interval` passed since `key` was last due in `last`; if so it is due now.
fn due(last: &Mutex<HashMap<String, Instant>>, key: &str, interval: Duration) -> bool {
    let mut last = lock(last);
    let now = Instant::now();
    match last.get(key) {
        Some(at) if now.duration_since(*at) < interval => false,
        _ => {
            last.insert(key.to_string(), now);
            true
        }
    }
}

/// The delay after `failures` transient failures in a row.
pub fn backoff_after(failures: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(2u32.saturating_pow(failures.min(16)))
        .min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let delays: Vec<u64> = (0..9).map(|n| backoff_after(n).as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff_after(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn a_throttled_read_is_due_once_per_interval_and_per_key() {
        let last = Mutex::new(HashMap::new());
        let minute = Duration::from_secs(60);
        assert!(due(&last, "prod/a", minute), "the first time");
        assert!(!due(&last, "prod/a", minute), "again within the interval");
        assert!(due(&last, "prod/b", minute), "another pipeline");
        assert!(due(&last, "prod/a", Duration::ZERO), "a zero interval");
        lock(&last).insert("prod/c".into(), Instant::now() - minute);
        assert!(due(&last, "prod/c", minute), "once the interval passed");
    }
}
