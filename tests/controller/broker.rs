//! What the controller's tests need of the broker besides the testkit: unique
//! pipeline names, removing the users a test made, and polling with a deadline.

use std::sync::atomic::{AtomicU32, Ordering};

use mailer_testkit::broker::raw_api;

/// The management API as a connection Secret's `uri` holds it: without credentials.
pub fn secret_uri() -> String {
    format!("http://{}", mailer_testkit::broker::management_host())
}
/// A port nothing listens on, for a broker that is gone.
pub const CLOSED_MANAGEMENT_URL: &str = "http://127.0.0.1:1";

pub use mailer_testkit::unique;

/// A pipeline name of [`unique`], and the removal of the user the operator makes for its
/// workers once the test ends, however it ends.
pub fn unique_pipeline(prefix: &str) -> (String, UserCleanup) {
    let name = unique(prefix);
    let users = UserCleanup(vec![mailer_testkit::operator::worker_user(&name)]);
    (name, users)
}

/// Removes RabbitMQ users (and the operator's owner markers of them) when dropped, even
/// when the test failed.
pub struct UserCleanup(pub Vec<String>);

impl Drop for UserCleanup {
    fn drop(&mut self) {
        let users = std::mem::take(&mut self.0);
        // Drop cannot be async: delete on a runtime of its own, on a thread of its own.
        let _ = mailer_testkit::run_apart(move || async move {
            for user in users {
                let _ = raw_api().delete_user(&user, true).await;
                let marker =
                    mailer::topology::ownership::Claim::User { name: user.clone() }.marker();
                let _ = raw_api().clear_global_runtime_parameter(&marker).await;
            }
        });
    }
}

/// Polls `check` until it returns `Some`, or panics after `seconds`.
pub use mailer_testkit::process::eventually;

/// A management API that accepts connections and never answers: a broker that hangs.
pub struct BlackHole {
    /// Its URL, for a connection Secret's `uri`.
    pub url: String,
    accepted: std::sync::Arc<AtomicU32>,
}

impl BlackHole {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = std::sync::Arc::new(AtomicU32::new(0));
        let counting = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                counting.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        Self { url, accepted }
    }

    /// Connections accepted so far: requests that are hanging.
    pub fn accepted(&self) -> u32 {
        self.accepted.load(Ordering::SeqCst)
    }
}
