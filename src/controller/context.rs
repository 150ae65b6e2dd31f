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

use crate::controller::key::PipelineKey;
use crate::controller::kube::keda::KedaDiscovery;
use crate::controller::kube::owned::OwnedCaches;
use crate::controller::kube::ssa::FIELD_MANAGER;
use crate::controller::metrics::Metrics;
use crate::controller::runtime::ahead::PoliciesAhead;
use crate::spec::MailerPipeline;
use crate::text::truncate_bytes;
use crate::topology::Clients;

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
    /// `--concurrency`: how many pipelines are reconciled at once, per controller (one
    /// per watched namespace, or one for all).
    pub concurrency: u16,
    /// `--cluster-name`: part of the workers' user names and of owner markers.
    pub cluster_name: String,
    /// The least time between two readings of a pipeline's queue depths (so between
    /// two status writes for depths alone); 30s.
    pub queue_depth_interval: Duration,
    /// How long a vhost's definitions, read for one reconcile, serve the others of the
    /// same broker and vhost while the operator writes nothing there
    /// ([`SHARED_DEFINITIONS_MAX_AGE`](crate::controller::reconcile::apply::SHARED_DEFINITIONS_MAX_AGE)); zero:
    /// each reconcile reads its pipeline's objects by name.
    pub definitions_max_age: Duration,
    /// How long after a pipeline's `deletionTimestamp` a cleanup that failed for now
    /// (the broker unreachable) is retried before the finalizer goes anyway.
    pub cleanup_deadline: Duration,
    /// How long the first reconcile with policies to write for a vhost waits for others
    /// of the same broker and vhost, so their policies go in one import
    /// ([`POLICY_WINDOW`]); zero: each writes its own.
    pub policy_window: Duration,
    /// How long the first reconcile with names to claim in a vhost waits for others of
    /// the same broker and vhost, so their claims are decided under one lock
    /// ([`CLAIM_WINDOW`]).
    pub claim_window: Duration,
}

/// How long the policies of reconciles running at once are gathered per vhost before
/// they are written together: short beside a reconcile, long enough for the reconciles
/// of a first pass (`--concurrency` of them at once) to join.
pub const POLICY_WINDOW: Duration = Duration::from_millis(200);

/// How long the claims of reconciles running at once are gathered per vhost before they
/// are decided together: short beside a reconcile, long enough for the reconciles of a
/// first pass to join.
pub const CLAIM_WINDOW: Duration = Duration::from_millis(100);

/// Reconciles running at once, per controller, unless `--concurrency` says otherwise.
pub const DEFAULT_CONCURRENCY: u16 = 16;

/// The most by which a pipeline's resync comes before the resync interval, as a share
/// of it: pipelines reconciled together (all of them, after a restart) are compared with
/// RabbitMQ again spread over the last tenth of the interval, not in one burst.
pub const RESYNC_JITTER: f64 = 0.1;

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
    failures: Mutex<HashMap<PipelineKey, u32>>,
    /// The controllers' caches of pipelines (one per watched namespace, or one for all).
    stores: Mutex<Vec<Store<DeserializeGuard<MailerPipeline>>>>,
    /// When each pipeline's queue depths were last read.
    depths_read: Mutex<HashMap<PipelineKey, Instant>>,
    /// When each pipeline's `DeadLettersGrew` was last published.
    dead_letters_told: Mutex<HashMap<PipelineKey, Instant>>,
    /// The controllers' caches of the Deployments and Secrets the operator made.
    pub owned: OwnedCaches,
    /// Whether KEDA is installed, as last found out.
    pub keda: KedaDiscovery,
    /// One management client per broker endpoint, shared by every reconcile.
    pub brokers: Clients,
    /// Pipelines that wrote their policies ahead of their queues, waiting.
    pub ahead: Arc<PoliciesAhead>,
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
            owned: OwnedCaches::default(),
            keda: KedaDiscovery::default(),
            brokers: Clients::default(),
            ahead: Arc::default(),
        }
    }

    /// Whether `key`'s queue depths are due to be read (and they count as read now).
    pub fn queue_depths_due(&self, key: &PipelineKey) -> bool {
        due(&self.depths_read, key, self.settings.queue_depth_interval)
    }

    /// Whether `key`'s `DeadLettersGrew` may be published (and it counts as published
    /// now): at most once per resync interval.
    pub fn dead_letters_event_due(&self, key: &PipelineKey) -> bool {
        due(&self.dead_letters_told, key, self.settings.resync_interval)
    }

    /// How long until the pipeline whose uid (or `namespace/name`) is `key` is compared
    /// with RabbitMQ again: the resync interval less a share of up to
    /// [`RESYNC_JITTER`] of it that is the pipeline's own ([`jittered`]).
    pub fn resync_after(&self, key: &str) -> Duration {
        jittered(self.settings.resync_interval, key)
    }

    /// Forgets what is kept about `key`, a pipeline that is gone.
    pub fn forget(&self, key: &PipelineKey) {
        for map in [&self.depths_read, &self.dead_letters_told] {
            lock(map).remove(key);
        }
        self.reset_backoff(key);
    }

    /// The delay before the next try of `key` after one more transient failure: 5s,
    /// 10s, 20s, … up to 5 minutes.
    pub fn next_backoff(&self, key: &PipelineKey) -> Duration {
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = failures.entry(key.clone()).or_insert(0);
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

    /// The pipelines in the controllers' caches (that could be read) that `keep` keeps;
    /// only those are copied.
    pub fn known_pipelines(
        &self,
        keep: impl Fn(&MailerPipeline) -> bool,
    ) -> Vec<Arc<MailerPipeline>> {
        self.stores
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .flat_map(Store::state)
            .filter_map(|guard| guard.0.as_ref().ok().filter(|p| keep(p)).cloned())
            .map(Arc::new)
            .collect()
    }

    /// Forgets `key`'s failures after a success.
    pub fn reset_backoff(&self, key: &PipelineKey) {
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
fn due(last: &Mutex<HashMap<PipelineKey, Instant>>, key: &PipelineKey, interval: Duration) -> bool {
    let mut last = lock(last);
    let now = Instant::now();
    match last.get(key) {
        Some(at) if now.duration_since(*at) < interval => false,
        _ => {
            last.insert(key.clone(), now);
            true
        }
    }
}

/// `interval` less a share of it in `[0, RESYNC_JITTER)` drawn from a hash of `key`: the
/// same for a pipeline every time (it keeps its place in the interval, and a test can
/// count), spread evenly over many pipelines.
pub fn jittered(interval: Duration, key: &str) -> Duration {
    // FNV-1a, then SplitMix64's finalizer so that keys differing in a character or two
    // (`shop-1`, `shop-2`) land far apart.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^= hash >> 31;
    // The top 53 bits, as a fraction in [0, 1).
    let fraction = (hash >> 11) as f64 / (1u64 << 53) as f64;
    interval.mul_f64(1.0 - RESYNC_JITTER * fraction)
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
    fn resyncs_spread_evenly_over_the_last_tenth_of_the_interval() {
        let interval = Duration::from_secs(300);
        let earliest = interval.mul_f64(1.0 - RESYNC_JITTER);
        let pipelines = 1000;
        let mut buckets = [0usize; 10];
        let mut delays = Vec::new();
        for i in 0..pipelines {
            let delay = jittered(interval, &format!("0d3c7a52-6e1f-4b8e-9a41-{i:012}"));
            assert!(earliest <= delay && delay <= interval, "{delay:?}");
            let share = (interval - delay).as_secs_f64() / (interval - earliest).as_secs_f64();
            buckets[((share * 10.0) as usize).min(9)] += 1;
            delays.push(delay);
        }
        // A tenth of them in each tenth of the window, give or take a third.
        assert!(
            buckets.iter().all(|&n| (67..=133).contains(&n)),
            "{buckets:?}"
        );
        delays.sort();
        delays.dedup();
        assert_eq!(delays.len(), pipelines, "no two pipelines at the same time");
        // A pipeline keeps its place.
        assert_eq!(jittered(interval, "a"), jittered(interval, "a"));
        assert_eq!(jittered(Duration::ZERO, "a"), Duration::ZERO);
    }

    #[test]
    fn a_throttled_read_is_due_once_per_interval_and_per_key() {
        let key = |name: &str| PipelineKey {
            namespace: "prod".into(),
            name: name.into(),
        };
        let last = Mutex::new(HashMap::new());
        let minute = Duration::from_secs(60);
        assert!(due(&last, &key("a"), minute), "the first time");
        assert!(!due(&last, &key("a"), minute), "again within the interval");
        assert!(due(&last, &key("b"), minute), "another pipeline");
        assert!(due(&last, &key("a"), Duration::ZERO), "a zero interval");
        lock(&last).insert(key("c"), Instant::now() - minute);
        assert!(due(&last, &key("c"), minute), "once the interval passed");
    }
}
