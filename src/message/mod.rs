//! The mail request: the JSON body of a message on `mail.send`, and how it becomes a
//! mail that is ready to send.
//!
//! Everything here is checked before anything is sent, so a request that can never
//! become a valid mail is refused as malformed instead of failing at the provider. The
//! errors name the field and what is wrong with it, never the mail's body.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use bytes::Bytes;
use lettre::address::Envelope;
use lettre::message::Mailbox;
use lettre::message::header::HeaderName;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::text::truncate;

mod body_part;
mod body_text;
mod checked;
pub mod id;
mod rendered;
pub mod send;
pub mod size;
mod wire;

pub use checked::{Fields, Mail};
pub use id::unique_id;
pub use rendered::Rendered;

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

/// Reads a request body and checks that it makes a mail; see [`read_request`], which
/// takes the bytes without a copy.
pub fn parse_request(body: &[u8], message_id: Option<&str>) -> Result<Mail, RequestError> {
    read_request(Bytes::copy_from_slice(body), message_id)
}

/// Reads a request body and checks that it makes a mail, without rendering it: the mail
/// keeps `request` (shared, not copied) and its bodies stay in it until the provider
/// renders the mail ([`Mail::render`]).
///
/// `message_id` is the AMQP `message_id` of the request: it becomes the mail's
/// `Message-ID` (`<message_id@domain-of-from>`, or `<message_id>` when it already holds
/// an `@`), so every attempt of a request sends the same mail. Without one the mail
/// gets a fresh random id.
///
/// Its size is not checked here: the limit is the caller's ([`size::check`]).
pub fn read_request(request: Bytes, message_id: Option<&str>) -> Result<Mail, RequestError> {
    let wire: wire::WireRequest = serde_json::from_slice(&request).map_err(|e| {
        RequestError::Json(truncate(&e.to_string(), MAX_PARSER_MESSAGE_CHARS).into_owned())
    })?;
    let from = mailbox("from", &wire.from)?;
    let to = mailboxes("to", &wire.to)?;
    let cc = mailboxes("cc", &wire.cc)?;
    let bcc = mailboxes("bcc", &wire.bcc)?;
    if to.is_empty() && cc.is_empty() && bcc.is_empty() {
        return Err(RequestError::NoRecipient);
    }
    let reply_to = wire
        .reply_to
        .as_deref()
        .map(|r| mailbox("reply_to", r))
        .transpose()?;
    single_line("subject", &wire.subject)?;
    let headers = extra_headers(wire.headers)?;
    let message_id = message_id_header(message_id, from.email.domain())?;
    let text_given = body_given("text", wire.text)?;
    if !body_given("html", wire.html)? && !text_given {
        return Err(RequestError::NoBody);
    }
    // As lettre makes it from the headers: the sender, then To, Cc and Bcc in order.
    let recipients = to.iter().chain(&cc).chain(&bcc);
    let envelope = Envelope::new(
        Some(from.email.clone()),
        recipients.map(|m| m.email.clone()).collect(),
    )
    .map_err(|e| RequestError::Build(e.to_string()))?;
    Ok(Mail {
        from,
        to,
        cc,
        bcc,
        reply_to,
        subject: wire.subject,
        headers,
        envelope,
        message_id,
        request,
    })
}

/// Whether a body field gives a body: present, not null, a string that decodes, and not
/// empty. Checked without decoding it (see [`body_text`]).
fn body_given(
    field: &str,
    literal: Option<&serde_json::value::RawValue>,
) -> Result<bool, RequestError> {
    let Some(literal) = literal else {
        return Ok(false);
    };
    match body_text::check(literal.get()) {
        Ok(empty) => Ok(!empty),
        Err(problem) => Err(RequestError::Json(format!("{field}: {problem}"))),
    }
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

/// The extra headers, checked, each name ready for lettre.
fn extra_headers(
    headers: BTreeMap<String, String>,
) -> Result<Vec<(HeaderName, String)>, RequestError> {
    let mut seen = BTreeSet::new();
    let mut checked = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        if name.contains(['\r', '\n']) {
            return Err(RequestError::LineBreak {
                field: "a header name".into(),
            });
        }
        if !is_field_name(&name) {
            return Err(RequestError::BadHeaderName(Quoted::new(&name)));
        }
        if is_reserved_header(&name) {
            return Err(RequestError::ReservedHeader(Quoted::new(&name)));
        }
        if !seen.insert(name.to_ascii_lowercase()) {
            return Err(RequestError::DuplicateHeader(Quoted::new(&name)));
        }
        single_line(HeaderField(&name), &value)?;
        // Cannot fail: is_field_name is stricter than lettre.
        let header_name = HeaderName::new_from_ascii(name).map_err(|_| {
            RequestError::Build("lettre refused a header name that passed the checks".into())
        })?;
        checked.push((header_name, value));
    }
    Ok(checked)
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
/// `field` names the field in the error, and is only formatted for one.
fn single_line(field: impl fmt::Display, value: &str) -> Result<(), RequestError> {
    if value.contains(['\r', '\n']) {
        return Err(RequestError::LineBreak {
            field: field.to_string(),
        });
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(RequestError::ControlCharacter {
            field: field.to_string(),
        });
    }
    Ok(())
}

fn mailbox(field: impl fmt::Display + Copy, value: &str) -> Result<Mailbox, RequestError> {
    single_line(field, value)?;
    let not_an_address = |_| RequestError::NotAnAddress {
        field: field.to_string(),
        value: Quoted::new(value),
    };
    parse_mailbox(value).map_err(not_an_address)
}

/// `value` as lettre reads a mailbox. Its RFC 2822 parser (display names, comments,
/// quoting) cost about half of reading a whole request; what most requests hold, a bare
/// `user@domain` of plain atoms or one behind a display name of plain words
/// (`Shop <noreply@shop.example>`), reads the same through the address's own checks,
/// which the parser ends in too.
fn parse_mailbox(value: &str) -> Result<Mailbox, lettre::address::AddressError> {
    if is_plain_address(value) {
        return value.parse::<lettre::Address>().map(Mailbox::from);
    }
    if let Some((name, address)) = plain_name_addr(value) {
        let address = address.parse::<lettre::Address>()?;
        return Ok(Mailbox::new(Some(name.to_string()), address));
    }
    value.parse()
}

/// RFC 5322's `atext`: what an atom is made of.
fn is_atext(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-/=?^_`{|}~".contains(&b)
}

/// `dot-atom "@" dot-atom` of ASCII atoms (RFC 5322 3.2.3): nothing the mailbox parser
/// would strip, unquote or take as a display name.
fn is_plain_address(value: &str) -> bool {
    let is_dot_atom = |part: &str| {
        part.split('.')
            .all(|atom| !atom.is_empty() && atom.bytes().all(is_atext))
    };
    value
        .split_once('@')
        .is_some_and(|(user, domain)| is_dot_atom(user) && is_dot_atom(domain))
}

/// `Name Words <user@domain>`: ASCII atoms separated by single spaces, one space, then a
/// plain address in angle brackets. Split into the display name and the address, which
/// is how the mailbox parser reads it; anything else (quotes, comments, dots or runs of
/// spaces in the name) is left to the parser.
fn plain_name_addr(value: &str) -> Option<(&str, &str)> {
    let (name, rest) = value.split_once(" <")?;
    let address = rest.strip_suffix('>')?;
    let plain_name = name
        .split(' ')
        .all(|word| !word.is_empty() && word.bytes().all(is_atext));
    (plain_name && is_plain_address(address)).then_some((name, address))
}

fn mailboxes(field: &'static str, values: &[String]) -> Result<Vec<Mailbox>, RequestError> {
    values
        .iter()
        .enumerate()
        .map(|(index, value)| mailbox(Indexed(field, index), value))
        .collect()
}

/// A field of a list as an error names it, e.g. `to[2]`.
#[derive(Clone, Copy)]
struct Indexed(&'static str, usize);

impl fmt::Display for Indexed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.0, self.1)
    }
}

/// An extra header's value as an error names it, e.g. `headers["X-Campaign"]`.
struct HeaderField<'a>(&'a str);

impl fmt::Display for HeaderField<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "headers[{}]", Quoted::new(self.0))
    }
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
