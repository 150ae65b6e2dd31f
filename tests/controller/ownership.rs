//! Ownership of broker objects: two pipelines that would share a send queue (in one
//! namespace, in two namespaces, in two clusters sharing a broker) never both write to
//! it; the one refused says who owns it, and deleting it removes nothing of the owner's.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use mailer::controller::reconcile;
use serde_json::{Value, json};

use super::broker::{UserCleanup, secret_uri, unique};
use mailer_testkit::broker::{TestVhost, raw_api};
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

/// What the event of a deleted pipeline that held nothing in the broker says.
const NOTHING_HELD: &str = "nothing in RabbitMQ was this pipeline's";

fn spec(vhost: &str) -> Value {
    PipelineSpec::new()
        .vhost(vhost)
        .deletion_policy("Delete")
        .build()
}

/// The owner marker of the send queue `mail.send` in `vhost` (the claim marker, the
/// format before pipeline markers).
fn marker(vhost: &str) -> String {
    send_queue(vhost).marker()
}

fn send_queue(vhost: &str) -> mailer::topology::ownership::Claim {
    mailer::topology::ownership::Claim::Queue {
        vhost: vhost.into(),
        name: "mail.send".into(),
    }
}

/// Who owns the send queue of `vhost`, as the operator reads the markers.
async fn owner_in_broker(vhost: &str) -> Value {
    mailer_testkit::broker::owner_of(&send_queue(vhost))
        .await
        .expect("the topology is marked")
}

fn assert_refused(
    result: &Result<kube::runtime::controller::Action, mailer::controller::Error>,
    says: &[&str],
) {
    let error = result.as_ref().expect_err("refused");
    assert_eq!(error.reason(), "Conflict");
    let message = error.to_string();
    for part in says {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
}

#[tokio::test]
async fn of_two_pipelines_on_one_queue_in_a_namespace_the_newer_is_refused_before_writing() {
    let h = harness();
    let test_vhost = TestVhost::fresh("controller-collide");
    let (older, newer) = (unique("a"), unique("b"));
    let _users = UserCleanup(vec![worker_user(&older), worker_user(&newer)]);
    connection_secret(&h, &secret_uri());
    h.seed_pipeline(&older, spec(&test_vhost.name), true);
    h.seed_pipeline(&newer, spec(&test_vhost.name), true);
    h.cache_pipelines(&[&older, &newer]);

    // The newer one goes first, and is refused before it writes anything.
    let (result, requests) = h.reconcile(&newer).await;
    assert_refused(
        &result,
        &[&format!("{NS}/{older} is older"), "exchange \"mail\""],
    );
    assert!(
        writes(&requests)
            .iter()
            .all(|w| w.ends_with("/status") || w.contains("/events")),
        "{:?}",
        writes(&requests)
    );
    assert!(raw_api().get_user(&worker_user(&newer)).await.is_err());
    assert!(
        raw_api()
            .get_queue_info(&test_vhost.name, "mail.send")
            .await
            .is_err()
    );

    // The older one builds, and marks the topology as its own.
    h.reconcile(&older).await.0.unwrap();
    let owner = owner_in_broker(&test_vhost.name).await;
    assert_eq!(owner["name"], older.as_str());
    assert_eq!(owner["namespace"], NS);
    assert_eq!(owner["cluster"], "default");
    assert_eq!(
        owner["uid"].as_str(),
        h.pipeline(&older).metadata.uid.as_deref()
    );
    let (result, _) = h.reconcile(&newer).await;
    assert_refused(&result, &[&older]);

    // Deleting the newer one removes nothing of the older one's.
    h.mark_deleted(&newer);
    let (result, requests) = h.reconcile(&newer).await;
    result.unwrap();
    let published = events(&requests);
    assert!(published[0].2.contains(NOTHING_HELD), "{published:?}");
    raw_api()
        .get_queue_info(&test_vhost.name, "mail.send")
        .await
        .expect("the older pipeline's queue stays");
    assert_eq!(
        owner_in_broker(&test_vhost.name).await["name"],
        older.as_str()
    );
}

#[tokio::test]
async fn a_pipeline_of_another_namespace_on_the_same_queue_is_refused_naming_the_owner() {
    let h = harness();
    let test_vhost = TestVhost::fresh("controller-collide-ns");
    let name = unique("shop");
    let other_user = format!("mailer-worker.default.staging.{name}");
    let _users = UserCleanup(vec![worker_user(&name), other_user.clone()]);
    connection_secret(&h, &secret_uri());
    h.seed_pipeline(&name, spec(&test_vhost.name), true);
    h.reconcile(&name).await.0.unwrap();

    // staging/<name>, with a connection Secret of its own to the same broker.
    h.fake.put(
        "/api/v1/namespaces/staging/secrets/conn",
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "conn", "namespace": "staging"},
               "data": {"uri": BASE64.encode(secret_uri()), "username": BASE64.encode("guest"),
                        "password": BASE64.encode("guest")}}),
    );
    let staging = format!("/apis/mailer.dev/v1alpha1/namespaces/staging/mailerpipelines/{name}");
    h.fake.put(
        &staging,
        json!({"apiVersion": "mailer.dev/v1alpha1", "kind": "MailerPipeline",
               "metadata": {"name": name, "namespace": "staging", "uid": unique("uid-staging"), "finalizers": [FINALIZER]},
               "spec": spec(&test_vhost.name)}),
    );
    let pipeline = serde_json::from_value(h.fake.get(&staging).unwrap()).unwrap();
    let result = reconcile(Arc::new(pipeline), h.ctx.clone()).await;
    assert_refused(
        &result,
        &[&format!(
            "belongs to MailerPipeline {NS}/{name} of cluster \"default\""
        )],
    );
    assert!(
        raw_api().get_user(&other_user).await.is_err(),
        "no user was made for the refused pipeline"
    );
    assert_eq!(owner_in_broker(&test_vhost.name).await["namespace"], NS);
}

#[tokio::test]
async fn clusters_sharing_a_broker_keep_their_own_users_and_the_second_is_refused() {
    let (east, west) = (harness_of_cluster("east"), harness_of_cluster("west"));
    let test_vhost = TestVhost::fresh("controller-collide-clusters");
    let name = unique("shop");
    let (east_user, west_user) = (
        format!("mailer-worker.east.{NS}.{name}"),
        format!("mailer-worker.west.{NS}.{name}"),
    );
    let _users = UserCleanup(vec![east_user.clone(), west_user.clone()]);
    for h in [&east, &west] {
        connection_secret(h, &secret_uri());
    }
    east.seed_pipeline(&name, spec(&test_vhost.name), true);
    // The same namespace and name in the other cluster: another pipeline (another UID).
    west.fake.put(
        &pipeline_path(&name),
        json!({"apiVersion": "mailer.dev/v1alpha1", "kind": "MailerPipeline",
               "metadata": {"name": name, "namespace": NS, "uid": unique("uid-west"), "finalizers": [FINALIZER]},
               "spec": spec(&test_vhost.name)}),
    );

    east.reconcile(&name).await.0.unwrap();
    let password = east.secret_value(&format!("{name}-worker-amqp"), "password");
    assert_eq!(owner_in_broker(&test_vhost.name).await["cluster"], "east");

    let (result, _) = west.reconcile(&name).await;
    assert_refused(&result, &["cluster \"east\""]);
    assert!(raw_api().get_user(&west_user).await.is_err());
    // East's workers keep their password: nothing of theirs was touched.
    assert_eq!(
        east.secret_value(&format!("{name}-worker-amqp"), "password"),
        password
    );
    raw_api().get_user(&east_user).await.expect("east's user");

    // West's pipeline goes: east's topology and user stay.
    west.mark_deleted(&name);
    let (result, requests) = west.reconcile(&name).await;
    result.unwrap();
    let published = events(&requests);
    assert!(published[0].2.contains(NOTHING_HELD), "{published:?}");
    raw_api()
        .get_queue_info(&test_vhost.name, "mail.send")
        .await
        .expect("east's queue stays");
    raw_api()
        .get_user(&east_user)
        .await
        .expect("east's user stays");

    // East's goes: its topology, user and markers go too.
    east.mark_deleted(&name);
    east.reconcile(&name).await.0.unwrap();
    assert!(raw_api().get_user(&east_user).await.is_err());
    assert!(
        mailer_testkit::broker::owner_of(&send_queue(&test_vhost.name))
            .await
            .is_none(),
        "the marker is released"
    );
}

#[tokio::test]
async fn a_vhost_change_leaves_what_another_pipeline_owns_in_the_old_vhost() {
    let h = harness();
    let name = unique("move");
    let (old, new) = (
        TestVhost::fresh("controller-move-old"),
        TestVhost::fresh("controller-move-new"),
    );
    let _users = UserCleanup(vec![worker_user(&name)]);
    connection_secret(&h, &secret_uri());
    h.seed_pipeline(&name, spec(&old.name), true);
    h.reconcile(&name).await.0.unwrap();
    // Meanwhile the old vhost's send queue has become another pipeline's.
    let other = mailer::topology::ownership::Owner {
        cluster: "default".into(),
        namespace: "staging".into(),
        name: "shop".into(),
        uid: "uid-of-another-pipeline".into(),
        retained: false,
    };
    mailer_testkit::broker::management()
        .set_owner(&marker(&old.name), &other)
        .await
        .expect("a foreign marker");

    let mut object = h.fake.get(&pipeline_path(&name)).unwrap();
    object["spec"]["rabbitmq"]["vhost"] = json!(new.name);
    h.fake.put(&pipeline_path(&name), object);
    h.reconcile(&name).await.0.unwrap();
    raw_api()
        .get_queue_info(&old.name, "mail.send")
        .await
        .expect("the other pipeline's queue stays in the old vhost");
    for queue in ["mail.send.retry", "mail.send.dead"] {
        assert!(
            raw_api().get_queue_info(&old.name, queue).await.is_err(),
            "{queue}, this pipeline's own, goes with its vhost change"
        );
    }
    assert_eq!(
        owner_in_broker(&old.name).await["uid"],
        "uid-of-another-pipeline"
    );
    raw_api()
        .get_queue_info(&new.name, "mail.send")
        .await
        .expect("built in the new vhost");
}
