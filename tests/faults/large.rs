//! Requests at the worker's size limit (10 MiB) through a slow SMTP server: the proxy's
//! slow mode holds each 64 KiB the worker writes for 50 ms, so a mail takes seconds to
//! send. On each broker, the node's and the cluster's: every request delivered once, no
//! worker restart (no connection closed under it: heartbeats, frames, a runtime thread
//! kept busy), and the worker's peak memory within the bound `docs/benchmarks.md` gives
//! for its prefetch and connections, over what it held idle.

use std::time::Instant;

use serde_json::json;

use super::kubelet::Kubelet;
use super::node::Pipeline;
use super::proxy::{Mode, SmtpProxy};
use super::{Tally, delivered, distinct, publish_bodies, secs, smtp_url};
use mailer::mail::DEFAULT_MAX_REQUEST_BYTES;
use mailer_testkit::process::eventually;
use mailer_testkit::smtp::SmtpServer;

/// Requests published.
const REQUESTS: usize = 12;
/// The worker's prefetch and SMTP connections here.
const PREFETCH: usize = 4;
const CONNECTIONS: usize = 2;
/// A request of exactly the size limit: a text body of 76-character lines.
fn request_at_the_limit(i: usize) -> Vec<u8> {
    let envelope = serde_json::to_vec(&json!({
        "from": "Shop <noreply@shop.example>", "to": [format!("large{i}@example.com")],
        "subject": "Your statement", "text": ""
    }))
    .unwrap();
    // Each line is 75 letters and a newline, 77 bytes in the JSON (\n); the rest of the
    // room is one last line.
    let room = DEFAULT_MAX_REQUEST_BYTES - envelope.len();
    let line = format!("{}\n", "x".repeat(75));
    let mut text = line.repeat(room / 77);
    text.push_str(&"y".repeat(room % 77));
    let body = serde_json::to_vec(&json!({
        "from": "Shop <noreply@shop.example>", "to": [format!("large{i}@example.com")],
        "subject": "Your statement", "text": text
    }))
    .unwrap();
    assert_eq!(
        body.len(),
        DEFAULT_MAX_REQUEST_BYTES,
        "a request at the limit"
    );
    body
}

/// The worker's documented peak for requests of `size_mib` (`docs/benchmarks.md`, the
/// worker's resident memory): what it holds idle, the deliveries in flight and the next
/// one being received ((P+1)·S), and per connection a part of the body being sent, its
/// encoding and lettre's dot-stuffed copy of it, with the allocator's rounding: allowed
/// half a request each (C·S/2; measured, 5 MiB in all), where a whole rendering per
/// connection, as before the bodies were encoded while sent, takes C·S more and fails.
/// `idle_mib` is measured, so the bound holds for the debug build the suite runs as for
/// the release build.
fn documented_bound_mib(idle_mib: f64, size_mib: f64) -> f64 {
    idle_mib + (PREFETCH + 1) as f64 * size_mib + CONNECTIONS as f64 * size_mib / 2.0
}

/// Publishes [`REQUESTS`] requests at the limit into `pipeline`, lets one worker send them
/// through the slow proxy and checks every one was delivered, nothing restarted, and the
/// worker's peak memory.
pub async fn large_mail_through_a_slow_smtp_server(pipeline: &Pipeline, fault: &'static str) {
    let smtp = SmtpServer::start();
    let proxy = SmtpProxy::start(smtp.port, Mode::Slow).await;
    let prefetch = PREFETCH.to_string();
    let provider = format!("{}&connections={CONNECTIONS}", smtp_url(proxy.port));
    let kubelet = Kubelet::start(
        &pipeline.amqp_url(),
        &provider,
        &[("MAIL_PREFETCH", prefetch.as_str())],
    );
    eventually(60, "the worker ready", || async {
        kubelet.readyz().filter(|(status, _)| *status == 200)
    })
    .await;
    let idle = kubelet.peak_memory_mib();
    let started = Instant::now();
    let published = publish_bodies(pipeline, 0..REQUESTS, request_at_the_limit).await;
    eventually(600, "every large mail delivered", || async {
        (distinct(&delivered(&smtp)) == published.len()).then_some(())
    })
    .await;
    let took = started.elapsed();
    let peak = kubelet.peak_memory_mib();
    let restarts = kubelet.restarts();
    kubelet.stop();
    let tally = Tally::take(fault, pipeline, published, delivered(&smtp)).await;
    let size_mib = DEFAULT_MAX_REQUEST_BYTES as f64 / (1024.0 * 1024.0);
    let bound = documented_bound_mib(idle, size_mib);
    tally.report(&format!(
        "{REQUESTS} requests of {size_mib:.0} MiB (the limit) delivered in {} through a proxy holding each 64 KiB 50 ms, prefetch {PREFETCH}, {CONNECTIONS} SMTP connections; {restarts} worker restarts; peak memory {peak:.0} MiB, {idle:.0} idle (bound {bound:.0} MiB)",
        secs(took)
    ));
    assert_eq!(restarts, 0, "no worker restart under large mail");
    assert_eq!(tally.twice(), 0, "nothing sent twice without a fault");
    assert!(
        peak <= bound,
        "the worker peaked at {peak:.0} MiB, over the documented {bound:.0} MiB ({idle:.0} MiB idle)"
    );
}
