//! The mail request: the JSON body of a message on `mail.send`, and how it becomes a
//! mail that is ready to send.
//!
//! Everything here is checked before anything is sent, so a request that can never
//! become a valid mail is refused as malformed instead of failing at the provider. The
//! errors name the field and what is wrong with it, never the mail's body.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::{Message, address::Envelope};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::mail;
use crate::text::truncate;

pub mod id;
pub mod publish;

pub use id::unique_id;

/// A mail to send: the JSON body of a request published to the `mail` exchange with
/// the routing key `mail.send`. The request's AMQP `message_id`, when set, becomes the
/// mail's `Message-ID`, so a retried request keeps its identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Mail request")]
pub struct MailRequest {
    /// The sender, as an address or a name and an address, e.g.
    /// `Shop <noreply@shop.example>`. It is also the envelope sender.
    pub from: String,
    /// Recipients shown in the `To` header. `to`, `cc` and `bcc` together must name at
    /// least one recipient.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<String>,
    /// Recipients shown in the `Cc` header.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cc: Vec<String>,
    /// Recipients that receive the mail without being shown in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bcc: Vec<String>,
    /// Where replies go when not to `from`, e.g. `help@shop.example`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// The subject line. It must not contain a line break.
    pub subject: String,
    /// The plain-text body. Give `text`, `html` or both (the mail is then
    /// multipart/alternative); an empty string counts as not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The HTML body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    /// Extra header fields, e.g. `{"X-Campaign": "autumn"}`. Names must be RFC 5322 field
    /// names and not one the mailer sets itself (From, To, Cc, Bcc, Reply-To, Sender,
    /// Subject, Message-ID, Date, MIME-Version, Return-Path, Content-*); neither names nor
    /// values may contain a line break.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// Why a request can never become a mail. Each message names the field and the
/// problem; none contains the mail's body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the request is {size} bytes; at most {max} are accepted", max = mail::MAX_REQUEST_BYTES)]
    TooLarge { size: usize },
    #[error("the request is not a mail request: {0}")]
    Json(String),
    #[error("{field}: {value} is not an email address")]
    NotAnAddress { field: String, value: Quoted },
    #[error("{field} contains a line break")]
    LineBreak { field: String },
    #[error("{field} contains a control character")]
    ControlCharacter { field: String },
    #[error("to, cc and bcc name no recipient; at least one is needed")]
    NoRecipient,
    #[error("text and html are both missing or empty; at least one is needed")]
    NoBody,
    #[error(
        "headers: {0} is not a header field name (1 to 76 printable ASCII characters, no colon)"
    )]
    BadHeaderName(Quoted),
    #[error("headers: {0} is set by the mailer and cannot be given as an extra header")]
    ReservedHeader(Quoted),
    #[error("headers: {0} is given more than once (header names ignore case)")]
    DuplicateHeader(Quoted),
    #[error("the message id {id} is malformed: it {problem}")]
    MalformedMessageId { id: Quoted, problem: &'static str },
    #[error("the mail cannot be built: {0}")]
    Build(String),
}

/// A value from a request, quoted for an error message and cut short when long, so an
/// error stays one readable line whatever the request holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quoted(String);

impl Quoted {
    /// The most characters of a value an error message repeats.
    const MAX_CHARS: usize = 100;

    fn new(value: &str) -> Self {
        Self(format!("{:?}", truncate(value, Self::MAX_CHARS)))
    }
}

/// The most characters of a parser's message, which may quote a value of any length.
const MAX_PARSER_MESSAGE_CHARS: usize = 300;

impl fmt::Display for Quoted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A mail that is ready to send: the formatted message and its envelope.
#[derive(Clone)]
pub struct Mail {
    message: Message,
    message_id: String,
}

impl Mail {
    /// The message, with its headers and body.
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// The envelope: the sender and every recipient of `to`, `cc` and `bcc`.
    pub fn envelope(&self) -> &Envelope {
        self.message.envelope()
    }

    /// The `Message-ID`, with its angle brackets, e.g. `<order-42@shop.example>`.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// The message as RFC 5322 bytes, as it goes to the provider.
    pub fn formatted(&self) -> Vec<u8> {
        self.message.formatted()
    }
}

/// Shows who the mail is from and to, never its body, so a `Mail` can be logged.
impl fmt::Debug for Mail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mail")
            .field("message_id", &self.message_id)
            .field("from", &self.envelope().from().map(ToString::to_string))
            .field("recipients", &self.envelope().to().len())
            .finish()
    }
}

/// Reads a request body and builds its mail.
///
/// `message_id` is the AMQP `message_id` of the request: it becomes the mail's
/// `Message-ID` (`<message_id@domain-of-from>`, or `<message_id>` when it already holds
/// an `@`), so every attempt of a request sends the same mail. Without one the mail
/// gets a fresh random id.
pub fn parse_request(body: &[u8], message_id: Option<&str>) -> Result<Mail, RequestError> {
    if body.len() > mail::MAX_REQUEST_BYTES {
        return Err(RequestError::TooLarge { size: body.len() });
    }
    let request: MailRequest = serde_json::from_slice(body).map_err(|e| {
        RequestError::Json(truncate(&e.to_string(), MAX_PARSER_MESSAGE_CHARS).into_owned())
    })?;
    request.to_mail(message_id)
}

/// The JSON Schema of [`MailRequest`], as published in `schemas/mail-request.schema.json`.
pub fn request_schema() -> serde_json::Value {
    schemars::schema_for!(MailRequest).to_value()
}

/// Header names the mailer sets from the request's own fields or from its body, so a
/// request cannot give them as extra headers. `Content-*` is refused as a prefix.
const RESERVED_HEADERS: [&str; 12] = [
    "From",
    "Sender",
    "To",
    "Cc",
    "Bcc",
    "Reply-To",
    "Subject",
    "Message-ID",
    "Date",
    "MIME-Version",
    "Return-Path",
    "Content-Transfer-Encoding",
];

/// The longest header name lettre accepts.
const MAX_HEADER_NAME_CHARS: usize = 76;

impl MailRequest {
    /// Checks the request and builds its mail; see [`parse_request`].
    pub fn to_mail(&self, message_id: Option<&str>) -> Result<Mail, RequestError> {
        let from = mailbox("from", &self.from)?;
        let to = mailboxes("to", &self.to)?;
        let cc = mailboxes("cc", &self.cc)?;
        let bcc = mailboxes("bcc", &self.bcc)?;
        if to.is_empty() && cc.is_empty() && bcc.is_empty() {
            return Err(RequestError::NoRecipient);
        }
        let reply_to = self
            .reply_to
            .as_deref()
            .map(|r| mailbox("reply_to", r))
            .transpose()?;
        single_line("subject", &self.subject)?;
        let extra_headers = self.extra_headers()?;
        let message_id = message_id_header(message_id, from.email.domain())?;

        let mut builder = Message::builder()
            .from(from)
            .subject(self.subject.as_str())
            .message_id(Some(message_id.clone()));
        for recipient in to {
            builder = builder.to(recipient);
        }
        for recipient in cc {
            builder = builder.cc(recipient);
        }
        for recipient in bcc {
            builder = builder.bcc(recipient);
        }
        if let Some(reply_to) = reply_to {
            builder = builder.reply_to(reply_to);
        }
        for header in extra_headers {
            builder = builder.raw_header(header);
        }

        let text = self.text.as_deref().filter(|t| !t.is_empty());
        let html = self.html.as_deref().filter(|h| !h.is_empty());
        let built = match (text, html) {
            (Some(text), Some(html)) => builder.multipart(MultiPart::alternative_plain_html(
                text.to_owned(),
                html.to_owned(),
            )),
            (Some(text), None) => builder.singlepart(SinglePart::plain(text.to_owned())),
            (None, Some(html)) => builder.singlepart(SinglePart::html(html.to_owned())),
            (None, None) => return Err(RequestError::NoBody),
        };
        let message = built.map_err(|e| RequestError::Build(e.to_string()))?;
        Ok(Mail {
            message,
            message_id,
        })
    }

    fn extra_headers(&self) -> Result<Vec<HeaderValue>, RequestError> {
        let mut seen = BTreeSet::new();
        let mut headers = Vec::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            if name.contains(['\r', '\n']) {
                return Err(RequestError::LineBreak {
                    field: "a header name".into(),
                });
            }
            if !is_field_name(name) {
                return Err(RequestError::BadHeaderName(Quoted::new(name)));
            }
            if is_reserved_header(name) {
                return Err(RequestError::ReservedHeader(Quoted::new(name)));
            }
            if !seen.insert(name.to_ascii_lowercase()) {
                return Err(RequestError::DuplicateHeader(Quoted::new(name)));
            }
            single_line(&format!("headers[{}]", Quoted::new(name)), value)?;
            let header_name = HeaderName::new_from_ascii(name.clone())
                .map_err(|_| RequestError::BadHeaderName(Quoted::new(name)))?;
            headers.push(HeaderValue::new(header_name, value.clone()));
        }
        Ok(headers)
    }
}

/// An RFC 5322 field name: printable ASCII except the colon (and so no space).
fn is_field_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_HEADER_NAME_CHARS
        && name.bytes().all(|b| (33..=126).contains(&b) && b != b':')
}

fn is_reserved_header(name: &str) -> bool {
    const CONTENT_PREFIX: &str = "content-";
    let lower = name.to_ascii_lowercase();
    lower.starts_with(CONTENT_PREFIX)
        || RESERVED_HEADERS
            .iter()
            .any(|reserved| reserved.eq_ignore_ascii_case(name))
}

/// Refuses line breaks, which would start a new header, and other control characters
/// (a tab is fine) that have no place in a header.
fn single_line(field: &str, value: &str) -> Result<(), RequestError> {
    if value.contains(['\r', '\n']) {
        return Err(RequestError::LineBreak {
            field: field.into(),
        });
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(RequestError::ControlCharacter {
            field: field.into(),
        });
    }
    Ok(())
}

fn mailbox(field: &str, value: &str) -> Result<Mailbox, RequestError> {
    single_line(field, value)?;
    let not_an_address = |_| RequestError::NotAnAddress {
        field: field.into(),
        value: Quoted::new(value),
    };
    value.parse().map_err(not_an_address)
}

fn mailboxes(field: &str, values: &[String]) -> Result<Vec<Mailbox>, RequestError> {
    values
        .iter()
        .enumerate()
        .map(|(index, value)| mailbox(&format!("{field}[{index}]"), value))
        .collect()
}

/// The `Message-ID` of a mail: from the request's AMQP message id when it has one, so
/// every attempt of the request sends the same mail, else a fresh random one.
fn message_id_header(message_id: Option<&str>, domain: &str) -> Result<String, RequestError> {
    let Some(id) = message_id else {
        return Ok(format!("<{}@{domain}>", unique_id()));
    };
    let malformed = |problem| RequestError::MalformedMessageId {
        id: Quoted::new(id),
        problem,
    };
    if id.is_empty() {
        return Err(malformed("is empty"));
    }
    if id.contains(['\r', '\n']) {
        return Err(malformed("contains a line break"));
    }
    if id.contains(['<', '>']) {
        return Err(malformed("contains \"<\" or \">\""));
    }
    if id.chars().any(char::is_whitespace) {
        return Err(malformed("contains whitespace"));
    }
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(malformed(
            "contains a character that is not printable ASCII",
        ));
    }
    if id.contains('@') {
        Ok(format!("<{id}>"))
    } else {
        Ok(format!("<{id}@{domain}>"))
    }
}

#[cfg(test)]
mod tests;
