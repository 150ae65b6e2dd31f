//! A provider that fails every send for now without any I/O, as a relay that refuses
//! every mail with a 4xx would (the send reached it, so it is parked with its attempt
//! counted): the park path with no SMTP round trip, so the worker's own cost shows.

use std::fmt;

use futures::future::BoxFuture;
use mailer::message::Mail;
use mailer::provider::{ErrorClass, Provider, SendError};

#[derive(Debug)]
pub struct FailingProvider;

impl fmt::Display for FailingProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("failing (in memory, 451 to every mail)")
    }
}

impl Provider for FailingProvider {
    fn send(&self, _mail: Mail) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(async {
            Err(SendError::for_now(
                ErrorClass::TemporaryReply,
                "127.0.0.1:25: MAIL FROM:<noreply@shop.example>: 451 4.3.2 not accepting mail for now",
            ))
        })
    }
}
