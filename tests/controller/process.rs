//! `mailer controller` as a process, against the in-memory API server served over HTTP:
//! it takes the Lease, reconciles, serves `/readyz` and `/metrics`, and on SIGTERM gives
//! the Lease up and exits cleanly.

use std::process::{Child, Command, Stdio};

use serde_json::json;

use super::broker::{BlackHole, eventually, unique};
use mailer_testkit::fake_api::Recorded;
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

/// The controller process; killed when dropped, should a test fail before it stops.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/mailer-operator";

async fn get(url: &str) -> Option<(u16, String)> {
    let response = reqwest::get(url).await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A kubeconfig file for the fake server at `server`, whose bearer token is `token`
/// (the fake records it, so a test tells replicas apart).
fn kubeconfig(server: &str, token: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("{}.yaml", unique("mailer-kubeconfig")));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
             clusters: [{{name: fake, cluster: {{server: '{server}'}}}}]\n\
             users: [{{name: fake, user: {{token: {token}}}}}]\n\
             contexts: [{{name: fake, context: {{cluster: fake, user: fake}}}}]\n"
        ),
    )
    .unwrap();
    path
}

/// Starts a replica named `identity` with `args` besides the common ones; returns it
/// and the URL of its /metrics server.
fn start(identity: &str, kubeconfig: &std::path::Path, args: &[&str]) -> (Running, String) {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_mailer"))
        .args([
            "controller",
            "--worker-image",
            "reg/mailer:test",
            "--namespace",
            NS,
        ])
        .args(["--identity", identity, "--lease-namespace", "ops"])
        .args(args)
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", kubeconfig)
        // MAILER_TEST_CONTROLLER_LOG=mailer=debug,kube_runtime=debug shows how one ran.
        .env(
            "RUST_LOG",
            std::env::var("MAILER_TEST_CONTROLLER_LOG").unwrap_or("error".into()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start mailer controller");
    (Running(child), format!("http://127.0.0.1:{port}"))
}

async fn until_ready(base: &str) {
    eventually(30, "/readyz to answer ready", || async {
        let (status, _) = get(&format!("{base}/readyz")).await?;
        (status == 200).then_some(())
    })
    .await;
}

/// Sends SIGTERM and waits for the exit.
async fn terminate(running: &mut Running) -> std::process::ExitStatus {
    let term = Command::new("kill")
        .args(["-TERM", &running.0.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(term.success());
    eventually(30, "the controller to exit", || {
        let exited = running.0.try_wait().expect("wait");
        async move { exited }
    })
    .await
}

fn holder(h: &Harness) -> serde_json::Value {
    h.fake.get(LEASE_PATH).expect("the Lease exists")["spec"]["holderIdentity"].clone()
}

#[tokio::test]
async fn the_controller_process_leads_reconciles_and_stops_on_sigterm() {
    mailer::install_crypto_provider();
    let h = harness();
    h.seed_pipeline("shop", PipelineSpec::new().build(), false);
    let config = kubeconfig(&h.fake.serve().await, "pod-a");
    let (mut controller, metrics) = start("pod-a", &config, &["--lease-retry", "1s"]);

    until_ready(&metrics).await;
    assert_eq!(holder(&h), "pod-a");
    eventually(30, "the pipeline's finalizer", || async {
        let stored = h.fake.get(&pipeline_path("shop"))?;
        (stored["metadata"]["finalizers"] == json!([FINALIZER])).then_some(())
    })
    .await;
    let (_, text) = get(&format!("{metrics}/metrics")).await.expect("/metrics");
    assert!(text.contains("mailer_controller_leader 1"), "{text}");
    assert!(
        text.contains(r#"mailer_controller_reconciles_total{result="success",category="none"}"#),
        "{text}"
    );
    let (status, _) = get(&format!("{metrics}/livez")).await.expect("/livez");
    assert_eq!(status, 200);

    let exit = terminate(&mut controller).await;
    assert!(exit.success(), "{exit}");
    assert!(holder(&h).is_null(), "the Lease is given up");
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn a_standby_is_ready_and_takes_over_when_the_leader_stops() {
    mailer::install_crypto_provider();
    let h = harness();
    let server = h.fake.serve().await;
    let config = kubeconfig(&server, "pod-a");
    let (mut leader, leader_metrics) = start("pod-a", &config, &["--lease-retry", "1s"]);
    until_ready(&leader_metrics).await;
    assert_eq!(holder(&h), "pod-a");

    let standby_config = kubeconfig(&server, "pod-b");
    let (mut standby, standby_metrics) = start("pod-b", &standby_config, &["--lease-retry", "1s"]);
    until_ready(&standby_metrics).await;
    let (_, text) = get(&format!("{standby_metrics}/metrics"))
        .await
        .expect("/metrics");
    assert!(text.contains("mailer_controller_leader 0"), "{text}");
    assert_eq!(holder(&h), "pod-a", "a standby does not take a held Lease");

    assert!(terminate(&mut leader).await.success());
    eventually(30, "the standby to take the Lease", || async {
        (holder(&h) == "pod-b").then_some(())
    })
    .await;
    eventually(30, "the new leader to say so", || async {
        let (_, text) = get(&format!("{standby_metrics}/metrics")).await?;
        text.contains("mailer_controller_leader 1").then_some(())
    })
    .await;
    assert!(terminate(&mut standby).await.success());
    let _ = std::fs::remove_file(config);
    let _ = std::fs::remove_file(standby_config);
}

/// `--leader-election false`, as the README says for development: the controller
/// reconciles, is ready, and stops on SIGTERM.
#[tokio::test]
async fn without_an_election_the_controller_runs_and_stops_cleanly() {
    mailer::install_crypto_provider();
    let h = harness();
    h.seed_pipeline("shop", PipelineSpec::new().build(), false);
    let config = kubeconfig(&h.fake.serve().await, "solo");
    let (mut controller, metrics) = start("solo", &config, &["--leader-election", "false"]);
    until_ready(&metrics).await;
    eventually(30, "the pipeline's finalizer", || async {
        let stored = h.fake.get(&pipeline_path("shop"))?;
        (stored["metadata"]["finalizers"] == json!([FINALIZER])).then_some(())
    })
    .await;
    let (_, text) = get(&format!("{metrics}/metrics")).await.expect("/metrics");
    assert!(text.contains("mailer_controller_leader 1"), "{text}");
    let exit = terminate(&mut controller).await;
    assert!(exit.success(), "{exit}");
    assert!(
        h.fake.get(LEASE_PATH).is_none(),
        "no Lease without an election"
    );
    let _ = std::fs::remove_file(config);
}

/// SIGTERM before the first list of pipelines came back: kube's controller, stopped
/// while its runner waits for that cache, never ends by itself; the drain's abort ends
/// it, and the process exits cleanly.
#[tokio::test]
async fn sigterm_before_the_caches_are_ready_still_exits() {
    mailer::install_crypto_provider();
    let h = harness();
    let pipelines = format!("/apis/mailer.dev/v1alpha1/namespaces/{NS}/mailerpipelines");
    h.fake.stall(&pipelines);
    let config = kubeconfig(&h.fake.serve().await, "solo");
    let (mut controller, _) = start("solo", &config, &["--leader-election", "false"]);
    eventually(30, "the list of pipelines to be under way", || async {
        let requests = h.fake.take_requests();
        requests.iter().any(|r| r.path == pipelines).then_some(())
    })
    .await;
    let exit = terminate(&mut controller).await;
    assert!(exit.success(), "{exit}");
    h.fake.release_stalls();
    let _ = std::fs::remove_file(config);
}

/// SIGTERM while a reconcile hangs on the broker: the leader stops starting reconciles,
/// keeps renewing while it drains, aborts what is left after the drain timeout, and only
/// then releases the Lease; the standby takes over. At no moment do both write.
#[tokio::test]
async fn sigterm_during_a_slow_reconcile_hands_over_without_two_leaders_writing() {
    mailer::install_crypto_provider();
    let h = harness();
    let broker = BlackHole::start().await;
    connection_secret(&h, &broker.url);
    h.seed_pipeline("shop", PipelineSpec::new().build(), true);
    let server = h.fake.serve().await;
    let timing = [
        "--lease-duration",
        "6s",
        "--lease-retry",
        "500ms",
        "--drain-timeout",
        "2s",
    ];
    let (a_config, b_config) = (kubeconfig(&server, "pod-a"), kubeconfig(&server, "pod-b"));
    let (mut leader, leader_metrics) = start("pod-a", &a_config, &timing);
    until_ready(&leader_metrics).await;
    let (_standby, standby_metrics) = start("pod-b", &b_config, &timing);
    until_ready(&standby_metrics).await;
    eventually(
        30,
        "the leader's reconcile to hang on the broker",
        || async { (broker.accepted() > 0).then_some(()) },
    )
    .await;

    let terminated = std::time::Instant::now();
    assert!(terminate(&mut leader).await.success());
    assert!(
        terminated.elapsed() < std::time::Duration::from_secs(5),
        "the drain is bounded: {:?}",
        terminated.elapsed()
    );
    eventually(30, "the standby to take the Lease", || async {
        (holder(&h) == "pod-b").then_some(())
    })
    .await;
    let requests = h.fake.take_requests();
    let is_lease = |r: &&Recorded| r.path.starts_with("/apis/coordination.k8s.io/");
    let release = requests
        .iter()
        .find(|r| {
            r.token == "pod-a" && r.method == "PUT" && r.body["spec"]["holderIdentity"].is_null()
        })
        .expect("the leader released the Lease");
    let late: Vec<_> = requests
        .iter()
        .filter(|r| r.token == "pod-a" && r.at > release.at)
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        late.is_empty(),
        "the old leader acted after releasing: {late:?}"
    );
    let early: Vec<_> = requests
        .iter()
        .filter(|r| r.token == "pod-b" && r.is_write() && !is_lease(r) && r.at < release.at)
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        early.is_empty(),
        "the standby wrote while the leader led: {early:?}"
    );
    let _ = (
        std::fs::remove_file(a_config),
        std::fs::remove_file(b_config),
    );
}
