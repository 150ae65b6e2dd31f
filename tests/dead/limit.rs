//! A dead queue whose delivery limit is finite is not read: not one delivery, by any
//! subcommand, whichever of a policy of higher priority (RabbitMQ 4's default then
//! applies), an operator policy or a queue argument sets it; and on RabbitMQ 4 not
//! without the management API to check it, while 3.x is read with a warning.

use std::process::{Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use rabbitmq_http_client::commons::PolicyTarget;
use rabbitmq_http_client::requests::PolicyParams;
use serde_json::{Value, json};

use crate::harness::{DEAD_QUEUE, Pipeline, headers, properties, request};
use mailer_testkit::broker::{TestBroker, amqp_base, management_url, publish, raw_api};
use mailer_testkit::process::eventually;
use mailer_testkit::smtp::closed_port;

const DEAD_PATTERN: &str = r"^mail\.send\.dead$";
const OURS: &str = "mailer.mail.send.dead";

/// What every subcommand is run as: each reads the whole queue before it acts.
const SUBCOMMANDS: [&[&str]; 7] = [
    &["list"],
    &["stats"],
    &["show", "s-1"],
    &["replay", "--dry-run"],
    &["replay"],
    &["purge"],
    &["purge", "--yes"],
];

fn definition(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// A policy (or an operator policy) of `priority` on the dead queue.
async fn put_policy(p: &Pipeline, name: &str, priority: i32, value: Value, operator: bool) {
    let params = PolicyParams {
        vhost: &p.vhost.name,
        name,
        pattern: DEAD_PATTERN,
        apply_to: PolicyTarget::Queues,
        priority,
        definition: definition(value),
    };
    let api = raw_api();
    let put = if operator {
        api.declare_operator_policy(&params).await
    } else {
        api.declare_policy(&params).await
    };
    put.expect("put the policy");
}

/// Waits until the management API reports `policy` and `operator_policy` as the ones
/// applied to `queue` (it reports them every 5 s).
async fn wait_for_report(p: &Pipeline, queue: &str, policy: &str, operator: Option<&str>) {
    let what = format!("{queue} reported with policy {policy} and operator policy {operator:?}");
    eventually(60, &what, || async {
        let info = raw_api().get_queue_info(&p.vhost.name, queue).await.ok()?;
        let reported = info.effective_policy_definition.is_some()
            && info.policy.as_deref() == Some(policy)
            && info.operator_policy.as_deref() == operator;
        reported.then_some(())
    })
    .await;
}

/// Asserts that the `n` messages of `queue` were never delivered: reads them with a
/// consumer of its own (which returns them, once), and looks at each.
async fn assert_never_delivered(p: &Pipeline, queue: &str, n: u32) {
    assert_eq!(p.ready(queue).await, n, "every message still ready");
    assert_eq!(p.consumers(queue).await, 0, "nothing left reading");
    let connection = p.vhost.connect().await;
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_qos(n as u16, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "never-delivered".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for _ in 0..n {
        let delivery = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .expect("a delivery")
            .expect("a delivery")
            .expect("a delivery");
        let id = delivery.properties.message_id().clone();
        assert!(!delivery.redelivered, "{id:?} was delivered before");
        let count = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-delivery-count").cloned());
        assert!(
            matches!(
                count,
                None | Some(AMQPValue::LongLongInt(0) | AMQPValue::LongInt(0))
            ),
            "{id:?} has x-delivery-count {count:?}"
        );
    }
    let _ = connection.close(200, "looked".into()).await;
}

/// Asserts that `mailer dead` refused with one line that says `expected`.
fn assert_refused(args: &[&str], (code, out, err): (i32, String, String), expected: &[&str]) {
    assert_eq!(code, 1, "{args:?} must refuse: {out}{err}");
    assert!(out.is_empty(), "{args:?} printed {out}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    for expected in expected {
        assert!(err.contains(expected), "{args:?}: {expected:?} in {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[tokio::test]
async fn a_policy_of_higher_priority_that_leaves_a_delivery_limit_stops_every_subcommand() {
    let p = Pipeline::new("shadowed").await;
    let ids = ["s-1", "s-2", "s-3"];
    for id in ids {
        p.publish_dead(id, "gave-up", "ok@example.com").await;
    }
    // On 4.x the platform's policy takes away our `delivery-limit: -1` (the default of
    // 20 is back); 3.x has no default, so there the policy sets a limit of its own.
    let (platform, limit) = if TestBroker::get().is_4x() {
        (json!({"max-length": 1000}), 20)
    } else {
        (json!({"max-length": 1000, "delivery-limit": 50}), 50)
    };
    put_policy(&p, "platform.all", 20, platform, false).await;
    wait_for_report(&p, DEAD_QUEUE, "platform.all", None).await;

    let says = format!(
        "will not read queue \"mail.send.dead\" in vhost \"{}\": its delivery limit is {limit} (",
        p.vhost.name
    );
    for args in SUBCOMMANDS {
        assert_refused(
            args,
            p.dead(args),
            &[
                &says,
                "policy \"platform.all\" of a higher priority than \"mailer.mail.send.dead\" applies instead",
                "Remove policy \"platform.all\" or lower its priority below 10",
            ],
        );
    }
    assert_never_delivered(&p, DEAD_QUEUE, 3).await;

    raw_api()
        .delete_policy(&p.vhost.name, "platform.all", false)
        .await
        .unwrap();
    wait_for_report(&p, DEAD_QUEUE, OURS, None).await;
    assert_eq!(p.listed(&[]), ids, "ours applies again");
}

#[tokio::test]
async fn an_operator_policy_with_a_delivery_limit_stops_a_read() {
    let p = Pipeline::new("operator").await;
    p.publish_dead("o-1", "gave-up", "ok@example.com").await;
    put_policy(&p, "limits", 0, json!({"delivery-limit": 100}), true).await;
    wait_for_report(&p, DEAD_QUEUE, OURS, Some("limits")).await;
    for args in [&["list"][..], &["purge", "--yes"]] {
        assert_refused(
            args,
            p.dead(args),
            &[
                "its delivery limit is 100 (set by operator policy \"limits\", which no policy can override)",
                "exempt queue \"mail.send.dead\" from operator policy \"limits\"",
            ],
        );
    }
    assert_never_delivered(&p, DEAD_QUEUE, 1).await;
}

#[tokio::test]
async fn a_queue_declared_with_a_delivery_limit_is_not_read() {
    let p = Pipeline::new("argument").await;
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    arguments.insert("x-delivery-limit".into(), AMQPValue::LongInt(1000));
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    p.channel
        .queue_declare("limited.dead".into(), options, arguments)
        .await
        .expect("declare a queue with x-delivery-limit");
    let dead = headers(&[]);
    publish(
        &p.channel,
        "",
        "limited.dead",
        &request(&["ok@example.com"]),
        properties("a-1", dead),
    )
    .await;
    // Its policies are not reported yet: the command waits for them.
    let output = Command::new(env!("CARGO_BIN_EXE_mailer"))
        .args(["dead", "list", "--queue", "limited.dead"])
        .env("MAIL_AMQP_URL", p.vhost.amqp_url())
        .env("RABBITMQ_MANAGEMENT_URL", management_url())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let found = (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert_refused(
        &["list", "--queue", "limited.dead"],
        found,
        &[
            "will not read queue \"limited.dead\"",
            "its delivery limit is 1000 (queue argument x-delivery-limit",
            "arguments never change",
        ],
    );
    assert_never_delivered(&p, "limited.dead", 1).await;
}

#[tokio::test]
async fn without_the_management_api_4x_is_not_read_and_3x_is_read_with_a_warning() {
    let p = Pipeline::new("unchecked").await;
    p.publish_dead("u-1", "gave-up", "ok@example.com").await;
    let broker = TestBroker::get();
    let unreachable = format!("http://guest:hunter2@127.0.0.1:{}", closed_port());
    let wrong_password = format!("http://guest:hunter2@127.0.0.1:{}", broker.management_port);
    for (management, says) in [
        (unreachable, "cannot be reached"),
        (wrong_password, "refused user \"guest\" (401)"),
    ] {
        let output = p
            .dead_command(&["list", "--output", "json"])
            .env("RABBITMQ_MANAGEMENT_URL", &management)
            .output()
            .unwrap();
        let (code, out, err) = (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        );
        assert!(
            !err.contains("hunter2") && !out.contains("hunter2"),
            "{err}"
        );
        if broker.is_4x() {
            assert_refused(
                &["list"],
                (code, out, err),
                &[
                    "on RabbitMQ 4.0.",
                    "its delivery limit could not be checked",
                    says,
                    "Pass --management-url",
                ],
            );
        } else {
            assert_eq!(code, 0, "{err}");
            assert_eq!(out.lines().count(), 1, "{out}");
            assert!(out.contains("\"u-1\""), "{out}");
            assert_eq!(err.trim_end().lines().count(), 1, "one warning: {err}");
            assert!(
                err.starts_with(
                    "warning: the delivery limit of mail.send.dead could not be checked"
                ) && err.contains(says)
                    && err.contains("RabbitMQ 3.10."),
                "{err}"
            );
        }
    }
    if broker.is_4x() {
        assert_never_delivered(&p, DEAD_QUEUE, 1).await;
    }
}

#[tokio::test]
async fn the_brokers_version_is_what_its_amqp_listener_says() {
    let version = mailer::amqp::server::server_version(&amqp_base(), Duration::from_secs(10))
        .await
        .expect("connection.start")
        .expect("a version property");
    let broker = TestBroker::get();
    assert!(
        version.starts_with(&format!("{}.", broker.version)),
        "{version} on the RabbitMQ {} ports",
        broker.version
    );
}
