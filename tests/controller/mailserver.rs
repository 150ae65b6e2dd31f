//! The operator started as the chart's Deployment says (`operator_pod.rs`) reconciles a
//! pipeline against the real broker; its workers, run from the Deployment it made
//! (`worker_pod.rs`), send through Postfix (`postfix.rs`), which delivers one mail to a
//! Maildir, defers another for a while and refuses a third for good. Everything is read
//! where a user would see it: the probes, the Lease, the pipeline's status, the
//! mailboxes, the worker's /metrics, Postfix's log and `mailer dead`.

use std::time::Instant;

use lapin::BasicProperties;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use serde_json::{Value, json};

use super::broker::unique_pipeline;
use super::broker::{eventually, secret_uri};
use super::operator_pod::{
    ApiServerTls, OperatorPod, PodIdentity, ServiceAccountToken, of_kind, render_chart,
};
use super::postfix::{DOMAIN, Postfix};
use super::worker_pod;
use mailer_testkit::broker::{TestVhost, confirming_channel, management_url, publish};
use mailer_testkit::operator::*;
use mailer_testkit::tls::TestCa;

const RELEASE: &str = "mailer";
const RELEASE_NAMESPACE: &str = "mailer-system";
/// The chart's name for its objects: `<release>-<chart>`.
const FULLNAME: &str = "mailer-mailer-operator";
const POD_NAME: &str = "mailer-mailer-operator-7d9f8b6c5-x2x4q";
/// The worker image the chart tells the operator to use (its own image).
const IMAGE: &str = "reg.test/mailer:e2e";
/// How long a parked request waits in the retry queue.
const RETRY_DELAY: &str = "2s";

fn address(local: &str) -> String {
    format!("{local}@{DOMAIN}")
}

/// `mailer_worker_deliveries_total{outcome="<outcome>"}` on the worker's /metrics.
async fn deliveries(worker: &worker_pod::WorkerPod, outcome: &str) -> Option<u64> {
    let url = format!("http://127.0.0.1:{}/metrics", worker.http_port);
    let text = reqwest::get(&url).await.ok()?.text().await.ok()?;
    let series = format!("mailer_worker_deliveries_total{{outcome=\"{outcome}\"}} ");
    Some(
        text.lines()
            .find_map(|line| line.strip_prefix(&series))
            .map_or(0, |n| n.trim().parse().expect("a count")),
    )
}

/// `mailer dead <args>` on the pipeline's dead queue, as its user would run it.
async fn mailer_dead(vhost: &TestVhost, args: &[&str]) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_mailer"));
    command
        .arg("dead")
        .args(args)
        .args(["--queue", "mail.send.dead", "--amqp-url", &vhost.amqp_url()])
        .args(["--management-url", &management_url()])
        .env("RUST_LOG", "error");
    tokio::task::spawn_blocking(move || command.output().expect("mailer dead"))
        .await
        .expect("mailer dead ran")
}

fn condition_status(pipeline: &Value, type_: &str) -> Option<String> {
    let conditions = pipeline["status"]["conditions"].as_array()?;
    let found = conditions.iter().find(|c| c["type"] == type_)?;
    found["status"].as_str().map(str::to_string)
}

/// A header's value in a mail as delivered (headers end at the first empty line).
fn header<'a>(mail: &'a str, name: &str) -> Option<&'a str> {
    let head = mail.split("\n\n").next()?;
    head.lines().find_map(|line| {
        let (field, value) = line.split_once(':')?;
        field.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_operator_pod_reconciles_and_its_workers_send_through_postfix() {
    let started = Instant::now();
    let h = harness();
    let (name, _users) = unique_pipeline("shop");
    let test_vhost = TestVhost::fresh("controller-mailserver");
    let ca = TestCa::generate();

    // The relay: mailboxes for delivered@ and deferred@; bounced@ has none; deferred@
    // is greylisted until the test lifts it.
    let postfix = Postfix::start(&ca, &["delivered", "deferred"]).await;
    postfix.greylist().defer(&address("deferred"));
    let relay_started = started.elapsed();

    // What the cluster holds: the broker's connection Secret, the relay's URL and CA,
    // and the pipeline.
    connection_secret(&h, &secret_uri());
    let ca_pem = std::fs::read_to_string(ca.file("ca.pem")).unwrap();
    h.seed_secret(
        "relay",
        &[
            ("url", &format!("smtp://127.0.0.1:{}", postfix.port)),
            ("ca.crt", &ca_pem),
        ],
    );
    let spec = json!({
        "rabbitmq": {"vhost": test_vhost.name, "connectionSecret": {"name": "conn"}},
        "topology": {"retryDelay": RETRY_DELAY, "deletionPolicy": "Delete"},
        "worker": {"replicas": 1, "maxAttempts": 10,
                   "provider": {"urlSecretKeyRef": {"name": "relay", "key": "url"},
                                "caSecretKeyRef": {"name": "relay", "key": "ca.crt"}}}});
    h.seed_pipeline(&name, spec, false);

    // The operator's pod, as the chart's Deployment says, against the API server over
    // HTTPS with its ServiceAccount's token.
    let log_level = std::env::var("MAILER_TEST_CONTROLLER_LOG").unwrap_or("error".into());
    let objects = render_chart(
        RELEASE,
        RELEASE_NAMESPACE,
        &format!(
            "image: {{repository: reg.test/mailer, tag: e2e}}\nlogLevel: {log_level:?}\nlogFormat: text\n"
        ),
    );
    let deployment = of_kind(&objects, "Deployment");
    let service_account = of_kind(&objects, "ServiceAccount");
    let api = ApiServerTls::start(&ca, &h.fake.serve().await).await;
    let token = ServiceAccountToken::new(&ca, RELEASE_NAMESPACE);
    let sa_token = token.token.clone();
    let pod = PodIdentity {
        name: POD_NAME.into(),
        namespace: RELEASE_NAMESPACE.into(),
        uid: "0e1f5b2a-6c1d-4a8e-9f3b-2d7c8e9a1b4c".into(),
        node_name: "node-a".into(),
    };
    let mut operator = OperatorPod::start(deployment, &pod, service_account, token, &api);
    let liveness = operator.prober("livenessProbe");
    let readiness = operator.prober("readinessProbe");

    // Ready, as its readiness probe says; alive, as its liveness probe says.
    eventually(30, "the operator's readinessProbe to answer 200", || {
        let exited = operator.exited();
        let url = readiness.url().to_string();
        async move {
            assert!(exited.is_none(), "the operator exited: {exited:?}");
            let response = reqwest::get(&url).await.ok()?;
            (response.status() == 200).then_some(())
        }
    })
    .await;
    let live = reqwest::get(liveness.url())
        .await
        .expect("the livenessProbe");
    assert_eq!(live.status(), 200, "{}", liveness.url());
    let operator_ready = started.elapsed();
    operator.assert_confined();

    // It leads, by the Lease in its own namespace (the downward API's), in its pod's name.
    let lease =
        format!("/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/leases/{FULLNAME}");
    eventually(30, "the operator to hold the Lease", || async {
        let held = h.fake.get(&lease)?;
        (held["spec"]["holderIdentity"] == POD_NAME).then_some(())
    })
    .await;

    // It reconciles the pipeline: the topology, and the workers' Deployment with the
    // image the chart told it.
    let worker_deployment = deployment_path(&format!("{name}-worker"));
    let made = eventually(
        60,
        "the operator to make the workers' Deployment",
        || async {
            let pipeline = h.fake.get(&pipeline_path(&name))?;
            (condition_status(&pipeline, "TopologyReady").as_deref() == Some("True"))
                .then_some(())?;
            h.fake.get(&worker_deployment)
        },
    )
    .await;
    let worker_container = &made["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(worker_container["image"], IMAGE, "{worker_container}");

    // The worker's pod, as that Deployment says; once its readinessProbe answers, the
    // Deployment controller would count it ready, and the pipeline is Ready.
    let worker = worker_pod::start(&h, &worker_deployment);
    let worker_probe = worker_container["readinessProbe"]["httpGet"]["path"]
        .as_str()
        .expect("the worker's readinessProbe path")
        .to_string();
    eventually(30, "the worker's readinessProbe to answer 200", || async {
        let url = format!("http://127.0.0.1:{}{worker_probe}", worker.http_port);
        (reqwest::get(&url).await.ok()?.status() == 200).then_some(())
    })
    .await;
    let mut with_status = h.fake.get(&worker_deployment).unwrap();
    with_status["status"] = json!({
        "observedGeneration": with_status["metadata"]["generation"],
        "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1});
    h.fake.put(&worker_deployment, with_status);
    eventually(30, "the pipeline to be Ready", || async {
        let pipeline = h.fake.get(&pipeline_path(&name))?;
        (condition_status(&pipeline, "Ready").as_deref() == Some("True")).then_some(())
    })
    .await;
    let pipeline_ready = started.elapsed();

    // A shop sends three mails.
    let connection = test_vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    for local in ["delivered", "deferred", "bounced"] {
        let request = json!({"from": "Shop <noreply@shop.example>", "to": [address(local)],
                             "subject": format!("Your order, {local}"),
                             "text": format!("Thanks for your order, {local}.")});
        publish(
            &channel,
            "mail",
            "mail.send",
            request.to_string().as_bytes(),
            BasicProperties::default().with_message_id(format!("{local}-1").into()),
        )
        .await;
    }
    let sent_at = started.elapsed();

    // delivered@ has it in its Maildir, over TLS through Postfix.
    let mail = eventually(30, "the mail in delivered@'s Maildir", || async {
        postfix.mailbox("delivered").pop()
    })
    .await;
    let delivered_in = started.elapsed() - sent_at;
    assert_eq!(
        header(&mail, "Message-ID"),
        Some("<delivered-1@shop.example>")
    );
    assert_eq!(header(&mail, "Subject"), Some("Your order, delivered"));
    assert_eq!(header(&mail, "From"), Some("Shop <noreply@shop.example>"));
    assert_eq!(header(&mail, "To"), Some("delivered@mail.test"));
    assert_eq!(header(&mail, "Delivered-To"), Some("delivered@mail.test"));
    assert!(
        mail.contains("by relay.mailer.test (Postfix) with ESMTPS"),
        "it came over STARTTLS: {mail}"
    );
    assert!(mail.contains("Thanks for your order, delivered."), "{mail}");

    // deferred@ is refused for now, again and again: each time parked in the retry
    // queue (where it waits, as its depth shows), and not delivered.
    let deferred = address("deferred");
    eventually(
        30,
        "the deferred mail to wait in the retry queue",
        || async {
            let passive = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            let queue = channel
                .queue_declare("mail.send.retry".into(), passive, FieldTable::default())
                .await
                .expect("the retry queue");
            (queue.message_count() == 1).then_some(())
        },
    )
    .await;
    let _ = connection.close(200, "done".into()).await;
    eventually(30, "deferred@ to be refused and parked twice", || async {
        let parked = deliveries(&worker, "parked").await?;
        (parked >= 2 && postfix.greylist().deferrals(&deferred) >= 2).then_some(())
    })
    .await;
    let parked_twice = started.elapsed() - sent_at;
    assert!(postfix.mailbox("deferred").is_empty());
    let refusals = postfix
        .log()
        .lines()
        .filter(|line| {
            line.contains("450 4.7.1 <deferred@mail.test>") && line.contains("greylisted")
        })
        .count();
    assert!(refusals >= 2, "{}", postfix.log());

    // Lifted: the next retry delivers it.
    postfix.greylist().lift(&deferred);
    let lifted_at = started.elapsed();
    let mail = eventually(30, "the deferred mail in deferred@'s Maildir", || async {
        postfix.mailbox("deferred").pop()
    })
    .await;
    let retried_in = started.elapsed() - lifted_at;
    assert_eq!(
        header(&mail, "Message-ID"),
        Some("<deferred-1@shop.example>")
    );
    assert!(mail.contains("Thanks for your order, deferred."), "{mail}");
    assert_eq!(postfix.mailbox("deferred").len(), 1, "delivered once");
    assert_eq!(postfix.mailbox("delivered").len(), 1, "delivered once");

    // bounced@ is refused for good: dead-lettered as rejected, as `mailer dead` shows
    // (each run of which waits 2 s for more: it runs once the worker counted one).
    eventually(30, "the worker to dead-letter the bounced mail", || async {
        (deliveries(&worker, "dead_lettered").await? == 1).then_some(())
    })
    .await;
    let dead = eventually(30, "the bounced mail in the dead queue", || async {
        let output = mailer_dead(&test_vhost, &["list", "--output", "json"]).await;
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let lines: Vec<Value> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect();
        (!lines.is_empty()).then_some(lines)
    })
    .await;
    let dead_listed = started.elapsed() - sent_at;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["message_id"], "bounced-1");
    assert_eq!(dead[0]["reason"], "rejected");
    assert_eq!(dead[0]["attempts"], 1);
    let error = dead[0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("550 5.1.1") && error.contains("User unknown in virtual mailbox table"),
        "{error}"
    );
    let shown = mailer_dead(&test_vhost, &["show", "bounced-1"]).await;
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("x-mail-dead-reason: \"rejected\""),
        "{shown}"
    );

    // The worker counts it all: each refusal for now parked once, two sent, one dead.
    let counted = eventually(10, "the worker's counts", || async {
        let parked = deliveries(&worker, "parked").await?;
        let sent = deliveries(&worker, "sent").await?;
        let dead = deliveries(&worker, "dead_lettered").await?;
        (sent == 2).then_some((parked, dead))
    })
    .await;
    assert_eq!(
        counted,
        (
            u64::try_from(postfix.greylist().deferrals(&deferred)).unwrap(),
            1
        ),
        "(parked, dead-lettered): each deferral parked once"
    );

    // The kubelet's probes never failed enough to restart the operator or to take it out
    // of its Service; SIGTERM stops it cleanly, and it gives the Lease up.
    assert!(operator.exited().is_none(), "the operator is running");
    assert!(
        !liveness.tripped(false),
        "liveness: {:?}",
        liveness.results()
    );
    assert!(
        !readiness.tripped(true),
        "readiness: {:?}",
        readiness.results()
    );
    drop((liveness, readiness));
    let (exit, took) = operator.terminate().await;
    assert!(exit.success(), "{exit}");
    let released = h.fake.get(&lease).expect("the Lease");
    assert!(released["spec"]["holderIdentity"].is_null(), "{released}");

    // Every request it made came over TLS with its ServiceAccount's token.
    let requests = h.fake.take_requests();
    assert!(api.connections() > 0, "no TLS connection to the API server");
    assert!(
        requests
            .iter()
            .any(|r| r.path.ends_with("/mailerpipelines")),
        "{requests:?}"
    );
    let others: Vec<_> = requests
        .iter()
        .filter(|r| r.token != sa_token)
        .map(|r| format!("{} {} (token {:?})", r.method, r.path, r.token))
        .collect();
    assert!(others.is_empty(), "requests without the token: {others:?}");

    drop(worker);
    eprintln!(
        "mailserver timings: relay {relay_started:?}, operator ready {operator_ready:?}, \
         pipeline Ready {pipeline_ready:?}; after sending: delivered {delivered_in:?}, \
         listed dead {dead_listed:?}, deferred twice {parked_twice:?}; deferred mail \
         delivered {retried_in:?} after the lift; SIGTERM to exit {took:?}; all {:?}",
        started.elapsed()
    );
}
