//! The controller at scale, by counts that do not depend on the machine: what a first
//! pass costs per pipeline (one reconcile, bounded requests), what a pipeline
//! in sync costs after a restart (Kubernetes requests, counted by the test API server;
//! management API requests, counted by a recording proxy in front of the real broker),
//! no write in steady state, and at most `--concurrency` reconciles at once. (The spread
//! of the resyncs over the interval is counted by `context.rs`'s unit test.)

use std::time::Duration;

use mailer::mail::CLAIM_LOCK_VHOST;
use mailer::topology::MAX_IN_FLIGHT;
use serde_json::{Value, json};

use super::broker::{CLOSED_MANAGEMENT_URL, eventually};
use mailer_testkit::broker::{TestVhost, management_host};
use mailer_testkit::fake_api::Address;
use mailer_testkit::management_proxy::Proxy;
use mailer_testkit::many::pipeline_spec_yaml;
use mailer_testkit::operator::*;

/// Requests to the management API of one pipeline in sync whose workers' user is given
/// (`spec.worker.userSecret`), with queue depths read on every reconcile: the depths of
/// its 3 queues. The topology is read from the vhost's definitions, read once for the
/// pipelines of a vhost reconciled within 10 s, and so are the owner markers of the whole
/// broker and whether the operator may use the vhost (its permissions); the broker's
/// version once a minute per broker (by each reconcile that finds none read, at start).
const MANAGEMENT_REQUESTS_PER_PIPELINE: usize = 3;

/// Requests to the API server of one pipeline in sync: the Secrets it names (connection,
/// workers' user). Its Deployment and worker Secret come from the watch caches.
const KUBERNETES_REQUESTS_PER_PIPELINE: usize = 2;

/// Requests to the management API of a pipeline's first reconcile, all objects to make,
/// whose workers' user is given: its 6 owner markers written (its 3 exchanges and 3
/// queues), and its share of its batch of claims, decided together with those of the
/// other reconciles of its vhost under one lock (the lock queue declared and deleted in
/// the locks' own vhost, every marker read, whether the vhost exists, its exchanges and
/// queues listed when it does: at most 6 for a batch, 1 each for the test's 6 in one
/// batch); its pipeline's marker written (1; one per object, 6, before one marker per
/// pipeline); whether the vhost exists (1), or its definitions, read once for the vhost
/// and kept current by the client's own writes (nothing read by name: see the test); its
/// 9 writes and its share of one policy import; the vhost made (by each reconcile that
/// found it missing) and the operator's permissions there (read, and whether the vhost
/// exists: 2, and granted), the broker's version (the first reconciles each read it), the
/// locks' vhost and the operator's permissions there (once per client): up to 6 more.
/// Its queues are not read: it made them. That is 24 to 26 (alone in its batch). A
/// pipeline made among others of its vhost hands its policies to their batch and is
/// reconciled a second time for the rest, which reads nothing of its own but the
/// operator's permissions, when a reconcile running at once has not read them (1). This
/// test counts 17.8 (107 for 6); at most 27 leaves room for the claims going in two
/// batches. Whatever the number of pipelines. (A marker per object: 23.7, at most 32;
/// each object read by name and the queues' depths read, before definitions were kept
/// current: 42; a lock, a marker read and an object read per name, before claims were
/// decided together: 55.)
const FIRST_PASS_MANAGEMENT_REQUESTS_PER_PIPELINE: usize = 27;

/// Requests to the API server of a pipeline's first reconcile, besides the watches, their
/// lists and discovery: the connection Secret read and patched to hold it (again when
/// another pipeline's patch came first), the workers' user Secret read, its worker Secret
/// and Deployment read and applied, its status written and its event: 9. A pipeline that
/// wrote its policies ahead reads the two Secrets it names and what it owns again in its
/// second reconcile: 4 more, 13; this test counts 14.7 with the connection Secret's
/// retries; at most 17.
const FIRST_PASS_KUBERNETES_REQUESTS_PER_PIPELINE: usize = 17;

/// Runs the controllers of `h` until `until` resolves (within 120 s).
async fn run_until<T>(h: &Harness, until: impl Future<Output = T>) -> T {
    run_controllers_until(h, &controller_health(), Duration::from_secs(120), until).await
}

/// Reconciles counted by `h`'s metrics: `(successful, failed)`.
fn reconciles(h: &Harness) -> (u64, u64) {
    mailer_testkit::reconciles::reconciles_in(&h.metrics())
}

/// The reconciles that stopped after a new pipeline's policies (each followed by a
/// second that makes the rest), and the others, successful and failed.
fn reconciles_ahead(h: &Harness) -> (u64, (u64, u64)) {
    let metrics = h.metrics();
    let ahead = mailer_testkit::reconciles::policies_ahead_in(&metrics);
    let (ok, failed) = mailer_testkit::reconciles::reconciles_in(&metrics);
    (ahead, (ok - ahead, failed))
}

/// Waits until no reconcile has started for `window` (within 60 s).
async fn quiet(h: &Harness, window: Duration) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut last = reconciles(h);
    let mut since = tokio::time::Instant::now();
    while since.elapsed() < window {
        assert!(
            tokio::time::Instant::now() < deadline,
            "reconciles never settle: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = reconciles(h);
        if now != last {
            last = now;
            since = tokio::time::Instant::now();
        }
    }
}

async fn reconciled(h: &Harness, pipelines: usize) {
    eventually(60, "every pipeline to be reconciled", || async {
        let (_, (ok, failed)) = reconciles_ahead(h);
        assert_eq!(failed, 0, "{}", h.metrics());
        (ok >= pipelines as u64).then_some(())
    })
    .await;
}

/// Runs the first pass of `pipelines` until it settles, and checks that it made one
/// reconcile per pipeline and a second only for those that wrote their policies ahead of
/// their queues (at most 2 each), none failed.
async fn first_pass(h: &Harness, pipelines: usize) {
    run_until(h, async {
        reconciled(h, pipelines).await;
        quiet(h, Duration::from_secs(2)).await;
    })
    .await;
    let (ahead, others) = reconciles_ahead(h);
    assert_eq!(others, (pipelines as u64, 0), "{}", h.metrics());
    assert!(ahead <= pipelines as u64, "{}", h.metrics());
}

/// Pipeline `i` in `vhost`, with names of its own, the broker through the `conn` Secret
/// and the workers' user given in the `user` Secret.
fn spec(vhost: &str, i: usize) -> Value {
    let mut spec: Value = serde_yaml::from_str(&pipeline_spec_yaml(vhost, i)).expect("a spec");
    spec["rabbitmq"]["connectionSecret"] = json!({"name": "conn"});
    spec["worker"] = json!({"userSecret": {"name": "user"}, "replicas": 0});
    spec
}

/// A harness whose reconciles share a vhost's definitions as the controller's do, its
/// broker behind a recording proxy, and the workers' user given (guest).
async fn sharing_definitions() -> (Harness, Proxy) {
    let proxy = Proxy::start(&management_host(), Duration::ZERO).await;
    let h = harness_tuned(|settings| {
        settings.definitions_max_age =
            mailer::controller::reconcile::apply::SHARED_DEFINITIONS_MAX_AGE;
    });
    connection_secret(&h, &proxy.url());
    h.seed_secret("user", &[("username", "guest"), ("password", "guest")]);
    (h, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_pipelines_in_sync_cost_a_constant_and_write_nothing() {
    const PIPELINES: usize = 4;
    let vhost = TestVhost::fresh("controller-scale");
    let (h, proxy) = sharing_definitions().await;
    let names: Vec<String> = (0..PIPELINES).map(|i| format!("p{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        h.seed_pipeline(name, spec(&vhost.name, i), true);
    }
    // The first pass makes everything, one reconcile each and a second for those that
    // wrote their policies ahead: the operator's own writes (the worker Secret and
    // Deployment, the connection Secret it holds) coming back through its watches
    // trigger none.
    first_pass(&h, PIPELINES).await;
    for name in &names {
        let stored = h.fake.get(&pipeline_path(name)).expect("pipeline");
        assert_eq!(
            condition(&stored["status"], "TopologyReady")["status"],
            "True",
            "{name}: {}",
            stored["status"]
        );
    }

    // A new process: every pipeline is reconciled once, from its watch's first list.
    let restarted = h.restarted();
    h.fake.take_requests();
    proxy.take();
    proxy.take_max_in_flight();
    run_until(&restarted, reconciled(&restarted, PIPELINES)).await;
    assert_eq!(reconciles(&restarted), (PIPELINES as u64, 0));

    let requests = h.fake.take_requests();
    assert_listed_in_rbac(&requests);
    assert_eq!(
        writes(&requests),
        Vec::<String>::new(),
        "no write: {:?}",
        events(&requests)
    );
    // Besides the watches and the lists they begin with, and discovery: one GET per
    // Secret the pipeline names, and nothing of what it owns.
    let reads: Vec<String> = requests
        .iter()
        .filter(|r| Address::parse(&r.path).is_some_and(|a| a.name.is_some()))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    let named_secret = |r: &String| {
        *r == format!("GET {}", secret_path("conn")) || *r == format!("GET {}", secret_path("user"))
    };
    assert!(reads.iter().all(named_secret), "{reads:#?}");
    assert_eq!(
        reads.len(),
        PIPELINES * KUBERNETES_REQUESTS_PER_PIPELINE,
        "{reads:#?}"
    );

    let broker = proxy.take();
    let paths: Vec<String> = broker
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(broker.iter().all(|r| !r.is_write()), "{paths:#?}");
    // The vhost's definitions and the broker's owner markers once for all its pipelines;
    // the broker's version and the operator's permissions on the vhost at most once per
    // reconcile running at the start (then once a minute, and every 10 s).
    let definitions = broker
        .iter()
        .filter(|r| r.path.starts_with("definitions/"))
        .count();
    let versions = broker.iter().filter(|r| r.path == "overview").count();
    let grants = broker
        .iter()
        .filter(|r| r.path.starts_with("permissions/"))
        .count();
    let markers = broker
        .iter()
        .filter(|r| r.path == "global-parameters")
        .count();
    assert_eq!(definitions, 1, "{paths:#?}");
    assert_eq!(markers, 1, "{paths:#?}");
    assert!(versions <= PIPELINES, "{paths:#?}");
    assert!((1..=PIPELINES).contains(&grants), "{paths:#?}");
    let shared_reads = definitions + markers + versions + grants;
    assert_eq!(
        broker.len() - shared_reads,
        PIPELINES * MANAGEMENT_REQUESTS_PER_PIPELINE,
        "{paths:#?}"
    );
    assert!(proxy.take_max_in_flight() <= MAX_IN_FLIGHT);
    for name in &names {
        assert!(
            restarted.metrics().contains(&format!(
                "mailer_controller_rabbitmq_writes_total{{namespace=\"{NS}\",pipeline=\"{name}\"}} 0"
            )),
            "{}",
            restarted.metrics()
        );
    }
}

/// Issue 25: a first pass costs one reconcile per pipeline (none caused by the operator's
/// own writes) and at most the stated requests per pipeline on either side.
#[tokio::test]
async fn a_first_pass_costs_one_reconcile_and_bounded_requests_per_pipeline() {
    const PIPELINES: usize = 6;
    let vhost = TestVhost::fresh("controller-first-pass");
    let (h, proxy) = sharing_definitions().await;
    for i in 0..PIPELINES {
        h.seed_pipeline(&format!("p{i}"), spec(&vhost.name, i), true);
    }
    h.fake.take_requests();
    proxy.take();
    first_pass(&h, PIPELINES).await;

    let broker = proxy.take();
    let paths: Vec<String> = broker
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        broker.len() <= PIPELINES * FIRST_PASS_MANAGEMENT_REQUESTS_PER_PIPELINE,
        "{} management requests: {paths:#?}",
        broker.len()
    );
    // The vhost being built is read whole and kept current by the operator's own writes:
    // no exchange, queue or policy is read by name.
    let by_name: Vec<&String> = paths
        .iter()
        .filter(|path| {
            let segments: Vec<&str> = path.split(['/', ' ']).collect();
            segments.len() == 4
                && segments[0] == "GET"
                && ["exchanges", "queues", "policies"].contains(&segments[1])
        })
        .collect();
    assert_eq!(by_name, Vec::<&String>::new(), "{paths:#?}");
    // Besides the watches, the lists they begin with and discovery: what names an object,
    // and every write (events are posted to their collection).
    let kubernetes: Vec<String> = h
        .fake
        .take_requests()
        .iter()
        .filter(|r| r.is_write() || Address::parse(&r.path).is_some_and(|a| a.name.is_some()))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        kubernetes.len() <= PIPELINES * FIRST_PASS_KUBERNETES_REQUESTS_PER_PIPELINE,
        "{} API server requests: {kubernetes:#?}",
        kubernetes.len()
    );
}

#[tokio::test]
async fn no_more_than_concurrency_reconciles_run_at_once() {
    const PIPELINES: usize = 9;
    const CONCURRENCY: u16 = 3;
    let h = harness_tuned(|settings| settings.concurrency = CONCURRENCY);
    connection_secret(&h, CLOSED_MANAGEMENT_URL);
    for i in 0..PIPELINES {
        // Each with a send queue of its own, or all but one would collide.
        h.seed_pipeline(&format!("shop-{i}"), spec("shop", i), true);
    }
    // Every reconcile starts by reading the connection Secret; each read waits, so the
    // reconciles running at once are the reads waiting at once.
    h.fake
        .slow_down(&secret_path("conn"), Duration::from_millis(300));
    run_until(&h, async {
        eventually(60, "every pipeline to be tried", || async {
            let (ok, failed) = reconciles(&h);
            (ok + failed >= PIPELINES as u64).then_some(())
        })
        .await;
    })
    .await;
    assert_eq!(h.fake.most_slowed_at_once(), usize::from(CONCURRENCY));
}

/// Issue 25: the claims and the policies of reconciles running at once in one vhost go
/// out together: the claims decided under one lock, the policies in one import.
#[tokio::test]
async fn the_claims_and_policies_of_reconciles_running_at_once_go_out_together() {
    const PIPELINES: usize = 6;
    let vhost = TestVhost::fresh("controller-together");
    let proxy = Proxy::start(&management_host(), Duration::ZERO).await;
    let h = harness_tuned(|settings| {
        // Long enough for every first reconcile to join the first one's batches.
        settings.claim_window = Duration::from_secs(3);
        settings.policy_window = Duration::from_secs(3);
    });
    connection_secret(&h, &proxy.url());
    h.seed_secret("user", &[("username", "guest"), ("password", "guest")]);
    for i in 0..PIPELINES {
        h.seed_pipeline(&format!("p{i}"), spec(&vhost.name, i), true);
    }
    run_until(&h, reconciled(&h, PIPELINES)).await;
    let writes: Vec<String> = proxy
        .take()
        .iter()
        .filter(|r| r.is_write())
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    let imports = writes
        .iter()
        .filter(|w| **w == format!("POST definitions/{}", vhost.name))
        .count();
    let policy_puts = writes
        .iter()
        .filter(|w| w.starts_with(&format!("PUT policies/{}/", vhost.name)))
        .count();
    assert_eq!((imports, policy_puts), (1, 0), "{writes:#?}");
    // One lock for the six pipelines' 36 claims, and one marker per pipeline.
    let count = |prefix: &str| writes.iter().filter(|w| w.starts_with(prefix)).count();
    let locks = count(&format!("PUT queues/{CLAIM_LOCK_VHOST}/"));
    let markers = count("PUT global-parameters/mailer-owner|pipeline|");
    let all_markers = count("PUT global-parameters/");
    assert_eq!(
        (locks, markers, all_markers),
        (1, PIPELINES, PIPELINES),
        "{writes:#?}"
    );
    // Every pipeline's three policies are there.
    let policies = mailer_testkit::broker::raw_api()
        .list_policies_in(&vhost.name)
        .await
        .expect("policies");
    assert_eq!(policies.len(), 3 * PIPELINES);
}
