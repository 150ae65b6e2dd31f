//! A mail request that was checked and will make a valid mail, kept as it came until the
//! provider that sends it renders it, once.
//!
//! Checking reads the addresses, the subject and the extra headers, and checks that each
//! body field is a JSON string that decodes, but keeps the bodies where they are: in the
//! request's bytes, shared with the worker (which republishes them when it parks the
//! request) rather than copied; rendering reads them again. So a provider that sends nothing (`discard://`, or one
//! that fails before it needs the message) never pays for the MIME message, and a request
//! is held at most twice: its bytes and one rendering.

use std::fmt;

use bytes::Bytes;
use lettre::Message;
use lettre::address::Envelope;
use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};

use super::RequestError;
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

/// A rendered mail: its envelope and its RFC 5322 bytes, as a provider sends them.
pub struct Rendered {
    envelope: Envelope,
    message: Vec<u8>,
}

impl Rendered {
    /// The sender and every recipient of `to`, `cc` and `bcc`.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// The message, headers and body, as RFC 5322 bytes.
    pub fn message(&self) -> &[u8] {
        &self.message
    }

    /// The message's bytes, without a copy.
    pub fn into_message(self) -> Vec<u8> {
        self.message
    }
}

impl Mail {
    /// The envelope: the sender and every recipient of `to`, `cc` and `bcc`.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// The `Message-ID`, with its angle brackets, e.g. `<order-42@shop.example>`.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// Builds the MIME message. It takes the mail by value, so each body is decoded from
    /// the request once and moved, not copied, into the message. It cannot fail for a
    /// mail that [`super::read_request`] made (which checked everything lettre checks);
    /// an error here is a bug, reported as the request's fault.
    pub fn render(self) -> Result<Rendered, RequestError> {
        let bodies: Bodies = serde_json::from_slice(&self.request)
            .map_err(|e| RequestError::Build(format!("the bodies do not decode: {e}")))?;
        // Empty counts as not given.
        let text = bodies.text.filter(|t| !t.is_empty());
        let html = bodies.html.filter(|h| !h.is_empty());
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
        // The request's bytes are not needed any more: let them go before the message
        // is formatted, so that this clone of them does not keep them alive meanwhile.
        drop(self.request);
        let (text, html) = (text.map(crlf_line_endings), html.map(crlf_line_endings));
        let built = match (text, html) {
            (Some(text), Some(html)) => {
                builder.multipart(MultiPart::alternative_plain_html(text, html))
            }
            (Some(text), None) => builder.singlepart(SinglePart::plain(text)),
            (None, Some(html)) => builder.singlepart(SinglePart::html(html)),
            (None, None) => return Err(RequestError::NoBody),
        };
        let message = built.map_err(|e| RequestError::Build(e.to_string()))?;
        Ok(Rendered {
            envelope: self.envelope,
            message: message.formatted(),
        })
    }
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

/// `text` with a CR before every LF that lacks one, as a MIME body's lines end. lettre
/// does the same to a body it is given, but by inserting each CR in place, which moves
/// the rest of the text every time: a 10 MiB body of short lines took it 12 s of CPU.
/// Here it is one pass from the end, in the same buffer (a rendering is held once per
/// connection, and may be 10 MiB), so lettre finds nothing left to insert.
fn crlf_line_endings(text: String) -> String {
    let mut previous = 0u8;
    let bare = text
        .bytes()
        .filter(|&b| {
            let lone = b == b'\n' && previous != b'\r';
            previous = b;
            lone
        })
        .count();
    if bare == 0 {
        return text;
    }
    let mut bytes = text.into_bytes();
    let len = bytes.len();
    bytes.resize(len + bare, 0);
    // Each byte moves right by the CRs still to insert before it; those are never fewer
    // than zero, so a byte is read before anything is written over it.
    let mut write = bytes.len();
    for read in (0..len).rev() {
        let b = bytes[read];
        write -= 1;
        bytes[write] = b;
        if b == b'\n' && (read == 0 || bytes[read - 1] != b'\r') {
            write -= 1;
            bytes[write] = b'\r';
        }
    }
    // Only ASCII CRs were added before ASCII LFs, so the text is still UTF-8.
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::crlf_line_endings;

    #[test]
    fn every_line_ends_with_crlf_once() {
        for (text, expected) in [
            ("", ""),
            ("one line", "one line"),
            ("a\nb\n", "a\r\nb\r\n"),
            ("\n\nx", "\r\n\r\nx"),
            ("a\r\nb\nc\r\n", "a\r\nb\r\nc\r\n"),
            ("a lone \r stays\n", "a lone \r stays\r\n"),
            ("\r\r\n", "\r\r\n"),
            ("é\nü\n", "é\r\nü\r\n"),
        ] {
            assert_eq!(crlf_line_endings(text.to_string()), expected, "{text:?}");
        }
    }

    #[test]
    fn text_already_in_crlf_is_kept_as_it_is() {
        let text = "a\r\nb\r\n".to_string();
        let pointer = text.as_ptr();
        let kept = crlf_line_endings(text);
        assert_eq!(kept.as_ptr(), pointer);
    }
}
