//! A provider that fails every send for now without any I/O: the park path with the
//! cost of a refused SMTP connection taken out, to tell it from the worker's own.

use std::fmt;

use futures::future::BoxFuture;
use mailer::message::Mail;
use mailer::provider::{ErrorClass, Provider, SendError};

#[derive(Debug)]
pub struct FailingProvider;

impl fmt::Display for FailingProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("failing (in memory)")
    }
}

impl Provider for FailingProvider {
    fn send(&self, _mail: Mail) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(async {
            Err(SendError::for_now(
                ErrorClass::Connect,
                "connecting to 127.0.0.1:1: Connection refused (os error 111)",
            ))
        })
    }
}
