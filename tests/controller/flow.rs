//! The reconcile flow: `reconcile` against the in-memory API server, with the real broker.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use kube::runtime::controller::Action;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use mailer::controller::metrics::Metrics;
use mailer::controller::{Context, Error, Settings, error_policy, reconcile};
use mailer::spec::MailerPipeline;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use super::broker::{CLOSED_MANAGEMENT_URL, Cleanup, MANAGEMENT_URL, admin, eventually, unique};
use super::fake_api::{FakeApi, Recorded};

const NS: &str = "prod";
const RESYNC: Duration = Duration::from_secs(300);
const FINALIZER: &str = "mailer.dev/cleanup";

fn pipeline_path(name: &str) -> String {
    format!("/apis/mailer.dev/v1alpha1/namespaces/{NS}/mailerpipelines/{name}")
}
fn secret_path(name: &str) -> String {
    format!("/api/v1/namespaces/{NS}/secrets/{name}")
}
fn deployment_path(name: &str) -> String {
    format!("/apis/apps/v1/namespaces/{NS}/deployments/{name}")
}
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/prod/events";

struct Harness {
    fake: FakeApi,
    ctx: Arc<Context>,
    registry: Registry,
}

fn harness() -> Harness {
    let fake = FakeApi::default();
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let settings = Settings {
        worker_image: "reg/mailer:test".into(),
        resync_interval: RESYNC,
    };
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
    fn seed_pipeline(&self, name: &str, spec: Value, finalized: bool) {
        let mut metadata =
            json!({"name": name, "namespace": NS, "uid": format!("uid-{name}"), "generation": 1});
        if finalized {
            metadata["finalizers"] = json!([FINALIZER]);
        }
        self.fake.put(
            &pipeline_path(name),
            json!({"apiVersion": "mailer.dev/v1alpha1", "kind": "MailerPipeline", "metadata": metadata, "spec": spec}),
        );
    }

    fn seed_secret(&self, name: &str, data: &[(&str, &str)]) {
        let data: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| (k.to_string(), json!(BASE64.encode(v))))
            .collect();
        self.fake.put(
            &secret_path(name),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS}, "data": data}),
        );
    }

    fn pipeline(&self, name: &str) -> MailerPipeline {
        serde_json::from_value(
            self.fake
                .get(&pipeline_path(name))
                .expect("pipeline stored"),
        )
        .unwrap()
    }

    async fn reconcile(&self, name: &str) -> (Result<Action, Error>, Vec<Recorded>) {
        self.fake.take_requests();
        let result = reconcile(Arc::new(self.pipeline(name)), self.ctx.clone()).await;
        (result, self.fake.take_requests())
    }

    fn mark_deleted(&self, name: &str) {
        let mut object = self.fake.get(&pipeline_path(name)).unwrap();
        object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        self.fake.put(&pipeline_path(name), object);
    }

    fn secret_value(&self, name: &str, key: &str) -> String {
        let secret = self.fake.get(&secret_path(name)).expect("secret stored");
        let encoded = secret["data"][key].as_str().expect("key present");
        String::from_utf8(BASE64.decode(encoded).unwrap()).unwrap()
    }

    fn metrics(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap();
        out
    }
}

/// `METHOD path` of every write, in order.
fn writes(requests: &[Recorded]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| r.is_write())
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

fn write_to<'a>(requests: &'a [Recorded], method: &str, path: &str) -> &'a Recorded {
    requests
        .iter()
        .find(|r| r.method == method && r.path == path)
        .unwrap_or_else(|| panic!("no {method} {path} in {:#?}", writes(requests)))
}

/// `(type, reason, note)` of every event published.
fn events(requests: &[Recorded]) -> Vec<(String, String, String)> {
    requests
        .iter()
        .filter(|r| r.method == "POST" && r.path == EVENTS_PATH)
        .map(|r| {
            let text = |field: &str| r.body[field].as_str().unwrap_or_default().to_string();
            (text("type"), text("reason"), text("note"))
        })
        .collect()
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

fn connection_secret(h: &Harness, management_url: &str) {
    h.seed_secret(
        "conn",
        &[
            ("uri", management_url),
            ("username", "guest"),
            ("password", "guest"),
        ],
    );
}

#[tokio::test]
async fn a_pipeline_is_built_left_alone_when_in_sync_repaired_and_cleaned_up() {
    let h = harness();
    let name = unique("shop");
    let vhost = unique("mailer-ctl");
    let user = format!("mailer-worker.{NS}.{name}");
    let _cleanup = Cleanup {
        vhost: vhost.clone(),
        users: vec![user.clone()],
    };
    connection_secret(&h, MANAGEMENT_URL);
    h.seed_secret("smtp", &[("url", "smtp://mail.example:587")]);
    let spec = json!({"rabbitmq": {"vhost": vhost, "connectionSecret": {"name": "conn"}},
                      "topology": {"deletionPolicy": "Delete"},
                      "worker": {"replicas": 2, "provider": {"urlSecretKeyRef": {"name": "smtp", "key": "url"}}}});
    h.seed_pipeline(&name, spec, false);

    // The first reconcile only adds the finalizer.
    let (result, requests) = h.reconcile(&name).await;
    assert_eq!(result.unwrap(), Action::await_change());
    assert_eq!(
        writes(&requests),
        [format!("PATCH {}", pipeline_path(&name))]
    );
    let patch = write_to(&requests, "PATCH", &pipeline_path(&name));
    assert_eq!(patch.content_type, "application/json-patch+json");
    assert_eq!(
        patch.body,
        json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
               {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}])
    );

    // The second builds everything.
    let (result, requests) = h.reconcile(&name).await;
    assert_eq!(result.unwrap(), Action::requeue(RESYNC));
    let worker_secret = format!("{name}-worker-amqp");
    let worker_deployment = format!("{name}-worker");
    let status_path = format!("{}/status", pipeline_path(&name));
    assert_eq!(
        writes(&requests),
        [
            format!("PATCH {}", secret_path(&worker_secret)),
            format!("PATCH {}", deployment_path(&worker_deployment)),
            format!("PATCH {status_path}"),
            format!("POST {EVENTS_PATH}"),
        ]
    );
    for path in [
        secret_path(&worker_secret),
        deployment_path(&worker_deployment),
    ] {
        let apply = write_to(&requests, "PATCH", &path);
        assert_eq!(apply.content_type, "application/apply-patch+yaml");
        assert!(
            apply.query.contains("fieldManager=mailer-operator"),
            "{}",
            apply.query
        );
        assert!(apply.query.contains("force=true"), "{}", apply.query);
        assert_eq!(
            apply.body["metadata"]["ownerReferences"][0]["name"],
            name.as_str()
        );
    }
    let status = &write_to(&requests, "PATCH", &status_path).body["status"];
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(condition(status, "TopologyReady")["status"], "True");
    assert_eq!(
        condition(status, "WorkerReady")["reason"],
        "WorkersNotReady"
    );
    assert_eq!(condition(status, "Ready")["status"], "False");
    assert_eq!(status["queues"], json!({"send": 0, "retry": 0, "dead": 0}));
    assert_eq!(status["workers"], json!({"ready": 0, "desired": 2}));
    assert_eq!(status["workerUser"], user.as_str());
    let published = events(&requests);
    assert_eq!(published[0].1, "TopologyCreated");
    assert!(
        published[0].2.contains(&format!("create user \"{user}\"")),
        "{published:?}"
    );
    let amqp_url = h.secret_value(&worker_secret, "url");
    let password = h.secret_value(&worker_secret, "password");
    assert_eq!(password.len(), 32);
    for told in requests
        .iter()
        .filter(|r| r.path == EVENTS_PATH || r.path == status_path)
    {
        assert!(
            !told.body.to_string().contains(&password),
            "the password leaked into {}",
            told.path
        );
    }

    // RabbitMQ holds the topology, and the worker's user may consume but not declare.
    let admin = admin();
    admin
        .get_queue_info(&vhost, "mail.send")
        .await
        .expect("send queue exists");
    let permissions = admin
        .get_permissions(&vhost, &user)
        .await
        .expect("worker user has permissions");
    assert_eq!(
        (
            permissions.configure.as_str(),
            permissions.write.as_str(),
            permissions.read.as_str()
        ),
        ("^$", r"^(mail\.retry|mail\.dead)$", r"^mail\.send$")
    );
    worker_may_consume_but_not_declare(&amqp_url).await;

    // The Deployment's pods become ready: only the status changes.
    let mut deployment = h.fake.get(&deployment_path(&worker_deployment)).unwrap();
    deployment["status"] = json!({"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2});
    h.fake.put(&deployment_path(&worker_deployment), deployment);
    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    assert_eq!(writes(&requests), [format!("PATCH {status_path}")]);
    let status = &write_to(&requests, "PATCH", &status_path).body["status"];
    assert_eq!(condition(status, "Ready")["status"], "True");

    // In sync: no write to Kubernetes, and none to RabbitMQ (it would show as an event).
    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    assert_eq!(writes(&requests), Vec::<String>::new());

    // A policy deleted by hand is put back, with an event and a metric.
    admin
        .delete_policy(&vhost, "mailer.mail.send.retry", false)
        .await
        .unwrap();
    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    let published = events(&requests);
    assert_eq!(published.len(), 1, "{published:?}");
    assert_eq!(published[0].1, "TopologyRepaired");
    assert!(
        published[0].2.contains("mailer.mail.send.retry"),
        "{published:?}"
    );
    admin
        .get_policy(&vhost, "mailer.mail.send.retry")
        .await
        .expect("policy repaired");
    assert!(h.metrics().contains(&format!(
        "mailer_controller_drift_repairs_total{{namespace=\"{NS}\",pipeline=\"{name}\"}} 1"
    )));

    // A dead letter arrives: once the management API counts it, the status shows it and
    // a warning says so.
    publish_dead_letter(&vhost).await;
    let published = eventually(30, "the dead letter to be counted", || async {
        let (result, requests) = h.reconcile(&name).await;
        result.unwrap();
        let stored = h.fake.get(&pipeline_path(&name)).unwrap();
        (stored["status"]["queues"]["dead"] == 1).then(|| events(&requests))
    })
    .await;
    assert_eq!(
        published.iter().map(|e| e.1.as_str()).collect::<Vec<_>>(),
        ["DeadLettersGrew"]
    );
    assert!(h.metrics().contains(&format!(
        "mailer_controller_queue_messages{{namespace=\"{NS}\",pipeline=\"{name}\",queue=\"dead\"}} 1"
    )));

    // Deleted: the user and the empty queues go; the dead-letter queue holds mail and
    // stays, which a warning says; the finalizer is removed.
    h.mark_deleted(&name);
    let (result, requests) = h.reconcile(&name).await;
    assert_eq!(result.unwrap(), Action::await_change());
    let published = events(&requests);
    assert_eq!(published.len(), 1);
    assert_eq!(
        (published[0].0.as_str(), published[0].1.as_str()),
        ("Warning", "CleanupIncomplete")
    );
    assert!(
        published[0].2.contains(&format!("removed user {user}")),
        "{published:?}"
    );
    assert!(
        published[0]
            .2
            .contains("queue mail.send.dead: it holds 1 messages"),
        "{published:?}"
    );
    let removal = write_to(&requests, "PATCH", &pipeline_path(&name));
    assert_eq!(
        removal.body,
        json!([{"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER},
               {"op": "remove", "path": "/metadata/finalizers/0"}])
    );
    assert!(
        admin.get_user(&user).await.is_err(),
        "the worker user is deleted"
    );
    assert!(
        admin.get_queue_info(&vhost, "mail.send").await.is_err(),
        "the empty send queue is deleted"
    );
    admin
        .get_queue_info(&vhost, "mail.send.dead")
        .await
        .expect("the dead-letter queue is kept");
    assert!(
        !h.metrics().contains(&format!("pipeline=\"{name}\",queue")),
        "gauges are dropped"
    );
}

async fn worker_may_consume_but_not_declare(amqp_url: &str) {
    let connection = Connection::connect(amqp_url, ConnectionProperties::default())
        .await
        .expect("the worker's URL connects");
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_consume(
            "mail.send".into(),
            "test".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("the worker may consume from the send queue");
    let other = connection.create_channel().await.unwrap();
    let refused = other
        .queue_declare(
            "sneaky".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect_err("the worker may not declare a queue");
    assert!(refused.to_string().contains("ACCESS_REFUSED"), "{refused}");
    let _ = connection.close(200, "done".into()).await;
}

async fn publish_dead_letter(vhost: &str) {
    let url = format!("amqp://guest:guest@127.0.0.1:5672/{}", urlencode(vhost));
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_publish(
            "mail.dead".into(),
            "mail.send".into(),
            BasicPublishOptions::default(),
            b"{}",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let _ = connection.close(200, "done".into()).await;
}

fn urlencode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

#[tokio::test]
async fn deletion_completes_when_the_broker_or_its_secret_is_gone() {
    let h = harness();
    connection_secret(&h, CLOSED_MANAGEMENT_URL);
    let spec = |secret: &str| json!({"rabbitmq": {"vhost": "gone", "connectionSecret": {"name": secret}}, "topology": {"deletionPolicy": "Delete"}});
    h.seed_pipeline("unreachable", spec("conn"), true);
    h.seed_pipeline("secretless", spec("missing"), true);
    for (name, says) in [
        ("unreachable", "cannot reach"),
        ("secretless", "Secret prod/missing does not exist"),
    ] {
        h.mark_deleted(name);
        let (result, requests) = tokio::time::timeout(Duration::from_secs(60), h.reconcile(name))
            .await
            .expect("deletion does not hang");
        assert_eq!(result.unwrap(), Action::await_change());
        assert_eq!(
            writes(&requests),
            [
                format!("POST {EVENTS_PATH}"),
                format!("PATCH {}", pipeline_path(name))
            ],
            "{name}"
        );
        let published = events(&requests);
        assert_eq!(
            (published[0].0.as_str(), published[0].1.as_str()),
            ("Warning", "CleanupIncomplete")
        );
        assert!(published[0].2.contains(says), "{name}: {published:?}");
        assert!(published[0].2.contains("NOT cleaned up"), "{published:?}");
    }
}

#[tokio::test]
async fn a_missing_secret_key_is_reported_once_and_waits_for_a_change() {
    let h = harness();
    h.seed_secret("conn", &[("uri", MANAGEMENT_URL), ("username", "guest")]);
    h.seed_pipeline(
        "shop",
        json!({"rabbitmq": {"connectionSecret": {"name": "conn"}}}),
        true,
    );
    let (result, requests) = h.reconcile("shop").await;
    let error = result.unwrap_err();
    assert_eq!(error.category(), "missing-secret-key");
    let status = &write_to(
        &requests,
        "PATCH",
        &format!("{}/status", pipeline_path("shop")),
    )
    .body["status"];
    let topology = condition(status, "TopologyReady");
    assert_eq!(
        (topology["status"].as_str(), topology["reason"].as_str()),
        (Some("False"), Some("MissingSecretKey"))
    );
    assert!(
        topology["message"]
            .as_str()
            .unwrap()
            .contains("Secret prod/conn has no key \"password\"")
    );
    assert_eq!(condition(status, "Ready")["reason"], "MissingSecretKey");
    assert_eq!(events(&requests)[0].1, "ReconcileFailedMissingSecretKey");
    let policy = error_policy(Arc::new(h.pipeline("shop")), &error, h.ctx.clone());
    assert_eq!(
        policy,
        Action::requeue(RESYNC),
        "a spec that cannot work waits"
    );

    let (result, requests) = h.reconcile("shop").await;
    assert!(result.is_err());
    assert_eq!(
        writes(&requests),
        Vec::<String>::new(),
        "the same failure writes nothing again"
    );
    assert!(h.metrics().contains(
        r#"mailer_controller_reconciles_total{result="error",category="missing-secret-key"} 2"#
    ));
}

#[tokio::test]
async fn transient_failures_back_off_per_pipeline() {
    let h = harness();
    connection_secret(&h, CLOSED_MANAGEMENT_URL);
    for name in ["a", "b"] {
        h.seed_pipeline(
            name,
            json!({"rabbitmq": {"connectionSecret": {"name": "conn"}}}),
            true,
        );
    }
    let (result, requests) = h.reconcile("a").await;
    let error = result.unwrap_err();
    assert_eq!(error.category(), "unreachable");
    let status = &write_to(
        &requests,
        "PATCH",
        &format!("{}/status", pipeline_path("a")),
    )
    .body["status"];
    assert!(
        condition(status, "TopologyReady")["message"]
            .as_str()
            .unwrap()
            .contains("cannot reach")
    );
    let delays: Vec<Action> = (0..3)
        .map(|_| error_policy(Arc::new(h.pipeline("a")), &error, h.ctx.clone()))
        .collect();
    assert_eq!(
        delays,
        [5, 10, 20].map(|s| Action::requeue(Duration::from_secs(s)))
    );
    assert_eq!(
        error_policy(Arc::new(h.pipeline("b")), &error, h.ctx.clone()),
        Action::requeue(Duration::from_secs(5)),
        "each pipeline backs off on its own"
    );
}

#[tokio::test]
async fn a_cluster_ref_finds_the_management_api_through_the_clusters_service() {
    let h = harness();
    h.fake.put(
        "/apis/rabbitmq.com/v1beta1/namespaces/data/rabbitmqclusters/rmq",
        json!({"apiVersion": "rabbitmq.com/v1beta1", "kind": "RabbitmqCluster", "metadata": {"name": "rmq", "namespace": "data"}}),
    );
    h.fake.put(
        "/api/v1/namespaces/data/services/rmq",
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "rmq", "namespace": "data"},
               "spec": {"ports": [{"name": "amqp", "port": 5672}, {"name": "management", "port": 15672}]}}),
    );
    h.fake.put(
        "/api/v1/namespaces/data/secrets/rmq-default-user",
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rmq-default-user", "namespace": "data"},
               "data": {"username": BASE64.encode("admin"), "password": BASE64.encode("pw")}}),
    );
    h.seed_pipeline(
        "shop",
        json!({"rabbitmq": {"clusterRef": {"name": "rmq", "namespace": "data"}}}),
        true,
    );
    let broker = mailer::controller::connection::resolve(&h.ctx.client, &h.pipeline("shop"))
        .await
        .unwrap();
    assert_eq!(broker.management_url, "http://rmq.data.svc:15672");
    assert_eq!(broker.endpoint.username, "admin");

    h.seed_pipeline(
        "other",
        json!({"rabbitmq": {"clusterRef": {"name": "absent"}}}),
        true,
    );
    let error = mailer::controller::connection::resolve(&h.ctx.client, &h.pipeline("other"))
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("RabbitmqCluster prod/absent: does not exist"),
        "{error}"
    );
}

/// See `end_to_end_on_a_real_cluster` in controller.rs.
pub async fn end_to_end() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use kube::api::{Api, Patch, PatchParams};

    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "set KUBECONFIG to a test cluster"
    );
    mailer::install_crypto_provider();
    let client = kube::Client::try_default().await.expect("a cluster");
    let apply = PatchParams::apply("mailer-e2e").force();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        "mailerpipelines.mailer.dev",
        &apply,
        &Patch::Apply(MailerPipeline::crd()),
    )
    .await
    .expect("CRD installed");
    let namespace = "default";
    let image = std::env::var("MAILER_E2E_IMAGE").unwrap_or_else(|_| "mailer:dev".into());
    let options = mailer::controller::Options {
        namespaces: vec![namespace.to_string()],
        settings: Settings {
            worker_image: image,
            resync_interval: Duration::from_secs(30),
        },
        metrics_addr: "127.0.0.1:0".parse().unwrap(),
        leader: None,
    };
    let controller = tokio::spawn(mailer::controller::run(options));
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    for file in [
        "rabbitmq-connection-secret.yaml",
        "smtp-provider-secret.yaml",
        "pipeline.yaml",
    ] {
        let text = std::fs::read_to_string(format!("{examples}/{file}")).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let object: kube::api::DynamicObject =
                serde::Deserialize::deserialize(document).unwrap();
            let types = object.types.clone().expect("apiVersion and kind");
            let gvk = kube::core::GroupVersionKind::try_from(&types).unwrap();
            let (resource, _) = kube::discovery::pinned_kind(&client, &gvk).await.unwrap();
            let api: Api<kube::api::DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, &resource);
            let name = object.metadata.name.clone().unwrap();
            api.patch(&name, &apply, &Patch::Apply(&object))
                .await
                .expect("example applied");
        }
    }
    let pipelines: Api<MailerPipeline> = Api::namespaced(client.clone(), namespace);
    eventually(180, "the example pipeline to be Ready", || async {
        let pipeline = pipelines.get("shop").await.ok()?;
        pipeline.status.filter(|s| s.is_true("Ready")).map(|_| ())
    })
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client, namespace);
    deployments
        .get("shop-worker")
        .await
        .expect("the worker Deployment exists");
    controller.abort();
}
