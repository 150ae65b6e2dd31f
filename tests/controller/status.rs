//! Honest status and events: drift is only what changed behind the operator's back, its
//! own status writes trigger no reconcile, and `DeadLettersGrew` is told at most once per
//! resync interval; workers whose provider refuses their key are told apart from
//! workers that are merely not ready.

use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector;
use lapin::BasicProperties;
use mailer::amqp::connect;
use mailer::controller::runtime::index::{Guarded, ReferenceIndex};
use mailer::controller::runtime::watch::pipeline_triggers;
use mailer::mail::CREDENTIALS_REFUSED_CONNECTION;
use mailer::spec::MailerPipeline;
use serde_json::json;

use super::broker::unique_pipeline;
use super::broker::{eventually, secret_uri};
use mailer_testkit::broker::{TestVhost, confirming_channel, publish};
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

/// Generation 2 is attempted and fails (its provider Secret is missing); once the Secret
/// exists it is applied: an update, not drift, though `observedGeneration` said 2.
#[tokio::test]
async fn a_spec_change_after_a_failed_attempt_is_an_update_not_drift() {
    let h = harness();
    let (name, _users) = unique_pipeline("shop");
    let vhost = TestVhost::fresh("controller-applied-generation");
    connection_secret(&h, &secret_uri());
    h.seed_pipeline(&name, PipelineSpec::new().vhost(&vhost.name).build(), true);
    h.reconcile(&name).await.0.unwrap();

    let mut object = h.fake.get(&pipeline_path(&name)).unwrap();
    object["spec"]["topology"]["retryDelay"] = json!("30s");
    object["spec"]["worker"]["provider"] =
        json!({"urlSecretKeyRef": {"name": "smtp", "key": "url"}});
    h.fake.put(&pipeline_path(&name), object);
    let (result, _) = h.reconcile(&name).await;
    assert_eq!(result.unwrap_err().category(), "missing-secret");
    let status = &h.pipeline(&name).status.unwrap();
    assert_eq!(
        (status.observed_generation, status.applied_generation),
        (Some(2), Some(1))
    );

    h.seed_secret("smtp", &[("url", "discard://")]);
    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    let published = events(&requests);
    assert_eq!(published[0].1, "TopologyUpdated", "{published:?}");
    assert!(
        published[0].2.contains("mailer.mail.send.retry"),
        "{published:?}"
    );
    assert!(
        !h.metrics()
            .contains("mailer_controller_drift_repairs_total"),
        "no drift was repaired"
    );
    assert_eq!(
        h.pipeline(&name).status.unwrap().applied_generation,
        Some(2)
    );
}

/// Dead letters that keep coming are told once per resync interval, not every pass.
#[tokio::test]
async fn dead_letters_grew_is_told_at_most_once_per_resync_interval() {
    let h = harness();
    let (name, _users) = unique_pipeline("shop");
    let vhost = TestVhost::fresh("controller-dead-letters");
    connection_secret(&h, &secret_uri());
    h.seed_pipeline(&name, PipelineSpec::new().vhost(&vhost.name).build(), true);
    h.reconcile(&name).await.0.unwrap();
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    let mut told = Vec::new();
    for expected in [1, 2] {
        publish(&channel, "mail.dead", "", b"{}", BasicProperties::default()).await;
        let requests = eventually(30, "the dead letter to be counted", || async {
            let (result, requests) = h.reconcile(&name).await;
            result.unwrap();
            let stored = h.fake.get(&pipeline_path(&name)).unwrap();
            (stored["status"]["queues"]["dead"] == expected).then_some(requests)
        })
        .await;
        told.extend(events(&requests).into_iter().map(|e| e.1));
        told.extend(event_repeats(&requests).into_iter().map(|e| e.0));
    }
    let _ = connection.close(200, "done".into()).await;
    assert_eq!(told, ["DeadLettersGrew"]);
}

/// The pipelines' watch passes on what asks for a reconcile (a new pipeline, a spec
/// change, the finalizer, deletion) and not the operator's own status writes.
#[tokio::test]
async fn own_status_writes_trigger_no_reconcile() {
    let h = harness();
    h.seed_pipeline("shop", PipelineSpec::new().build(), false);
    let (_reader, writer) = reflector::store();
    let guarded: Api<Guarded> = Api::namespaced(h.fake.client(), NS);
    let triggers = pipeline_triggers(guarded, writer, ReferenceIndex::default());
    tokio::pin!(triggers);
    let mut next_generation = async || {
        let next = tokio::time::timeout(Duration::from_secs(5), triggers.next())
            .await
            .expect("a trigger")
            .unwrap()
            .unwrap();
        let meta = &kube::Resource::meta(&next);
        (meta.generation, meta.finalizers.clone().unwrap_or_default())
    };
    assert_eq!(next_generation().await, (Some(1), vec![]));

    let api: Api<MailerPipeline> = Api::namespaced(h.fake.client(), NS);
    let params = PatchParams::default();
    let finalizer = json!({"metadata": {"finalizers": [FINALIZER]}});
    api.patch("shop", &params, &Patch::Merge(&finalizer))
        .await
        .unwrap();
    assert_eq!(
        next_generation().await,
        (Some(1), vec![FINALIZER.to_string()])
    );

    for depth in 1..=3 {
        let status = json!({"status": {"observedGeneration": 1, "queues": {"send": depth}}});
        api.patch_status("shop", &params, &Patch::Merge(&status))
            .await
            .unwrap();
    }
    let labelled = json!({"metadata": {"labels": {"team": "mail"}}});
    api.patch("shop", &params, &Patch::Merge(&labelled))
        .await
        .unwrap();
    let spec = json!({"spec": {"worker": {"replicas": 3}}});
    api.patch("shop", &params, &Patch::Merge(&spec))
        .await
        .unwrap();
    assert_eq!(
        next_generation().await.0,
        Some(2),
        "the status writes and the label passed no trigger on"
    );
    api.delete("shop", &DeleteParams::default()).await.unwrap();
    assert_eq!(next_generation().await.0, Some(3), "deletion is a trigger");
}

/// The WorkerReady reason of the stored pipeline, and its message.
fn worker_ready(h: &Harness, name: &str) -> (String, String) {
    let status = h.pipeline(name).status.expect("a status");
    let condition = status
        .condition(mailer::spec::WORKER_READY)
        .expect("WorkerReady")
        .clone();
    (condition.reason, condition.message)
}

/// Workers whose provider refuses their key tell it through the broker, as their own
/// user; while they are not ready, the status names it (ProviderRefusesKey, with the
/// Secret to fix) instead of WorkersNotReady. The same connection name from another user
/// of the vhost tells nothing.
#[tokio::test]
async fn workers_whose_provider_refuses_their_key_are_told_apart() {
    let h = harness();
    let (name, _users) = unique_pipeline("refused");
    let vhost = TestVhost::fresh("controller-refused-key");
    connection_secret(&h, &secret_uri());
    h.seed_secret("mail-api", &[("url", "sendgrid://:key@api.sendgrid.com")]);
    let spec = PipelineSpec::new()
        .vhost(&vhost.name)
        .worker(json!({"provider": {"urlSecretKeyRef": {"name": "mail-api", "key": "url"}}}))
        .build();
    h.seed_pipeline(&name, spec, true);
    h.reconcile(&name).await.0.expect("the pipeline is built");
    // The Deployment asks for a worker; none is ready (no kubelet runs it).
    assert_eq!(worker_ready(&h, &name).0, "WorkersNotReady");

    // Another user's connection of that name tells nothing about these workers.
    let other = connect(
        &vhost.amqp_url(),
        CREDENTIALS_REFUSED_CONNECTION,
        Duration::from_secs(10),
    )
    .await
    .expect("the test's own connection");
    let workers_url = h.secret_value(&format!("{name}-worker-amqp"), "url");
    let telling = connect(
        &workers_url,
        CREDENTIALS_REFUSED_CONNECTION,
        Duration::from_secs(10),
    )
    .await
    .expect("a connection as the workers' user");
    let (_, message) = eventually(30, "ProviderRefusesKey", || async {
        h.reconcile(&name).await.0.expect("a reconcile");
        let (reason, message) = worker_ready(&h, &name);
        (reason == "ProviderRefusesKey").then_some((reason, message))
    })
    .await;
    assert!(
        message.contains("refuses the key") && message.contains("key url of Secret mail-api"),
        "{message}"
    );
    let ready = h.pipeline(&name).status.expect("a status");
    let ready = ready.condition(mailer::spec::READY).expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "ProviderRefusesKey")
    );

    // The key is taken again: the workers close that connection.
    let _ = telling.close(200, "taken".into()).await;
    eventually(30, "WorkersNotReady again", || async {
        h.reconcile(&name).await.0.expect("a reconcile");
        (worker_ready(&h, &name).0 == "WorkersNotReady").then_some(())
    })
    .await;
    let _ = other.close(200, "done".into()).await;
}
