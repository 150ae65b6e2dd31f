//! Delay tiers through the operator, on the real broker: the workers get the tiers'
//! routing keys, the status and the gauge count each tier, and a tier removed while its
//! queue holds mail keeps the queue (held, draining) until it is empty and the workers
//! have rolled out, then removes it.

use lapin::BasicProperties;
use lapin::options::QueuePurgeOptions;
use serde_json::{Value, json};

use super::broker::{eventually, secret_uri, unique_pipeline};
use mailer::topology::ownership::Claim;
use mailer_testkit::broker::{TestVhost, confirming_channel, live_count, publish, raw_api};
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

const GOING: &str = "mail.send.retry.3";

/// The worker Deployment's `MAIL_RETRY_KEYS`, if it has one.
fn retry_keys(h: &Harness, name: &str) -> Option<String> {
    let deployment = h
        .fake
        .get(&deployment_path(&format!("{name}-worker")))
        .expect("the worker Deployment");
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"].clone();
    env.as_array()?
        .iter()
        .find(|var| var["name"] == "MAIL_RETRY_KEYS")
        .and_then(|var| var["value"].as_str().map(String::from))
}

/// Reconciles until the stored status's `queues` satisfies `check`.
async fn reconcile_until(h: &Harness, name: &str, what: &str, check: impl Fn(&Value) -> bool) {
    eventually(30, what, || async {
        h.reconcile(name).await.0.expect("a reconcile");
        let stored = h.fake.get(&pipeline_path(name)).expect("the pipeline");
        check(&stored["status"]["queues"]).then_some(())
    })
    .await;
}

#[tokio::test]
async fn tiers_reach_workers_and_status_and_a_former_tier_drains_before_it_goes() {
    let h = harness();
    let (name, _users) = unique_pipeline("tiers");
    let vhost = TestVhost::fresh("controller-tiers");
    connection_secret(&h, &secret_uri());
    h.seed_secret("smtp", &[("url", "discard://")]);
    let spec = |delays: Value| {
        PipelineSpec::new()
            .vhost(&vhost.name)
            .topology(json!({"retryDelays": delays}))
            .worker(json!({"provider": {"urlSecretKeyRef": {"name": "smtp", "key": "url"}}}))
            .build()
    };
    h.seed_pipeline(&name, spec(json!(["1s", "2s", "1h"])), true);
    h.reconcile(&name).await.0.expect("the pipeline is built");
    assert_eq!(
        retry_keys(&h, &name).as_deref(),
        Some("mail.send,mail.send.retry.2,mail.send.retry.3")
    );

    // Three requests parked in tier 3, as a worker parks them after their third attempt.
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    for i in 0..3 {
        let properties = BasicProperties::default()
            .with_message_id(format!("parked-{i}").as_str().into())
            .with_delivery_mode(2);
        publish(&channel, "mail.retry", GOING, b"{}", properties).await;
    }
    reconcile_until(&h, &name, "tier 3 counted", |queues| {
        queues["retryByTier"] == "0/0/3"
    })
    .await;
    let stored = h.fake.get(&pipeline_path(&name)).expect("the pipeline");
    let queues = &stored["status"]["queues"];
    assert_eq!(queues["retry"], 3, "{queues}");
    assert_eq!(
        queues["retryTiers"][2],
        json!({"tier": 3, "queue": GOING, "delay": "1h", "messages": 3}),
        "{queues}"
    );
    let gauge = format!(
        "mailer_controller_retry_tier_messages{{namespace=\"{NS}\",pipeline=\"{name}\",tier=\"3\"}} 3"
    );
    assert!(h.metrics().contains(&gauge), "{}", h.metrics());

    // The spec loses tier 3 while it holds them: no QueueNotEmpty, the workers lose its
    // key, and the queue stays, held, with its policy and binding.
    let mut object = h.fake.get(&pipeline_path(&name)).expect("the pipeline");
    object["spec"] = spec(json!(["1s", "2s"]));
    h.fake.put(&pipeline_path(&name), object);
    reconcile_until(&h, &name, "tier 3 shown draining", |queues| {
        queues["retryByTier"] == "0/0 +3 draining"
    })
    .await;
    assert_eq!(
        retry_keys(&h, &name).as_deref(),
        Some("mail.send,mail.send.retry.2")
    );
    assert_eq!(live_count(&connection, GOING).await, Some(3));
    let api = raw_api();
    assert!(
        api.get_policy(&vhost.name, "mailer.mail.send.retry.3")
            .await
            .is_ok()
    );
    let going = Claim::Queue {
        vhost: vhost.name.clone(),
        name: GOING.into(),
    };
    let owner = mailer_testkit::broker::owner_of(&going)
        .await
        .expect("tier 3's queue is still held");
    assert_eq!(
        owner["retained"],
        Value::Null,
        "held, not left behind: {owner}"
    );
    let stored = h.fake.get(&pipeline_path(&name)).expect("the pipeline");
    assert_eq!(
        stored["status"]["queues"]["retryTiers"][2],
        json!({"tier": 3, "queue": GOING, "messages": 3, "draining": true})
    );

    // Empty, but a worker of the old template may still run and park there: it stays
    // until the Deployment has rolled out.
    channel
        .queue_purge(GOING.into(), QueuePurgeOptions::default())
        .await
        .expect("purge");
    let (result, requests) = h.reconcile(&name).await;
    result.expect("a reconcile");
    assert!(
        !events(&requests)
            .iter()
            .any(|(_, reason, _)| reason == "RetryTierRemoved")
    );
    assert_eq!(live_count(&connection, GOING).await, Some(0));
    let path = deployment_path(&format!("{name}-worker"));
    let mut deployment = h.fake.get(&path).expect("the worker Deployment");
    let replicas = deployment["spec"]["replicas"].clone();
    deployment["status"] = json!({"observedGeneration": deployment["metadata"]["generation"],
        "replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas});
    h.fake.put(&path, deployment);

    // Rolled out and empty: the next reconcile removes it with its policy and marker.
    let (result, requests) = h.reconcile(&name).await;
    result.expect("a reconcile");
    let published = events(&requests);
    assert!(
        published
            .iter()
            .any(|(_, reason, note)| reason == "RetryTierRemoved" && note.contains(GOING)),
        "{published:?}"
    );
    assert!(
        !published
            .iter()
            .any(|(_, reason, _)| reason == "TopologyRepaired"),
        "{published:?}"
    );
    assert_eq!(live_count(&connection, GOING).await, None);
    assert!(
        api.get_policy(&vhost.name, "mailer.mail.send.retry.3")
            .await
            .is_err()
    );
    assert_eq!(
        mailer_testkit::broker::owner_of(&going).await,
        None,
        "tier 3's queue is no longer held"
    );
    reconcile_until(&h, &name, "no tier draining", |queues| {
        queues["retryByTier"] == "0/0"
    })
    .await;
    let _ = connection.close(200, "done".into()).await;
}
