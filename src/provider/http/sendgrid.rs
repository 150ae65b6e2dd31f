//! `sendgrid://:API_KEY@`: SendGrid's v3 `POST /v3/mail/send`, the key as a bearer
//! token.
//!
//! The mail goes as SendGrid's fields: one personalization with the `to`, `cc` and `bcc`
//! recipients, `from`, `reply_to`, `subject`, the contents (`text/plain` first, as
//! SendGrid requires) and the extra headers with the `Message-ID`. SendGrid needs at
//! least one `to` recipient: a mail with only `cc` or `bcc` is rejected for good before
//! it is sent. Option: `endpoint=URL`.

use std::fmt;

use futures::future::BoxFuture;
use lettre::message::Mailbox;
use serde_json::{Map, Value, json};
use url::Url;

use super::{Api, Said};
use crate::message::Mail;
use crate::provider::{ErrorClass, Provider, ProviderUrlError, SendError};

/// The path of v3 `mail/send`.
pub const PATH: &str = "/v3/mail/send";

/// Sends mail through SendGrid's v3 API.
pub struct SendGridProvider {
    api: Api,
    url: Url,
    /// `Bearer KEY`, marked sensitive on each request.
    authorization: reqwest::header::HeaderValue,
}

impl SendGridProvider {
    pub fn from_url(url: &Url, ca_pem: Option<&[u8]>) -> Result<Self, ProviderUrlError> {
        super::refuse_query(url, &["endpoint"])?;
        let base = super::api_host(url, "sendgrid://:API_KEY@api.sendgrid.com")?;
        super::no_user(url, &["apikey"])?;
        let authorization = bearer(url, &super::key(url, "API key")?)?;
        Ok(Self {
            api: Api::new(url, "sendgrid://".to_string(), ca_pem)?,
            url: super::endpoint(url, &base, PATH)?,
            authorization,
        })
    }

    /// The request's JSON, as v3 `mail/send` documents it.
    fn request_body(&self, mail: Mail) -> Result<Vec<u8>, SendError> {
        let fields = mail
            .into_fields()
            .map_err(|e| crate::provider::unrenderable(self, &e))?;
        if fields.to.is_empty() {
            return Err(SendError::for_good(
                ErrorClass::Protocol,
                format!(
                    "{self}: SendGrid needs at least one to recipient; this mail has only cc or bcc"
                ),
            )
            .not_reached());
        }
        let mut personalization = Map::new();
        for (name, list) in [("to", &fields.to), ("cc", &fields.cc), ("bcc", &fields.bcc)] {
            if !list.is_empty() {
                let people = list.iter().map(person).collect();
                personalization.insert(name.into(), Value::Array(people));
            }
        }
        let mut content = Vec::new();
        if let Some(text) = fields.text {
            content.push(json!({ "type": "text/plain", "value": text }));
        }
        if let Some(html) = fields.html {
            content.push(json!({ "type": "text/html", "value": html }));
        }
        let mut headers: Map<String, Value> = fields
            .headers
            .into_iter()
            .map(|(name, value)| (name, Value::String(value)))
            .collect();
        headers.insert("Message-ID".into(), Value::String(fields.message_id));
        let mut body = json!({
            "personalizations": [personalization],
            "from": person(&fields.from),
            "subject": fields.subject,
            "content": content,
            "headers": headers,
        });
        if let (Some(reply_to), Some(body)) = (&fields.reply_to, body.as_object_mut()) {
            body.insert("reply_to".into(), person(reply_to));
        }
        serde_json::to_vec(&body).map_err(|e| {
            SendError::for_good(ErrorClass::Protocol, format!("{self}: {e}")).not_reached()
        })
    }
}

/// A mailbox as SendGrid's `{"email", "name"}`.
fn person(mailbox: &Mailbox) -> Value {
    match &mailbox.name {
        Some(name) => json!({ "email": mailbox.email.to_string(), "name": name }),
        None => json!({ "email": mailbox.email.to_string() }),
    }
}

/// `Authorization: Bearer KEY`, marked sensitive so that it is never logged.
pub(super) fn bearer(
    url: &Url,
    key: &str,
) -> Result<reqwest::header::HeaderValue, ProviderUrlError> {
    let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
        .map_err(|_| super::invalid(url, "the API key holds characters a header cannot"))?;
    value.set_sensitive(true);
    Ok(value)
}

/// SendGrid's error body: `{"errors": [{"message", "field"}]}`.
fn read(_: &reqwest::header::HeaderMap, body: &[u8]) -> Said {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return Said::default();
    };
    let Some(errors) = value.get("errors").and_then(Value::as_array) else {
        return Said::default();
    };
    let messages: Vec<String> = errors
        .iter()
        .filter_map(|error| {
            let message = error.get("message")?.as_str()?;
            Some(match error.get("field").and_then(Value::as_str) {
                Some(field) => format!("{field}: {message}"),
                None => message.to_string(),
            })
        })
        .collect();
    Said::reason((!messages.is_empty()).then(|| messages.join("; ")))
}

impl fmt::Display for SendGridProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sendgrid://")
    }
}

impl fmt::Debug for SendGridProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendGridProvider")
            .field("url", &self.url.as_str())
            .finish_non_exhaustive()
    }
}

impl Provider for SendGridProvider {
    fn send(&self, mail: Mail) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(async move {
            self.api.gate()?;
            let body = self.request_body(mail)?;
            let request = self
                .api
                .client()
                .post(self.url.clone())
                .header(reqwest::header::AUTHORIZATION, self.authorization.clone())
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
            self.api.outcome(request, read).await
        })
    }

    fn paused(&self) -> Option<crate::provider::Pause> {
        self.api.paused()
    }
}
