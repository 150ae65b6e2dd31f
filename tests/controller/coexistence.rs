//! Coexisting with what others made and change: an object of the operator's name that
//! another controller owns is never taken over, and values the API server rewrites do not
//! look like drift.

use serde_json::{Value, json};

use super::broker::secret_uri;
use super::broker::unique_pipeline;
use mailer_testkit::broker::{TestVhost, raw_api};
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

fn foreign_deployment(name: &str, owner: Option<Value>) -> Value {
    let mut metadata = json!({"name": name, "namespace": NS, "labels": {"app": "legacy"}});
    if let Some(owner) = owner {
        metadata["ownerReferences"] = json!([owner]);
    }
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
           "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "legacy"}},
                    "template": {"metadata": {"labels": {"app": "legacy"}},
                                 "spec": {"containers": [{"name": "legacy", "image": "legacy:1"}]}}},
           "status": {"readyReplicas": 3, "updatedReplicas": 3}})
}

#[tokio::test]
async fn a_deployment_or_secret_of_the_workers_name_that_is_not_ours_is_left_alone() {
    let h = harness();
    let (name, _users) = unique_pipeline("shop");
    let test_vhost = TestVhost::fresh("controller-foreign");
    let user = worker_user(&name);
    connection_secret(&h, &secret_uri());
    h.seed_pipeline(
        &name,
        PipelineSpec::new().vhost(&test_vhost.name).build(),
        true,
    );
    let worker_deployment = format!("{name}-worker");
    let other_pipeline = json!({"apiVersion": "mailer.dev/v1alpha1", "kind": "MailerPipeline",
                                "name": "other", "uid": "uid-other", "controller": true});
    for (owner, says) in [
        (None, "it has no controller"),
        (
            Some(other_pipeline),
            "its controller is MailerPipeline other",
        ),
    ] {
        let legacy = foreign_deployment(&worker_deployment, owner);
        h.fake
            .put(&deployment_path(&worker_deployment), legacy.clone());
        let (result, requests) = h.reconcile(&name).await;
        let error = result.unwrap_err();
        assert_eq!(error.reason(), "Conflict");
        assert!(!error.is_transient());
        let status = h.fake.get(&pipeline_path(&name)).unwrap()["status"].clone();
        let topology = condition(&status, "TopologyReady");
        assert_eq!(topology["reason"], "Conflict");
        let message = topology["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("Deployment {NS}/{worker_deployment}"))
                && message.contains(says),
            "{message}"
        );
        assert_eq!(
            status["workers"]["ready"], 0,
            "the foreign Deployment's pods are not counted as workers"
        );
        assert!(
            writes(&requests)
                .iter()
                .all(|w| !w.contains("/deployments/") && !w.contains("/secrets/")),
            "{:?}",
            writes(&requests)
        );
        let stored = h.fake.get(&deployment_path(&worker_deployment)).unwrap();
        assert_eq!(stored["spec"], legacy["spec"], "left as it was");
        assert!(
            raw_api().get_user(&user).await.is_err(),
            "nothing was written to RabbitMQ either"
        );
        assert!(
            raw_api()
                .get_queue_info(&test_vhost.name, "mail.send")
                .await
                .is_err()
        );
    }

    // A Secret of the worker Secret's name that is someone else's: the same.
    h.fake.delete(&deployment_path(&worker_deployment)).unwrap();
    h.seed_secret(&format!("{name}-worker-amqp"), &[("password", "theirs")]);
    let (result, requests) = h.reconcile(&name).await;
    assert_eq!(result.unwrap_err().reason(), "Conflict");
    assert!(writes(&requests).iter().all(|w| !w.contains("/secrets/")));
    assert_eq!(
        h.secret_value(&format!("{name}-worker-amqp"), "password"),
        "theirs"
    );
    assert!(raw_api().get_user(&user).await.is_err());
}

#[tokio::test]
async fn quantities_the_api_server_rewrites_are_not_drift() {
    let h = harness();
    let (name, _users) = unique_pipeline("shop");
    let test_vhost = TestVhost::fresh("controller-quantities");
    connection_secret(&h, &secret_uri());
    let resources =
        json!({"requests": {"cpu": "0.5", "memory": "1024Mi"}, "limits": {"memory": "0.5Gi"}});
    h.seed_pipeline(
        &name,
        PipelineSpec::new()
            .vhost(&test_vhost.name)
            .worker(json!({"resources": resources}))
            .build(),
        true,
    );
    let (result, _) = h.reconcile(&name).await;
    result.unwrap();
    // As the API server stores them: in canonical form.
    let path = deployment_path(&format!("{name}-worker"));
    let mut stored = h.fake.get(&path).unwrap();
    stored["spec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "512Mi"}});
    h.fake.put(&path, stored);
    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    assert_eq!(
        writes(&requests),
        Vec::<String>::new(),
        "no apply, no event"
    );

    // A real change of a quantity is put back.
    let mut stored = h.fake.get(&path).unwrap();
    stored["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] =
        json!("250m");
    h.fake.put(&path, stored);
    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    assert!(writes(&requests).contains(&format!("PATCH {path}")));
}
