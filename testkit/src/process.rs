//! `mailer worker` as a child process, as it runs in production.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Starts `mailer worker` on the vhost of `amqp_url`, sending through `provider_url`.
pub fn start_worker(amqp_url: &str, provider_url: &str, max_attempts: u32) -> Child {
    let max_attempts = max_attempts.to_string();
    start_worker_with(
        amqp_url,
        provider_url,
        &[("MAIL_MAX_ATTEMPTS", max_attempts.as_str())],
    )
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
pub async fn eventually<T, F, Fut>(seconds: u64, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    match within(seconds, check).await {
        Some(found) => found,
        None => panic!("timed out after {seconds}s waiting for {what}"),
    }
}

/// Polls `check` until it gives a value, at most `seconds`; `None` if it never did.
pub async fn within<T, F, Fut>(seconds: u64, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(found) = check().await {
            return Some(found);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A port that was free a moment ago, for a server the test starts itself.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// `GET path` on `127.0.0.1:port`: the status code and the body, or `None` when nothing
/// answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

/// Starts `mailer worker` with `env` on top of the defaults of [`start_worker`].
pub fn start_worker_with(amqp_url: &str, provider_url: &str, env: &[(&str, &str)]) -> Child {
    let mut command = Command::new(crate::mailer_bin());
    command
        .arg("worker")
        .env("MAIL_AMQP_URL", amqp_url)
        .env("MAIL_PROVIDER_URL", provider_url)
        .env("MAIL_HTTP_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (name, value) in env {
        command.env(name, value);
    }
    command.spawn().expect("start mailer worker")
}
