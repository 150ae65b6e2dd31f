//! The topology reconciler against the real RabbitMQ: what apply creates, that a second
//! apply writes nothing, drift, conflicts, deletion, and that the policies really work;
//! and (`topology/scale.rs`) what a pass over many pipelines costs the management API;
//! (`topology/tiers.rs`) a live change of the delay tiers.

mod scale;
mod tiers;

use std::process::Command;
use std::time::Duration;

use lapin::BasicProperties;
use lapin::options::{BasicAckOptions, BasicNackOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use mailer::spec::{DeletionPolicy, MailerPipelineSpec};
use mailer::topology::EmptinessCheck;
use mailer::topology::{self, BrokerCapabilities, Removed, Topology, TopologyError};
use mailer_testkit::broker::{
    self, TestBroker, TestVhost, confirming_channel, get_within, management, publish, raw_api, text,
};
use rabbitmq_http_client::commons::BindingDestinationType;
use serde_json::{Value, json};

fn spec(vhost: &str, extra: &str) -> MailerPipelineSpec {
    serde_yaml::from_str(&format!("rabbitmq: {{vhost: {vhost}}}\n{extra}")).expect("spec")
}

fn desired(vhost: &str, extra: &str) -> Topology {
    let spec = spec(vhost, extra);
    Topology::desired(
        &spec.rabbitmq.vhost,
        &spec.topology,
        TestBroker::get().capabilities(),
    )
    .expect("topology")
}

#[tokio::test]
async fn a_fresh_apply_creates_exactly_the_designs_objects() {
    let vhost = TestVhost::fresh("fresh");
    let m = management();
    let changes = topology::apply(&m, &desired(&vhost.name, ""))
        .await
        .expect("apply");
    assert_eq!(changes.len(), 13, "{changes:#?}");

    let api = raw_api();
    let mut exchanges: Vec<(String, String, bool, bool)> = api
        .list_exchanges_in(&vhost.name)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| !e.name.is_empty() && !e.name.starts_with("amq."))
        .map(|e| (e.name, e.exchange_type, e.durable, e.auto_delete))
        .collect();
    exchanges.sort();
    assert_eq!(
        exchanges,
        [
            ("mail".into(), "direct".into(), true, false),
            ("mail.dead".into(), "fanout".into(), true, false),
            ("mail.retry".into(), "direct".into(), true, false),
        ]
    );

    let mut queues: Vec<(String, String, bool, Value)> = api
        .list_queues_in(&vhost.name)
        .await
        .unwrap()
        .into_iter()
        .map(|q| {
            (
                q.name,
                q.queue_type,
                q.durable,
                Value::Object(q.arguments.0),
            )
        })
        .collect();
    queues.sort_by(|a, b| a.0.cmp(&b.0));
    let quorum = json!({"x-queue-type": "quorum"});
    assert_eq!(
        queues,
        [
            ("mail.send".into(), "quorum".into(), true, quorum.clone()),
            (
                "mail.send.dead".into(),
                "quorum".into(),
                true,
                quorum.clone()
            ),
            ("mail.send.retry".into(), "quorum".into(), true, quorum),
        ]
    );

    let mut bindings: Vec<(String, String, String)> = api
        .list_bindings_in(&vhost.name)
        .await
        .unwrap()
        .into_iter()
        .filter(|b| !b.source.is_empty() && b.destination_type == BindingDestinationType::Queue)
        .map(|b| (b.source, b.destination, b.routing_key))
        .collect();
    bindings.sort();
    assert_eq!(
        bindings,
        [
            ("mail".into(), "mail.send".into(), "mail.send".into()),
            ("mail.dead".into(), "mail.send.dead".into(), "".into()),
            (
                "mail.retry".into(),
                "mail.send.retry".into(),
                "mail.send".into()
            ),
        ]
    );

    let mut policies: Vec<(String, String, Value)> = api
        .list_policies_in(&vhost.name)
        .await
        .unwrap()
        .into_iter()
        .map(|p| {
            (
                p.name,
                p.pattern,
                Value::Object(p.definition.0.unwrap_or_default()),
            )
        })
        .collect();
    policies.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        policies,
        [
            (
                "mailer.mail.send".into(),
                r"^mail\.send$".into(),
                json!({"delivery-limit": 5, "dead-letter-exchange": "mail.dead", "dead-letter-strategy": "at-least-once", "overflow": "reject-publish"})
            ),
            (
                "mailer.mail.send.dead".into(),
                r"^mail\.send\.dead$".into(),
                dead_queue_definition()
            ),
            (
                "mailer.mail.send.retry".into(),
                r"^mail\.send\.retry$".into(),
                json!({"message-ttl": 300000, "dead-letter-exchange": "mail", "dead-letter-routing-key": "mail.send", "dead-letter-strategy": "at-least-once", "overflow": "reject-publish"})
            ),
        ]
    );

    // Each policy is the one in force on exactly its own queue. The API reports the
    // policy in force from its statistics, which lag, so wait for it with a deadline.
    for (queue, policy) in [
        ("mail.send", "mailer.mail.send"),
        ("mail.send.retry", "mailer.mail.send.retry"),
        ("mail.send.dead", "mailer.mail.send.dead"),
    ] {
        wait_for_policy_in_force(&vhost, queue, policy).await;
    }
}

/// The dead queue's policy on the broker under test: no delivery limit on 4.x, where
/// quorum queues otherwise have one of 20.
fn dead_queue_definition() -> Value {
    if TestBroker::get().is_4x() {
        json!({"delivery-limit": -1, "overflow": "reject-publish"})
    } else {
        json!({"overflow": "reject-publish"})
    }
}

/// Waits until `policy` is the one in force on `queue`. The API reports it from its
/// statistics, which lag, so this polls with a deadline.
async fn wait_for_policy_in_force(vhost: &TestVhost, queue: &str, policy: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let found = raw_api()
            .get_queue_info(&vhost.name, queue)
            .await
            .unwrap()
            .policy;
        if found.as_deref() == Some(policy) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{queue}: policy in force is {found:?}, not {policy:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn a_second_apply_of_an_unchanged_spec_writes_nothing() {
    let vhost = TestVhost::fresh("idempotent");
    let t = desired(
        &vhost.name,
        "topology: {retryQueueMaxLength: 100, deadQueueMaxLength: 10}",
    );
    topology::apply(&management(), &t)
        .await
        .expect("first apply");

    let m = management();
    assert_eq!(topology::plan(&m, &t).await.expect("plan"), vec![]);
    assert_eq!(topology::apply(&m, &t).await.expect("second apply"), vec![]);
    assert_eq!(m.writes(), 0, "an apply in sync must only read");
}

#[tokio::test]
async fn drift_made_by_hand_is_repaired() {
    let vhost = TestVhost::fresh("drift");
    let t = desired(&vhost.name, "");
    topology::apply(&management(), &t).await.expect("apply");

    let api = raw_api();
    api.delete_policy(&vhost.name, "mailer.mail.send", false)
        .await
        .unwrap();
    let mut edited = rabbitmq_http_client::requests::PolicyParams {
        vhost: &vhost.name,
        name: "mailer.mail.send.retry",
        pattern: r"^mail\.send\.retry$",
        apply_to: rabbitmq_http_client::commons::PolicyTarget::Queues,
        priority: 10,
        definition: serde_json::Map::new(),
    };
    edited.definition.insert("message-ttl".into(), json!(1000));
    api.declare_policy(&edited).await.unwrap();
    mailer_testkit::broker::remove_retry_binding(&vhost).await;

    let changes: Vec<String> = topology::apply(&management(), &t)
        .await
        .expect("repair")
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(changes.len(), 3, "{changes:#?}");
    assert!(
        changes[0].starts_with("create binding mail.retry -> mail.send.retry"),
        "{changes:?}"
    );
    assert!(
        changes[1].starts_with("create policy mailer.mail.send "),
        "{changes:?}"
    );
    assert!(
        changes[2].starts_with("update policy mailer.mail.send.retry: "),
        "{changes:?}"
    );
    assert!(
        changes[2].contains("message-ttl 1000 -> 300000"),
        "{changes:?}"
    );

    let m = management();
    assert_eq!(topology::apply(&m, &t).await.expect("in sync"), vec![]);
    assert_eq!(m.writes(), 0);
}

#[tokio::test]
async fn a_classic_queue_in_the_way_is_reported_and_left_untouched() {
    let vhost = TestVhost::created("classic").await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    channel
        .queue_declare(
            "mail.send".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    publish(
        &channel,
        "",
        "mail.send",
        b"precious",
        BasicProperties::default(),
    )
    .await;

    let m = management();
    let err = topology::apply(&m, &desired(&vhost.name, ""))
        .await
        .unwrap_err();
    assert!(matches!(err, TopologyError::Conflict { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(r#"queue "mail.send" exists but is a classic queue, not quorum"#),
        "{text}"
    );
    assert!(text.contains("choose another name"), "{text}");
    assert_eq!(
        m.writes(),
        0,
        "nothing may be written while a conflict remains"
    );

    let q = raw_api()
        .get_queue_info(&vhost.name, "mail.send")
        .await
        .unwrap();
    assert_eq!(q.queue_type, "classic");
    let message = get_within(&channel, "mail.send", Duration::from_secs(5))
        .await
        .expect("the message is still there");
    assert_eq!(message.delivery.data, b"precious");
}

#[tokio::test]
async fn retain_removes_nothing() {
    let vhost = TestVhost::fresh("retain");
    let t = desired(&vhost.name, "");
    topology::apply(&management(), &t).await.unwrap();
    let m = management();
    let report = topology::delete(&m, &t, DeletionPolicy::Retain, EmptinessCheck::Force)
        .await
        .unwrap();
    assert!(report.removed.is_empty());
    assert_eq!(m.writes(), 0);
    assert_eq!(
        topology::plan(&management(), &t).await.unwrap(),
        vec![],
        "everything is still there"
    );
}

#[tokio::test]
async fn delete_keeps_a_queue_that_holds_mail_unless_forced() {
    let vhost = TestVhost::fresh("delete");
    let t = desired(&vhost.name, "topology: {deletionPolicy: Delete}");
    topology::apply(&management(), &t).await.unwrap();
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    publish(
        &channel,
        "mail.dead",
        "mail.send",
        b"dead letter",
        BasicProperties::default(),
    )
    .await;

    let report = topology::delete(
        &management(),
        &t,
        DeletionPolicy::Delete,
        EmptinessCheck::Live(&vhost.amqp_url()),
    )
    .await
    .unwrap();
    let removed: Vec<String> = report.removed.iter().map(ToString::to_string).collect();
    assert_eq!(
        removed,
        [
            "binding mail -> mail.send",
            "binding mail.retry -> mail.send.retry",
            "binding mail.dead -> mail.send.dead",
            "exchange mail",
            "exchange mail.retry",
            "exchange mail.dead",
            "queue mail.send",
            "queue mail.send.retry",
            "policy mailer.mail.send",
            "policy mailer.mail.send.retry",
        ]
    );
    // The dead queue holds mail: it stays, and so does its policy, which the mail needs.
    assert_eq!(report.kept.len(), 2, "{report:?}");
    assert!(
        report.kept[0]
            .to_string()
            .starts_with("queue mail.send.dead: it holds 1 messages"),
        "{report:?}"
    );
    let names: Vec<String> = raw_api()
        .list_queues_in(&vhost.name)
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(names, ["mail.send.dead"]);

    let report = topology::delete(
        &management(),
        &t,
        DeletionPolicy::Delete,
        EmptinessCheck::Force,
    )
    .await
    .unwrap();
    assert_eq!(
        report.removed,
        [
            Removed::Queue("mail.send.dead".into()),
            Removed::Policy("mailer.mail.send.dead".into())
        ]
    );
    assert!(
        raw_api()
            .list_queues_in(&vhost.name)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn delete_of_a_missing_vhost_or_an_unreachable_broker_is_not_an_error() {
    let vhost = TestVhost::fresh("gone");
    let t = desired(&vhost.name, "");
    let report = topology::delete(
        &management(),
        &t,
        DeletionPolicy::Delete,
        EmptinessCheck::Force,
    )
    .await
    .unwrap();
    assert!(report.removed.is_empty());
    assert!(
        report.kept[0].to_string().contains("does not exist"),
        "{report:?}"
    );

    let closed =
        mailer::topology::ManagementEndpoint::parse("http://guest:guest@127.0.0.1:1").unwrap();
    let m = mailer::topology::Management::new(&closed).unwrap();
    let report = topology::delete(&m, &t, DeletionPolicy::Delete, EmptinessCheck::Force)
        .await
        .unwrap();
    assert!(
        report.kept[0].to_string().contains("cannot reach"),
        "{report:?}"
    );
}

#[tokio::test]
async fn a_parked_request_comes_back_to_the_send_queue_after_the_delay() {
    let vhost = TestVhost::fresh("ttl");
    topology::apply(
        &management(),
        &desired(&vhost.name, "topology: {retryDelay: 1s}"),
    )
    .await
    .unwrap();
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    let started = std::time::Instant::now();
    publish(
        &channel,
        "mail.retry",
        "mail.send",
        b"later",
        BasicProperties::default(),
    )
    .await;

    let message = get_within(&channel, "mail.send", Duration::from_secs(15))
        .await
        .expect("back in mail.send");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "it came back before the delay: {:?}",
        started.elapsed()
    );
    assert_eq!(message.delivery.data, b"later");
    let headers = message
        .delivery
        .properties
        .headers()
        .clone()
        .unwrap_or_default();
    let reason = x_death_field(&headers, "reason");
    assert_eq!(reason.as_deref(), Some("expired"), "{headers:?}");
}

#[tokio::test]
async fn a_request_returned_six_times_lands_in_the_dead_queue() {
    let vhost = TestVhost::fresh("limit");
    topology::apply(&management(), &desired(&vhost.name, ""))
        .await
        .unwrap();
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    publish(
        &channel,
        "mail",
        "mail.send",
        b"poison",
        BasicProperties::default(),
    )
    .await;

    let mut deliveries = 0;
    while let Some(message) = get_within(&channel, "mail.send", Duration::from_secs(2)).await {
        deliveries += 1;
        assert!(
            deliveries <= 6,
            "delivered more often than the limit allows"
        );
        put_back(message).await;
    }
    assert_eq!(
        deliveries, 6,
        "the delivery limit of 5 allows five returns and dead-letters on the sixth"
    );

    let dead = get_within(&channel, "mail.send.dead", Duration::from_secs(10))
        .await
        .expect("dead-lettered");
    assert_eq!(dead.delivery.data, b"poison");
    let headers = dead
        .delivery
        .properties
        .headers()
        .clone()
        .unwrap_or_default();
    assert_eq!(
        text(headers.inner().get("x-first-death-reason")).as_deref(),
        Some("delivery_limit"),
        "{headers:?}"
    );
    dead.delivery
        .acker
        .ack(BasicAckOptions::default())
        .await
        .unwrap();
}

/// Once the dead queue's policy is in force, publishes a dead letter, reads it and returns
/// it, as the management UI's "get messages" does, up to `times` times; returns how many
/// reads found it.
async fn dead_letter_read_and_returned(
    vhost: &TestVhost,
    channel: &lapin::Channel,
    times: usize,
) -> usize {
    wait_for_policy_in_force(vhost, "mail.send.dead", "mailer.mail.send.dead").await;
    publish(
        channel,
        "mail.dead",
        "",
        b"looked at",
        BasicProperties::default(),
    )
    .await;
    for read in 0..times {
        // A returned message is back in the queue a moment later, not at once.
        let Some(message) = get_within(channel, "mail.send.dead", Duration::from_secs(2)).await
        else {
            return read;
        };
        put_back(message).await;
    }
    times
}

/// Returns a delivery to its queue, as a consumer that gives up on it does.
async fn put_back(message: lapin::message::BasicGetMessage) {
    message
        .delivery
        .acker
        .nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await
        .unwrap();
}

/// A user's catch-all policy, of a lower priority than the mailer's, that would drop a
/// dead letter at its fourth read if it were in force on the dead queue.
async fn declare_catch_all_policy(vhost: &TestVhost) {
    let mut definition = serde_json::Map::new();
    definition.insert("delivery-limit".into(), json!(3));
    raw_api()
        .declare_policy(&rabbitmq_http_client::requests::PolicyParams {
            vhost: &vhost.name,
            name: "everything",
            pattern: ".*",
            apply_to: rabbitmq_http_client::commons::PolicyTarget::Queues,
            priority: 0,
            definition,
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn the_dead_queue_keeps_a_dead_letter_however_often_it_is_read() {
    let broker = TestBroker::get();
    assert_eq!(
        management().capabilities().await.unwrap(),
        broker.capabilities(),
        "the capabilities follow the version the broker reports"
    );
    let vhost = TestVhost::created("dead-reads").await;
    declare_catch_all_policy(&vhost).await;
    let spec = spec(&vhost.name, "");
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;

    // The topology of the other major version: on 3.x it is refused (-1 is invalid there);
    // on 4.x it is accepted, and the default delivery limit drops a dead letter at its
    // 21st look.
    let other = if broker.is_4x() {
        BrokerCapabilities::RABBITMQ_3
    } else {
        BrokerCapabilities::RABBITMQ_4
    };
    let result = topology::apply(
        &management(),
        &Topology::desired(&spec.rabbitmq.vhost, &spec.topology, other).unwrap(),
    )
    .await;
    if broker.is_4x() {
        result.expect("apply");
        assert_eq!(
            dead_letter_read_and_returned(&vhost, &channel, 25).await,
            21,
            "RabbitMQ 4 drops a dead letter at its 21st return unless the policy lifts the limit"
        );
    } else {
        let err = result.unwrap_err().to_string();
        assert!(err.contains("not a valid delivery limit"), "{err}");
    }

    let changes = topology::apply(&management(), &desired(&vhost.name, ""))
        .await
        .expect("apply");
    let dead_policy: Vec<String> = changes
        .iter()
        .map(ToString::to_string)
        .filter(|c| c.contains("mailer.mail.send.dead"))
        .collect();
    assert_eq!(dead_policy.len(), 1, "{changes:#?}");
    if broker.is_4x() {
        assert_eq!(
            dead_policy[0],
            "update policy mailer.mail.send.dead: delivery-limit (unset) -> -1"
        );
    }
    assert_eq!(
        dead_letter_read_and_returned(&vhost, &channel, 30).await,
        30,
        "neither the broker's default limit nor the user's catch-all policy applies"
    );
    let message = get_within(&channel, "mail.send.dead", Duration::from_secs(2))
        .await
        .expect("still there");
    let count = message
        .delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-delivery-count").cloned());
    assert!(
        matches!(
            count,
            Some(AMQPValue::LongLongInt(30)) | Some(AMQPValue::LongInt(30))
        ),
        "every read counted as a delivery: {count:?}"
    );
}

/// A field of the newest `x-death` entry.
fn x_death_field(headers: &FieldTable, field: &str) -> Option<String> {
    let AMQPValue::FieldArray(deaths) = headers.inner().get("x-death")? else {
        return None;
    };
    let AMQPValue::FieldTable(first) = deaths.as_slice().first()? else {
        return None;
    };
    text(first.inner().get(field))
}

fn mailer(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_mailer"))
        .args(args)
        .env_remove("RABBITMQ_MANAGEMENT_URL")
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_cli_plans_applies_and_reports_no_change() {
    let vhost = TestVhost::fresh("cli");
    let dir = tempdir();
    let file = dir.join("pipeline.yaml");
    let text = std::fs::read_to_string("examples/pipeline.yaml")
        .unwrap()
        .replace("vhost: shop", &format!("vhost: {}", vhost.name));
    std::fs::write(
        &file,
        format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: x}}\n---\n{text}"),
    )
    .unwrap();
    let file = file.to_str().unwrap();

    let topology_cli = |action: &str| {
        mailer(&[
            "topology",
            action,
            "-f",
            file,
            "--management-url",
            &broker::management_url(),
        ])
    };
    let (code, out, _) = topology_cli("plan");
    assert_eq!(code, 0);
    assert!(
        out.contains("skipped document 1 (Secret x): not a MailerPipeline"),
        "{out}"
    );
    assert!(
        out.contains("would create queue mail.send (quorum)"),
        "{out}"
    );
    let (code, out, _) = topology_cli("apply");
    assert_eq!(code, 0);
    assert!(
        out.contains("create policy mailer.mail.send.retry"),
        "{out}"
    );
    for action in ["apply", "plan"] {
        let (code, out, _) = topology_cli(action);
        assert_eq!(code, 0);
        assert!(
            out.contains("in sync: nothing to change"),
            "{action}: {out}"
        );
    }
}

#[test]
fn bad_input_gets_one_clear_line_and_a_non_zero_exit() {
    let dir = tempdir();
    let bad_field = dir.join("field.yaml");
    std::fs::write(&bad_field, "apiVersion: mailer.dev/v1alpha1\nkind: MailerPipeline\nmetadata: {name: x}\nspec: {topology: {retryDelya: 5m}}\n").unwrap();
    let bad_delay = dir.join("delay.yaml");
    std::fs::write(&bad_delay, "apiVersion: mailer.dev/v1alpha1\nkind: MailerPipeline\nmetadata: {name: x}\nspec: {topology: {retryDelay: -5m}}\n").unwrap();
    let good = "examples/pipeline.yaml";
    let management_url = broker::management_url();
    let wrong_password = format!("http://guest:hunter2@{}", broker::management_host());
    let cases: [(&str, &str, &str); 5] = [
        (
            bad_field.to_str().unwrap(),
            management_url.as_str(),
            "spec.topology.retryDelya: unknown field",
        ),
        (
            bad_delay.to_str().unwrap(),
            management_url.as_str(),
            "spec.topology.retryDelay: \"-5m\" is not a duration",
        ),
        (
            good,
            wrong_password.as_str(),
            "refused user \"guest\" (401 Unauthorized)",
        ),
        (
            good,
            "http://guest:hunter2@127.0.0.1:1",
            "cannot reach the RabbitMQ management API",
        ),
        (
            "no/such/file.yaml",
            management_url.as_str(),
            "cannot read no/such/file.yaml",
        ),
    ];
    for (file, url, expected) in cases {
        let (code, out, err) = mailer(&["topology", "plan", "-f", file, "--management-url", url]);
        assert_eq!(code, 1, "{file} {url}: {out}{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(expected),
            "{err}"
        );
        assert!(
            !err.contains("hunter2") && !err.contains("panicked"),
            "{err}"
        );
    }
}

fn tempdir() -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("mailer-topology-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn policies_written_together_each_learn_their_own_outcome() {
    let vhost = mailer_testkit::broker::TestVhost::created("together").await;
    let management = std::sync::Arc::new(management());
    let policy = |name: &str, definition: Value| mailer::topology::desired::Policy {
        name: name.into(),
        pattern: format!("^{name}$"),
        definition: serde_json::from_value(definition).expect("a definition"),
    };
    let good = vec![policy("mailer.good", json!({"message-ttl": 1000}))];
    // A value RabbitMQ refuses: the batch's one import fails as a whole.
    let bad = vec![policy("mailer.bad", json!({"message-ttl": "never"}))];
    let window = Duration::from_millis(500);
    let (good_written, bad_written) = tokio::join!(
        topology::management::together::put_policies_together(
            &management,
            &vhost.name,
            good,
            window,
            None
        ),
        topology::management::together::put_policies_together(
            &management,
            &vhost.name,
            bad,
            window,
            None
        ),
    );
    good_written.expect("the good policy is written");
    assert!(bad_written.is_err(), "{bad_written:?}");
    assert_eq!(policy_names(&vhost.name).await, ["mailer.good"]);
}

/// The names of `vhost`'s policies, in order.
async fn policy_names(vhost: &str) -> Vec<String> {
    let mut names: Vec<String> = raw_api()
        .list_policies_in(vhost)
        .await
        .expect("policies")
        .into_iter()
        .map(|p| p.name)
        .collect();
    names.sort();
    names
}

/// Policies that join a batch holding others' are handed over: their submission returns
/// before the batch is even closed, and the batch writes them with the rest.
#[tokio::test]
async fn policies_joining_others_are_handed_to_their_batch() {
    let vhost = mailer_testkit::broker::TestVhost::created("handed").await;
    let management = std::sync::Arc::new(management());
    let policy = |name: &str| {
        vec![mailer::topology::desired::Policy {
            name: name.into(),
            pattern: format!("^{name}$"),
            definition: serde_json::from_value(json!({"message-ttl": 1000})).expect("a definition"),
        }]
    };
    // The batch closes 300 ms after its last submission.
    let window = Duration::from_secs(3);
    let recent = Some(Duration::from_secs(1));
    let together = |name: &str| {
        topology::management::together::put_policies_together(
            &management,
            &vhost.name,
            policy(name),
            window,
            recent,
        )
    };
    // The first opens the batch in a quiet vhost, so it waits for the import.
    let first = together("mailer.first");
    tokio::pin!(first);
    assert!(futures::poll!(&mut first).is_pending());
    // The second joins it and is handed over.
    let second = together("mailer.second").await.expect("handed over");
    assert_eq!(second.batch, 2, "{second:?}");
    assert_eq!(
        policy_names(&vhost.name).await,
        Vec::<String>::new(),
        "written before the batch closed"
    );
    let first = first.await.expect("written");
    assert_eq!(first.batch, 2, "{first:?}");
    assert_eq!(
        policy_names(&vhost.name).await,
        ["mailer.first", "mailer.second"]
    );
}
