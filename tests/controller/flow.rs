//! The reconcile flow of one pipeline from creation to deletion, against the in-memory
//! API server and the real broker.

use kube::runtime::controller::Action;
use lapin::options::{BasicConsumeOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde_json::json;

use super::broker::unique_pipeline;
use super::broker::{UserCleanup, eventually, secret_uri, unique};
use super::worker_pod;
use mailer_testkit::broker::{TestVhost, confirming_channel, publish, raw_api};
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

#[tokio::test]
async fn a_pipeline_is_built_left_alone_when_in_sync_repaired_and_cleaned_up() {
    let h = harness();
    let name = unique("shop");
    let test_vhost = TestVhost::fresh("controller");
    let vhost = test_vhost.name.clone();
    let user = worker_user(&name);
    let _users = UserCleanup(vec![user.clone()]);
    connection_secret(&h, &secret_uri());
    h.seed_secret("smtp", &[("url", "discard://")]);
    let spec = PipelineSpec::new()
        .vhost(&vhost)
        .deletion_policy("Delete")
        .worker(
            json!({"replicas": 2, "provider": {"urlSecretKeyRef": {"name": "smtp", "key": "url"}}}),
        )
        .build();
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
    let uid = h.pipeline(&name).metadata.uid.expect("a uid");
    assert_eq!(
        result.unwrap(),
        Action::requeue(mailer::controller::context::jittered(RESYNC, &uid))
    );
    let worker_secret = format!("{name}-worker-amqp");
    let worker_deployment = format!("{name}-worker");
    let status_path = format!("{}/status", pipeline_path(&name));
    assert_eq!(
        writes(&requests),
        [
            format!("PATCH {}", secret_path("conn")),
            format!("PATCH {}", secret_path(&worker_secret)),
            format!("PATCH {}", deployment_path(&worker_deployment)),
            format!("PATCH {status_path}"),
            format!("POST {EVENTS_PATH}"),
        ]
    );
    // The connection Secret, which the cleanup needs, is held before anything is made.
    let hold = write_to(&requests, "PATCH", &secret_path("conn"));
    assert_eq!(hold.content_type, "application/merge-patch+json");
    let conn = h
        .fake
        .get(&secret_path("conn"))
        .expect("the connection Secret");
    assert_eq!(
        conn["metadata"]["finalizers"],
        json!([format!("mailer.dev/in-use-{uid}")])
    );
    assert_eq!(conn["metadata"]["labels"]["mailer.dev/in-use"], "true");
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
    assert_condition(status, "TopologyReady", "True", None);
    assert_eq!(
        condition(status, "WorkerReady")["reason"],
        "WorkersNotReady"
    );
    assert_condition(status, "Ready", "False", None);
    assert_eq!(status["queues"], json!({"send": 0, "retry": 0, "dead": 0}));
    assert_eq!(status["workers"], json!({"ready": 0, "desired": 2}));
    assert_eq!(status["workerUser"], user.as_str());
    let published = events(&requests);
    assert_eq!(published[0].1, "TopologyCreated");
    assert!(
        // The note is cut at 1 kB, which the test vhost's long name comes near.
        published[0]
            .2
            .contains("create user \"mailer-worker.default."),
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
    let admin = raw_api();
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
    assert_condition(status, "Ready", "True", None);
    assert!(h.metrics().contains(&format!(
        "mailer_controller_pipeline_ready{{namespace=\"{NS}\",pipeline=\"{name}\"}} 1"
    )));

    // In sync: no write to Kubernetes, and none to RabbitMQ.
    let rabbitmq_writes = || {
        let metrics = h.metrics();
        let prefix = format!(
            "mailer_controller_rabbitmq_writes_total{{namespace=\"{NS}\",pipeline=\"{name}\"}} "
        );
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(&prefix).map(str::to_string))
            .expect("the RabbitMQ writes counter")
    };
    let before = rabbitmq_writes();
    assert_ne!(before, "0", "building the pipeline wrote to RabbitMQ");
    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    assert_eq!(writes(&requests), Vec::<String>::new());
    assert_eq!(rabbitmq_writes(), before);

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

    // A Deployment scaled by hand is put back.
    let mut deployment = h.fake.get(&deployment_path(&worker_deployment)).unwrap();
    deployment["spec"]["replicas"] = json!(5);
    h.fake.put(&deployment_path(&worker_deployment), deployment);
    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    assert!(writes(&requests).contains(&format!("PATCH {}", deployment_path(&worker_deployment))));
    // The same event about the same object version: one process-wide recorder counts
    // it in the first Event's series (which keeps the first note) instead of a new one.
    assert_eq!(events(&requests), []);
    let repeats = event_repeats(&requests);
    assert_eq!(repeats, [("TopologyRepaired".to_string(), 2)]);
    assert!(h.metrics().contains(&format!(
        "mailer_controller_drift_repairs_total{{namespace=\"{NS}\",pipeline=\"{name}\"}} 2"
    )));
    let stored = h.fake.get(&deployment_path(&worker_deployment)).unwrap();
    assert_eq!(stored["spec"]["replicas"], 2);

    // A change of the spec is applied and told as an update, not as drift.
    let mut object = h.fake.get(&pipeline_path(&name)).unwrap();
    object["spec"]["topology"]["retryDelay"] = json!("30s");
    object["metadata"]["generation"] = json!(2);
    h.fake.put(&pipeline_path(&name), object);
    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    let published = events(&requests);
    assert_eq!(published[0].1, "TopologyUpdated");
    assert!(
        published[0].2.contains("mailer.mail.send.retry"),
        "{published:?}"
    );
    let status = &write_to(&requests, "PATCH", &status_path).body["status"];
    assert_eq!(status["observedGeneration"], 2);
    let policy = admin
        .get_policy(&vhost, "mailer.mail.send.retry")
        .await
        .unwrap();
    assert_eq!(policy.definition.0.unwrap()["message-ttl"], 30_000);
    assert!(
        h.metrics().contains(&format!(
            "mailer_controller_drift_repairs_total{{namespace=\"{NS}\",pipeline=\"{name}\"}} 2"
        )),
        "a spec change is no drift"
    );

    // The real worker, run as the Deployment says with the user the operator made,
    // consumes a request it cannot understand and dead-letters it (which its permissions
    // allow). Once the management API counts it, the status shows it and a warning says so.
    let worker = worker_pod::start(&h, &deployment_path(&worker_deployment));
    let connection = test_vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    publish(
        &channel,
        "mail",
        "mail.send",
        b"{}",
        BasicProperties::default(),
    )
    .await;
    let _ = connection.close(200, "done".into()).await;
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

    drop(worker);

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
    // The connection Secret is let go of once the cleanup no longer needs it.
    let conn = h
        .fake
        .get(&secret_path("conn"))
        .expect("the connection Secret");
    assert_eq!(conn["metadata"]["finalizers"], json!([]), "{conn}");
    assert!(
        conn["metadata"]["labels"]["mailer.dev/in-use"].is_null(),
        "{conn}"
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

#[tokio::test]
async fn naming_an_own_user_removes_the_one_the_operator_made() {
    let h = harness();
    let (name, _users) = unique_pipeline("shop");
    let test_vhost = TestVhost::fresh("controller-own-user");
    let user = worker_user(&name);
    connection_secret(&h, &secret_uri());
    let spec = PipelineSpec::new().vhost(&test_vhost.name).build();
    h.seed_pipeline(&name, spec, true);
    h.reconcile(&name).await.0.unwrap();
    raw_api()
        .get_user(&user)
        .await
        .expect("the operator made a user");

    h.seed_secret("own-user", &[("username", "guest"), ("password", "guest")]);
    let mut object = h.fake.get(&pipeline_path(&name)).unwrap();
    object["spec"]["worker"] = json!({"userSecret": {"name": "own-user"}});
    object["metadata"]["generation"] = json!(2);
    h.fake.put(&pipeline_path(&name), object);
    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    assert!(
        raw_api().get_user(&user).await.is_err(),
        "the operator's user is gone"
    );
    let published = events(&requests);
    assert_eq!(published[0].1, "TopologyUpdated");
    assert!(
        published[0].2.contains(&format!("delete user \"{user}\"")),
        "{published:?}"
    );
    let url = h.secret_value(&format!("{name}-worker-amqp"), "url");
    let at_the_broker = amqp_uri().replace("amqp://", "amqp://guest:guest@");
    assert!(url.starts_with(&format!("{at_the_broker}/")), "{url}");
    let stored = h.fake.get(&pipeline_path(&name)).unwrap();
    assert_eq!(stored["status"]["workerUser"], "guest");
}
