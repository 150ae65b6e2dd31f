//! Where mail goes: one module per way of sending, behind [`Provider`].
//!
//! A provider is chosen by a URL (see [`from_url`]):
//!
//! | URL | What it does |
//! |-----|--------------|
//! | `smtp://[user:pass@]host[:port][?options]` | SMTP, port 25 by default, STARTTLS as `tls=` says |
//! | `smtps://[user:pass@]host[:port][?options]` | SMTP over implicit TLS, port 465 by default |
//! | `file:///dir` | writes each mail as an RFC 5322 `.eml` file into `dir`, for development |
//! | `discard://` | accepts every mail and drops it, for benchmarks |
//! | `ses://KEY_ID:SECRET@REGION` | Amazon SES v2 `SendEmail`, SigV4-signed |
//! | `sendgrid://:API_KEY@api.sendgrid.com` | SendGrid v3 `mail/send` |
//! | `postmark://:SERVER_TOKEN@api.postmarkapp.com[?stream=NAME]` | Postmark `/email` |
//! | `mailgun://:API_KEY@DOMAIN[?region=eu]` | Mailgun `messages.mime`, US or EU |
//!
//! The SMTP options are documented on [`smtp::SmtpSettings`], the HTTP APIs' on
//! [`http`]. A user name and password must be percent-encoded in the URL; the password
//! (an API's key) never appears in an error, a log line or the `Display`/`Debug` of a
//! provider.

pub mod discard;
pub mod file;
pub mod http;
pub mod rate;
mod refusals;
pub mod smtp;

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use crate::message::Mail;
use crate::redact::redacted;

/// A way of sending mail.
///
/// `Display` shows the provider's URL with its password replaced by `***`.
pub trait Provider: Send + Sync + fmt::Display + fmt::Debug {
    /// Sends one mail. `Ok` means the provider took responsibility for every recipient.
    ///
    /// The mail comes checked, not rendered: a provider that needs the message's bytes
    /// renders it ([`Mail::render`]) once, when it is about to send it, so a provider that
    /// fails first (or sends nothing) never pays for it.
    fn send(&self, mail: Mail) -> BoxFuture<'_, Result<(), SendError>>;

    /// [`send`](Self::send) within `limit`: the sending itself, from the moment the
    /// provider starts on it. A wait for the provider's turn (a provider that makes at most
    /// [`concurrency`](Self::concurrency) sends at once, such as a free connection of an
    /// SMTP pool) comes first and is not counted. Past `limit` the send failed for now,
    /// class [`ErrorClass::Timeout`].
    fn send_within(&self, mail: Mail, limit: Duration) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(async move {
            tokio::time::timeout(limit, self.send(mail))
                .await
                .unwrap_or_else(|_| Err(SendError::past_deadline(self, limit)))
        })
    }

    /// How many sends the provider makes at once; more wait for their turn. `None` when it
    /// sets no bound of its own.
    fn concurrency(&self) -> Option<NonZeroUsize> {
        None
    }

    /// The longest a send may wait for its turn besides the provider's own bound
    /// ([`concurrency`](Self::concurrency)) when `waiting` sends ask at once: a
    /// rate-limited provider's turns ([`rate::RateLimited`]). Not part of the send's
    /// deadline either.
    fn longest_wait(&self, waiting: u16) -> Duration {
        let _ = waiting;
        Duration::ZERO
    }

    /// While the provider cannot be reached (connecting to it keeps failing) or refuses
    /// our credentials, when it tries again: until then a send fails for now at once,
    /// without reaching it. A time that has passed means the pause is over and the next
    /// send tries (and so probes the provider); `None` while it is not paused.
    fn paused(&self) -> Option<Pause> {
        None
    }
}

/// A provider that takes no sends for a while ([`Provider::paused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pause {
    /// When the next send tries again.
    pub until: Instant,
    pub cause: PauseCause,
}

/// Why a provider is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseCause {
    /// Connecting to it keeps failing.
    Unreachable,
    /// It refused our credentials (an API's 401 or 403): a key that is wrong, revoked or
    /// not allowed to send. Nothing is sent, and no attempt spent, until one is taken.
    CredentialsRefused,
}

/// Whether a send that failed may succeed when tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Failure {
    /// Failed for now (a 4xx reply, the network, a timeout): park the request and retry.
    ForNow,
    /// Failed for good (a 5xx reply to the mail, its sender or a recipient): retrying
    /// only delays the bad news, so dead-letter the request.
    ForGood,
}

/// A mail that [`Mail::render`] could not build: a request that its checks let through
/// by mistake, so it never will be sent.
fn unrenderable(provider: &dyn fmt::Display, error: &crate::message::RequestError) -> SendError {
    SendError::for_good(ErrorClass::Protocol, format!("{provider}: {error}"))
}

/// What kind of failure a send had: a small, fixed set fit for a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorClass {
    /// Resolving or connecting to the server failed.
    Connect,
    /// The TLS handshake failed, or TLS was required and the server did not offer it.
    Tls,
    /// The server did not answer in time.
    Timeout,
    /// The server refused our login (or offers no way to log in that we support); for an
    /// HTTP API, a 401 or 403: a key that is wrong, revoked or not allowed to send.
    Auth,
    /// The server said something we could not understand, or refused a command that
    /// the mail itself cannot be blamed for.
    Protocol,
    /// A 4xx SMTP reply, or an HTTP API's 429 or 5xx: try again later.
    TemporaryReply,
    /// A 5xx SMTP reply, or an HTTP API's other 4xx: the server will never take this mail.
    PermanentReply,
    /// Reading or writing failed: a reset connection or a full disk.
    Io,
}

impl ErrorClass {
    pub const ALL: [ErrorClass; 8] = [
        Self::Connect,
        Self::Tls,
        Self::Timeout,
        Self::Auth,
        Self::Protocol,
        Self::TemporaryReply,
        Self::PermanentReply,
        Self::Io,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Tls => "tls",
            Self::Timeout => "timeout",
            Self::Auth => "auth",
            Self::Protocol => "protocol",
            Self::TemporaryReply => "temporary-reply",
            Self::PermanentReply => "permanent-reply",
            Self::Io => "io",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a mail was not sent. Its message is fit for logs and the `x-mail-dead-error`
/// header: it names the server and the step, and quotes the server's reply code and
/// text; it never holds a password or the mail's body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SendError {
    failure: Failure,
    class: ErrorClass,
    message: String,
    /// Whether the send reached the provider: see [`SendError::reached`].
    reached: bool,
    /// How long the provider asked us to wait (an HTTP API's `Retry-After`).
    retry_after: Option<Duration>,
}

impl SendError {
    /// A failure that may go away: the request should be tried again later.
    pub fn for_now(class: ErrorClass, message: impl Into<String>) -> Self {
        Self {
            failure: Failure::ForNow,
            class,
            message: message.into(),
            reached: true,
            retry_after: None,
        }
    }

    /// A failure that never will go away: the request should be dead-lettered.
    pub fn for_good(class: ErrorClass, message: impl Into<String>) -> Self {
        Self {
            failure: Failure::ForGood,
            class,
            message: message.into(),
            reached: true,
            retry_after: None,
        }
    }

    /// A send that did not end within `limit` (the worker's `MAIL_SEND_TIMEOUT`): failed
    /// for now, class [`ErrorClass::Timeout`]; it reached the provider unless said
    /// otherwise ([`not_reached`](Self::not_reached)).
    pub fn past_deadline(provider: &(impl fmt::Display + ?Sized), limit: Duration) -> Self {
        Self::for_now(
            ErrorClass::Timeout,
            format!(
                "{provider}: the send took longer than {} (MAIL_SEND_TIMEOUT)",
                humantime::format_duration(limit)
            ),
        )
    }

    /// The same failure, of a send that never reached the provider.
    pub fn not_reached(mut self) -> Self {
        self.reached = false;
        self
    }

    /// The same failure, with the wait the provider asked for.
    pub fn with_retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = Some(wait);
        self
    }

    /// How long the provider asked to wait before trying again (an HTTP API's
    /// `Retry-After`, in seconds), when it said. The message quotes it too.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    pub fn failure(&self) -> Failure {
        self.failure
    }

    /// True when the mail never will be sent, so retrying is pointless.
    pub fn is_for_good(&self) -> bool {
        self.failure == Failure::ForGood
    }

    pub fn class(&self) -> ErrorClass {
        self.class
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the send reached the provider: it may have had the mail, so the attempt
    /// counts. A send that failed before (for SMTP: no session was opened, because
    /// connecting, the TLS of `smtps://`, the greeting or `EHLO` failed, or connecting was
    /// paused) never showed the mail to anyone; its attempt does not count, so an outage
    /// of the provider, however long, never makes a request `gave-up`.
    pub fn reached(&self) -> bool {
        self.reached
    }
}

/// A provider URL that cannot be used. Its message is one line and never shows the
/// password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderUrlError {
    /// The text does not parse as a URL; it is not repeated, since it may hold a password
    /// in a form that cannot be told apart.
    #[error("the provider URL is not a URL ({0}); write it like smtp://user:pass@host:587")]
    NotAUrl(String),
    #[error(
        "the provider URL {url} has the unknown scheme {scheme:?}; use smtp://, smtps://, ses://, sendgrid://, postmark://, mailgun://, file:// or discard://"
    )]
    UnknownScheme { url: String, scheme: String },
    #[error("the provider URL {url} is unusable: {problem}")]
    Invalid { url: String, problem: String },
    #[error("MAIL_PROVIDER_CA_FILE: cannot read {path}: {problem}")]
    CaFile { path: String, problem: String },
}

impl ProviderUrlError {
    fn invalid(url: &url::Url, problem: impl Into<String>) -> Self {
        Self::Invalid {
            url: redacted(url),
            problem: problem.into(),
        }
    }
}

/// Builds the provider a URL names; see the [module documentation](self).
pub fn from_url(url: &str) -> Result<Arc<dyn Provider>, ProviderUrlError> {
    from_url_with(url, None)
}

/// [`from_url`], trusting also the CA certificate in the PEM file `ca_file`
/// (`MAIL_PROVIDER_CA_FILE`) for TLS to the provider.
pub fn from_url_with(
    url: &str,
    ca_file: Option<&std::path::Path>,
) -> Result<Arc<dyn Provider>, ProviderUrlError> {
    let parsed =
        url::Url::parse(url.trim()).map_err(|e| ProviderUrlError::NotAUrl(e.to_string()))?;
    match parsed.scheme() {
        "smtp" | "smtps" => {
            let settings = smtp::SmtpSettings::from_url(&parsed)?;
            let ca = ca_file.map(read_ca).transpose()?;
            Ok(Arc::new(smtp::SmtpProvider::new(settings, ca.as_deref())?))
        }
        "file" => Ok(Arc::new(file::FileProvider::from_url(&parsed)?)),
        "discard" => Ok(Arc::new(discard::DiscardProvider::from_url(&parsed)?)),
        scheme if http::SCHEMES.contains(&scheme) => {
            let ca = ca_file.map(read_ca).transpose()?;
            http::from_url(&parsed, ca.as_deref())
        }
        scheme => Err(ProviderUrlError::UnknownScheme {
            url: redacted(&parsed),
            scheme: scheme.to_owned(),
        }),
    }
}

/// The PEM file of `MAIL_PROVIDER_CA_FILE`.
fn read_ca(path: &std::path::Path) -> Result<Vec<u8>, ProviderUrlError> {
    std::fs::read(path).map_err(|e| ProviderUrlError::CaFile {
        path: path.display().to_string(),
        problem: e.to_string(),
    })
}

/// Refuses query parameters a provider does not know, so a typo is not ignored.
fn refuse_query(url: &url::Url, known: &[&str]) -> Result<(), ProviderUrlError> {
    for (name, _) in url.query_pairs() {
        if !known.contains(&name.as_ref()) {
            let problem = if known.is_empty() {
                format!("it takes no options, but has {name:?}")
            } else {
                format!(
                    "unknown option {name:?}; the options are {}",
                    known.join(", ")
                )
            };
            return Err(ProviderUrlError::invalid(url, problem));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
