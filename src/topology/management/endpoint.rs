//! Where a management API is and who to be there: parsed from a URL, shown without the
//! password, and the AMQP address of the broker behind it.

use std::fmt;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use url::Url;

use crate::amqp::address::AmqpAddress;
use crate::redact::{MASK, credentials};
use crate::topology::error::TopologyError;

/// Where the management API is and who to be there.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ManagementEndpoint {
    /// The API's base, e.g. `http://localhost:15672/api`, without credentials.
    pub(super) api: Url,
    pub username: String,
    password: String,
}

/// What is escaped in a path segment of the API: all but RFC 3986's unreserved
/// characters. `Url`'s own segment escaping leaves `|` as it is, which RabbitMQ's web
/// server refuses (400), and the owner markers' names are made of it.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

impl ManagementEndpoint {
    /// The URL of `segments` below the API, each one escaped.
    pub(super) fn url_of(&self, segments: &[&str]) -> Url {
        let mut url = self.api.clone();
        let mut path = url.path().trim_end_matches('/').to_string();
        for segment in segments {
            path.push('/');
            path.extend(utf8_percent_encode(segment, SEGMENT));
        }
        url.set_path(&path);
        url
    }

    /// From a URL like `http://user:password@host:15672`; `/api` is added when the path
    /// does not already end with it.
    pub fn parse(url: &str) -> Result<Self, TopologyError> {
        let parsed = Self::parse_base(url)?;
        let (username, password) = credentials(&parsed);
        if username.is_empty() {
            return Err(TopologyError::BadEndpoint(format!(
                "the management URL {} has no user name; write it as http://USER:PASSWORD@HOST:15672",
                crate::redact::redact_url(url)
            )));
        }
        Self::with_credentials(url, &username, &password)
    }

    /// From a URL and separately kept credentials (e.g. the keys of a Secret); any
    /// credentials in the URL itself are ignored.
    pub fn with_credentials(
        url: &str,
        username: &str,
        password: &str,
    ) -> Result<Self, TopologyError> {
        let mut api = Self::parse_base(url)?;
        let _ = api.set_username("");
        let _ = api.set_password(None);
        if !api.path().trim_end_matches('/').ends_with("/api") {
            let path = format!("{}/api", api.path().trim_end_matches('/'));
            api.set_path(&path);
        }
        let path = api.path().trim_end_matches('/').to_string();
        api.set_path(&path);
        Ok(Self {
            api,
            username: username.to_string(),
            password: password.to_string(),
        })
    }

    fn parse_base(url: &str) -> Result<Url, TopologyError> {
        let parsed = Url::parse(url).map_err(|e| {
            TopologyError::BadEndpoint(format!(
                "{} is not a management URL ({e}); write it as http://USER:PASSWORD@HOST:15672",
                crate::redact::redact_url(url)
            ))
        })?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(TopologyError::BadEndpoint(format!(
                "{} is not a management URL: it must start with http:// or https:// and name a host",
                crate::redact::redact_url(url)
            )));
        }
        Ok(parsed)
    }

    /// The host the API runs on, to find the broker's AMQP listener on.
    pub fn host(&self) -> &str {
        self.api.host_str().unwrap_or("localhost")
    }

    pub fn password(&self) -> &str {
        &self.password
    }

    /// Where the broker behind this API takes AMQP connections, when nothing says
    /// otherwise: the same host on AMQP's standard port (5671 with TLS when the API is
    /// served over https).
    pub fn amqp_address(&self) -> AmqpAddress {
        AmqpAddress::standard(self.host(), self.is_tls())
    }

    /// The AMQP URL of `vhost` on the broker behind this API, with its credentials.
    pub fn amqp_url(&self, vhost: &str) -> String {
        self.amqp_address()
            .url(&self.username, self.password(), vhost)
    }

    pub fn is_tls(&self) -> bool {
        self.api.scheme() == "https"
    }
}

impl fmt::Display for ManagementEndpoint {
    /// The URL with the user name and a masked password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.api.clone();
        let _ = shown.set_username(&self.username);
        let _ = shown.set_password(Some(MASK));
        write!(f, "{shown}")
    }
}

impl fmt::Debug for ManagementEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ManagementEndpoint({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_segment_of_an_api_url_is_escaped_but_for_unreserved_characters() {
        let e = ManagementEndpoint::parse("http://guest:guest@localhost:15672").unwrap();
        let url = e.url_of(&["global-parameters", "mailer-owner|pipeline|a b"]);
        assert_eq!(
            url.as_str(),
            "http://localhost:15672/api/global-parameters/mailer-owner%7Cpipeline%7Ca%20b"
        );
        let url = e.url_of(&["queues", "/", "mail.send_1~%"]);
        assert_eq!(url.path(), "/api/queues/%2F/mail.send_1~%25");
    }

    #[test]
    fn an_endpoint_keeps_credentials_out_of_its_url_and_its_display() {
        let e = ManagementEndpoint::parse("http://guest:s3cret@localhost:15672").unwrap();
        assert_eq!(e.api.as_str(), "http://localhost:15672/api");
        assert_eq!(e.username, "guest");
        assert_eq!(e.password(), "s3cret");
        assert_eq!(e.to_string(), "http://guest:***@localhost:15672/api");
        assert!(!format!("{e:?}").contains("s3cret"));
    }

    #[test]
    fn the_amqp_url_follows_the_management_endpoint() {
        let e = ManagementEndpoint::parse("http://gu%40st:p%2Fw@rabbit:15672").unwrap();
        assert_eq!(e.amqp_url("/"), "amqp://gu%40st:p%2Fw@rabbit:5672/%2F");
        let e = ManagementEndpoint::with_credentials("https://rabbit", "u", "p").unwrap();
        assert_eq!(e.amqp_url("shop"), "amqps://u:p@rabbit:5671/shop");
    }

    #[test]
    fn an_api_path_is_kept() {
        let e = ManagementEndpoint::with_credentials("https://rmq.example/rabbit/api/", "u", "p")
            .unwrap();
        assert_eq!(e.api.as_str(), "https://rmq.example/rabbit/api");
        assert!(e.is_tls());
    }

    #[test]
    fn bad_endpoints_say_what_to_write_without_the_password() {
        for url in [
            "localhost:15672",
            "amqp://u:hunter2@h:5672",
            "http://localhost:15672",
            "http://u:hunter2@[::1",
        ] {
            let err = ManagementEndpoint::parse(url).unwrap_err().to_string();
            assert!(
                err.contains("http://USER:PASSWORD@HOST:15672")
                    || err.contains("must start with http"),
                "{err}"
            );
            assert!(!err.contains("hunter2"), "{err}");
        }
    }
}
