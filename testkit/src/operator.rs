//! The operator in this process, against the in-memory API server ([`crate::fake_api`]):
//! the reconcile harness of the controller's tests and the cluster faults: a pipeline and
//! its Secrets in the in-memory API server, a `Context` on its client, and helpers to read
//! what the controller wrote.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use kube::runtime::controller::Action;
use mailer::controller::metrics::Metrics;
use mailer::controller::runtime::watch::run_controllers;
use mailer::controller::{Context, Error, Settings, reconcile};
use mailer::spec::MailerPipeline;
use mailer::telemetry::Health;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use crate::fake_api::{FakeApi, Recorded};

pub const NS: &str = "prod";
pub const RESYNC: Duration = Duration::from_secs(300);
pub const FINALIZER: &str = "mailer.dev/cleanup";

pub fn pipeline_path(name: &str) -> String {
    format!("/apis/mailer.dev/v1alpha1/namespaces/{NS}/mailerpipelines/{name}")
}
pub fn secret_path(name: &str) -> String {
    format!("/api/v1/namespaces/{NS}/secrets/{name}")
}
pub fn deployment_path(name: &str) -> String {
    format!("/apis/apps/v1/namespaces/{NS}/deployments/{name}")
}
pub const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/prod/events";

pub struct Harness {
    pub fake: FakeApi,
    pub ctx: Arc<Context>,
    registry: Registry,
}

/// The user the operator makes for pipeline `name` of namespace `NS` in cluster `default`.
pub fn worker_user(name: &str) -> String {
    format!("mailer-worker.default.{NS}.{name}")
}

pub fn harness() -> Harness {
    harness_of("default", CLEANUP_DEADLINE)
}

/// The cleanup deadline of [`harness`]: the operator's default.
pub const CLEANUP_DEADLINE: Duration = Duration::from_secs(600);

/// A harness whose operator retries a failed cleanup for `cleanup_deadline` after the
/// deletion (zero: never).
pub fn harness_with(cleanup_deadline: Duration) -> Harness {
    harness_of("default", cleanup_deadline)
}

/// A harness whose operator runs with `--cluster-name cluster`, with an API server of
/// its own (another cluster's), sharing the broker.
pub fn harness_of_cluster(cluster: &str) -> Harness {
    harness_of(cluster, CLEANUP_DEADLINE)
}

fn harness_of(cluster: &str, cleanup_deadline: Duration) -> Harness {
    harness_tuned(|settings| {
        settings.cluster_name = cluster.into();
        settings.cleanup_deadline = cleanup_deadline;
    })
}

/// A harness whose operator runs with the settings `tune` makes of the default ones.
pub fn harness_tuned(tune: impl FnOnce(&mut Settings)) -> Harness {
    harness_on(FakeApi::default(), tune)
}

/// A harness on `fake` (e.g. a `FakeApi::cluster` that kubectl and Helm use too) whose
/// operator runs with the settings `tune` makes of the default ones.
pub fn harness_on(fake: FakeApi, tune: impl FnOnce(&mut Settings)) -> Harness {
    let mut settings = Settings {
        worker_image: "reg/mailer:test".into(),
        resync_interval: RESYNC,
        concurrency: mailer::controller::context::DEFAULT_CONCURRENCY,
        cluster_name: "default".into(),
        // Every reconcile reads them, so a test sees a new depth at once.
        queue_depth_interval: Duration::ZERO,
        // Each reconcile reads what it compares, so a test sees a change at once.
        definitions_max_age: Duration::ZERO,
        cleanup_deadline: CLEANUP_DEADLINE,
        policy_window: mailer::controller::context::POLICY_WINDOW,
        claim_window: mailer::controller::context::CLAIM_WINDOW,
    };
    tune(&mut settings);
    operator_of(fake, settings)
}

/// An operator with `settings` on `fake`'s API server.
fn operator_of(fake: FakeApi, settings: Settings) -> Harness {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let ctx = Arc::new(Context::new(
        fake.client(),
        metrics,
        settings,
        Some("test".into()),
    ));
    Harness {
        fake,
        ctx,
        registry,
    }
}

impl Harness {
    /// The same operator as a new process would be (nothing kept in memory), on the same
    /// API server.
    pub fn restarted(&self) -> Harness {
        operator_of(self.fake.clone(), self.ctx.settings.clone())
    }

    /// Stores pipeline `name` with `spec`. Its uid is unique to this run (`uid-<name>-…`),
    /// as an API server's are: the owner markers in the shared broker are keyed by it.
    pub fn seed_pipeline(&self, name: &str, spec: Value, finalized: bool) {
        let uid = crate::unique(&format!("uid-{name}"));
        let mut metadata = json!({"name": name, "namespace": NS, "uid": uid, "generation": 1});
        if finalized {
            metadata["finalizers"] = json!([FINALIZER]);
        }
        self.fake.put(
            &pipeline_path(name),
            json!({"apiVersion": "mailer.dev/v1alpha1", "kind": "MailerPipeline", "metadata": metadata, "spec": spec}),
        );
    }

    pub fn seed_secret(&self, name: &str, data: &[(&str, &str)]) {
        let data: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| (k.to_string(), json!(BASE64.encode(v))))
            .collect();
        self.fake.put(
            &secret_path(name),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS}, "data": data}),
        );
    }

    pub fn pipeline(&self, name: &str) -> MailerPipeline {
        serde_json::from_value(
            self.fake
                .get(&pipeline_path(name))
                .expect("pipeline stored"),
        )
        .unwrap()
    }

    pub async fn reconcile(&self, name: &str) -> (Result<Action, Error>, Vec<Recorded>) {
        self.fake.take_requests();
        let result = reconcile(Arc::new(self.pipeline(name)), self.ctx.clone()).await;
        let requests = self.fake.take_requests();
        assert_listed_in_rbac(&requests);
        (result, requests)
    }

    /// Deletes the pipeline as `kubectl delete` would: its finalizer holds it, marked
    /// with a `deletionTimestamp`.
    /// Puts the named pipelines in a cache the controller reads, as its watch would.
    pub fn cache_pipelines(&self, names: &[&str]) {
        let (store, mut writer) = kube::runtime::reflector::store();
        for name in names {
            let pipeline = self.pipeline(name);
            let guard = kube::core::DeserializeGuard(Ok(pipeline));
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(guard));
        }
        self.ctx.register_store(store);
    }

    pub fn mark_deleted(&self, name: &str) {
        let deleted = self
            .fake
            .delete(&pipeline_path(name))
            .expect("pipeline stored");
        assert!(
            deleted["metadata"]["deletionTimestamp"].is_string(),
            "a finalizer holds {name}"
        );
    }

    pub fn secret_value(&self, name: &str, key: &str) -> String {
        let secret = self.fake.get(&secret_path(name)).expect("secret stored");
        let encoded = secret["data"][key].as_str().expect("key present");
        String::from_utf8(BASE64.decode(encoded).unwrap()).unwrap()
    }

    pub fn metrics(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap();
        out
    }
}

/// Runs the controllers of `h` (reporting to `health`) until `until` resolves, then stops
/// them as SIGTERM would and waits until they have finished; fails the test when all of
/// it takes longer than `within`.
pub async fn run_controllers_until<T>(
    h: &Harness,
    health: &Health,
    within: Duration,
    until: impl Future<Output = T>,
) -> T {
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let (_abort_tx, abort) = tokio::sync::watch::channel(false);
    let namespaces = [NS.to_string()];
    let running = run_controllers(
        h.fake.client(),
        &namespaces,
        h.ctx.clone(),
        health,
        stop,
        abort,
    );
    let checking = async {
        let found = until.await;
        stop_tx.send(true).expect("the controllers listen");
        found
    };
    let ((), found) = tokio::time::timeout(within, async { tokio::join!(running, checking) })
        .await
        .expect("the controllers stop on shutdown");
    found
}

/// A replica's health, as `mailer controller` makes it.
pub fn controller_health() -> Arc<Health> {
    Health::new(Duration::from_secs(60))
}

/// Every request is one the code's list of API calls (src/controller/kube/rbac.rs, which the
/// chart's RBAC is held to) has: a call missing there would be forbidden in a cluster.
/// Discovery (`GET /apis/<group>/<version>`) needs no rule.
pub fn assert_listed_in_rbac(requests: &[Recorded]) {
    use mailer::controller::kube::rbac::CALLS;
    for request in requests {
        let segments: Vec<&str> = request.path.trim_matches('/').split('/').collect();
        let (group, rest) = match segments.as_slice() {
            ["api", _version, rest @ ..] => ("", rest),
            ["apis", group, _version, rest @ ..] => (*group, rest),
            _ => panic!("unexpected path {}", request.path),
        };
        let (resource, named) = match rest {
            [] => continue,
            ["namespaces", _, resource] => (resource.to_string(), false),
            ["namespaces", _, resource, _name] => (resource.to_string(), true),
            ["namespaces", _, resource, _name, sub] => (format!("{resource}/{sub}"), true),
            other => panic!("unexpected path {}: {other:?}", request.path),
        };
        let verb = match (request.method.as_str(), named) {
            ("GET", true) => "get",
            ("GET", false) if request.is_watch() => "watch",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", _) => "delete",
            (method, _) => panic!("unexpected method {method}"),
        };
        assert!(
            CALLS
                .iter()
                .any(|c| c.group == group && c.resource == resource && c.verbs.contains(&verb)),
            "{verb} {group}/{resource} ({} {}) is not in src/controller/kube/rbac.rs",
            request.method,
            request.path
        );
    }
}

/// `METHOD path` of every write, in order.
pub fn writes(requests: &[Recorded]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| r.is_write())
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

pub fn write_to<'a>(requests: &'a [Recorded], method: &str, path: &str) -> &'a Recorded {
    requests
        .iter()
        .find(|r| r.method == method && r.path == path)
        .unwrap_or_else(|| panic!("no {method} {path} in {:#?}", writes(requests)))
}

/// `(type, reason, note)` of every event published.
pub fn events(requests: &[Recorded]) -> Vec<(String, String, String)> {
    requests
        .iter()
        .filter(|r| r.method == "POST" && r.path == EVENTS_PATH)
        .map(|r| {
            let text = |field: &str| r.body[field].as_str().unwrap_or_default().to_string();
            (text("type"), text("reason"), text("note"))
        })
        .collect()
}

/// `(reason, count)` of every repeat of an event, which the recorder patches into the
/// first one's series.
pub fn event_repeats(requests: &[Recorded]) -> Vec<(String, i64)> {
    let prefix = format!("{EVENTS_PATH}/");
    requests
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.starts_with(&prefix))
        .map(|r| {
            let reason = r.body["reason"].as_str().unwrap_or_default().to_string();
            (reason, r.body["series"]["count"].as_i64().unwrap_or(0))
        })
        .collect()
}

pub use crate::pipeline::{assert_condition, condition};

/// The test broker's AMQP address, as a connection Secret's `amqpUri` holds it.
pub fn amqp_uri() -> String {
    format!(
        "amqp://127.0.0.1:{}",
        crate::broker::TestBroker::get().amqp_port
    )
}

pub fn connection_secret(h: &Harness, management_url: &str) {
    h.seed_secret(
        "conn",
        &[
            ("uri", management_url),
            ("username", "guest"),
            ("password", "guest"),
            ("amqpUri", &amqp_uri()),
        ],
    );
}
