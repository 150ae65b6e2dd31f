//! The controller's memory and its requests to the API server, at scale:
//! `cargo bench --bench controller`.
//!
//! It fills the test API server (`tests/controller/fake_api`, served over HTTP) with
//! `MAILER_BENCH_PIPELINES` pipelines (1000) in the namespace `bench` and
//! `MAILER_BENCH_SECRETS` unrelated Secrets (10000, 4 KiB of data each, labelled like
//! Helm's release Secrets) spread over ten other namespaces, runs `mailer controller
//! --leader-election false` over all namespaces as a child process, and waits until
//! every pipeline has been reconciled and has a status. It prints the controller's
//! resident memory (VmRSS, and VmHWM, its peak) and the requests it made to the API
//! server per reconcile, for the first pass and for a resync's worth (every pipeline
//! reconciled again). It fails only when something does not work, never on a figure.
//!
//! By default the pipelines' connection Secret is missing, so each reconcile stops in
//! its resolve phase (a status and an event say so) and the figure is the controller's
//! own: its caches and watches. `MAILER_BENCH_BROKER=1` gives them the real RabbitMQ at
//! 127.0.0.1 instead (all in one vhost, the workers' user given, so no broker user is
//! made per pipeline); that pass is bound by the broker's management API.

#[path = "../../tests/controller/fake_api/mod.rs"]
pub mod fake_api;

use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use fake_api::FakeApi;

/// The target of issue 11, in MiB.
const MEMORY_TARGET_MIB: f64 = 64.0;
const NS: &str = "bench";
const VHOST: &str = "mailer-bench-controller";

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("the controller benchmark failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn count(var: &str, default: usize) -> Result<usize> {
    match std::env::var(var) {
        Ok(text) => text.parse().with_context(|| format!("{var}={text}")),
        Err(_) => Ok(default),
    }
}

struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn run() -> Result<()> {
    mailer::install_crypto_provider();
    let pipelines = count("MAILER_BENCH_PIPELINES", 1000)?;
    let with_broker = std::env::var("MAILER_BENCH_BROKER").is_ok_and(|v| v == "1");
    let connection = if with_broker { "conn" } else { "missing" };
    let secrets = count("MAILER_BENCH_SECRETS", 10_000)?;
    let fake = FakeApi::default();
    let secret = |namespace: &str, name: &str, data: Value, labels: Value| {
        json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
               "metadata": {"name": name, "namespace": namespace, "labels": labels}, "data": data})
    };
    let release = BASE64.encode(vec![b'x'; 4096]);
    for i in 0..secrets {
        let namespace = format!("apps-{}", i % 10);
        let name = format!("sh.helm.release.v1.app-{i}.v1");
        let labels = json!({"owner": "helm", "name": format!("app-{i}"), "status": "deployed", "version": "1"});
        fake.put(
            &format!("/api/v1/namespaces/{namespace}/secrets/{name}"),
            secret(&namespace, &name, json!({"release": release}), labels),
        );
    }
    let text = |value: &str| BASE64.encode(value);
    fake.put(
        &format!("/api/v1/namespaces/{NS}/secrets/conn"),
        secret(
            NS,
            "conn",
            json!({"uri": text("http://127.0.0.1:15672"), "username": text("guest"), "password": text("guest")}),
            json!({}),
        ),
    );
    fake.put(
        &format!("/api/v1/namespaces/{NS}/secrets/user"),
        secret(
            NS,
            "user",
            json!({"username": text("guest"), "password": text("guest")}),
            json!({}),
        ),
    );
    for i in 0..pipelines {
        let name = format!("shop-{i}");
        fake.put(
            &format!("/apis/mailer.dev/v1alpha1/namespaces/{NS}/mailerpipelines/{name}"),
            json!({"apiVersion": "mailer.dev/v1alpha1", "kind": "MailerPipeline",
                   "metadata": {"name": name, "namespace": NS, "finalizers": ["mailer.dev/cleanup"]},
                   "spec": {"rabbitmq": {"vhost": VHOST, "connectionSecret": {"name": connection}},
                            "worker": {"userSecret": {"name": "user"}, "replicas": 0}}}),
        );
    }
    let server = fake.serve().await;
    let kubeconfig = std::env::temp_dir().join(format!("mailer-bench-{}.yaml", std::process::id()));
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
             clusters: [{{name: fake, cluster: {{server: '{server}'}}}}]\n\
             users: [{{name: fake, user: {{token: bench}}}}]\n\
             contexts: [{{name: fake, context: {{cluster: fake, user: fake}}}}]\n"
        ),
    )?;
    fake.take_requests();
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let metrics = format!("http://127.0.0.1:{port}/metrics");
    let child = Command::new(env!("CARGO_BIN_EXE_mailer"))
        .args([
            "controller",
            "--leader-election",
            "false",
            "--resync-interval",
            "60s",
        ])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "error")
        .env("MIMALLOC_ALLOW_THP", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("start mailer controller")?;
    let controller = Controller(child);
    let pid = controller.0.id();

    let started = Instant::now();
    let reconciled = |fake: &FakeApi| {
        (0..pipelines)
            .filter(|i| {
                let path =
                    format!("/apis/mailer.dev/v1alpha1/namespaces/{NS}/mailerpipelines/shop-{i}");
                fake.get(&path)
                    .is_some_and(|p| p["status"]["observedGeneration"] == 1)
            })
            .count()
    };
    let mut peak = 0;
    while reconciled(&fake) < pipelines {
        peak = peak.max(status_kib(pid, "VmRSS")?);
        if started.elapsed() > Duration::from_secs(600) {
            bail!(
                "only {} of {pipelines} pipelines were reconciled in 10 minutes",
                reconciled(&fake)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = started.elapsed();
    let first = fake.take_requests();
    let first_reconciles = reconciles(&metrics).await?;
    let rss = status_kib(pid, "VmRSS")?.max(peak);
    let against = if with_broker {
        "the real RabbitMQ"
    } else {
        "a missing connection Secret"
    };
    println!(
        "{pipelines} pipelines ({against}), {secrets} unrelated Secrets (4 KiB each, in 10 other namespaces), watched cluster-wide:"
    );
    println!(
        "  first pass: every pipeline reconciled in {:.1}s",
        took.as_secs_f64()
    );
    report_requests("  first pass", &first, first_reconciles);

    // A resync's worth: every pipeline reconciled again, nothing to change.
    let before = reconciles(&metrics).await?;
    let resync = Instant::now();
    while reconciles(&metrics).await? < before + pipelines as u64 {
        if resync.elapsed() > Duration::from_secs(300) {
            bail!("the resync did not reconcile every pipeline");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let steady = fake.take_requests();
    let steady_reconciles = reconciles(&metrics).await? - before;
    report_requests("  steady state (a resync)", &steady, steady_reconciles);
    let rss_now = status_kib(pid, "VmRSS")?;
    let hwm = status_kib(pid, "VmHWM")?;
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "  controller memory: VmRSS {:.1} MiB after the first pass, {:.1} MiB after the resync; VmHWM {:.1} MiB (target {MEMORY_TARGET_MIB} MiB: {})",
        mib(rss),
        mib(rss_now),
        mib(hwm),
        if mib(hwm) <= MEMORY_TARGET_MIB {
            "met"
        } else {
            "NOT met"
        }
    );
    drop(controller);
    let _ = std::fs::remove_file(kubeconfig);
    let api =
        rabbitmq_http_client::api::Client::new("http://127.0.0.1:15672/api", "guest", "guest");
    let _ = api.delete_vhost(VHOST, true).await;
    Ok(())
}

fn report_requests(what: &str, requests: &[fake_api::Recorded], reconciles: u64) {
    let watches = requests.iter().filter(|r| r.is_watch()).count();
    let calls: Vec<_> = requests.iter().filter(|r| !r.is_watch()).collect();
    let writes = calls.iter().filter(|r| r.is_write()).count();
    let per = |n: usize| n as f64 / reconciles.max(1) as f64;
    println!(
        "{what}: {reconciles} reconciles, {} requests to the API server ({:.2} per reconcile, of which {:.2} writes), {watches} watches",
        calls.len(),
        per(calls.len()),
        per(writes)
    );
}

/// Reconciles the controller counted, from its /metrics.
async fn reconciles(metrics: &str) -> Result<u64> {
    let body = reqwest::get(metrics).await?.text().await?;
    Ok(body
        .lines()
        .filter(|l| l.starts_with("mailer_controller_reconciles_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}
