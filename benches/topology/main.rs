//! The topology's benchmark: `cargo bench --bench topology` (part of `make bench`).
//!
//! On the real RabbitMQ (3.10 at 127.0.0.1:15672 by default), for each N, with N
//! pipelines of 12 objects each (names of their own) in one vhost, it measures and prints:
//!
//! 1. the first apply: `topology::apply_all` of the N pipelines into a fresh, empty vhost,
//!    as `mailer topology apply -f` does with a file of N pipelines: objects per second;
//! 2. the second apply, with nothing to change: seconds, writes (0 is right) and requests
//!    per pipeline; and one pipeline applied alone, in sync: its requests;
//! 3. the first apply again, into another fresh vhost, with the exchanges, queues and
//!    bindings declared over AMQP (`topology::apply_all_declaring`, as `mailer topology
//!    apply --amqp-url` does): objects per second, and a second apply through the
//!    management API that must find nothing to change;
//! 4. the broker's own bulk import of the same objects (`POST /api/definitions/<vhost>`)
//!    into another fresh vhost: objects per second, and each first apply's rate over it.
//!
//! Each round runs the two first applies and the import back to back, the applies first
//! in odd rounds and the import first in even ones; with several rounds it prints the median of each
//! figure and of the rounds' ratios. Every vhost it makes is deleted at the end, also
//! when it fails. It prints whether each target was met; it never fails on a figure, only
//! when the broker does not work (or a second apply writes, which is a bug).
//!
//! Environment:
//! - `MAILER_BENCH_TOPOLOGY_N`: the pipeline counts, comma-separated (`200,1000`);
//! - `MAILER_BENCH_TOPOLOGY_ROUNDS`: rounds per count (1);
//! - `MAILER_BENCH_BROKER`: `3.10` (management port 15672, the default) or `4.0` (15673);
//! - `MAILER_BENCH_TOPOLOGY_IMPORT=0`: no bulk import (4.): on RabbitMQ 4.0 the import of
//!   1,000 pipelines' objects in one request takes longer than the rest of the bench.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mailer::topology::desired::POLICY_PRIORITY;
use mailer::topology::{
    self, AmqpDeclarer, BrokerCapabilities, Management, ManagementEndpoint, Topology,
};
use rabbitmq_http_client::api::Client;
use rabbitmq_http_client::requests::VirtualHostParams;
use serde_json::{Value, json};

use mailer_testkit::many::OBJECTS_PER_PIPELINE;

/// Objects per second the first apply should reach.
const FIRST_APPLY_TARGET: f64 = 300.0;
/// Seconds a second apply of 200 pipelines in sync should take at most.
const SECOND_APPLY_TARGET: Duration = Duration::from_secs(5);

struct Settings {
    counts: Vec<usize>,
    rounds: usize,
    /// Whether each round runs the broker's bulk import too.
    import: bool,
    management_port: u16,
    amqp_port: u16,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let counts = std::env::var("MAILER_BENCH_TOPOLOGY_N").unwrap_or_else(|_| "200,1000".into());
        let counts = counts
            .split(',')
            .map(|n| {
                n.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .with_context(|| format!("MAILER_BENCH_TOPOLOGY_N: {n:?} is not a count"))
            })
            .collect::<Result<Vec<_>>>()?;
        let rounds = match std::env::var("MAILER_BENCH_TOPOLOGY_ROUNDS") {
            Ok(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .with_context(|| format!("MAILER_BENCH_TOPOLOGY_ROUNDS={v:?} is not a count"))?,
            Err(_) => 1,
        };
        let (management_port, amqp_port) = match std::env::var("MAILER_BENCH_BROKER").as_deref() {
            Err(_) | Ok("3.10") => (15672, 5672),
            Ok("4.0") => (15673, 5673),
            Ok(other) => bail!("MAILER_BENCH_BROKER={other:?}: use 3.10 or 4.0"),
        };
        let import = std::env::var("MAILER_BENCH_TOPOLOGY_IMPORT").as_deref() != Ok("0");
        Ok(Self {
            counts,
            rounds,
            import,
            management_port,
            amqp_port,
        })
    }
}

/// A vhost of the benchmark, deleted when dropped.
struct BenchVhost {
    name: String,
    api_base: String,
}

impl BenchVhost {
    async fn create(api_base: &str, what: &str, n: usize) -> Result<Self> {
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        let vhost = Self {
            name: format!(
                "mailer-bench-topology-{what}-{n}-{}-{millis}",
                std::process::id()
            ),
            api_base: api_base.to_string(),
        };
        let api = Client::new(api_base, "guest", "guest");
        api.create_vhost(&VirtualHostParams {
            name: &vhost.name,
            description: None,
            tags: None,
            default_queue_type: None,
            tracing: false,
        })
        .await
        .context("create a vhost")?;
        api.grant_full_permissions("guest", &vhost.name)
            .await
            .context("grant guest permissions")?;
        Ok(vhost)
    }
}

impl Drop for BenchVhost {
    fn drop(&mut self) {
        let (name, base) = (self.name.clone(), self.api_base.clone());
        // Drop cannot be async: delete on a runtime of its own, on a thread of its own.
        let deleted = mailer_testkit::run_apart(move || async move {
            Client::new(&base, "guest", "guest")
                .delete_vhost(&name, true)
                .await
                .err()
                .map(|e| e.to_string())
        });
        if let Ok(Some(e)) = deleted {
            eprintln!("could not delete vhost {}: {e}", self.name);
        }
    }
}

/// What one round measured.
struct Round {
    first_apply: Duration,
    first_writes: usize,
    second_apply: Duration,
    second_writes: usize,
    second_requests: usize,
    alone_requests: usize,
    /// The first apply with exchanges, queues and bindings declared over AMQP.
    declared_apply: Duration,
    /// `None` when the bench runs without the import.
    import: Option<Duration>,
}

impl Round {
    fn first_rate(&self, objects: usize) -> f64 {
        objects as f64 / self.first_apply.as_secs_f64()
    }

    fn declared_rate(&self, objects: usize) -> f64 {
        objects as f64 / self.declared_apply.as_secs_f64()
    }

    fn import_rate(&self, objects: usize) -> Option<f64> {
        self.import.map(|took| objects as f64 / took.as_secs_f64())
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    mailer::install_crypto_provider();
    let settings = Settings::from_env()?;
    let port = settings.management_port;
    let api_base = format!("http://127.0.0.1:{port}/api");
    let endpoint = ManagementEndpoint::parse(&format!("http://guest:guest@127.0.0.1:{port}"))?;
    let version = Client::new(&api_base, "guest", "guest")
        .server_version()
        .await
        .with_context(|| format!("no RabbitMQ management API at 127.0.0.1:{port}"))?;
    let capabilities = Management::new(&endpoint)?.capabilities().await?;
    let declarer = AmqpDeclarer::new(&format!(
        "amqp://guest:guest@127.0.0.1:{}",
        settings.amqp_port
    ))?;
    let contenders = Contenders {
        api_base: &api_base,
        endpoint: &endpoint,
        declarer: &declarer,
        capabilities,
        import: settings.import,
    };
    println!(
        "topology benchmark: RabbitMQ {version} at 127.0.0.1:{port}; {} cores; load average {}",
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average()
    );
    let mut verdicts = Vec::new();
    for &n in &settings.counts {
        let objects = n * OBJECTS_PER_PIPELINE;
        let mut rounds = Vec::new();
        for round in 1..=settings.rounds {
            println!(
                "\nN = {n} pipelines ({objects} objects), round {round} of {}",
                settings.rounds
            );
            let measured = run_round(&contenders, n, round % 2 == 1).await?;
            print_round(&measured, n);
            rounds.push(measured);
        }
        if settings.rounds > 1 {
            print_medians(&rounds, n);
        }
        verdicts.extend(judge(&rounds, n));
    }
    println!("\nload average at the end: {}", load_average());
    println!("\ntargets:");
    for verdict in verdicts {
        println!("  {verdict}");
    }
    Ok(())
}

/// What each round compares, on one broker.
struct Contenders<'a> {
    api_base: &'a str,
    endpoint: &'a ManagementEndpoint,
    declarer: &'a AmqpDeclarer,
    capabilities: BrokerCapabilities,
    import: bool,
}

async fn run_round(c: &Contenders<'_>, n: usize, apply_first: bool) -> Result<Round> {
    // One vhost at a time: each is deleted before the next is made, so the broker never
    // holds two sets of queues.
    let both_applies = async {
        let applied = applies(c.api_base, c.endpoint, c.capabilities, n).await?;
        let declared_apply = declared_apply(c, n).await?;
        Ok::<_, anyhow::Error>(Round {
            declared_apply,
            ..applied
        })
    };
    let (applied, import) = if !c.import {
        (both_applies.await?, None)
    } else if apply_first {
        let applied = both_applies.await?;
        (applied, Some(import(c.api_base, n, c.capabilities).await?))
    } else {
        let import = import(c.api_base, n, c.capabilities).await?;
        (both_applies.await?, Some(import))
    };
    Ok(Round { import, ..applied })
}

/// The first apply with exchanges, queues and bindings declared over AMQP, timed, in a
/// vhost of its own; then checked by a second apply through the management API.
async fn declared_apply(c: &Contenders<'_>, n: usize) -> Result<Duration> {
    let vhost = BenchVhost::create(c.api_base, "declared", n).await?;
    let topologies = mailer_testkit::many::topologies(&vhost.name, 0..n, c.capabilities);
    let management = Management::new(c.endpoint)?;
    let started = Instant::now();
    let plans = topology::apply_all_declaring(&management, Some(c.declarer), &topologies).await?;
    let took = started.elapsed();
    let changes: usize = plans.iter().map(Vec::len).sum();
    ensure!(
        changes == n * OBJECTS_PER_PIPELINE,
        "the first apply over AMQP made {changes} changes"
    );
    let check = Management::new(c.endpoint)?;
    let plans = topology::apply_all(&check, &topologies).await?;
    ensure!(
        plans.iter().all(Vec::is_empty) && check.writes() == 0,
        "after the first apply over AMQP, a second apply changed something"
    );
    drop(vhost);
    Ok(took)
}

/// The first apply, the second and one pipeline alone, in a vhost of their own.
async fn applies(
    api_base: &str,
    endpoint: &ManagementEndpoint,
    capabilities: BrokerCapabilities,
    n: usize,
) -> Result<Round> {
    let vhost = BenchVhost::create(api_base, "apply", n).await?;
    let topologies = mailer_testkit::many::topologies(&vhost.name, 0..n, capabilities);
    let (first_apply, first_writes) = first_apply(endpoint, &topologies).await?;

    let second = Management::new(endpoint)?;
    let started = Instant::now();
    let plans = topology::apply_all(&second, &topologies).await?;
    let second_apply = started.elapsed();
    ensure!(
        plans.iter().all(Vec::is_empty) && second.writes() == 0,
        "the second apply changed something: {} writes",
        second.writes()
    );

    let alone = Management::new(endpoint)?;
    let changes = topology::apply(&alone, &topologies[0]).await?;
    ensure!(
        changes.is_empty(),
        "one pipeline alone changed: {changes:?}"
    );

    Ok(Round {
        first_apply,
        first_writes,
        second_apply,
        second_writes: second.writes(),
        second_requests: second.reads() + second.writes(),
        alone_requests: alone.reads() + alone.writes(),
        declared_apply: Duration::ZERO,
        import: None,
    })
}

/// The first apply of `topologies`, timed, and its writes.
async fn first_apply(
    endpoint: &ManagementEndpoint,
    topologies: &[Topology],
) -> Result<(Duration, usize)> {
    let management = Management::new(endpoint)?;
    let started = Instant::now();
    let plans = topology::apply_all(&management, topologies).await?;
    let took = started.elapsed();
    let changes: usize = plans.iter().map(Vec::len).sum();
    ensure!(
        changes == topologies.len() * OBJECTS_PER_PIPELINE,
        "the first apply made {changes} changes"
    );
    Ok((took, management.writes()))
}

/// The broker's own import of the same objects into a vhost of its own, timed, and
/// checked by exporting the vhost's definitions.
async fn import(api_base: &str, n: usize, capabilities: BrokerCapabilities) -> Result<Duration> {
    let made = BenchVhost::create(api_base, "import", n).await?;
    let vhost = made.name.as_str();
    let api = Client::new(api_base, "guest", "guest");
    let definitions = definitions(&mailer_testkit::many::topologies(vhost, 0..n, capabilities));
    let started = Instant::now();
    api.import_vhost_definitions(vhost, definitions)
        .await
        .context("import definitions")?;
    let took = started.elapsed();
    let exported: Value = serde_json::from_str(
        &api.export_vhost_definitions(vhost)
            .await
            .context("export definitions")?,
    )?;
    let count = |key: &str| exported[key].as_array().map_or(0, Vec::len);
    let found = count("exchanges") + count("queues") + count("bindings") + count("policies");
    ensure!(
        found == n * OBJECTS_PER_PIPELINE,
        "the import left {found} objects, not {}",
        n * OBJECTS_PER_PIPELINE
    );
    Ok(took)
}

/// The definitions of `topologies`' objects, as `POST /api/definitions/<vhost>` takes them.
fn definitions(topologies: &[Topology]) -> Value {
    let (mut exchanges, mut queues, mut bindings, mut policies) = (vec![], vec![], vec![], vec![]);
    for t in topologies {
        exchanges.extend(t.exchanges.iter().map(|e| {
            json!({"name": e.name, "type": e.kind.as_str(), "durable": true,
                   "auto_delete": false, "internal": false, "arguments": {}})
        }));
        queues.extend(t.queues.iter().map(|q| {
            json!({"name": q.name, "durable": true, "auto_delete": false,
                   "arguments": {"x-queue-type": "quorum"}})
        }));
        bindings.extend(t.bindings.iter().map(|b| {
            json!({"source": b.exchange, "destination": b.queue, "destination_type": "queue",
                   "routing_key": b.routing_key, "arguments": {}})
        }));
        policies.extend(t.policies.iter().map(|p| {
            json!({"name": p.name, "pattern": p.pattern, "apply-to": "queues",
                   "priority": POLICY_PRIORITY, "definition": p.definition})
        }));
    }
    json!({"exchanges": exchanges, "queues": queues, "bindings": bindings, "policies": policies})
}

fn print_round(r: &Round, n: usize) {
    let objects = n * OBJECTS_PER_PIPELINE;
    println!(
        "  first apply      {objects} objects in {:.2} s = {:.0} objects/s ({} writes)",
        r.first_apply.as_secs_f64(),
        r.first_rate(objects),
        r.first_writes
    );
    println!(
        "  first apply AMQP {objects} objects in {:.2} s = {:.0} objects/s (exchanges, queues, bindings declared over AMQP)",
        r.declared_apply.as_secs_f64(),
        r.declared_rate(objects)
    );
    match (r.import, r.import_rate(objects)) {
        (Some(took), Some(import_rate)) => {
            println!(
                "  bulk import      {objects} objects in {:.2} s = {import_rate:.0} objects/s (POST /api/definitions/<vhost>)",
                took.as_secs_f64(),
            );
            println!(
                "  apply/import     {:.2} (management API), {:.2} (over AMQP)",
                r.first_rate(objects) / import_rate,
                r.declared_rate(objects) / import_rate
            );
        }
        _ => println!("  bulk import      not run (MAILER_BENCH_TOPOLOGY_IMPORT=0)"),
    }
    println!(
        "  second apply     {:.2} s, {} writes, {} requests = {:.2} per pipeline",
        r.second_apply.as_secs_f64(),
        r.second_writes,
        r.second_requests,
        r.second_requests as f64 / n as f64
    );
    println!(
        "  one pipeline     {} requests in sync, applied alone",
        r.alone_requests
    );
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

fn print_medians(rounds: &[Round], n: usize) {
    let objects = n * OBJECTS_PER_PIPELINE;
    let imports: Vec<f64> = rounds
        .iter()
        .filter_map(|r| r.import_rate(objects))
        .collect();
    let import = if imports.is_empty() {
        "import not run".to_string()
    } else {
        let ratios = rounds
            .iter()
            .filter_map(|r| Some(r.first_rate(objects) / r.import_rate(objects)?))
            .collect();
        format!(
            "import {:.0} objects/s, apply/import {:.2}",
            median(imports),
            median(ratios)
        )
    };
    println!(
        "  median of {}: first apply {:.0} objects/s, over AMQP {:.0} objects/s, {import}, second apply {:.2} s",
        rounds.len(),
        median(rounds.iter().map(|r| r.first_rate(objects)).collect()),
        median(rounds.iter().map(|r| r.declared_rate(objects)).collect()),
        median(
            rounds
                .iter()
                .map(|r| r.second_apply.as_secs_f64())
                .collect()
        ),
    );
}

/// Whether the figures of `rounds` (medians) meet the targets.
fn judge(rounds: &[Round], n: usize) -> Vec<String> {
    let objects = n * OBJECTS_PER_PIPELINE;
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    let rate = median(rounds.iter().map(|r| r.first_rate(objects)).collect());
    let declared = median(rounds.iter().map(|r| r.declared_rate(objects)).collect());
    let second = median(
        rounds
            .iter()
            .map(|r| r.second_apply.as_secs_f64())
            .collect(),
    );
    let writes = rounds.iter().map(|r| r.second_writes).max().unwrap_or(0);
    let per_pipeline: Vec<String> = rounds
        .iter()
        .map(|r| format!("{:.2}", r.second_requests as f64 / n as f64))
        .collect();
    let alone: Vec<usize> = rounds.iter().map(|r| r.alone_requests).collect();
    let mut verdicts = vec![
        format!(
            "N={n}: first apply over AMQP (--amqp-url) {declared:.0} objects/s (target >= {FIRST_APPLY_TARGET:.0}): {}",
            met(declared >= FIRST_APPLY_TARGET)
        ),
        format!(
            "N={n}: first apply through the management API alone {rate:.0} objects/s (target >= {FIRST_APPLY_TARGET:.0}): {}",
            met(rate >= FIRST_APPLY_TARGET)
        ),
    ];
    let second_verdict = if n == 200 {
        format!(
            " (target <= {} s with 0 writes): {}",
            SECOND_APPLY_TARGET.as_secs(),
            met(second <= SECOND_APPLY_TARGET.as_secs_f64() && writes == 0)
        )
    } else {
        String::new()
    };
    verdicts.push(format!(
        "N={n}: second apply {second:.2} s, {writes} writes{second_verdict}; requests per pipeline in a pass {}, one pipeline alone {alone:?} (13 = 1 vhost + 12 objects, whatever N)",
        per_pipeline.join(", ")
    ));
    verdicts
}

/// The machine's load average, as /proc/loadavg gives it.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}
