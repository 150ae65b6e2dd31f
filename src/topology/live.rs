//! Live queue counts over AMQP: the management API's statistics lag by seconds, and
//! deciding whether a queue may be deleted must not rest on a stale count.

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

use super::ManagementEndpoint;

/// A queue's load this instant, as the broker's own `queue.declare-ok` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveLoad {
    /// Messages ready for delivery (a quorum queue does not count unacknowledged ones).
    pub ready: u32,
    pub consumers: u32,
}

/// An AMQP connection to one vhost, used only for passive declares.
pub struct LiveQueues {
    connection: Connection,
}

impl LiveQueues {
    pub async fn connect(amqp_url: &str) -> Result<Self, String> {
        let connection = Connection::connect(amqp_url, ConnectionProperties::default())
            .await
            .map_err(|e| {
                format!(
                    "cannot connect to {} over AMQP: {e}",
                    crate::redact::redact_url(amqp_url)
                )
            })?;
        Ok(Self { connection })
    }

    /// The load of `queue`, or `None` when it does not exist.
    pub async fn load(&self, queue: &str) -> Result<Option<LiveLoad>, String> {
        // A passive declare of a missing queue closes its channel, so each check gets one.
        let channel = self
            .connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        match channel
            .queue_declare(queue.into(), options, FieldTable::default())
            .await
        {
            Ok(q) => {
                let _ = channel.close(200, "checked".into()).await;
                Ok(Some(LiveLoad {
                    ready: q.message_count(),
                    consumers: q.consumer_count(),
                }))
            }
            Err(e) if e.to_string().contains("NOT_FOUND") => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    pub async fn close(self) {
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// The AMQP URL of `vhost` on the broker behind a management endpoint: same host and
/// credentials, the standard AMQP port (5671 with TLS when the API is served over https).
pub fn amqp_url_for(endpoint: &ManagementEndpoint, vhost: &str) -> String {
    let (scheme, port) = if endpoint.is_tls() {
        ("amqps", 5671)
    } else {
        ("amqp", 5672)
    };
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    format!(
        "{scheme}://{}:{}@{}:{port}/{}",
        enc(&endpoint.username),
        enc(endpoint.password()),
        endpoint.host(),
        enc(vhost)
    )
}

/// `amqp_url` with its vhost path replaced by `vhost`.
pub fn with_vhost(amqp_url: &str, vhost: &str) -> Result<String, String> {
    let mut url = url::Url::parse(amqp_url).map_err(|e| {
        format!(
            "{} is not an AMQP URL: {e}",
            crate::redact::redact_url(amqp_url)
        )
    })?;
    let encoded = percent_encoding::utf8_percent_encode(vhost, percent_encoding::NON_ALPHANUMERIC)
        .to_string();
    url.set_path(&format!("/{encoded}"));
    Ok(url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_amqp_url_follows_the_management_endpoint() {
        let e = ManagementEndpoint::parse("http://gu%40st:p%2Fw@rabbit:15672").unwrap();
        assert_eq!(
            amqp_url_for(&e, "/"),
            "amqp://gu%40st:p%2Fw@rabbit:5672/%2F"
        );
        let e = ManagementEndpoint::with_credentials("https://rabbit", "u", "p").unwrap();
        assert_eq!(amqp_url_for(&e, "shop"), "amqps://u:p@rabbit:5671/shop");
    }

    #[test]
    fn a_vhost_replaces_the_path() {
        assert_eq!(
            with_vhost("amqp://u:p@h:5672/%2f", "a/b").unwrap(),
            "amqp://u:p@h:5672/a%2Fb"
        );
    }
}
