//! The worker's benchmark: `make bench`, or `cargo bench --bench worker`.
//!
//! On the real RabbitMQ at 127.0.0.1 (AMQP 5672, management 15672, guest/guest), each
//! scenario in a fresh vhost of its own with the pipeline's topology (quorum queues),
//! all at the worker's default prefetch (16), it measures and prints:
//!
//! 1. the ack path: the worker with `discard://` draining pre-published requests, against
//!    a bare lapin consume-and-ack loop over as many identical messages;
//! 2. the park path: every send fails for now after reaching the provider (in memory, as
//!    a relay that refuses every mail with a 4xx would), so the worker parks each request
//!    in the retry exchange, against a bare consume, publish-with-confirm (mandatory), ack
//!    loop with the same concurrency;
//! 3. end to end: mails per second from the worker to a local SMTP sink (aiosmtpd, or
//!    Postfix's `smtp-sink` with `MAILER_BENCH_SMTP_SINK`), and the sink's own limit with
//!    the SMTP provider alone;
//! 4. through each HTTP API provider (`ses://`, `sendgrid://`, `postmark://`,
//!    `mailgun://`) to the testkit's stand-in of its API, answering at once: mails per
//!    second and the connections used (see `api.rs`);
//! 5. the resident memory of `mailer worker`, run as a child process, draining requests
//!    of 579 bytes and of 10 MiB (see `memory.rs`).
//!
//! Each comparison runs a warm-up, then `MAILER_BENCH_ROUNDS` rounds (5 by default), each
//! running the worker and the bare loop back to back in alternating order; it reports the
//! best and the median rate of each, and as the ratio the median of the rounds' ratios
//! (a pair run back to back sees the same load on the machine). Each run also shows the
//! CPU time per message of this process and of the broker, which tells where time went.
//! It prints whether each target was met; it never fails on a figure, only when the
//! broker, the sink or the worker does not work.
//!
//! Environment:
//! - `MAILER_BENCH_ACK_N` (20000), `MAILER_BENCH_PARK_N` (10000), `MAILER_BENCH_SMTP_N`
//!   (1000; the SMTP scenario runs at most 2 rounds), `MAILER_BENCH_API_N` (5000; at most
//!   3 rounds per API): requests per run;
//! - `MAILER_BENCH_ROUNDS` (5);
//! - `MAILER_BENCH_SCENARIOS`: a subset of `ack,park,smtp,api,memory`;
//! - `MAILER_BENCH_SMTP_OPTIONS`, e.g. `&connections=16`: appended to the sink's URL;
//! - `MAILER_BENCH_SMTP_SINK`: the path of Postfix's `smtp-sink`, to use instead of
//!   aiosmtpd (see `sink.rs`).

mod api;
mod broker;
mod cpu;
mod failing;
mod inproc;
mod memory;
mod sink;

use std::fmt;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mailer::message::parse_request;
use mailer::provider;

use broker::{BenchVhost, PREFETCH, bare_ack, bare_park};
use inproc::run_worker;

/// worker/bare at or above this meets the throughput target of the ack path, and the
/// share of the SMTP provider alone the worker must reach to be called not the limit.
const RATIO_TARGET: f64 = 0.9;
/// The park path's target: above 0.9 with a margin (issue 25).
const PARK_RATIO_TARGET: f64 = 0.95;
/// The worker's default log filter (`mailer worker` without `RUST_LOG`).
const WORKER_LOG_FILTER: &str = "info,lapin=off";

struct Settings {
    ack_n: usize,
    park_n: usize,
    smtp_n: usize,
    api_n: usize,
    rounds: usize,
    /// The scenarios to run: `ack`, `park`, `smtp`, `api`, `memory`.
    scenarios: Vec<String>,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let read = |name: &str, default: usize| -> Result<usize> {
            match std::env::var(name) {
                Ok(v) => {
                    let n: usize = v
                        .trim()
                        .parse()
                        .with_context(|| format!("{name}={v:?} is not a count"))?;
                    ensure!(n > 0, "{name} must be at least 1");
                    Ok(n)
                }
                Err(_) => Ok(default),
            }
        };
        Ok(Self {
            ack_n: read("MAILER_BENCH_ACK_N", 20_000)?,
            park_n: read("MAILER_BENCH_PARK_N", 10_000)?,
            smtp_n: read("MAILER_BENCH_SMTP_N", 1_000)?,
            api_n: read("MAILER_BENCH_API_N", 5_000)?,
            rounds: read("MAILER_BENCH_ROUNDS", 5)?,
            scenarios: std::env::var("MAILER_BENCH_SCENARIOS")
                .unwrap_or_else(|_| "ack,park,smtp,api,memory".into())
                .split(',')
                .map(|s| s.trim().to_string())
                .collect(),
        })
    }

    fn runs(&self, scenario: &str) -> bool {
        self.scenarios.iter().any(|s| s == scenario)
    }
}

/// A valid mail request, as a shop would publish it.
fn request_body() -> Vec<u8> {
    let request = serde_json::json!({
        "from": "Shop <noreply@shop.example>",
        "to": ["customer@example.com"],
        "reply_to": "help@shop.example",
        "subject": "Your order 12345 has shipped",
        "text": "Hello,\n\nyour order 12345 is on its way and should arrive within three working days.\nYou can follow it at https://shop.example/orders/12345.\n\nThank you for shopping with us.\n",
        "html": "<p>Hello,</p><p>your order 12345 is on its way and should arrive within three working days. You can follow it <a href=\"https://shop.example/orders/12345\">here</a>.</p><p>Thank you for shopping with us.</p>",
        "headers": {"X-Campaign": "bench"}
    });
    let body = serde_json::to_vec(&request).expect("JSON");
    parse_request(&body, Some("check")).expect("the bench's request is valid");
    body
}

/// Throughputs of several runs of one contender.
#[derive(Default)]
struct Runs(Vec<f64>);

impl Runs {
    fn best(&self) -> f64 {
        self.0.iter().copied().fold(0.0, f64::max)
    }

    fn median(&self) -> f64 {
        let mut sorted = self.0.clone();
        sorted.sort_by(f64::total_cmp);
        match sorted.len() {
            0 => 0.0,
            n if n % 2 == 1 => sorted[n / 2],
            n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        }
    }
}

impl fmt::Display for Runs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "best {:>6.0}/s, median {:>6.0}/s of {} runs",
            self.best(),
            self.median(),
            self.0.len()
        )
    }
}

/// The worker against the bare loop on one path.
struct Comparison {
    worker: Runs,
    bare: Runs,
    /// The median ratio that meets the target.
    target: f64,
}

impl Comparison {
    /// worker/bare of each round: the two ran back to back, so a change in the machine's
    /// load between rounds cancels out.
    fn round_ratios(&self) -> Vec<f64> {
        self.worker
            .0
            .iter()
            .zip(&self.bare.0)
            .map(|(w, b)| w / b)
            .collect()
    }

    /// The headline ratio: the median of the rounds' ratios.
    fn ratio(&self) -> f64 {
        Runs(self.round_ratios()).median()
    }

    fn report(&self) {
        println!("  worker: {}", self.worker);
        println!("  bare:   {}", self.bare);
        let rounds: Vec<String> = self
            .round_ratios()
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect();
        println!(
            "  worker/bare by round: {} -> median {:.2} (best against best {:.2}); target >= {}: {}",
            rounds.join(" "),
            self.ratio(),
            self.worker.best() / self.bare.best(),
            self.target,
            met(self.ratio() >= self.target)
        );
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Contender {
    Worker,
    Bare,
}

/// The worker first in even rounds, the bare loop first in odd ones, so a drift in the
/// machine's load does not favour either.
fn order(round: usize) -> [Contender; 2] {
    if round.is_multiple_of(2) {
        [Contender::Worker, Contender::Bare]
    } else {
        [Contender::Bare, Contender::Worker]
    }
}

fn rate(n: usize, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
}

fn report_run(round: usize, who: &str, n: usize, took: Duration, cpu: &cpu::CpuUsed) -> f64 {
    let r = rate(n, took);
    let per_msg = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    let broker = cpu
        .broker
        .map_or_else(|| "?".to_string(), |b| format!("{:.0}", per_msg(b)));
    println!(
        "  round {}  {who:<7} {n} in {:>6.3} s = {r:>6.0} msg/s  (per message: CPU {:>3.0} us here, {broker:>3} us in the broker; {:.1} context switches here)",
        round + 1,
        took.as_secs_f64(),
        per_msg(cpu.this),
        cpu.switches as f64 / n as f64,
    );
    r
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

/// The ack path (1.): `discard://` against a bare consume-and-ack loop.
async fn ack_path(s: &Settings, body: &[u8]) -> Result<Comparison> {
    let n = s.ack_n;
    println!(
        "\n== 1. ack path: {n} requests of {} bytes, worker with discard:// vs bare consume+ack (load {})",
        body.len(),
        load_average()
    );
    let vhost = BenchVhost::create("ack").await?;
    let connection = vhost.connect().await?;
    let discard = provider::from_url("discard://")?;
    let queue = vhost.topology.queue.clone();

    let warm = (n / 5).max(1);
    vhost.fill(&connection, warm, body).await?;
    run_worker(&vhost, discard.clone(), warm, "sent").await?;
    vhost.fill(&connection, warm, body).await?;
    bare_ack(&vhost, warm).await?;
    println!("  warmed up with {warm} requests each");

    let mut c = Comparison {
        worker: Runs::default(),
        bare: Runs::default(),
        target: RATIO_TARGET,
    };
    for round in 0..s.rounds {
        for who in order(round) {
            vhost.fill(&connection, n, body).await?;
            let clock = cpu::CpuClock::now();
            let took = match who {
                Contender::Worker => run_worker(&vhost, discard.clone(), n, "sent").await?,
                Contender::Bare => bare_ack(&vhost, n).await?,
            };
            let used = clock.used();
            let left = vhost.ready(&connection, &queue).await?;
            ensure!(left == 0, "{left} requests left in {queue} after a drain");
            match who {
                Contender::Worker => c.worker.0.push(report_run(round, "worker", n, took, &used)),
                Contender::Bare => c.bare.0.push(report_run(round, "bare", n, took, &used)),
            }
        }
    }
    let _ = connection.close(200, "done".into()).await;
    c.report();
    Ok(c)
}

/// The park path (2.): every send fails for now, against a bare consume, publish with
/// confirm, ack loop.
async fn park_path(s: &Settings, body: &[u8]) -> Result<Comparison> {
    let n = s.park_n;
    // A provider that cannot be reached makes the worker stop consuming, not park: the
    // sends fail after reaching it, as to a relay that refuses every mail for now.
    let refused: std::sync::Arc<dyn mailer::provider::Provider> =
        std::sync::Arc::new(failing::FailingProvider);
    println!(
        "\n== 2. park path: {n} requests, worker with {refused} (each request parked) vs bare consume+publish(confirm, mandatory)+ack (load {})",
        load_average()
    );
    let vhost = BenchVhost::create("park").await?;
    let connection = vhost.connect().await?;
    let (queue, retry) = (
        vhost.topology.queue.clone(),
        vhost.topology.retry_queue.clone(),
    );

    let warm = (n / 5).max(1);
    vhost.fill(&connection, warm, body).await?;
    run_worker(&vhost, refused.clone(), warm, "parked").await?;
    vhost.fill(&connection, warm, body).await?;
    bare_park(&vhost, warm).await?;
    vhost.purge(&connection, &retry).await?;
    println!("  warmed up with {warm} requests each");

    let mut c = Comparison {
        worker: Runs::default(),
        bare: Runs::default(),
        target: PARK_RATIO_TARGET,
    };
    for round in 0..s.rounds {
        for who in order(round) {
            vhost.fill(&connection, n, body).await?;
            let clock = cpu::CpuClock::now();
            let took = match who {
                Contender::Worker => run_worker(&vhost, refused.clone(), n, "parked").await?,
                Contender::Bare => bare_park(&vhost, n).await?,
            };
            let used = clock.used();
            let left = vhost.ready(&connection, &queue).await?;
            ensure!(left == 0, "{left} requests left in {queue} after a drain");
            let parked = vhost.purge(&connection, &retry).await?;
            ensure!(
                parked as usize == n,
                "{retry} held {parked} parked requests, not {n}"
            );
            match who {
                Contender::Worker => c.worker.0.push(report_run(round, "worker", n, took, &used)),
                Contender::Bare => c.bare.0.push(report_run(round, "bare", n, took, &used)),
            }
        }
    }
    let _ = connection.close(200, "done".into()).await;
    c.report();
    Ok(c)
}

/// What the SMTP scenario found.
struct EndToEnd {
    worker: Runs,
    alone: Runs,
}

/// End to end (3.): the worker sending through SMTP to a local sink, and the sink's own
/// limit with the provider alone.
async fn end_to_end(s: &Settings, body: &[u8]) -> Result<EndToEnd> {
    let n = s.smtp_n;
    let sink = sink::SmtpSink::start()?;
    let url = format!(
        "{}{}",
        sink.provider_url(),
        std::env::var("MAILER_BENCH_SMTP_OPTIONS").unwrap_or_default()
    );
    println!(
        "\n== 3. end to end: {n} requests, worker with {url} ({}) (load {})",
        sink.describe(),
        load_average()
    );
    let vhost = BenchVhost::create("smtp").await?;
    let connection = vhost.connect().await?;
    // One provider for every worker run, as in a long-running worker, and another for
    // the provider alone: each keeps its own pool of connections.
    let worker_provider = provider::from_url(&url)?;
    let alone_provider = provider::from_url(&url)?;
    let mails = (0..n)
        .map(|i| parse_request(body, Some(&format!("alone-{i}"))))
        .collect::<Result<Vec<_>, _>>()?;

    let warm = (n / 5).max(1);
    vhost.fill(&connection, warm, body).await?;
    run_worker(&vhost, worker_provider.clone(), warm, "sent").await?;
    sink::provider_alone(alone_provider.as_ref(), &mails[..warm], PREFETCH.into()).await?;
    let mut expected = 2 * warm;
    println!("  warmed up with {warm} mails each");

    let mut e = EndToEnd {
        worker: Runs::default(),
        alone: Runs::default(),
    };
    for round in 0..s.rounds.min(2) {
        for who in order(round) {
            match who {
                Contender::Worker => {
                    vhost.fill(&connection, n, body).await?;
                    let clock = cpu::CpuClock::now();
                    let took = run_worker(&vhost, worker_provider.clone(), n, "sent").await?;
                    let used = clock.used();
                    e.worker.0.push(report_run(round, "worker", n, took, &used));
                }
                Contender::Bare => {
                    let clock = cpu::CpuClock::now();
                    let took =
                        sink::provider_alone(alone_provider.as_ref(), &mails, PREFETCH.into())
                            .await?;
                    let used = clock.used();
                    e.alone.0.push(report_run(round, "alone", n, took, &used));
                }
            }
            expected += n;
        }
    }
    let _ = connection.close(200, "done".into()).await;
    let stored = sink.stored();
    ensure!(
        stored == expected,
        "the sink stored {stored} mails, not the {expected} sent"
    );
    println!("  the sink stored all {stored} mails");
    println!("  worker through SMTP: {}", e.worker);
    println!("  provider alone:      {}", e.alone);
    let connections = connections_of(&url);
    println!(
        "  one SMTP transaction (MAIL, RCPT, DATA) takes {:.1} ms on each of the provider's {connections} connections (best run of the provider alone)",
        connections as f64 * 1000.0 / e.alone.best()
    );
    println!("  {}", sink_verdict(&e));
    Ok(e)
}

fn sink_verdict(e: &EndToEnd) -> String {
    let share = e.worker.best() / e.alone.best();
    if share >= RATIO_TARGET {
        format!(
            "the worker is not the limit: it sends {:.0}% of what the SMTP provider alone gets through to the sink",
            share * 100.0
        )
    } else {
        format!(
            "the worker is the limit: it sends only {:.0}% of what the SMTP provider alone gets through to the sink",
            share * 100.0
        )
    }
}

/// How many connections an SMTP provider URL allows.
fn connections_of(url: &str) -> usize {
    url::Url::parse(url)
        .ok()
        .and_then(|u| {
            u.query_pairs()
                .find(|(k, _)| k == "connections")
                .and_then(|(_, v)| v.parse().ok())
        })
        .unwrap_or(mailer::provider::smtp::DEFAULT_CONNECTIONS)
}

/// Logs as `mailer worker` does by default, into /dev/null: the worker's log lines
/// (one per parked request) cost what they cost in production, without flooding this
/// output.
fn init_logging() -> Result<()> {
    let null: &'static std::fs::File = Box::leak(Box::new(
        std::fs::OpenOptions::new().write(true).open("/dev/null")?,
    ));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(WORKER_LOG_FILTER))
        .with_writer(move || null)
        .try_init();
    Ok(())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

async fn bench() -> Result<()> {
    let settings = Settings::from_env()?;
    mailer::install_crypto_provider();
    init_logging()?;
    let version = broker::broker_version().await?;
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "mailer worker benchmark: RabbitMQ {version} at 127.0.0.1, quorum queues, prefetch {PREFETCH}; {cpus} CPUs ({}); load average {}",
        cpu_model(),
        load_average()
    );
    println!(
        "each comparison: a warm-up, then {} rounds of both contenders back to back, in alternating order; rates are the best run (the median is shown too), ratios the median of the rounds' ratios",
        settings.rounds
    );
    let body = request_body();

    let ack = if settings.runs("ack") {
        Some(ack_path(&settings, &body).await?)
    } else {
        None
    };
    let park = if settings.runs("park") {
        Some(park_path(&settings, &body).await?)
    } else {
        None
    };
    let smtp = if settings.runs("smtp") {
        match end_to_end(&settings, &body).await {
            Ok(e) => Some(e),
            Err(e) => {
                println!("  end to end skipped: {e:#}");
                None
            }
        }
    } else {
        None
    };
    let apis = if settings.runs("api") {
        api::api_end_to_end(&settings, &body).await?
    } else {
        Vec::new()
    };
    let memory = if settings.runs("memory") {
        memory::memory_use(settings.ack_n, &body).await?
    } else {
        Vec::new()
    };

    println!(
        "\n== summary (rates: best run; ratios: median of the rounds' worker/bare; load average now {})",
        load_average()
    );
    for (name, c) in [("ack path ", &ack), ("park path", &park)] {
        if let Some(c) = c {
            println!(
                "  {name}  worker {:>6.0} msg/s  bare {:>6.0} msg/s  worker/bare {:.2}  target >= {}: {}",
                c.worker.best(),
                c.bare.best(),
                c.ratio(),
                c.target,
                met(c.ratio() >= c.target)
            );
        }
    }
    if let Some(e) = &smtp {
        println!(
            "  SMTP       worker {:>6.0} mails/s; provider alone {:>6.0} mails/s: {}",
            e.worker.best(),
            e.alone.best(),
            sink_verdict(e)
        );
    }
    for figure in &apis {
        println!(
            "  API {:<8} worker {:>6.0} mails/s (median {:.0}); {} mails on {} connections; {}",
            figure.service.name(),
            figure.worker.best(),
            figure.worker.median(),
            figure.mails,
            figure.connections,
            figure.verdict()
        );
    }
    for figure in &memory {
        println!(
            "  memory     VmHWM {:>5.1} MiB  {:<20} target <= {} MiB: {}",
            figure.mib(),
            figure.label,
            figure.target_mib,
            met(figure.met())
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    // As `mailer worker`: tokio's multi-threaded runtime, one thread per CPU.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("bench: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}
