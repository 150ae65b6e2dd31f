//! `mailgun://:API_KEY@DOMAIN`: Mailgun's `POST /v3/DOMAIN/messages.mime`, with HTTP
//! basic auth (user `api`), at `api.mailgun.net`, or `api.eu.mailgun.net` with
//! `?region=eu` for a domain in Mailgun's EU region.
//!
//! The mail goes as the MIME message the mailer renders for SMTP (form field `message`),
//! so every header (Message-ID, Reply-To, Cc, the extra headers) reaches Mailgun as it
//! is; the form field `to` lists every recipient of `To`, `Cc` and `Bcc`, which is whom
//! Mailgun delivers to. Options: `region=us|eu` and `endpoint=URL`.

use std::fmt;

use futures::future::BoxFuture;
use url::Url;

use super::{Api, Said};
use crate::message::{Mail, unique_id};
use crate::provider::{Provider, ProviderUrlError, SendError};

const US_BASE: &str = "https://api.mailgun.net";
const EU_BASE: &str = "https://api.eu.mailgun.net";

/// The path of `messages.mime` for `domain`.
pub fn path(domain: &str) -> String {
    format!("/v3/{domain}/messages.mime")
}

/// Sends mail through Mailgun for one sending domain.
pub struct MailgunProvider {
    api: Api,
    domain: String,
    url: Url,
    /// `Basic base64(api:KEY)`, marked sensitive.
    authorization: reqwest::header::HeaderValue,
}

impl MailgunProvider {
    pub fn from_url(url: &Url, ca_pem: Option<&[u8]>) -> Result<Self, ProviderUrlError> {
        super::refuse_query(url, &["endpoint", "region"])?;
        let domain = url.host_str().unwrap_or_default().to_ascii_lowercase();
        if domain.is_empty() || !matches!(url.path(), "" | "/") || url.port().is_some() {
            return Err(super::invalid(
                url,
                "the host must be the sending domain, with no port or path: mailgun://:API_KEY@mg.example.com",
            ));
        }
        super::no_user(url, &["api"])?;
        let key = super::key(url, "API key")?;
        let base = match super::option(url, "region").as_deref() {
            None | Some("us") => US_BASE,
            Some("eu") => EU_BASE,
            Some(_) => return Err(super::invalid(url, "region= must be us or eu")),
        };
        use base64::Engine;
        let credentials = base64::engine::general_purpose::STANDARD.encode(format!("api:{key}"));
        let mut authorization =
            reqwest::header::HeaderValue::from_str(&format!("Basic {credentials}"))
                .map_err(|_| super::invalid(url, "the API key cannot be sent in a header"))?;
        authorization.set_sensitive(true);
        Ok(Self {
            api: Api::new(url, format!("mailgun://{domain}"), ca_pem)?,
            url: super::endpoint(url, base, &path(&domain))?,
            domain,
            authorization,
        })
    }

    /// The `multipart/form-data` body, and its content type.
    fn form(&self, mail: Mail) -> Result<(String, Vec<u8>), SendError> {
        let to = mail
            .envelope()
            .to()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let message = mail
            .render()
            .map_err(|e| crate::provider::unrenderable(self, &e))?;
        let size = message.size();
        let boundary = format!("mailer-form-{}", unique_id());
        let mut body = Vec::with_capacity(size + 512);
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"to\"\r\n\r\n{to}\r\n")
                .as_bytes(),
        );
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"message\"; filename=\"message.mime\"\r\n\
                 Content-Type: message/rfc822\r\n\r\n"
            )
            .as_bytes(),
        );
        // Straight from the rendered pieces: the message is not copied once more.
        for piece in message.parts() {
            body.extend_from_slice(&piece);
        }
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        Ok((format!("multipart/form-data; boundary={boundary}"), body))
    }
}

/// Mailgun's error body: `{"message": "..."}`, or plain text (`Forbidden`).
fn read(_: &reqwest::header::HeaderMap, body: &[u8]) -> Said {
    Said::reason(super::json_field(body, "message"))
}

impl fmt::Display for MailgunProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mailgun://{}", self.domain)
    }
}

impl fmt::Debug for MailgunProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MailgunProvider")
            .field("domain", &self.domain)
            .field("url", &self.url.as_str())
            .finish_non_exhaustive()
    }
}

impl Provider for MailgunProvider {
    fn send(&self, mail: Mail) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(async move {
            self.api.gate()?;
            let (content_type, body) = self.form(mail)?;
            let request = self
                .api
                .client()
                .post(self.url.clone())
                .header(reqwest::header::AUTHORIZATION, self.authorization.clone())
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(body);
            self.api.outcome(request, read).await
        })
    }

    fn paused(&self) -> Option<crate::provider::Pause> {
        self.api.paused()
    }
}
