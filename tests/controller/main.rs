//! The operator's tests: the CRD and its CEL rules offline, leader election and the
//! reconcile flow against an in-memory API server (`fake_api`), with the RabbitMQ side
//! against the real broker at 127.0.0.1 (AMQP 5672, management 15672, guest/guest).
//! Each broker test works in its own vhost and removes it at the end.
//!
//! `end_to_end_on_a_real_cluster` runs only with `--ignored` and a `KUBECONFIG`; see
//! its doc comment.

mod autoscaling;
mod broker;
mod claims;
mod clients;
mod coexistence;
mod deletion;
mod e2e;
mod failures;
mod fake_api_conformance;
mod fake_api_managers;
mod flow;
mod hostile;
mod leadership;
mod mailserver;
mod operator_pod;
mod ownership;
mod phases;
mod postfix;
mod process;
mod provider_ca;
mod readme;
mod running;
mod scale;
mod status;
mod tenancy;
mod tiers;
mod worker_pod;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::core::cel::Validator;
use mailer::controller::runtime::leader::LeaderElection;
use mailer::spec::MailerPipeline;
use serde_json::{Value, json};

use mailer_testkit::fake_api::FakeApi;
use mailer_testkit::pipeline::PipelineSpec;

#[test]
fn the_checked_in_crd_is_what_mailer_crd_prints() {
    let generated = mailer::cli::crd::yaml().unwrap();
    let path = format!(
        "{}/{}",
        env!("CARGO_MANIFEST_DIR"),
        mailer::cli::crd::CHECKED_IN_PATH
    );
    let checked_in = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        generated == checked_in,
        "crds/mailerpipeline.yaml is stale: run `cargo run -- crd > crds/mailerpipeline.yaml`"
    );
}

#[test]
fn every_spec_field_has_a_description_for_kubectl_explain() {
    let crd = crd();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut undescribed = Vec::new();
    walk_properties(schema, "spec", &mut undescribed);
    assert!(
        undescribed.is_empty(),
        "fields without a description: {undescribed:?}"
    );
}

fn walk_properties(schema: &Value, at: &str, undescribed: &mut Vec<String>) {
    if let Some(properties) = schema["properties"].as_object() {
        for (name, property) in properties {
            let path = format!("{at}.{name}");
            if property["description"].as_str().is_none_or(str::is_empty) {
                undescribed.push(path.clone());
            }
            // Kubernetes' own types describe themselves; only ours are walked into.
            if !path.starts_with("spec.worker.") || path.matches('.').count() < 2 {
                walk_properties(property, &path, undescribed);
            }
        }
    }
}

/// The CRD as `mailer crd` prints it.
fn crd() -> Value {
    serde_yaml::from_str(&mailer::cli::crd::yaml().unwrap()).unwrap()
}

fn crd_schema() -> Value {
    let crd = crd();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// A pipeline as the API server would see it after defaulting: the serialized spec has
/// every default filled in.
fn defaulted(spec: Value) -> Value {
    let spec: mailer::spec::MailerPipelineSpec = serde_json::from_value(spec).unwrap();
    let pipeline = MailerPipeline::new("shop", spec);
    serde_json::to_value(pipeline).unwrap()
}

fn cel_errors(spec: Value) -> Vec<String> {
    match Validator::new().validate(&crd_schema(), &defaulted(spec), None) {
        Ok(()) => vec![],
        Err(errors) => errors.to_string().lines().map(str::to_string).collect(),
    }
}

#[test]
fn cel_rules_want_exactly_one_connection() {
    assert_eq!(
        cel_errors(PipelineSpec::new().connection_secret("c").build()),
        Vec::<String>::new()
    );
    assert_eq!(
        cel_errors(
            PipelineSpec::new()
                .cluster_ref(json!({"name": "r"}))
                .build()
        ),
        Vec::<String>::new()
    );
    for spec in [
        json!({}),
        json!({"rabbitmq": {"connectionSecret": {"name": "c"}, "clusterRef": {"name": "r"}}}),
    ] {
        let errors = cel_errors(spec.clone());
        assert!(
            errors
                .iter()
                .any(|e| e.contains("exactly one of connectionSecret and clusterRef")),
            "{spec}: {errors:?}"
        );
    }
}

#[test]
fn cel_rules_want_distinct_unreserved_names() {
    let with = |topology: Value| {
        PipelineSpec::new()
            .connection_secret("c")
            .topology(json!(topology))
            .build()
    };
    let errors = cel_errors(with(json!({"deadQueue": "mail.send"})));
    assert!(
        errors.iter().any(|e| e.contains("must all be different")),
        "{errors:?}"
    );
    let errors = cel_errors(with(json!({"retryExchange": "amq.direct"})));
    assert!(
        errors.iter().any(|e| e.contains("reserved by RabbitMQ")),
        "{errors:?}"
    );
    assert!(cel_errors(with(json!({"exchange": "shop", "queue": "shop.out"}))).is_empty());
}

#[test]
fn cel_rules_want_one_delay_or_delay_tiers_not_both() {
    let with = |topology: Value| {
        PipelineSpec::new()
            .connection_secret("c")
            .topology(topology)
            .build()
    };
    assert!(cel_errors(with(json!({"retryDelay": "5m"}))).is_empty());
    assert!(cel_errors(with(json!({"retryDelays": ["30s", "5m", "30m", "2h"]}))).is_empty());
    let errors = cel_errors(with(json!({"retryDelay": "5m", "retryDelays": ["1m"]})));
    assert!(
        errors.iter().any(
            |e| e.contains("set retryDelay (one delay) or retryDelays (delay tiers), not both")
        ),
        "{errors:?}"
    );
    // The schema bounds the tiers (the API server checks it; CEL rules do not).
    let tiers =
        &crd_schema()["properties"]["spec"]["properties"]["topology"]["properties"]["retryDelays"];
    assert_eq!(
        (&tiers["minItems"], &tiers["maxItems"]),
        (&json!(1), &json!(10)),
        "{tiers}"
    );
}

#[test]
fn cel_rules_want_min_replicas_at_most_max_and_allow_zero() {
    let with = |autoscaling: Value| {
        PipelineSpec::new()
            .connection_secret("c")
            .worker(json!({"autoscaling": autoscaling}))
            .build()
    };
    assert!(cel_errors(with(json!({"minReplicas": 0, "maxReplicas": 3}))).is_empty());
    assert!(cel_errors(with(json!({"minReplicas": 3, "maxReplicas": 3}))).is_empty());
    let errors = cel_errors(with(json!({"minReplicas": 4, "maxReplicas": 3})));
    assert!(
        errors
            .iter()
            .any(|e| e.contains("minReplicas must not be above maxReplicas")),
        "{errors:?}"
    );
}

/// Every example pipeline parses; those for the operator (they name a connection
/// Secret or a RabbitmqCluster) also pass its checks and the CRD's CEL rules. The others
/// are for the standalone CLI, which is given the broker on its command line.
#[test]
fn the_examples_are_valid_pipelines() {
    let dir = mailer_testkit::repo_root().join("examples");
    let mut pipelines = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        // examples/argocd/ holds Argo CD objects.
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        if !text.contains("kind: MailerPipeline") {
            continue;
        }
        let manifest = mailer::manifest::parse(&path.display().to_string(), &text).unwrap();
        for pipeline in manifest.pipelines {
            let rabbitmq = &pipeline.spec.rabbitmq;
            if rabbitmq.connection_secret.is_none() && rabbitmq.cluster_ref.is_none() {
                continue;
            }
            pipelines += 1;
            pipeline.spec.validate_for_operator().unwrap();
            let object = serde_json::to_value(&pipeline).unwrap();
            let errors = Validator::new().validate(&crd_schema(), &object, None);
            assert!(errors.is_ok(), "{}: {errors:?}", path.display());
        }
    }
    assert!(
        pipelines >= 2,
        "found {pipelines} example pipelines for the operator"
    );
}

#[test]
fn the_operator_manifest_runs_the_controller_with_the_permissions_it_uses() {
    let path = mailer_testkit::repo_root().join("deploy/operator.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let documents: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let of_kind = |kind: &str| {
        documents
            .iter()
            .find(|d| d["kind"] == kind)
            .unwrap()
            .clone()
    };
    let deployment: k8s_openapi::api::apps::v1::Deployment =
        serde_json::from_value(of_kind("Deployment")).unwrap();
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod.containers[0].args.as_deref(),
        Some(&["controller".to_string()][..])
    );
    // The rules are exactly the calls the code lists (src/controller/kube/rbac.rs), both ways.
    let granted = |rules: &Value| {
        let mut all = Vec::new();
        for rule in rules.as_array().unwrap() {
            let named = rule.get("resourceNames").is_some();
            let strings = |v: &Value| -> Vec<String> {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap().to_string())
                    .collect()
            };
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        all.push((group.clone(), resource.clone(), verb, named));
                    }
                }
            }
        }
        all.sort();
        all.dedup();
        all
    };
    use mailer::controller::kube::rbac::{Scope, grants};
    assert_eq!(
        granted(&of_kind("ClusterRole")["rules"]),
        grants(|scope| scope == Scope::Watched)
    );
    assert_eq!(
        granted(&of_kind("Role")["rules"]),
        grants(|scope| matches!(scope, Scope::Lease { .. }))
    );
}

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases";

fn election(fake: &FakeApi, identity: &str) -> LeaderElection {
    let api: Api<Lease> = Api::namespaced(fake.client(), "ops");
    LeaderElection::new(api, "mailer-operator", identity, Duration::from_secs(15))
}

#[tokio::test]
async fn one_replica_leads_and_a_standby_takes_over_when_it_lets_go() {
    let fake = FakeApi::default();
    let (a, b) = (election(&fake, "pod-a"), election(&fake, "pod-b"));
    assert!(
        a.try_lead().await.unwrap(),
        "the first replica takes a free Lease"
    );
    assert!(!b.try_lead().await.unwrap(), "a held Lease is not taken");
    assert!(a.try_lead().await.unwrap(), "the leader renews");
    assert_eq!(b.holder().await.unwrap().as_deref(), Some("pod-a"));

    a.release().await.unwrap();
    assert!(
        b.try_lead().await.unwrap(),
        "a released Lease is taken at once"
    );
    assert!(!a.try_lead().await.unwrap());
    let lease = fake.get(&format!("{LEASES}/mailer-operator")).unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "pod-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
}

#[tokio::test]
async fn an_abandoned_lease_is_taken_over_after_its_duration_by_the_local_clock() {
    let fake = FakeApi::default();
    // Renewed "long ago" by the holder's clock: that alone proves nothing, since clocks
    // differ; the Lease must stand unchanged for its duration as seen here.
    fake.put(
        &format!("{LEASES}/mailer-operator"),
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "mailer-operator", "namespace": "ops"},
               "spec": {"holderIdentity": "gone", "leaseDurationSeconds": 1,
                        "renewTime": "2020-01-01T00:00:00.000000Z"}}),
    );
    let b = election(&fake, "pod-b");
    let first_seen = std::time::Instant::now();
    assert!(
        !b.try_lead().await.unwrap(),
        "a Lease just seen is respected"
    );
    broker::eventually(10, "the abandoned Lease to be taken", || async {
        b.try_lead().await.unwrap().then_some(())
    })
    .await;
    assert!(first_seen.elapsed() > Duration::from_secs(1));
    // The write carried the resourceVersion it read, so a racing writer would fail.
    let writes: Vec<_> = fake
        .take_requests()
        .into_iter()
        .filter(|r| r.is_write())
        .collect();
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].method, "PUT");
    assert!(writes[0].body["metadata"]["resourceVersion"].is_string());
    let lease = fake.get(&format!("{LEASES}/mailer-operator")).unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "pod-b");
}

/// Runs against a real cluster (kind or k3d) with RabbitMQ reachable from it:
///
/// ```text
/// KUBECONFIG=~/.kube/config MAILER_E2E_IMAGE=reg/mailer:dev \
///   cargo test --test controller -- --ignored end_to_end
/// ```
///
/// It installs the CRD, runs the controller in this process, applies the example
/// Secrets and pipeline (edit `examples/rabbitmq-connection-secret.yaml` to point at the
/// broker), and waits for the pipeline's Ready condition and its worker Deployment.
#[tokio::test]
#[ignore = "needs a real cluster: set KUBECONFIG and run with --ignored"]
async fn end_to_end_on_a_real_cluster() {
    e2e::end_to_end().await;
}
