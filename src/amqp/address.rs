//! Where a broker takes AMQP connections, and the AMQP URLs built from it: one home for
//! every AMQP address of the project (the controller's, the workers', `mailer topology`'s
//! and `mailer dead`'s).

/// Where a broker takes AMQP connections: a scheme, a host and a port, without
/// credentials or vhost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpAddress {
    pub tls: bool,
    pub host: String,
    pub port: u16,
}

impl AmqpAddress {
    /// `host` on AMQP's standard port: 5671 (amqps) with TLS, else 5672.
    pub fn standard(host: &str, tls: bool) -> Self {
        Self {
            tls,
            host: host.to_string(),
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

/// The broker user of an AMQP URL (`guest` when it names none, as AMQP clients assume).
pub fn amqp_user(amqp_url: &str) -> Result<String, String> {
    let shown = crate::redact::redact_url(amqp_url);
    let url = url::Url::parse(amqp_url).map_err(|e| {
        format!("{shown} is not a URL ({e}); write it as amqp://USER:PASSWORD@HOST:5672/VHOST")
    })?;
    if !matches!(url.scheme(), "amqp" | "amqps") || url.host_str().is_none() {
        return Err(format!(
            "{shown} is not an AMQP URL; write it as amqp://USER:PASSWORD@HOST:5672/VHOST (or amqps://)"
        ));
    }
    let (user, _) = crate::redact::credentials(&url);
    Ok(if user.is_empty() {
        "guest".to_string()
    } else {
        user
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_amqp_address_is_a_scheme_host_and_port_only() {
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
        assert_eq!(AmqpAddress::standard("rabbit", true).port, 5671);
        assert_eq!(AmqpAddress::standard("rabbit", false).port, 5672);
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

    #[test]
    fn a_vhost_replaces_the_path() {
        assert_eq!(
            with_vhost("amqp://u:p@h:5672/%2f", "a/b").unwrap(),
            "amqp://u:p@h:5672/a%2Fb"
        );
    }

    #[test]
    fn the_user_comes_from_the_url() {
        assert_eq!(
            amqp_user("amqp://mailer%2Dw:pw@h:5672/shop").unwrap(),
            "mailer-w"
        );
        assert_eq!(amqp_user("amqps://h").unwrap(), "guest");
    }
}
