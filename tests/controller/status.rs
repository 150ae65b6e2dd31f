//! Honest status and events: drift is only what changed behind the operator's back, its
//! own status writes trigger no reconcile, and `DeadLettersGrew` is told at most once per
//! resync interval.

use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector;
use lapin::BasicProperties;
use mailer::controller::runtime::index::{Guarded, ReferenceIndex};
use mailer::controller::runtime::watch::pipeline_triggers;
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
