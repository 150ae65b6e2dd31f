//! What a pipeline costs the management API, counted by a recording proxy in front of the
//! real broker: a constant number of reads per pipeline in sync whatever else shares its
//! vhost, no write in steady state, writes bounded in flight and made in dependency
//! order, and a conflict anywhere in a pass stopping it before its first write.

use std::time::{Duration, Instant};

use lapin::options::QueueDeclareOptions;
use mailer::topology::{
    self, AmqpDeclarer, DEFINITIONS_FROM, MAX_IN_FLIGHT, READS_PER_PIPELINE, TopologyError,
};

use mailer::topology::import::{POLICY_IMPORT_FROM, POLICY_IMPORT_PART};

use mailer_testkit::broker::{
    TestBroker, TestVhost, amqp_base, management, management_host, raw_api,
};
use mailer_testkit::management_proxy::{Proxy, Recorded};
use mailer_testkit::many::OBJECTS_PER_PIPELINE;

/// The requests of applying one pipeline in sync on its own: whether its vhost exists,
/// then its own objects.
const REQUESTS_PER_IN_SYNC_APPLY: usize = 13;

/// Applies pipeline 0 of `vhost` alone through the proxy, in sync, and checks that it
/// read only its own objects, a constant number of them, and wrote nothing.
async fn apply_pipeline_0_in_sync(proxy: &Proxy, topology: &topology::Topology) {
    let m = proxy.management();
    assert_eq!(topology::apply(&m, topology).await.expect("apply"), vec![]);
    let recorded = proxy.take();
    let paths: Vec<&str> = recorded.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        recorded.len(),
        REQUESTS_PER_IN_SYNC_APPLY,
        "requests of one pipeline in sync: {paths:#?}"
    );
    assert!(recorded.iter().all(|r| !r.is_write()), "{paths:#?}");
    assert!(
        recorded.iter().all(|r| r.kind() == "vhosts"
            || r.path.contains("/p0.")
            || r.path.contains("/mailer.p0.")),
        "only the pipeline's own objects are read: {paths:#?}"
    );
    assert_eq!((m.reads(), m.writes()), (REQUESTS_PER_IN_SYNC_APPLY, 0));
}

/// Applies `topologies` in one pass through the proxy, in sync, and returns the kinds of
/// the requests it made (none of them a write).
async fn pass_in_sync(proxy: &Proxy, topologies: &[topology::Topology]) -> Vec<String> {
    let m = proxy.management();
    let plans = topology::apply_all(&m, topologies).await.expect("a pass");
    assert!(plans.iter().all(Vec::is_empty), "{plans:#?}");
    let recorded = proxy.take();
    assert!(recorded.iter().all(|r| !r.is_write()));
    assert_eq!(m.writes(), 0);
    recorded.iter().map(|r| r.kind().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_in_sync_costs_the_same_requests_whatever_shares_its_vhost() {
    assert_eq!(READS_PER_PIPELINE + 1, REQUESTS_PER_IN_SYNC_APPLY);
    let vhost = TestVhost::fresh("scale-cost");
    let all =
        mailer_testkit::many::topologies(&vhost.name, 0..21, TestBroker::get().capabilities());
    let proxy = Proxy::start(&management_host(), Duration::ZERO).await;

    topology::apply_all(&management(), &all[..2])
        .await
        .expect("pipeline 0 and 1 other");
    apply_pipeline_0_in_sync(&proxy, &all[0]).await;
    // Fewer pipelines of a pass than DEFINITIONS_FROM in a vhost are read by name.
    let kinds = pass_in_sync(&proxy, &all[..2]).await;
    assert_eq!(kinds.len(), 1 + 2 * READS_PER_PIPELINE, "{kinds:?}");

    topology::apply_all(&management(), &all[2..])
        .await
        .expect("19 more");
    apply_pipeline_0_in_sync(&proxy, &all[0]).await;
    let kinds = pass_in_sync(&proxy, &all[..DEFINITIONS_FROM - 1]).await;
    assert_eq!(
        kinds.len(),
        1 + (DEFINITIONS_FROM - 1) * READS_PER_PIPELINE,
        "{kinds:?}"
    );
    // From DEFINITIONS_FROM on, the vhost's definitions are read once for all of them.
    for pipelines in [DEFINITIONS_FROM, 21] {
        let kinds = pass_in_sync(&proxy, &all[..pipelines]).await;
        assert_eq!(kinds, ["vhosts", "definitions"], "{pipelines} pipelines");
    }
}

/// The latest finish of the writes to `kinds` and the earliest start of those to `next`.
fn boundary(writes: &[&Recorded], kinds: &[&str], next: &[&str]) -> (Instant, Instant) {
    let finished = writes
        .iter()
        .filter(|r| kinds.contains(&r.kind()))
        .map(|r| r.finished)
        .max()
        .expect("writes of the earlier step");
    let started = writes
        .iter()
        .filter(|r| next.contains(&r.kind()))
        .map(|r| r.started)
        .min()
        .expect("writes of the later step");
    (finished, started)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_bounded_in_flight_and_made_in_dependency_order() {
    let vhost = TestVhost::fresh("scale-bound");
    let pipelines = 6;
    let all = mailer_testkit::many::topologies(
        &vhost.name,
        0..pipelines,
        TestBroker::get().capabilities(),
    );
    // Each write is held a while, so writes the client sends together overlap here.
    let proxy = Proxy::start(&management_host(), Duration::from_millis(25)).await;
    let m = proxy.management();
    let applied = topology::apply_all(&m, &all).await.expect("apply");
    assert_eq!(
        applied.iter().map(Vec::len).sum::<usize>(),
        1 + pipelines * OBJECTS_PER_PIPELINE,
        "the vhost once, and every object: {applied:#?}"
    );
    let max_in_flight = proxy.take_max_in_flight();
    let recorded = proxy.take();
    let writes: Vec<&Recorded> = recorded.iter().filter(|r| r.is_write()).collect();
    // Creating the vhost is two requests: the vhost, and the permissions of our user.
    assert_eq!(writes.len(), 2 + pipelines * OBJECTS_PER_PIPELINE);
    assert_eq!(m.writes(), writes.len());
    assert!(
        (2..=MAX_IN_FLIGHT).contains(&max_in_flight),
        "{max_in_flight} requests were in flight at once; the bound is {MAX_IN_FLIGHT}"
    );

    for (earlier, later) in [
        (&["vhosts", "permissions"][..], &["policies"][..]),
        (&["policies"][..], &["exchanges", "queues"][..]),
        (&["exchanges", "queues"][..], &["bindings"][..]),
    ] {
        let (finished, started) = boundary(&writes, earlier, later);
        assert!(
            finished <= started,
            "a write to {later:?} started before the last to {earlier:?} finished"
        );
    }

    let m = proxy.management();
    let plans = topology::apply_all(&m, &all).await.expect("second apply");
    assert!(plans.iter().all(Vec::is_empty), "{plans:#?}");
    assert_eq!(m.writes(), 0);
    assert_eq!(
        proxy.take().iter().filter(|r| r.is_write()).count(),
        0,
        "a second apply writes nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_in_any_pipeline_stops_the_pass_before_its_first_write() {
    let vhost = TestVhost::created("scale-conflict").await;
    let connection = vhost.connect().await;
    let channel = connection.create_channel().await.expect("channel");
    let declare = |name: &'static str, options: QueueDeclareOptions| {
        let channel = channel.clone();
        async move {
            channel
                .queue_declare(name.into(), options, Default::default())
                .await
                .expect("a queue in the way");
        }
    };
    declare(
        "p4.mail.send",
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
    )
    .await;
    // An exclusive queue is left out of the vhost's definitions; it lives as long as the
    // connection, which stays open until the end.
    declare(
        "p7.mail.send.dead",
        QueueDeclareOptions {
            exclusive: true,
            ..Default::default()
        },
    )
    .await;
    // Enough pipelines for the pass to read the vhost's definitions.
    let pipelines = DEFINITIONS_FROM + 2;
    let all = mailer_testkit::many::topologies(
        &vhost.name,
        0..pipelines,
        TestBroker::get().capabilities(),
    );
    let proxy = Proxy::start(&management_host(), Duration::ZERO).await;
    let m = proxy.management();

    let err = topology::apply_all(&m, &all).await.unwrap_err();
    assert!(matches!(err, TopologyError::Conflict { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(r#"queue "p4.mail.send" exists but is a classic queue, not quorum"#),
        "{text}"
    );
    assert!(
        text.contains(r#"queue "p7.mail.send.dead" exists but"#) && text.contains("is exclusive"),
        "{text}"
    );
    assert!(text.contains("nothing was changed"), "{text}");
    assert_eq!(m.writes(), 0);
    let recorded = proxy.take();
    assert_eq!(recorded.iter().filter(|r| r.is_write()).count(), 0);
    assert!(recorded.iter().any(|r| r.kind() == "definitions"));
    let mut queues: Vec<(String, String)> = raw_api()
        .list_queues_in(&vhost.name)
        .await
        .expect("queues")
        .into_iter()
        .map(|q| (q.name, q.queue_type))
        .collect();
    queues.sort();
    assert_eq!(
        queues,
        [
            ("p4.mail.send".to_string(), "classic".to_string()),
            ("p7.mail.send.dead".to_string(), "classic".to_string())
        ]
    );
    drop(connection);
}

#[tokio::test]
async fn the_cli_applies_a_file_of_many_pipelines_in_one_pass() {
    let vhost = TestVhost::fresh("scale-cli");
    let dir = crate::tempdir();
    let file = dir.join("pipelines.yaml");
    let documents: Vec<String> = (0..3)
        .map(|i| {
            format!(
                "apiVersion: mailer.dev/v1alpha1\nkind: MailerPipeline\nmetadata: {{name: p{i}}}\nspec: {}\n",
                mailer_testkit::many::pipeline_spec_yaml(&vhost.name, i)
            )
        })
        .collect();
    std::fs::write(&file, documents.join("---\n")).expect("write the file");
    let file = file.to_str().expect("a path");
    let url = mailer_testkit::broker::management_url();
    let apply = || crate::mailer(&["topology", "apply", "-f", file, "--management-url", &url]);

    // The first declares exchanges, queues and bindings over AMQP; the second, through
    // the management API alone, finds them as they should be.
    let amqp = amqp_base();
    let (code, out, err) = crate::mailer(&[
        "topology",
        "apply",
        "-f",
        file,
        "--management-url",
        &url,
        "--amqp-url",
        &amqp,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.matches("create vhost").count(), 1, "{out}");
    for i in 0..3 {
        assert!(out.contains(&format!("p{i} (vhost")), "{out}");
        assert!(
            out.contains(&format!("create binding p{i}.mail -> p{i}.mail.send")),
            "{out}"
        );
    }
    let (code, out, err) = apply();
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.matches("in sync: nothing to change").count(),
        3,
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_over_amqp_a_first_apply_makes_the_same_objects_and_only_policies_go_over_http() {
    let vhost = TestVhost::fresh("scale-amqp");
    // 270 policies: imported in two requests, a full part and the rest.
    let pipelines: usize = 90;
    let imports = (pipelines * 3).div_ceil(POLICY_IMPORT_PART);
    assert!(pipelines * 3 >= POLICY_IMPORT_FROM && imports == 2);
    let all = mailer_testkit::many::topologies(
        &vhost.name,
        0..pipelines,
        TestBroker::get().capabilities(),
    );
    let proxy = Proxy::start(&management_host(), Duration::ZERO).await;

    // A URL the broker refuses: only the vhost is written, and the password is not said.
    let refused = AmqpDeclarer::new(&amqp_base().replace("guest@", "hunter2@")).unwrap();
    let m = proxy.management();
    let error = topology::apply_all_declaring(&m, Some(&refused), &all)
        .await
        .expect_err("the broker refuses the password");
    let message = error.to_string();
    assert!(
        message.contains("open an AMQP connection to vhost"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
    let kinds: Vec<String> = proxy
        .take()
        .iter()
        .filter(|r| r.is_write())
        .map(|r| r.kind().to_string())
        .collect();
    assert_eq!(kinds, ["vhosts", "permissions"]);

    let declarer = AmqpDeclarer::new(&amqp_base()).unwrap();
    let m = proxy.management();
    let applied = topology::apply_all_declaring(&m, Some(&declarer), &all)
        .await
        .expect("apply");
    assert_eq!(
        applied.iter().map(Vec::len).sum::<usize>(),
        pipelines * OBJECTS_PER_PIPELINE,
        "every object (the vhost was made before): {applied:#?}"
    );
    assert_eq!(
        m.writes(),
        imports + pipelines * 9,
        "two imports, 9 declares a pipeline"
    );
    let http_writes: Vec<String> = proxy
        .take()
        .iter()
        .filter(|r| r.is_write())
        .map(|r| format!("{} {}", r.method, r.kind()))
        .collect();
    assert_eq!(
        http_writes, ["POST definitions"; 2],
        "the policies in two imports; exchanges, queues and bindings over AMQP"
    );

    // The management API finds every object as the pipeline wants it (quorum queues,
    // exchange kinds, bindings): nothing to change.
    let m = proxy.management();
    let plans = topology::apply_all(&m, &all).await.expect("second apply");
    assert!(plans.iter().all(Vec::is_empty), "{plans:#?}");
    assert_eq!(m.writes(), 0);
}

/// The claim batches of several vhosts share a read of the markers that started after
/// they took their locks, and a batch never decides on one that started before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_batches_share_a_read_of_the_markers_only_if_it_started_after_their_locks() {
    let proxy = Proxy::start(&management_host(), Duration::ZERO).await;
    let m = std::sync::Arc::new(proxy.management());
    let reads = |recorded: Vec<Recorded>| {
        recorded
            .iter()
            .filter(|r| r.path == "global-parameters")
            .count()
    };
    let locked = Instant::now();
    let shared = futures::future::join_all((0..5).map(|_| m.markers_read_after(locked))).await;
    assert!(shared.iter().all(Result::is_ok));
    assert_eq!(
        reads(proxy.take()),
        1,
        "five batches locked before it share one read"
    );
    m.markers_read_after(Instant::now()).await.expect("read");
    assert_eq!(
        reads(proxy.take()),
        1,
        "a batch locked after the last read started reads again"
    );
    m.markers_read_after(locked).await.expect("read");
    assert_eq!(
        reads(proxy.take()),
        0,
        "one locked before the last read shares it"
    );
}
