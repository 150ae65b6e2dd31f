//! `mailer worker` as a Deployment runs it: restarted whenever it exits non-zero, its
//! probes on a port that stays the same across restarts.

use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mailer_testkit::process::{exit_within, free_port, http_get, signal, start_worker_with};

/// How long the kubelet waits before it starts a worker that exited again (its
/// CrashLoopBackOff starts at 10s; shorter keeps the suite short).
const RESTART_AFTER: Duration = Duration::from_secs(1);

pub struct Kubelet {
    pub http_port: u16,
    /// The process id of the worker running now.
    pid: Arc<AtomicU32>,
    stop: Arc<AtomicBool>,
    exits: Arc<Mutex<Vec<(Instant, ExitStatus)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Kubelet {
    pub fn start(amqp_url: &str, provider_url: &str, env: &[(&str, &str)]) -> Self {
        let http_port = free_port();
        let addr = format!("127.0.0.1:{http_port}");
        let mut env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.push(("MAIL_HTTP_ADDR".into(), addr));
        let (amqp_url, provider_url) = (amqp_url.to_string(), provider_url.to_string());
        let stop = Arc::new(AtomicBool::new(false));
        let exits = Arc::new(Mutex::new(Vec::new()));
        let pid = Arc::new(AtomicU32::new(0));
        let thread = std::thread::spawn({
            let (stop, exits, pid) = (stop.clone(), exits.clone(), pid.clone());
            move || {
                let env: Vec<(&str, &str)> =
                    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                loop {
                    let mut worker: Child = start_worker_with(&amqp_url, &provider_url, &env);
                    pid.store(worker.id(), Ordering::SeqCst);
                    loop {
                        if stop.load(Ordering::SeqCst) {
                            signal(&worker, "TERM");
                            let status = exit_within(&mut worker, Duration::from_secs(60));
                            assert!(status.success(), "SIGTERM ends the worker with 0");
                            return;
                        }
                        if let Some(status) = worker.try_wait().expect("wait") {
                            exits.lock().unwrap().push((Instant::now(), status));
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    std::thread::sleep(RESTART_AFTER);
                }
            }
        });
        Self {
            http_port,
            pid,
            stop,
            exits,
            thread: Some(thread),
        }
    }

    /// When the worker first exited after `since`, if it did.
    pub fn exited_after(&self, since: Instant) -> Option<Instant> {
        let exits = self.exits.lock().unwrap();
        exits.iter().map(|(at, _)| *at).find(|at| *at >= since)
    }

    pub fn restarts(&self) -> usize {
        self.exits.lock().unwrap().len()
    }

    /// Every exit was non-zero (a worker that stops on its own never says all is well).
    pub fn exits_failed(&self) -> bool {
        self.exits.lock().unwrap().iter().all(|(_, s)| !s.success())
    }

    /// The peak resident memory of the worker running now (`VmHWM`), in MiB.
    pub fn peak_memory_mib(&self) -> f64 {
        let pid = self.pid.load(Ordering::SeqCst);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kib: f64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("the worker's VmHWM in /proc");
        kib / 1024.0
    }

    /// `/livez`, `/readyz` and `/metrics` status codes now (0 when nothing answers).
    pub fn probes(&self) -> [u16; 3] {
        ["/livez", "/readyz", "/metrics"]
            .map(|path| http_get(self.http_port, path).map_or(0, |(status, _)| status))
    }

    pub fn readyz(&self) -> Option<(u16, String)> {
        http_get(self.http_port, "/readyz")
    }

    /// The deliveries the worker running now has parked (its `/metrics`; 0 when nothing
    /// answers).
    pub fn parked(&self) -> usize {
        self.sample("mailer_worker_deliveries_total{outcome=\"parked\"}") as usize
    }

    /// The series named `series` (labels included) of the worker running now's
    /// `/metrics`; 0 when it has none or nothing answers.
    pub fn sample(&self, series: &str) -> f64 {
        let Some((200, metrics)) = http_get(self.http_port, "/metrics") else {
            return 0.0;
        };
        let prefix = format!("{series} ");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str())?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// The sum of the samples of metric `name` of the worker running now (0 when nothing
    /// answers).
    pub fn metric(&self, name: &str) -> f64 {
        let Some((200, metrics)) = http_get(self.http_port, "/metrics") else {
            return 0.0;
        };
        metrics
            .lines()
            .filter(|line| {
                line.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Stops the worker running now with SIGTERM, as a rollout does.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the kubelet thread");
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
