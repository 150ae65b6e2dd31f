//! A mail request that was checked and will make a valid mail, kept as it came until the
//! provider that sends it renders it, once.
//!
//! Checking reads the addresses, the subject and the extra headers, and checks that each
//! body field is a JSON string that decodes, but keeps the bodies where they are: in the
//! request's bytes, shared with the worker (which republishes them when it parks the
//! request) rather than copied. Rendering reads them again and still keeps them there:
//! a body is encoded a part at a time as it is sent. So a provider that sends nothing
//! (`discard://`, or one that fails before it needs the message) never pays for the MIME
//! message, and a request is held once, as its bytes, plus the part being sent.

use std::fmt;

use bytes::Bytes;
use lettre::Message;
use lettre::address::Envelope;
use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};

use super::RequestError;
use super::body_part::BodyPart;
use super::body_text::{self, BodyProblem};
use super::rendered::{MimeBody, Part, Rendered};
use super::wire::Bodies;

/// A mail that is ready to send: checked, not yet rendered (see [`Mail::render`]).
#[derive(Clone)]
pub struct Mail {
    /// The request's bytes, as they came; the bodies are read from them when rendering.
    pub(super) request: Bytes,
    pub(super) from: Mailbox,
    pub(super) to: Vec<Mailbox>,
    pub(super) cc: Vec<Mailbox>,
    pub(super) bcc: Vec<Mailbox>,
    pub(super) reply_to: Option<Mailbox>,
    pub(super) subject: String,
    pub(super) headers: Vec<(HeaderName, String)>,
    pub(super) envelope: Envelope,
    pub(super) message_id: String,
}

impl Mail {
    /// The envelope: the sender and every recipient of `to`, `cc` and `bcc`.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// The sender (`From`).
    pub fn from(&self) -> &Mailbox {
        &self.from
    }

    /// The recipients of `To`, `Cc` and `Bcc`.
    pub fn recipients(&self) -> [&[Mailbox]; 3] {
        [&self.to, &self.cc, &self.bcc]
    }

    /// The `Message-ID`, with its angle brackets, e.g. `<order-42@shop.example>`.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// Builds the MIME message. The bodies stay in the request's bytes, which the
    /// message shares: each is read once here to choose its transfer encoding, and
    /// encoded a part at a time while it is sent ([`super::body_part`]). It cannot fail
    /// for a mail that [`super::read_request`] made (which checked everything lettre
    /// checks); an error here is a bug, reported as the request's fault.
    pub fn render(self) -> Result<Rendered, RequestError> {
        let (text, html) = self.body_parts()?;
        let mut builder = Message::builder()
            .from(self.from)
            .subject(self.subject)
            .message_id(Some(self.message_id))
            .envelope(self.envelope.clone());
        for recipient in self.to {
            builder = builder.to(recipient);
        }
        for recipient in self.cc {
            builder = builder.cc(recipient);
        }
        for recipient in self.bcc {
            builder = builder.bcc(recipient);
        }
        if let Some(reply_to) = self.reply_to {
            builder = builder.reply_to(reply_to);
        }
        for (name, value) in self.headers {
            builder = builder.raw_header(HeaderValue::new(name, value));
        }
        let body = match (text, html) {
            (Some(text), Some(html)) => MimeBody::Alternative {
                frame: MultiPart::alternative().build(),
                text: Part::plain(text),
                html: Part::html(html),
            },
            (Some(text), None) => MimeBody::Single(Part::plain(text)),
            (None, Some(html)) => MimeBody::Single(Part::html(html)),
            (None, None) => return Err(RequestError::NoBody),
        };
        // The message's own headers, as lettre completes them (Date, MIME-Version),
        // from a message with an empty part: the parts are laid out under them.
        let headers_only = builder
            .singlepart(SinglePart::plain(String::new()))
            .map_err(|e| RequestError::Build(e.to_string()))?;
        Ok(Rendered::lay_out(
            self.envelope,
            headers_only.headers(),
            body,
        ))
    }

    /// The text and HTML bodies as parts to encode, each a slice of the request's
    /// bytes; an empty one counts as not given.
    fn body_parts(&self) -> Result<(Option<BodyPart>, Option<BodyPart>), RequestError> {
        self.each_body(|literal| BodyPart::new(self.request.slice_ref(literal.as_bytes())))
    }

    /// The mail as separate fields, for a provider whose API takes them rather than a
    /// MIME message. Like [`render`](Self::render) it takes the mail by value and
    /// decodes each body once.
    pub fn into_fields(self) -> Result<Fields, RequestError> {
        let (text, html) = self.bodies()?;
        Ok(Fields {
            from: self.from,
            to: self.to,
            cc: self.cc,
            bcc: self.bcc,
            reply_to: self.reply_to,
            subject: self.subject,
            headers: self
                .headers
                .into_iter()
                .map(|(name, value)| (name.to_string(), value))
                .collect(),
            message_id: self.message_id,
            text,
            html,
        })
    }

    /// The text and HTML bodies, decoded from the request with CRLF line endings (so
    /// lettre finds none to insert; see [`super::body_text`]); an empty one counts as not
    /// given.
    fn bodies(&self) -> Result<(Option<String>, Option<String>), RequestError> {
        self.each_body(|literal| {
            body_text::decode_crlf(literal).map(|body| Some(body).filter(|b| !b.is_empty()))
        })
    }

    /// The text and HTML bodies, each made by `make` from its JSON literal as it stands
    /// in the request's bytes; `None` for a body not given.
    fn each_body<T>(
        &self,
        make: impl Fn(&str) -> Result<Option<T>, BodyProblem>,
    ) -> Result<(Option<T>, Option<T>), RequestError> {
        let bodies: Bodies = serde_json::from_slice(&self.request)
            .map_err(|e| RequestError::Build(format!("the bodies do not decode: {e}")))?;
        let one = |literal: Option<&serde_json::value::RawValue>| {
            literal
                .map_or(Ok(None), |literal| make(literal.get()))
                .map_err(|e| RequestError::Build(format!("a body does not decode: {e}")))
        };
        Ok((one(bodies.text)?, one(bodies.html)?))
    }
}

/// A checked mail's fields ([`Mail::into_fields`]); bodies with CRLF line endings, an
/// empty one as `None`.
pub struct Fields {
    pub from: Mailbox,
    pub to: Vec<Mailbox>,
    pub cc: Vec<Mailbox>,
    pub bcc: Vec<Mailbox>,
    pub reply_to: Option<Mailbox>,
    pub subject: String,
    /// The extra header fields, checked as the request's `headers`.
    pub headers: Vec<(String, String)>,
    /// The `Message-ID`, with its angle brackets.
    pub message_id: String,
    pub text: Option<String>,
    pub html: Option<String>,
}

/// Shows who the mail is from and to, never its body, so a `Mail` can be logged.
impl fmt::Debug for Mail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mail")
            .field("message_id", &self.message_id)
            .field("from", &self.envelope.from().map(ToString::to_string))
            .field("recipients", &self.envelope.to().len())
            .finish()
    }
}
