//! Dead letters of every reason, made by the real worker and by the broker, listed with
//! the right reason each; the filters, stats and show.

use std::collections::BTreeMap;

use lapin::types::{AMQPValue, FieldTable};
use serde_json::Value;

use crate::harness::{DEAD_QUEUE, Pipeline, headers, json_lines, request, smtp_url};
use mailer_testkit::smtp::SmtpServer;

#[tokio::test]
async fn every_reason_is_listed_right_and_every_filter_narrows() {
    let smtp = SmtpServer::start();
    let p = Pipeline::new("reasons").await;
    p.make_delivery_limit("d-limit").await;
    p.send("a-malformed", b"{not json", FieldTable::default())
        .await;
    p.send(
        "b-gave-up",
        &request(&["busy+450@example.com"]),
        headers(&[("x-mail-replays", AMQPValue::LongLongInt(1))]),
    )
    .await;
    p.send(
        "c-rejected",
        &request(&["nobody+550@example.org"]),
        FieldTable::default(),
    )
    .await;
    p.send(
        "e-sent",
        &request(&["ok@example.com"]),
        FieldTable::default(),
    )
    .await;
    // b-gave-up fails for now twice, a second apart, and is given up at attempt 2.
    p.work_until_dead(&smtp_url(&smtp), 2, 4).await;
    assert_eq!(smtp.message_ids(), ["e-sent@shop.example"]);

    let (code, out, err) = p.dead(&["list", "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    let listed = json_lines(&out);
    let by_id: BTreeMap<&str, &Value> = listed
        .iter()
        .map(|l| (l["message_id"].as_str().unwrap(), l))
        .collect();
    let field = |id: &str, name: &str| by_id[id][name].clone();
    let text = |id: &str, name: &str| field(id, name).as_str().unwrap_or_default().to_string();
    assert_eq!(by_id.len(), 4, "{out}");
    assert_eq!(
        listed[0]["message_id"], "d-limit",
        "the first to die is first"
    );
    for (id, reason, attempts) in [
        ("a-malformed", "malformed", 1),
        ("b-gave-up", "gave-up", 2),
        ("c-rejected", "rejected", 1),
        ("d-limit", "delivery_limit", 2),
    ] {
        assert_eq!(text(id, "reason"), reason, "{id}: {out}");
        assert_eq!(field(id, "attempts"), attempts, "{id}: {out}");
        assert!(
            text(id, "dead_at").ends_with('Z'),
            "{id} says when it died: {out}"
        );
    }
    assert!(
        text("a-malformed", "error").contains("malformed request"),
        "{out}"
    );
    assert!(text("b-gave-up", "error").contains("450"), "{out}");
    assert!(text("c-rejected", "error").contains("550"), "{out}");
    assert_eq!(
        text("d-limit", "error"),
        "dead-lettered by RabbitMQ from queue mail.send (delivery_limit)"
    );
    assert_eq!(field("c-rejected", "to")[0], "nobody+550@example.org");
    assert_eq!(text("b-gave-up", "subject"), "Your order");
    assert_eq!(field("a-malformed", "subject"), Value::Null);

    // The broker's reason is its newest death, though the first was in the delay queue.
    let (code, shown, err) = p.dead(&["show", "d-limit"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        shown.contains("reason: delivery_limit (by RabbitMQ, from queue mail.send)"),
        "{shown}"
    );
    assert!(
        shown.contains(r#"  x-first-death-reason: "expired""#),
        "{shown}"
    );
    assert!(shown.contains(r#""reason":"delivery_limit""#), "{shown}");
    let (_, shown, _) = p.dead(&["show", "b-gave-up"]);
    assert!(
        shown.contains("replays: 1\n"),
        "the worker keeps x-mail-replays: {shown}"
    );
    assert!(
        shown.contains("  \"to\": [\n    \"busy+450@example.com\"\n  ]"),
        "the request, pretty-printed: {shown}"
    );

    // a-malformed and c-rejected die at once, in either order: expect the queue's.
    let order = p.listed(&[]);
    let in_order = |ids: &[&str]| {
        let mut ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        ids.sort_by_key(|id| order.iter().position(|o| o == id));
        ids
    };
    for (filters, expected) in [
        (vec!["--reason", "gave-up"], in_order(&["b-gave-up"])),
        (
            vec!["--reason", "malformed", "--reason", "delivery_limit"],
            in_order(&["d-limit", "a-malformed"]),
        ),
        (
            vec!["--to-domain", "example.org"],
            in_order(&["c-rejected"]),
        ),
        (
            vec!["--to-domain", "EXAMPLE.com"],
            in_order(&["d-limit", "b-gave-up"]),
        ),
        (
            vec!["--message-id", "c-rejected"],
            in_order(&["c-rejected"]),
        ),
        (vec!["--limit", "2"], order[..2].to_vec()),
        (vec!["--newer-than", "10m"], order.clone()),
        (vec!["--older-than", "10m"], vec![]),
        (
            vec!["--reason", "rejected", "--to-domain", "example.com"],
            vec![],
        ),
    ] {
        assert_eq!(p.listed(&filters), expected, "{filters:?}");
    }

    let (code, table, _) = p.dead(&["list", "--reason", "gave-up"]);
    assert_eq!(code, 0);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("MESSAGE-ID  REASON   ATTEMPTS  DEAD-AT"),
        "{table}"
    );
    assert!(
        lines[1].starts_with("b-gave-up   gave-up  2         "),
        "{table}"
    );
    assert!(
        lines[1].contains("busy+450@example.com  Your order"),
        "{table}"
    );
    assert_eq!(lines[2], "1 of 4 dead letters in mail.send.dead listed");

    let (code, stats, _) = p.dead(&["stats"]);
    assert_eq!(code, 0);
    assert!(
        stats.starts_with("mail.send.dead: 4 dead letters, 4 matching\nby reason:\n"),
        "{stats}"
    );
    for line in [
        "  delivery_limit  1",
        "  gave-up         1",
        "  malformed       1",
        "  rejected        1",
        "  example.com  2",
        "  example.org  1",
        "  (none)       1",
        "oldest: ",
        "newest: ",
    ] {
        assert!(stats.contains(line), "{line:?} in {stats}");
    }
    assert!(stats.contains("(d-limit)"), "d-limit died first: {stats}");

    assert_eq!(p.listed(&[]), order, "reading changed nothing");
    assert_eq!(p.ready(DEAD_QUEUE).await, 4);
}

#[tokio::test]
async fn bad_input_gets_one_clear_line() {
    let p = Pipeline::new("bad-input").await;
    let missing = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_mailer"))
            .arg("dead")
            .args(args)
            .env_remove("MAIL_AMQP_URL")
            .env(
                "RABBITMQ_MANAGEMENT_URL",
                mailer_testkit::broker::management_url(),
            )
            .output()
            .unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let vhost_url = p.vhost.amqp_url();
    let wrong_password = vhost_url.replace("guest:guest", "guest:hunter2");
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["list", "--amqp-url", &vhost_url], 2, "--file"),
        (
            vec!["list", "--queue", "nope", "--amqp-url", &vhost_url],
            1,
            "there is no queue nope",
        ),
        (
            vec![
                "list",
                "--queue",
                DEAD_QUEUE,
                "--reason",
                "gaveup",
                "--amqp-url",
                &vhost_url,
            ],
            2,
            "use one of malformed, gave-up, rejected, too-large, delivery_limit, expired, maxlen",
        ),
        (
            vec![
                "list",
                "--queue",
                DEAD_QUEUE,
                "--older-than",
                "soon",
                "--amqp-url",
                &vhost_url,
            ],
            2,
            "not a duration",
        ),
        (
            vec![
                "replay",
                "--queue",
                DEAD_QUEUE,
                "--rate",
                "fast",
                "--amqp-url",
                &vhost_url,
            ],
            2,
            "not a rate",
        ),
        (
            vec!["list", "--queue", DEAD_QUEUE, "--amqp-url", &wrong_password],
            1,
            "cannot connect to the broker",
        ),
        (
            vec![
                "show",
                "nobody",
                "--queue",
                DEAD_QUEUE,
                "--amqp-url",
                &vhost_url,
            ],
            1,
            "no dead letter in mail.send.dead has message id \"nobody\"",
        ),
    ];
    for (args, code, expected) in cases {
        let (found, err) = missing(&args);
        assert_eq!(found, code, "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(
            !err.contains("hunter2") && !err.contains("panicked"),
            "{err}"
        );
    }
    // --queue reads the URL's vhost, without a pipeline file.
    let (code, err) = missing(&["list", "--queue", DEAD_QUEUE, "--amqp-url", &vhost_url]);
    assert_eq!(code, 0, "{err}");
}
