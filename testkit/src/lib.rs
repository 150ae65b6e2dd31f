//! What mailer's integration tests (`tests/<area>/main.rs`, one binary per area) and its
//! benchmarks share, in one place: the real RabbitMQ and a vhost per test ([`broker`]),
//! the real SMTP server ([`smtp`], [`tls`]), stand-ins of the HTTP mail APIs ([`api`]), the chart as Helm renders it ([`chart`]), the worker as a process or in-process
//! ([`process`], [`inproc`]), the in-memory Kubernetes API server ([`fake_api`]) and the operator reconciling against
//! it ([`operator`]), a
//! recording proxy in front of the management API ([`management_proxy`]), and pipelines
//! as tests write them ([`pipeline`], [`many`]). Each test binary uses only part of it.

pub mod api;
pub mod broker;
pub mod chart;
pub mod fake_api;
pub mod inproc;
pub mod management_proxy;
pub mod many;
pub mod metrics;
pub mod operator;
pub mod pipeline;
pub mod process;
pub mod provider;
pub mod reconciles;
pub mod smtp;
pub mod tls;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// The repository's root: the scripts and files the tests run or read (e.g.
/// `tests/smtp_server.py`, `examples/`) are found from there, whichever binary runs them.
pub fn repo_root() -> PathBuf {
    let testkit = Path::new(env!("CARGO_MANIFEST_DIR"));
    testkit.parent().unwrap_or(testkit).to_path_buf()
}

/// The `mailer` binary cargo built for the test or bench that runs. Cargo gives a test
/// binary its path in `CARGO_BIN_EXE_mailer` when it runs it; without that (a test binary
/// run by hand) it is beside the `deps/` directory the test binary is in.
pub fn mailer_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("CARGO_BIN_EXE_mailer") {
        return PathBuf::from(path);
    }
    let test_binary = std::env::current_exe().expect("the test binary's path");
    let profile_dir = test_binary
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is in target/<profile>/deps");
    profile_dir.join("mailer")
}

/// Runs the future `make` returns to its end on a runtime of its own, on a thread of its
/// own, and returns its output (`Err` when it panicked). What a `Drop` or other
/// synchronous code of the tests and benches does with async work: called inside a
/// runtime, `block_on` there would panic.
pub fn run_apart<T, F>(make: impl FnOnce() -> F + Send + 'static) -> std::thread::Result<T>
where
    F: std::future::Future<Output = T>,
    T: Send + 'static,
{
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(make())
    })
    .join()
}

static UNIQUE: AtomicU32 = AtomicU32::new(0);

/// A name no other test, nor another run of this one, uses (it also names the worker
/// user, which is not confined to a vhost).
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::Relaxed)
    )
}
