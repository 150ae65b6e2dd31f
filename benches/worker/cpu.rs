//! CPU time used by this process (the worker or the bare loop, and the bench's light
//! polling) and by the broker, from /proc, to tell where a run's time went.

use std::sync::OnceLock;
use std::time::Duration;

/// Clock ticks per second of /proc's times (USER_HZ, 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU time so far of this process and of the broker, in ticks.
#[derive(Clone, Copy)]
pub struct CpuClock {
    this: u64,
    broker: Option<u64>,
    switches: u64,
}

/// CPU time a run used.
pub struct CpuUsed {
    pub this: Duration,
    pub broker: Option<Duration>,
    /// Context switches of this process's threads (those alive at both ends).
    pub switches: u64,
}

impl CpuClock {
    pub fn now() -> Self {
        Self {
            this: ticks("self").unwrap_or(0),
            broker: broker_pid().and_then(|pid| ticks(&pid.to_string())),
            switches: context_switches(),
        }
    }

    pub fn used(&self) -> CpuUsed {
        let now = Self::now();
        let secs = |ticks: u64| Duration::from_secs_f64(ticks as f64 / TICKS_PER_SECOND);
        CpuUsed {
            this: secs(now.this.saturating_sub(self.this)),
            broker: match (self.broker, now.broker) {
                (Some(before), Some(after)) => Some(secs(after.saturating_sub(before))),
                _ => None,
            },
            switches: now.switches.saturating_sub(self.switches),
        }
    }
}

/// utime + stime of /proc/<pid>/stat.
fn ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it do not.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Fields 14 and 15 of stat(5), counted from the state (field 3) at index 0.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The Erlang VM of the RabbitMQ node the bench talks to (the one listening on its AMQP
/// port), if it runs on this machine. Found once: with both brokers running, the first
/// `beam.smp` in /proc may be the other node.
fn broker_pid() -> Option<u32> {
    static PID: OnceLock<Option<u32>> = OnceLock::new();
    *PID.get_or_init(|| listening_pid(crate::broker::ports().0))
}

/// The `beam.smp` holding the socket that listens on `port`.
fn listening_pid(port: u16) -> Option<u32> {
    let sockets = listening_sockets(port);
    if sockets.is_empty() {
        return None;
    }
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let entry = entry.ok()?;
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
        if comm.trim() != "beam.smp" {
            return None;
        }
        let fds = std::fs::read_dir(entry.path().join("fd")).ok()?;
        fds.filter_map(Result::ok)
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|target| sockets.contains(&target.to_string_lossy().into_owned()))
            .then_some(pid)
    })
}

/// `socket:[inode]` of each socket listening on `port`, from /proc/net/tcp and tcp6.
fn listening_sockets(port: u16) -> Vec<String> {
    let port = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    // local_address, st (0A: listening), inode.
                    let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
                    (local.ends_with(&port) && *state == "0A").then(|| format!("socket:[{inode}]"))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Voluntary and involuntary context switches of every thread of this process.
fn context_switches() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.ends_with("ctxt_switches") || l.contains("ctxt_switches:"))
                .filter_map(|l| l.split(':').nth(1)?.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}
