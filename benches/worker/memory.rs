//! The worker's resident memory: `mailer worker` as a child process, configured by its
//! environment as in production, its /proc/<pid>/status read while it drains the queue.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::broker::{BenchVhost, PREFETCH};
use crate::inproc::deliveries_in;

const RUN_LIMIT: Duration = Duration::from_secs(120);
const SAMPLE: Duration = Duration::from_millis(5);

/// What the child process used, in KiB, and how fast it went.
pub struct MemoryRun {
    /// VmRSS once consuming, before the drain had got far.
    pub rss_start_kib: u64,
    /// The largest VmRSS sampled during the drain.
    pub rss_peak_kib: u64,
    /// VmHWM at the end: the kernel's own peak of the resident set.
    pub hwm_kib: u64,
    /// From ready to every request settled (metrics polled over HTTP).
    pub took: Duration,
}

/// A child worker, SIGKILLed if the bench leaves before stopping it.
struct ChildWorker(Child);

impl Drop for ChildWorker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `mailer worker` with `discard://` on `vhost`, whose send queue holds `n` requests,
/// until it has sent them all, then stops it with SIGTERM. `env` is set on top of the
/// worker's configuration.
pub fn run_child(vhost: &BenchVhost, n: usize, env: &[(&str, &str)]) -> Result<MemoryRun> {
    let http = free_addr()?;
    let log = std::env::temp_dir().join(format!("mailer-bench-worker-{}.log", std::process::id()));
    let stderr = std::fs::File::create(&log)?;
    let t = &vhost.topology;
    let child = Command::new(env!("CARGO_BIN_EXE_mailer"))
        .arg("worker")
        .env("MAIL_AMQP_URL", vhost.amqp_url())
        .env("MAIL_PROVIDER_URL", "discard://")
        .env("MAIL_PREFETCH", PREFETCH.to_string())
        .env("MAIL_QUEUE", &t.queue)
        .env("MAIL_RETRY_EXCHANGE", &t.retry_exchange)
        .env("MAIL_DEAD_EXCHANGE", &t.dead_exchange)
        .env("MAIL_SEND_KEY", &t.queue)
        .env("MAIL_HTTP_ADDR", http.to_string())
        .env_remove("RUST_LOG")
        .env_remove("MIMALLOC_ALLOW_THP")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .context("start target/release/mailer worker")?;
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
