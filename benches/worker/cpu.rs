//! CPU time used by this process (the worker or the bare loop, and the bench's light
//! polling) and by the broker, from /proc, to tell where a run's time went.

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

/// The RabbitMQ node's Erlang VM, if it runs on this machine.
fn broker_pid() -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let entry = entry.ok()?;
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
        (comm.trim() == "beam.smp").then_some(pid)
    })
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
