//! What an `smtp://` or `smtps://` URL says: the server, the login, TLS and limits.

use std::fmt;
use std::time::Duration;

use percent_encoding::percent_decode_str;

use crate::provider::ProviderUrlError;

/// The port of `smtp://` when the URL names none.
pub const DEFAULT_SMTP_PORT: u16 = 25;
/// The port of `smtps://` when the URL names none.
pub const DEFAULT_SMTPS_PORT: u16 = 465;
/// How long connecting, or any one command and its reply, may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The least and most `timeout=` accepted.
const TIMEOUT_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(600));
/// How many connections one worker keeps to the server by default.
pub const DEFAULT_CONNECTIONS: usize = 4;
/// The most `connections=` accepted.
const MAX_CONNECTIONS: usize = 100;

/// The options of an SMTP provider URL.
const OPTIONS: [&str; 4] = ["tls", "timeout", "connections", "hello"];

/// How the connection to the server is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// `smtps://`: TLS from the first byte (RFC 8314), usually on port 465.
    ImplicitTls,
    /// `smtp://…?tls=required`, the default: upgrade with STARTTLS, and refuse a server
    /// that does not offer it. Usually on port 587.
    StartTlsRequired,
    /// `smtp://…?tls=opportunistic`: upgrade with STARTTLS when the server offers it,
    /// else send in plain text, but never a password.
    StartTlsOpportunistic,
    /// `smtp://…?tls=none`: plain text, e.g. for a relay on the same host or in tests.
    Plaintext,
}

impl Security {
    /// The value of `tls=` that selects this, or `None` for `smtps://`.
    fn tls_option(self) -> Option<&'static str> {
        match self {
            Self::ImplicitTls => None,
            Self::StartTlsRequired => Some("required"),
            Self::StartTlsOpportunistic => Some("opportunistic"),
            Self::Plaintext => Some("none"),
        }
    }
}

/// What an SMTP provider URL says:
///
/// `smtp://[user:pass@]host[:port][?tls=required|opportunistic|none][&timeout=30s][&connections=4][&hello=name]`
/// or `smtps://` with the same options but `tls`.
///
/// - `tls` (smtp:// only): see [`Security`]; `required` by default.
/// - `timeout`: how long connecting, or any one command and its reply, may take, e.g.
///   `10s` (1s to 10m; 30s by default).
/// - `connections`: the most connections a worker holds to the server at once, each
///   reused for many mails (1 to 100; 4 by default). A send waits for a free one.
/// - `hello`: the name this client gives in `EHLO`; this host's name by default.
///
/// The user name and password are percent-decoded, so write `%40` for an `@` in them.
#[derive(Clone, PartialEq, Eq)]
pub struct SmtpSettings {
    /// The server's name or address, without brackets around an IPv6 address.
    pub host: String,
    pub port: u16,
    pub security: Security,
    pub username: Option<String>,
    password: Option<String>,
    pub timeout: Duration,
    pub connections: usize,
    pub hello: Option<String>,
    /// The host as the URL spells it (IPv6 addresses in brackets), for display.
    shown_host: String,
}

impl SmtpSettings {
    /// Reads an `smtp://` or `smtps://` URL.
    pub fn from_url(url: &url::Url) -> Result<Self, ProviderUrlError> {
        let invalid = |problem: String| ProviderUrlError::invalid(url, problem);
        let implicit_tls = match url.scheme() {
            "smtp" => false,
            "smtps" => true,
            other => return Err(invalid(format!("{other}:// is not SMTP"))),
        };
        let host = match url.host() {
            Some(url::Host::Domain(name)) if !name.is_empty() => name.to_owned(),
            Some(url::Host::Ipv4(address)) => address.to_string(),
            Some(url::Host::Ipv6(address)) => address.to_string(),
            _ => return Err(invalid("it names no host".into())),
        };
        if !matches!(url.path(), "" | "/") {
            return Err(invalid("an SMTP URL has no path".into()));
        }
        let username = Some(decode(url.username(), "user name").map_err(&invalid)?)
            .filter(|name| !name.is_empty());
        let password = url
            .password()
            .map(|password| decode(password, "password"))
            .transpose()
            .map_err(&invalid)?;
        if password.is_some() && username.is_none() {
            return Err(invalid("it has a password but no user name".into()));
        }

        let mut settings = Self {
            host,
            port: url.port().unwrap_or(if implicit_tls {
                DEFAULT_SMTPS_PORT
            } else {
                DEFAULT_SMTP_PORT
            }),
            security: if implicit_tls {
                Security::ImplicitTls
            } else {
                Security::StartTlsRequired
            },
            username,
            password,
            timeout: DEFAULT_TIMEOUT,
            connections: DEFAULT_CONNECTIONS,
            hello: None,
            shown_host: url.host_str().unwrap_or_default().to_owned(),
        };
        for (name, value) in url.query_pairs() {
            match name.as_ref() {
                "tls" if implicit_tls => {
                    return Err(invalid(
                        "smtps:// always uses TLS; tls= is an option of smtp://".into(),
                    ));
                }
                "tls" => {
                    settings.security = match value.as_ref() {
                        "required" => Security::StartTlsRequired,
                        "opportunistic" => Security::StartTlsOpportunistic,
                        "none" => Security::Plaintext,
                        other => {
                            return Err(invalid(format!(
                                "tls={other:?} is not one of required, opportunistic or none"
                            )));
                        }
                    }
                }
                "timeout" => settings.timeout = parse_timeout(&value).map_err(&invalid)?,
                "connections" => {
                    settings.connections = parse_connections(&value).map_err(&invalid)?
                }
                "hello" => settings.hello = Some(parse_hello(&value).map_err(&invalid)?),
                other => {
                    return Err(invalid(format!(
                        "unknown option {other:?}; the options are {}",
                        OPTIONS.join(", ")
                    )));
                }
            }
        }
        Ok(settings)
    }

    /// The password, to log in with; never shown.
    pub(crate) fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// `host:port`, to name the server in errors.
    pub fn server(&self) -> String {
        format!("{}:{}", self.shown_host, self.port)
    }
}

/// The URL with `***` for the password, e.g. `smtp://user:***@host:587?tls=required`.
impl fmt::Display for SmtpSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.security {
            Security::ImplicitTls => "smtps",
            _ => "smtp",
        };
        write!(f, "{scheme}://")?;
        if let Some(username) = &self.username {
            let encoded =
                percent_encoding::utf8_percent_encode(username, percent_encoding::NON_ALPHANUMERIC);
            match self.password {
                Some(_) => write!(f, "{encoded}:***@")?,
                None => write!(f, "{encoded}@")?,
            }
        }
        write!(f, "{}", self.server())?;
        if let Some(tls) = self.security.tls_option() {
            write!(f, "?tls={tls}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for SmtpSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmtpSettings")
            .field("url", &self.to_string())
            .field("timeout", &self.timeout)
            .field("connections", &self.connections)
            .field("hello", &self.hello)
            .finish()
    }
}

fn decode(text: &str, what: &str) -> Result<String, String> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|decoded| decoded.into_owned())
        .map_err(|_| format!("its {what} is not UTF-8 once percent-decoded"))
}

fn parse_timeout(value: &str) -> Result<Duration, String> {
    let timeout = humantime::parse_duration(value)
        .map_err(|e| format!("timeout={value:?} is not a duration ({e}); write it like 10s"))?;
    let (least, most) = TIMEOUT_RANGE;
    if timeout < least || timeout > most {
        return Err(format!("timeout={value:?} is not between 1s and 10m"));
    }
    Ok(timeout)
}

fn parse_connections(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(count) if (1..=MAX_CONNECTIONS).contains(&count) => Ok(count),
        _ => Err(format!(
            "connections={value:?} is not a number from 1 to {MAX_CONNECTIONS}"
        )),
    }
}

fn parse_hello(value: &str) -> Result<String, String> {
    let is_name = !value.is_empty()
        && value.len() <= 253
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if is_name {
        Ok(value.to_owned())
    } else {
        Err(format!("hello={value:?} is not a host name"))
    }
}
