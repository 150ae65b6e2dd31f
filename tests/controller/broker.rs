//! The real broker at 127.0.0.1 for tests: a fresh vhost per test, removed afterwards
//! with any user the test made.

use std::sync::atomic::{AtomicU32, Ordering};

use rabbitmq_http_client::api::Client;

pub const MANAGEMENT_URL: &str = "http://127.0.0.1:15672";
/// A port nothing listens on, for a broker that is gone.
pub const CLOSED_MANAGEMENT_URL: &str = "http://127.0.0.1:1";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name no other test, nor another run of this one, uses.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn admin() -> Client<String, String, String> {
    mailer::install_crypto_provider();
    Client::new(
        format!("{MANAGEMENT_URL}/api"),
        "guest".to_string(),
        "guest".to_string(),
    )
}

/// Removes a test's vhost and users when dropped, even when the test failed.
pub struct Cleanup {
    pub vhost: String,
    pub users: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let vhost = self.vhost.clone();
        let users = std::mem::take(&mut self.users);
        // Drop runs inside the test's runtime, which must not be blocked on; a thread
        // with its own runtime does the removal.
        let done = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for cleanup");
            runtime.block_on(async {
                let admin = admin();
                let _ = admin.delete_vhost(&vhost, true).await;
                for user in users {
                    let _ = admin.delete_user(&user, true).await;
                }
            });
        });
        let _ = done.join();
    }
}

/// Polls `check` every 100 ms until it returns `Some`, or panics after `seconds`.
pub async fn eventually<T, F, Fut>(seconds: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(seconds);
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {seconds}s waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
