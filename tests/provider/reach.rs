//! What `MAIL_SEND_TIMEOUT` (`send_within`'s limit) covers: the transaction, not the wait
//! for a free connection of the pool.

use std::time::{Duration, Instant};

use crate::mail;
use crate::support::smtp::SmtpServer;

#[tokio::test]
async fn the_send_deadline_starts_once_a_connection_is_free() {
    let server = SmtpServer::start();
    let provider = server.provider("&connections=1");
    // Five sends of half a second each on one connection: the last waits two seconds for
    // it, longer than the deadline, which its own transaction is well within.
    let limit = Duration::from_millis(1500);
    let started = Instant::now();
    let sends = (0..5).map(|n| {
        provider.send_within(mail(&["a+slow@example.com"], &format!("queued-{n}")), limit)
    });
    for (n, sent) in futures::future::join_all(sends)
        .await
        .into_iter()
        .enumerate()
    {
        sent.unwrap_or_else(|e| panic!("send {n} waited its turn, then sent: {e}"));
    }
    assert!(
        started.elapsed() >= Duration::from_millis(2500),
        "the sends took turns on the one connection ({:?})",
        started.elapsed()
    );
    assert_eq!(server.mails().len(), 5);
    assert_eq!(server.sessions(), 1);
}
