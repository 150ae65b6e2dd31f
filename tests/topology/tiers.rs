//! Delay tiers on the real broker: a live change of the tiers while mail is parked in a
//! tier that goes loses nothing; that tier's queue is kept, with its policy and binding,
//! while it holds mail, and removed once it is empty (as `mailer topology apply` does).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use lapin::BasicProperties;
use mailer::message::Mail;
use mailer::provider::{ErrorClass, Provider, SendError};
use mailer::topology::EmptinessCheck;
use mailer::topology::desired::Binding;
use mailer::topology::tiers::remove_former_tiers;
use mailer::topology::{Kept, Removed};
use mailer::worker::config::RetryTiers;
use mailer_testkit::broker::{
    TestVhost, confirming_channel, live_count, management, pipeline_of, publish, raw_api, spec_in,
};
use mailer_testkit::inproc::InProcess;

/// Fails every send for now until the outage is over, then records what it sent.
#[derive(Debug, Default)]
struct Outage {
    over: AtomicBool,
    sent: Mutex<BTreeSet<String>>,
}

impl fmt::Display for Outage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("outage://")
    }
}

impl Provider for Outage {
    fn send(&self, mail: Mail) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(async move {
            if !self.over.load(Ordering::SeqCst) {
                return Err(SendError::for_now(
                    ErrorClass::TemporaryReply,
                    "451 not yet",
                ));
            }
            // The Message-ID in its angle brackets: the request's message id.
            let id = mail.message_id().trim_matches(['<', '>']).to_string();
            self.sent.lock().expect("sent").insert(id);
            Ok(())
        })
    }
}

/// `mailer topology <action>` of a pipeline in `vhost` with `topology`, counting queues
/// over the test broker's AMQP port.
fn topology_cli(action: &str, vhost: &str, topology: &str) -> (i32, String, String) {
    let file = super::tempdir().join("pipeline.yaml");
    let text = format!(
        "apiVersion: mailer.dev/v1alpha1\nkind: MailerPipeline\nmetadata: {{name: tiers}}\nspec:\n  rabbitmq: {{vhost: {vhost}}}\n  topology: {{{topology}}}\n"
    );
    std::fs::write(&file, text).expect("the pipeline file");
    let file = file.to_str().expect("a path");
    let management_url = mailer_testkit::broker::management_url();
    let mut args = vec![
        "topology",
        action,
        "-f",
        file,
        "--management-url",
        &management_url,
    ];
    let amqp_url = mailer_testkit::broker::amqp_base();
    // Where queues are counted live: the test broker's AMQP port (4.0's is not the
    // default the management URL implies).
    if action == "apply" || action == "delete" {
        args.extend(["--amqp-url", &amqp_url]);
    }
    super::mailer(&args)
}

/// Waits, at most `within`, until `done` holds.
async fn until<F: AsyncFnMut() -> bool>(what: &str, within: Duration, mut done: F) {
    let deadline = Instant::now() + within;
    while !done().await {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const PARKED: usize = 20;
const GOING: &str = "mail.send.retry.3";

#[tokio::test]
async fn a_live_tier_change_loses_nothing_and_a_former_tier_goes_once_empty() {
    // Three tiers; the third is long enough to change the tiers while mail waits in it.
    let (vhost, three) = pipeline_of("tiers-change", "retryDelays: [1s, 2s, 12s]").await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    let outage = Arc::new(Outage::default());
    let worker = InProcess::start_tiered(
        &vhost.amqp_url(),
        outage.clone(),
        16,
        RetryTiers::of_topology(&three.topology).expect("valid tiers"),
    );
    let mut published = BTreeSet::new();
    for i in 0..PARKED {
        let id = format!("t-{i:02}@shop.example");
        let body = serde_json::to_vec(&serde_json::json!({
            "from": "shop@example.com", "to": ["a@example.com"], "subject": "s", "text": "t"
        }))
        .expect("json");
        let properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(id.as_str().into())
            .with_delivery_mode(2);
        publish(&channel, "mail", "mail.send", &body, properties).await;
        published.insert(id);
    }
    // Attempts 1 and 2 fail and wait 1s and 2s; attempt 3 fails and parks in tier 3.
    until(
        "every request parked in tier 3",
        Duration::from_secs(30),
        async || live_count(&connection, GOING).await == Some(PARKED as u32),
    )
    .await;
    // The workers of the old tiers stop (a Deployment's rollout) and the spec loses tier
    // 3: `mailer topology apply` keeps its queue, and says so; so does the next pass.
    worker.stop().await.expect("the worker stops cleanly");
    let two = spec_in(&vhost, "retryDelays: [1s, 2s]");
    let (code, out, err) = topology_cli("plan", &vhost.name, "retryDelays: [1s, 2s]");
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("would remove queue mail.send.retry.3 of a former delay tier"),
        "{out}"
    );
    let (code, out, err) = topology_cli("apply", &vhost.name, "retryDelays: [1s, 2s]");
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("kept queue mail.send.retry.3 of a former delay tier"),
        "{out}"
    );
    let amqp_url = vhost.amqp_url();
    let m = management();
    let former_tiers = async || {
        let live = EmptinessCheck::Live(&amqp_url);
        remove_former_tiers(&m, &vhost.name, &two.topology, live)
            .await
            .expect("former tiers")
    };
    let report = former_tiers().await;
    assert!(report.removed.is_empty(), "{report}");
    assert!(
        report
            .kept
            .iter()
            .any(|kept| matches!(kept, Kept::Queue { name, .. } if name == GOING)),
        "{report}"
    );
    // Kept whole: the queue with its mail, its policy, its binding.
    assert!(live_count(&connection, GOING).await.is_some_and(|n| n > 0));
    assert!(
        raw_api()
            .get_policy(&vhost.name, "mailer.mail.send.retry.3")
            .await
            .is_ok()
    );
    let binding = Binding {
        exchange: "mail.retry".into(),
        queue: GOING.into(),
        routing_key: GOING.into(),
    };
    let observed = m.observe(&vhost.name).await.expect("what the vhost holds");
    assert!(observed.bindings.contains(&binding), "{observed:?}");

    // The provider is back; the workers of the new tiers deliver what tier 3 returns.
    outage.over.store(true, Ordering::SeqCst);
    let worker = InProcess::start_tiered(
        &amqp_url,
        outage.clone(),
        16,
        RetryTiers::of_topology(&two.topology).expect("valid tiers"),
    );
    until(
        "every request delivered",
        Duration::from_secs(40),
        async || *outage.sent.lock().expect("sent") == published,
    )
    .await;
    worker.stop().await.expect("the worker stops cleanly");
    assert_eq!(live_count(&connection, "mail.send.dead").await, Some(0));
    assert_eq!(live_count(&connection, "mail.send").await, Some(0));
    assert_eq!(live_count(&connection, GOING).await, Some(0));

    // Empty now: the next apply removes it, with its policy; then there is nothing left.
    let report = former_tiers().await;
    assert_eq!(
        report.removed,
        [
            Removed::Queue(GOING.into()),
            Removed::Policy("mailer.mail.send.retry.3".into())
        ],
        "{report}"
    );
    assert!(report.kept.is_empty(), "{report}");
    assert_eq!(live_count(&connection, GOING).await, None);
    assert!(
        raw_api()
            .get_policy(&vhost.name, "mailer.mail.send.retry.3")
            .await
            .is_err()
    );
    let (code, out, err) = topology_cli("apply", &vhost.name, "retryDelays: [1s, 2s]");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("in sync: nothing to change"), "{out}");
    assert!(!out.contains("former delay tier"), "{out}");
    // Tiers 1 and 2 were never touched.
    for queue in ["mail.send.retry", "mail.send.retry.2"] {
        assert_eq!(live_count(&connection, queue).await, Some(0), "{queue}");
    }
}

/// `mailer topology delete` removes the queue of a tier the spec no longer has too (kept
/// by an apply while it held parked requests), by the same rule as the others: only once
/// it is empty.
#[tokio::test]
async fn topology_delete_removes_a_former_tiers_queue_once_it_is_empty() {
    let vhost = TestVhost::fresh("tiers-delete");
    let three = "retryDelays: [1s, 2s, 1h], deletionPolicy: Delete";
    let two = "retryDelays: [1s, 2s], deletionPolicy: Delete";
    let (code, out, err) = topology_cli("apply", &vhost.name, three);
    assert_eq!(code, 0, "{out}{err}");
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    let properties = BasicProperties::default()
        .with_message_id("parked".into())
        .with_delivery_mode(2);
    publish(&channel, "mail.retry", GOING, b"{}", properties).await;
    let (code, out, err) = topology_cli("apply", &vhost.name, two);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("kept queue mail.send.retry.3"), "{out}");

    let (code, out, err) = topology_cli("delete", &vhost.name, two);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("kept queue {GOING}")), "{out}");
    assert_eq!(live_count(&connection, GOING).await, Some(1), "{out}");
    assert_eq!(
        live_count(&connection, "mail.send.retry.2").await,
        None,
        "{out}"
    );

    channel
        .queue_purge(GOING.into(), lapin::options::QueuePurgeOptions::default())
        .await
        .expect("purge");
    let (code, out, err) = topology_cli("delete", &vhost.name, two);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("removed queue {GOING}")), "{out}");
    assert_eq!(live_count(&connection, GOING).await, None, "{out}");
    assert!(
        raw_api()
            .get_policy(&vhost.name, "mailer.mail.send.retry.3")
            .await
            .is_err(),
        "its policy went with it"
    );
}
