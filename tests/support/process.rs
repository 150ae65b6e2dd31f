//! `mailer worker` as a child process, as it runs in production.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Starts `mailer worker` on the vhost of `amqp_url`, sending through `provider_url`.
pub fn start_worker(amqp_url: &str, provider_url: &str, max_attempts: u32) -> Child {
    Command::new(env!("CARGO_BIN_EXE_mailer"))
        .arg("worker")
        .env("MAIL_AMQP_URL", amqp_url)
        .env("MAIL_PROVIDER_URL", provider_url)
        .env("MAIL_MAX_ATTEMPTS", max_attempts.to_string())
        .env("MAIL_HTTP_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start mailer worker")
}

/// Waits for the process to exit, at most `within`.
pub fn exit_within(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("the process did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `signal` (e.g. `TERM`, `INT`) to the process.
pub fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal} {}", child.id());
}

/// Stops a worker with SIGTERM and checks that it stopped cleanly.
pub fn stop_worker(mut worker: Child) {
    signal(&worker, "TERM");
    assert!(
        exit_within(&mut worker, Duration::from_secs(30)).success(),
        "SIGTERM ends the worker with 0"
    );
}

/// Polls `check` until it gives a value, at most `seconds`.
pub async fn eventually<T, F, Fut>(seconds: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {seconds}s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
