//! The worker's resident memory: `mailer worker` as a child process, configured by its
//! environment as in production, its /proc/<pid>/status read while it drains the queue.
//!
//! Two sizes of request: the bench's usual one (579 bytes; target: under 30 MiB), and
//! requests of 10 MiB, the largest accepted (issue 25: at most 200 MiB at prefetch 16;
//! a request is held once, as its bytes, and each body is encoded a part at a time while
//! it is sent). The large ones go both to `discard://`, which never renders a mail (what
//! the worker itself holds: 16 requests' bytes), and through SMTP to the local sink,
//! which renders each (the same bytes, plus a part of each body per connection of the
//! provider, 4): the second is the bound.
//!
//! `MAILER_BENCH_WORKER_BIN` runs another build of `mailer` (e.g. one from before a
//! change) instead of this one's; `MAILER_BENCH_LARGE_N` (32) sets how many large
//! requests each run drains.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::broker::{BenchVhost, PREFETCH};
use crate::inproc::deliveries_in;
use crate::sink::SmtpSink;
use crate::{WORKER_LOG_FILTER, load_average, rate};

const RUN_LIMIT: Duration = Duration::from_secs(180);
const SAMPLE: Duration = Duration::from_millis(5);
/// The resident memory targets, in MiB: small requests (issue 3), and 10 MiB requests at
/// prefetch 16 (issue 25; issue 10 asked for 256).
pub const SMALL_TARGET_MIB: f64 = 30.0;
pub const LARGE_TARGET_MIB: f64 = 200.0;

/// The largest VmHWM of one case, and its target.
pub struct MemoryFigure {
    pub label: String,
    pub hwm_kib: u64,
    pub target_mib: f64,
}

/// Where the child worker sends mail.
enum Sends {
    Discard,
    Smtp,
}

struct MemoryCase {
    label: &'static str,
    large: bool,
    sends: Sends,
    runs: usize,
}

const CASES: [MemoryCase; 3] = [
    MemoryCase {
        label: "579 B, discard://",
        large: false,
        sends: Sends::Discard,
        runs: 2,
    },
    MemoryCase {
        label: "10 MiB, discard://",
        large: true,
        sends: Sends::Discard,
        runs: 1,
    },
    MemoryCase {
        label: "10 MiB, SMTP sink",
        large: true,
        sends: Sends::Smtp,
        runs: 1,
    },
];

/// A request of just under 10 MiB (`DEFAULT_MAX_REQUEST_BYTES`): a text body of short lines, as
/// a long newsletter would be.
pub fn large_request_body() -> Vec<u8> {
    const LINE: &str =
        "The quick brown fox jumps over the lazy dog, and then it jumps over it again.\n";
    // On the wire each line's break is two bytes, `\n`; leave room for the rest.
    let lines = (mailer::mail::DEFAULT_MAX_REQUEST_BYTES - 1024) / (LINE.len() + 1);
    let request = serde_json::json!({
        "from": "Shop <noreply@shop.example>",
        "to": ["customer@example.com"],
        "subject": "Everything we sold this year",
        "text": LINE.repeat(lines),
        "headers": {"X-Campaign": "bench-large"}
    });
    serde_json::to_vec(&request).expect("JSON")
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The `mailer` binary the child runs.
fn worker_binary() -> PathBuf {
    std::env::var_os("MAILER_BENCH_WORKER_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_mailer")),
        PathBuf::from,
    )
}

/// Resident memory (4.) of `mailer worker` while it drains small and large requests: the
/// largest VmHWM of each case.
pub async fn memory_use(small_n: usize, small: &[u8]) -> Result<Vec<MemoryFigure>> {
    let large_n: usize = match std::env::var("MAILER_BENCH_LARGE_N") {
        Ok(v) => v
            .trim()
            .parse()
            .context("MAILER_BENCH_LARGE_N is not a count")?,
        Err(_) => 32,
    };
    let large = large_request_body();
    let binary = worker_binary();
    println!(
        "\n== 5. memory: {} worker (MAIL_PREFETCH={PREFETCH}, log {WORKER_LOG_FILTER}) draining {small_n} requests of {} bytes, and {large_n} of {} bytes (load {})",
        binary.display(),
        small.len(),
        large.len(),
        load_average()
    );
    let vhost = BenchVhost::create("memory").await?;
    let connection = vhost.connect().await?;
    let mut figures = Vec::new();
    for case in &CASES {
        let (n, body, target_mib) = if case.large {
            (large_n, large.as_slice(), LARGE_TARGET_MIB)
        } else {
            (small_n, small, SMALL_TARGET_MIB)
        };
        let sink = match case.sends {
            Sends::Smtp => match SmtpSink::start() {
                Ok(sink) => Some(sink),
                Err(e) => {
                    println!("  {:<20} skipped: {e:#}", case.label);
                    continue;
                }
            },
            Sends::Discard => None,
        };
        let provider_url = sink
            .as_ref()
            .map_or_else(|| "discard://".to_string(), SmtpSink::provider_url);
        let mut hwm_kib = 0;
        let mut failed = false;
        for round in 0..case.runs {
            vhost.fill(&connection, n, body).await?;
            let run = match tokio::task::block_in_place(|| {
                run_child(&binary, &vhost, n, &provider_url)
            }) {
                Ok(run) => run,
                // Reported, and the other cases still run: the queue is emptied for them.
                Err(e) => {
                    println!("  {:<20} run {} FAILED: {e:#}", case.label, round + 1);
                    vhost.purge(&connection, &vhost.topology.queue).await?;
                    failed = true;
                    break;
                }
            };
            println!(
                "  {:<20} run {}  VmRSS {:>5.1} MiB once consuming, {:>5.1} MiB at most while draining; VmHWM {:>5.1} MiB; {:>6.0} msg/s",
                case.label,
                round + 1,
                mib(run.rss_start_kib),
                mib(run.rss_peak_kib),
                mib(run.hwm_kib),
                rate(n, run.took)
            );
            hwm_kib = hwm_kib.max(run.hwm_kib);
        }
        if failed {
            continue;
        }
        if let Some(sink) = &sink {
            let stored = sink.stored();
            ensure!(
                stored == n * case.runs,
                "the sink stored {stored} mails, not {}",
                n * case.runs
            );
        }
        figures.push(MemoryFigure {
            label: case.label.to_string(),
            hwm_kib,
            target_mib,
        });
    }
    let _ = connection.close(200, "done".into()).await;
    Ok(figures)
}

impl MemoryFigure {
    pub fn met(&self) -> bool {
        mib(self.hwm_kib) <= self.target_mib
    }

    pub fn mib(&self) -> f64 {
        mib(self.hwm_kib)
    }
}

/// What the child process used, in KiB, and how fast it went.
struct MemoryRun {
    /// VmRSS once consuming, before the drain had got far.
    rss_start_kib: u64,
    /// The largest VmRSS sampled during the drain.
    rss_peak_kib: u64,
    /// VmHWM at the end: the kernel's own peak of the resident set.
    hwm_kib: u64,
    /// From ready to every request settled (metrics polled over HTTP).
    took: Duration,
}

/// A child worker, SIGKILLed if the bench leaves before stopping it.
struct ChildWorker(Child);

impl Drop for ChildWorker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `binary worker` sending to `provider_url` on `vhost`, whose send queue holds `n`
/// requests, until it has sent them all, then stops it with SIGTERM.
fn run_child(
    binary: &std::path::Path,
    vhost: &BenchVhost,
    n: usize,
    provider_url: &str,
) -> Result<MemoryRun> {
    let http = free_addr()?;
    let log = std::env::temp_dir().join(format!("mailer-bench-worker-{}.log", std::process::id()));
    let stderr = std::fs::File::create(&log)?;
    let t = &vhost.topology;
    let child = Command::new(binary)
        .arg("worker")
        .env("MAIL_AMQP_URL", vhost.amqp_url())
        .env("MAIL_PROVIDER_URL", provider_url)
        .env("MAIL_PREFETCH", PREFETCH.to_string())
        .env("MAIL_QUEUE", &t.queue)
        .env("MAIL_RETRY_EXCHANGE", &t.retry_exchange)
        .env("MAIL_DEAD_EXCHANGE", &t.dead_exchange)
        .env("MAIL_SEND_KEY", &t.queue)
        .env("MAIL_HTTP_ADDR", http.to_string())
        .env_remove("RUST_LOG")
        .env_remove("MIMALLOC_ALLOW_THP")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("start {} worker", binary.display()))?;
    let mut child = ChildWorker(child);
    let pid = child.0.id();
    let result = (|| {
        let deadline = Instant::now() + RUN_LIMIT;
        while http_get(http, "/readyz").is_none_or(|(status, _)| status != 200) {
            if let Ok(Some(status)) = child.0.try_wait() {
                bail!("the worker exited at start ({status})");
            }
            if Instant::now() > deadline {
                bail!("the worker did not become ready");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let started = Instant::now();
        let rss_start_kib = status_kib(pid, "VmRSS")?;
        let mut rss_peak_kib = rss_start_kib;
        let mut next_poll = Instant::now();
        loop {
            rss_peak_kib = rss_peak_kib.max(status_kib(pid, "VmRSS")?);
            if Instant::now() >= next_poll {
                let settled = settled(http);
                if settled.values().sum::<u64>() >= n as u64 {
                    let took = started.elapsed();
                    if settled.get("sent").copied() != Some(n as u64) {
                        bail!("expected {n} deliveries sent, the worker settled {settled:?}");
                    }
                    let hwm_kib = status_kib(pid, "VmHWM")?;
                    return Ok(MemoryRun {
                        rss_start_kib,
                        rss_peak_kib,
                        hwm_kib,
                        took,
                    });
                }
                next_poll = Instant::now() + Duration::from_millis(20);
            }
            if Instant::now() > deadline {
                bail!("the worker did not drain the queue in {RUN_LIMIT:?}");
            }
            std::thread::sleep(SAMPLE);
        }
    })();
    // Stop it as Kubernetes would, and expect a clean exit.
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    let exited = loop {
        if let Some(status) = child.0.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let run = result.with_context(|| format!("the worker's log:\n{logged}"))?;
    match exited {
        Some(status) if status.success() => Ok(run),
        Some(status) => bail!("the worker exited with {status} on SIGTERM; its log:\n{logged}"),
        None => bail!("the worker did not exit within 30s of SIGTERM"),
    }
}

fn free_addr() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// A field of /proc/<pid>/status, in KiB.
pub fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

fn settled(http: SocketAddr) -> BTreeMap<String, u64> {
    http_get(http, "/metrics").map_or_else(BTreeMap::new, |(_, body)| deliveries_in(&body))
}

/// A plain HTTP/1.0 GET: the status code and the body, or `None` when nothing answers.
fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Some((status, body.to_string()))
}
