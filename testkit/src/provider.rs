//! A provider of the tests' own, for what no real server does on purpose.

use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use mailer::message::Mail;
use mailer::provider::{ErrorClass, Provider, SendError};

/// A provider that records every mail it sent, panics for recipients whose local part
/// starts with `panic`, fails for now for those starting with `later`, and takes `delay`
/// for each send.
#[derive(Debug, Default)]
pub struct TestProvider {
    pub delay: Duration,
    pub started: Mutex<Vec<String>>,
    pub sent: Mutex<Vec<String>>,
}

impl std::fmt::Display for TestProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("test://")
    }
}

impl Provider for TestProvider {
    fn send(&self, mail: Mail) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(async move {
            let id = mail.message_id().to_string();
            self.started.lock().unwrap().push(id.clone());
            if mail
                .envelope()
                .to()
                .iter()
                .any(|to| to.user().starts_with("panic"))
            {
                panic!("the test provider panics for {id}");
            }
            tokio::time::sleep(self.delay).await;
            if mail
                .envelope()
                .to()
                .iter()
                .any(|to| to.user().starts_with("later"))
            {
                return Err(SendError::for_now(ErrorClass::TemporaryReply, "450 later"));
            }
            self.sent.lock().unwrap().push(id);
            Ok(())
        })
    }
}
