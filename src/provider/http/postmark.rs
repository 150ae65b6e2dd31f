//! `postmark://:SERVER_TOKEN@`: Postmark's `POST /email`, the server token in
//! `X-Postmark-Server-Token`.
//!
//! The mail goes as Postmark's fields: `From`, `To`, `Cc`, `Bcc` (comma-separated),
//! `ReplyTo`, `Subject`, `TextBody`, `HtmlBody`, and `Headers` with the extra headers and
//! the `Message-ID`. Options: `stream=NAME` (the `MessageStream`; Postmark's default
//! transactional stream when absent) and `endpoint=URL`.

use std::fmt;

use futures::future::BoxFuture;
use lettre::message::Mailbox;
use serde_json::{Value, json};
use url::Url;

use super::{Api, Said};
use crate::message::Mail;
use crate::provider::{ErrorClass, Provider, ProviderUrlError, SendError};

/// The path of Postmark's single-mail endpoint.
pub const PATH: &str = "/email";
/// Postmark's `ErrorCode` for a missing or wrong server token.
const BAD_TOKEN: i64 = 10;

/// Sends mail through Postmark.
pub struct PostmarkProvider {
    api: Api,
    url: Url,
    token: reqwest::header::HeaderValue,
    stream: Option<String>,
}

impl PostmarkProvider {
    pub fn from_url(url: &Url, ca_pem: Option<&[u8]>) -> Result<Self, ProviderUrlError> {
        super::refuse_query(url, &["endpoint", "stream"])?;
        let base = super::api_host(url, "postmark://:SERVER_TOKEN@api.postmarkapp.com")?;
        super::no_user(url, &[])?;
        let mut token = reqwest::header::HeaderValue::from_str(&super::key(url, "server token")?)
            .map_err(|_| {
            super::invalid(url, "the server token holds characters a header cannot")
        })?;
        token.set_sensitive(true);
        Ok(Self {
            api: Api::new(url, "postmark://".to_string(), ca_pem)?,
            url: super::endpoint(url, &base, PATH)?,
            token,
            stream: super::option(url, "stream"),
        })
    }

    /// The request's JSON, as Postmark's `/email` documents it.
    fn request_body(&self, mail: Mail) -> Result<Vec<u8>, SendError> {
        let fields = mail
            .into_fields()
            .map_err(|e| crate::provider::unrenderable(self, &e))?;
        let mut headers: Vec<Value> = fields
            .headers
            .into_iter()
            .map(|(name, value)| json!({ "Name": name, "Value": value }))
            .collect();
        headers.push(json!({ "Name": "Message-ID", "Value": fields.message_id }));
        let mut body = json!({
            "From": fields.from.to_string(),
            "Subject": fields.subject,
            "Headers": headers,
        });
        let Some(object) = body.as_object_mut() else {
            return Err(SendError::for_good(
                ErrorClass::Protocol,
                format!("{self}: no JSON object"),
            ));
        };
        for (name, list) in [("To", &fields.to), ("Cc", &fields.cc), ("Bcc", &fields.bcc)] {
            if !list.is_empty() {
                object.insert(name.into(), Value::String(joined(list)));
            }
        }
        let optional = [
            ("ReplyTo", fields.reply_to.map(|m| m.to_string())),
            ("TextBody", fields.text),
            ("HtmlBody", fields.html),
            ("MessageStream", self.stream.clone()),
        ];
        for (name, value) in optional {
            if let Some(value) = value {
                object.insert(name.into(), Value::String(value));
            }
        }
        serde_json::to_vec(&body).map_err(|e| {
            SendError::for_good(ErrorClass::Protocol, format!("{self}: {e}")).not_reached()
        })
    }
}

/// Mailboxes as one comma-separated field.
fn joined(list: &[Mailbox]) -> String {
    list.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Postmark's error body: `{"ErrorCode": 300, "Message": "..."}`. `ErrorCode` 10 (a bad
/// server token, which Postmark may answer with 422) fails for now, class `auth`.
fn read(_: &reqwest::header::HeaderMap, body: &[u8]) -> Said {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return Said::default();
    };
    let code = value.get("ErrorCode").and_then(Value::as_i64);
    let message = value.get("Message").and_then(Value::as_str);
    Said {
        reason: match (code, message) {
            (Some(code), Some(message)) => Some(format!("ErrorCode {code}: {message}")),
            (None, Some(message)) => Some(message.to_string()),
            (Some(code), None) => Some(format!("ErrorCode {code}")),
            (None, None) => None,
        },
        class: (code == Some(BAD_TOKEN)).then_some(ErrorClass::Auth),
    }
}

impl fmt::Display for PostmarkProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("postmark://")
    }
}

impl fmt::Debug for PostmarkProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostmarkProvider")
            .field("url", &self.url.as_str())
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl Provider for PostmarkProvider {
    fn send(&self, mail: Mail) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(async move {
            self.api.gate()?;
            let body = self.request_body(mail)?;
            let request = self
                .api
                .client()
                .post(self.url.clone())
                .header("X-Postmark-Server-Token", self.token.clone())
                .header(reqwest::header::ACCEPT, "application/json")
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
            self.api.outcome(request, read).await
        })
    }

    fn paused(&self) -> Option<crate::provider::Pause> {
        self.api.paused()
    }
}
