//! The HTTP API providers: Amazon SES, SendGrid, Postmark and Mailgun, each through one
//! pooled reqwest client (rustls with ring), behind [`Provider`](super::Provider).
//!
//! | URL | API |
//! |-----|-----|
//! | `ses://ACCESS_KEY_ID:SECRET_ACCESS_KEY@REGION` | SES v2 `SendEmail` at `email.REGION.amazonaws.com`, SigV4-signed |
//! | `sendgrid://:API_KEY@api.sendgrid.com` | SendGrid v3 `mail/send` at the host named (`api.eu.sendgrid.com` for an EU subuser) |
//! | `postmark://:SERVER_TOKEN@api.postmarkapp.com[?stream=NAME]` | Postmark `/email` at the host named |
//! | `mailgun://:API_KEY@DOMAIN[?region=eu]` | Mailgun `messages.mime` at `api.mailgun.net`, or `api.eu.mailgun.net` |
//!
//! The key is the URL's password, percent-encoded (a `/` as `%2F`, a `+` as `%2B`); it is
//! never shown: a provider's `Display`, `Debug` and errors name the scheme and the region
//! or domain only. Every one of them takes the option `endpoint=URL`, the base URL its
//! requests go to instead of the service's own (e.g. `endpoint=http://127.0.0.1:8025` for
//! a local stand-in, or a proxy), with the API's paths below it.
//!
//! Answers map to the outcomes as the APIs document them ([`Api::outcome`]): a 2xx was
//! sent; 429 and 5xx fail for now (class `temporary-reply`, quoting `Retry-After`); 401
//! and 403 fail for now (class `auth`: a wrong or revoked key is fixed without losing the
//! mail); 408 fails for now (class `timeout`); any other 4xx is rejected for good (class
//! `permanent-reply`) with the provider's own message. A connection that cannot be made
//! fails for now without reaching the provider (no attempt spent); a timeout or a cut
//! connection fails for now.

pub mod mailgun;
pub mod postmark;
pub mod sendgrid;
pub mod ses;

use std::sync::Arc;
use std::time::{Duration, Instant};

use url::Url;

use super::refusals::Refusals;
use super::{ErrorClass, Pause, Provider, ProviderUrlError, SendError};
use crate::redact::MASK;
use crate::text::truncate;

/// The schemes of the HTTP API providers.
pub const SCHEMES: [&str; 4] = ["ses", "sendgrid", "postmark", "mailgun"];

/// How long connecting (TCP and TLS) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one request may take, its answer included. `MAIL_SEND_TIMEOUT` bounds the
/// whole send as well.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// An idle pooled connection is closed after this long.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(50);
/// The most characters of a provider's answer an error quotes.
const MAX_REASON_CHARS: usize = 300;

/// Builds the HTTP API provider `url` names (its scheme is one of [`SCHEMES`]).
pub(super) fn from_url(
    url: &Url,
    ca_pem: Option<&[u8]>,
) -> Result<Arc<dyn Provider>, ProviderUrlError> {
    match url.scheme() {
        "ses" => Ok(Arc::new(ses::SesProvider::from_url(url, ca_pem)?)),
        "sendgrid" => Ok(Arc::new(sendgrid::SendGridProvider::from_url(url, ca_pem)?)),
        "postmark" => Ok(Arc::new(postmark::PostmarkProvider::from_url(url, ca_pem)?)),
        "mailgun" => Ok(Arc::new(mailgun::MailgunProvider::from_url(url, ca_pem)?)),
        scheme => Err(ProviderUrlError::UnknownScheme {
            url: masked(url),
            scheme: scheme.to_owned(),
        }),
    }
}

/// `url` with its user name and password, if any, replaced by one [`MASK`]: an API's
/// key may have been put in either.
pub fn masked(url: &Url) -> String {
    let credentials = if url.username().is_empty() && url.password().is_none() {
        String::new()
    } else {
        format!("{MASK}@")
    };
    format!(
        "{}://{credentials}{}",
        url.scheme(),
        &url[url::Position::BeforeHost..]
    )
}

/// A URL that cannot be used, shown without its key.
fn invalid(url: &Url, problem: impl Into<String>) -> ProviderUrlError {
    ProviderUrlError::Invalid {
        url: masked(url),
        problem: problem.into(),
    }
}

/// Refuses query options other than `known`, naming the URL without its key.
fn refuse_query(url: &Url, known: &[&str]) -> Result<(), ProviderUrlError> {
    super::refuse_query(url, known).map_err(|e| match e {
        ProviderUrlError::Invalid { problem, .. } => invalid(url, problem),
        other => other,
    })
}

/// The URL's password, percent-decoded: the API's key. `what` names it in the error.
fn key(url: &Url, what: &str) -> Result<String, ProviderUrlError> {
    let (_, key) = crate::redact::credentials(url);
    if key.is_empty() {
        return Err(invalid(
            url,
            format!(
                "the {what} is missing: put it as the password, percent-encoded, e.g. {}://:KEY@…",
                url.scheme()
            ),
        ));
    }
    Ok(key)
}

/// Refuses a user name other than `allowed` (or none), which would be a misplaced key.
fn no_user(url: &Url, allowed: &[&str]) -> Result<(), ProviderUrlError> {
    let user = url.username();
    if user.is_empty() || allowed.contains(&user) {
        return Ok(());
    }
    Err(invalid(
        url,
        "it takes no user name: the key is the password, after the colon (scheme://:KEY@…)",
    ))
}

/// `https://HOST[:PORT]` of the URL's host: the API's host, named in the URL since a URL
/// with a key must have a host (`example` shows one).
fn api_host(url: &Url, example: &str) -> Result<String, ProviderUrlError> {
    let host = url.host_str().unwrap_or_default();
    if host.is_empty() || !matches!(url.path(), "" | "/") {
        return Err(invalid(
            url,
            format!("the host must be the API's host, with no path: {example}"),
        ));
    }
    Ok(match url.port() {
        Some(port) => format!("https://{host}:{port}"),
        None => format!("https://{host}"),
    })
}

/// The value of the query option `name`, when given.
fn option(url: &Url, name: &str) -> Option<String> {
    url.query_pairs()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

/// The URL of `path` at the service's `default_base`, or at the base the URL's
/// `endpoint=` option names.
fn endpoint(url: &Url, default_base: &str, path: &str) -> Result<Url, ProviderUrlError> {
    let base = match option(url, "endpoint") {
        None => default_base.to_string(),
        Some(base) => {
            let parsed = Url::parse(&base)
                .map_err(|e| invalid(url, format!("endpoint= is not a URL ({e})")))?;
            if !matches!(parsed.scheme(), "http" | "https")
                || parsed.host_str().is_none()
                || !parsed.username().is_empty()
                || parsed.password().is_some()
                || parsed.query().is_some()
            {
                return Err(invalid(
                    url,
                    "endpoint= must be an http:// or https:// URL with a host and no user or query",
                ));
            }
            base
        }
    };
    let joined = format!("{}{path}", base.trim_end_matches('/'));
    Url::parse(&joined).map_err(|e| invalid(url, format!("the API's URL is unusable ({e})")))
}

/// What every API provider shares: the pooled client and how answers map to outcomes.
pub struct Api {
    client: reqwest::Client,
    /// What errors name: the scheme and the region or domain, never the key.
    shown: String,
    /// Pauses sends while the provider refuses the key.
    refusals: Refusals,
}

impl Api {
    /// One client for the provider's whole life: its connections are pooled and kept
    /// alive, so sends reuse them. It trusts the public CAs and `ca_pem` (a PEM
    /// certificate of `MAIL_PROVIDER_CA_FILE`, e.g. a proxy's).
    fn new(url: &Url, shown: String, ca_pem: Option<&[u8]>) -> Result<Self, ProviderUrlError> {
        crate::install_crypto_provider();
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("mailer/", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = ca_pem {
            let ca = reqwest::Certificate::from_pem(pem).map_err(|e| {
                invalid(
                    url,
                    format!("MAIL_PROVIDER_CA_FILE is not a PEM certificate ({e})"),
                )
            })?;
            builder = builder.tls_certs_merge([ca]);
        }
        let client = builder
            .build()
            .map_err(|e| invalid(url, format!("cannot build an HTTP client ({e})")))?;
        Ok(Self {
            client,
            shown,
            refusals: Refusals::default(),
        })
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Whether a send may go to the provider now: not while it refuses the key (see
    /// [`crate::provider::refusals`]); then the send fails for now without reaching it.
    /// Checked before the mail is built.
    pub fn gate(&self) -> Result<(), SendError> {
        self.refusals.gate(Instant::now())
    }

    /// While the provider refuses the key, until when.
    pub fn paused(&self) -> Option<Pause> {
        self.refusals.paused()
    }

    /// Sends `request` and maps its answer to the send's outcome. `read` reads what the
    /// provider said in an error's headers and body. A refused key (401, 403) pauses the
    /// provider and spends no attempt.
    pub async fn outcome(
        &self,
        request: reqwest::RequestBuilder,
        read: fn(&reqwest::header::HeaderMap, &[u8]) -> Said,
    ) -> Result<(), SendError> {
        let answer = self.answer(request, read).await;
        self.refusals.answered(&self.shown, answer)
    }

    /// [`outcome`](Self::outcome) of one request, as the provider answered it.
    async fn answer(
        &self,
        request: reqwest::RequestBuilder,
        read: fn(&reqwest::header::HeaderMap, &[u8]) -> Said,
    ) -> Result<(), SendError> {
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => return Err(self.network_error(&e)),
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        if status.is_success() {
            // Read to its end, so the connection goes back to the pool.
            let _ = response.bytes().await;
            return Ok(());
        }
        let headers = response.headers().clone();
        let body = response.bytes().await.unwrap_or_default();
        let Said { reason, class } = read(&headers, &body);
        let said = reason.unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        let said = said.split_whitespace().collect::<Vec<_>>().join(" ");
        let said = truncate(&said, MAX_REASON_CHARS);
        let mut message = format!("{}: HTTP {status}", self.shown);
        if !said.is_empty() {
            message.push_str(&format!(": {said}"));
        }
        if let Some(wait) = retry_after {
            message.push_str(&format!(" (Retry-After: {}s)", wait.as_secs()));
        }
        let error = match (class, status.as_u16()) {
            (Some(class), _) => SendError::for_now(class, message),
            (None, 401 | 403) => SendError::for_now(ErrorClass::Auth, message),
            (None, 408) => SendError::for_now(ErrorClass::Timeout, message),
            (None, 429 | 500..=599) => SendError::for_now(ErrorClass::TemporaryReply, message),
            (None, 400..=499) => SendError::for_good(ErrorClass::PermanentReply, message),
            _ => SendError::for_now(ErrorClass::Protocol, message),
        };
        Err(match retry_after {
            Some(wait) => error.with_retry_after(wait),
            None => error,
        })
    }

    /// A request that got no answer: failed for now. One that could not connect never
    /// showed the mail to anyone, so its attempt does not count.
    fn network_error(&self, e: &reqwest::Error) -> SendError {
        let mut cause = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(inner) = source {
            cause.push_str(&format!(": {inner}"));
            source = inner.source();
        }
        let message = format!("{}: {cause}", self.shown);
        if e.is_timeout() {
            SendError::for_now(ErrorClass::Timeout, message)
        } else if e.is_connect() {
            SendError::for_now(ErrorClass::Connect, message).not_reached()
        } else {
            SendError::for_now(ErrorClass::Io, message)
        }
    }
}

/// What a provider said in an error answer.
#[derive(Debug, Default)]
pub struct Said {
    /// Its message, when it could be read; else the body is quoted.
    pub reason: Option<String>,
    /// A failure for now of this class whatever the status: the provider said the
    /// account cannot send for now, or that the key is wrong, in a status that would
    /// otherwise reject the mail.
    pub class: Option<ErrorClass>,
}

impl Said {
    fn reason(reason: Option<String>) -> Self {
        Self {
            reason,
            class: None,
        }
    }
}

/// A JSON string field `name` of a JSON object, for an error's reason.
fn json_field(body: &[u8], name: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    value.get(name)?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests;
