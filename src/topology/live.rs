//! Live queue counts over AMQP: the management API's statistics lag by seconds, and
//! deciding whether a queue may be deleted must not rest on a stale count.

use lapin::Connection;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

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
        let connection = crate::amqp::connect(
            amqp_url,
            "mailer live queue counts",
            crate::amqp::connect::DEFAULT_CONNECT_TIMEOUT,
        )
        .await
        .map_err(|e| e.to_string())?;
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
    AmqpAddress::beside(endpoint).url(&endpoint.username, endpoint.password(), vhost)
}

/// Where a broker takes AMQP connections: a scheme, a host and a port, without
/// credentials or vhost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpAddress {
    pub tls: bool,
    pub host: String,
    pub port: u16,
}

impl AmqpAddress {
    /// The management API's host on AMQP's standard port: 5671 (amqps) when the
    /// management API is served over https, else 5672.
    pub fn beside(endpoint: &ManagementEndpoint) -> Self {
        let tls = endpoint.is_tls();
        Self {
            tls,
            host: endpoint.host().to_string(),
            port: if tls { 5671 } else { 5672 },
        }
    }

    /// `amqp://host[:port]` or `amqps://host[:port]`; credentials and a vhost in it are
    /// refused, since they come from elsewhere. The error never quotes `uri`, which may
    /// hold a password.
    pub fn parse(uri: &str) -> Result<Self, String> {
        let url = url::Url::parse(uri.trim())
            .map_err(|e| format!("it is not an AMQP URI ({e}); e.g. amqp://rabbitmq:5672"))?;
        let tls = match url.scheme() {
            "amqp" => false,
            "amqps" => true,
            other => {
                return Err(format!("its scheme is {other:?}; use amqp:// or amqps://"));
            }
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err(
                "the AMQP URI must not hold credentials (they come from username and password)"
                    .to_string(),
            );
        }
        if !matches!(url.path(), "" | "/") {
            return Err(
                "it names a vhost; leave it out (the pipeline's spec.rabbitmq.vhost is used)"
                    .to_string(),
            );
        }
        let host = url
            .host_str()
            .filter(|host| !host.is_empty())
            .ok_or_else(|| "it has no host".to_string())?;
        Ok(Self {
            tls,
            host: host.to_string(),
            port: url.port().unwrap_or(if tls { 5671 } else { 5672 }),
        })
    }

    /// The URL of `username` on `vhost`, each part percent-encoded.
    pub fn url(&self, username: &str, password: &str, vhost: &str) -> String {
        let enc = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let scheme = if self.tls { "amqps" } else { "amqp" };
        format!(
            "{scheme}://{}:{}@{}:{}/{}",
            enc(username),
            enc(password),
            self.host,
            self.port,
            enc(vhost)
        )
    }
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
    #[test]
    fn an_amqp_address_is_a_scheme_host_and_port_only() {
        use super::AmqpAddress;
        let parsed = AmqpAddress::parse("amqps://rmq.shop.svc").unwrap();
        assert_eq!(
            (parsed.tls, parsed.host.as_str(), parsed.port),
            (true, "rmq.shop.svc", 5671)
        );
        assert_eq!(AmqpAddress::parse("amqp://rmq:5673/").unwrap().port, 5673);
        assert_eq!(
            AmqpAddress::parse("amqp://rmq:5673")
                .unwrap()
                .url("u s", "p@ss", "/"),
            "amqp://u%20s:p%40ss@rmq:5673/%2F"
        );
        for (bad, says) in [
            ("http://rmq:15672", "use amqp:// or amqps://"),
            ("amqp://guest:guest@rmq:5672", "must not hold credentials"),
            ("amqp://rmq:5672/shop", "names a vhost"),
            ("not a uri", "is not an AMQP URI"),
            ("http://u:hunter2@rmq:15672", "use amqp://"),
        ] {
            let error = AmqpAddress::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
            assert!(!error.contains("hunter2"), "{bad}: {error}");
        }
    }

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
