//! A rendered mail: its envelope and its RFC 5322 message, kept as pieces rather than
//! joined into one buffer.
//!
//! lettre's `Message::formatted` copies every part's body into one `Vec` that grows by
//! doubling, while the parts still hold theirs: a 10 MiB mail was held two to three
//! times over for a moment by each connection sending one. Here the small pieces
//! (headers, MIME boundaries) are formatted as lettre formats them, and each body is
//! encoded a part at a time while it is sent, from the request's bytes
//! ([`super::body_part`]).

use std::borrow::Cow;

use lettre::address::Envelope;
use lettre::message::header::{ContentType, Headers};
use lettre::message::{Body, MultiPart, SinglePart};

use super::body_part::BodyPart;

/// A mail ready to send: its envelope, and its message in order.
pub struct Rendered {
    envelope: Envelope,
    pieces: Vec<Piece>,
}

enum Piece {
    /// Headers and boundaries, formatted here.
    Formatted(Vec<u8>),
    /// A part's body, encoded as it is sent.
    Body(BodyPart),
}

/// A single part: its headers as lettre makes them for its body, and the body.
pub(super) struct Part {
    headers: Headers,
    body: BodyPart,
}

impl Part {
    /// A `text/plain` part.
    pub(super) fn plain(body: BodyPart) -> Self {
        Self::of(ContentType::TEXT_PLAIN, body)
    }

    /// A `text/html` part.
    pub(super) fn html(body: BodyPart) -> Self {
        Self::of(ContentType::TEXT_HTML, body)
    }

    fn of(content_type: ContentType, body: BodyPart) -> Self {
        // lettre's `SinglePart::plain`/`html` headers for a body in this encoding.
        let headers = SinglePart::builder()
            .header(content_type)
            .body(Body::dangerous_pre_encoded(Vec::new(), body.encoding()))
            .headers()
            .clone();
        Self { headers, body }
    }
}

/// The body of a mail, in parts.
pub(super) enum MimeBody {
    Single(Part),
    /// `multipart/alternative` of the text and the HTML; `frame` is the multipart
    /// without its parts, for its headers and boundary.
    Alternative {
        frame: MultiPart,
        text: Part,
        html: Part,
    },
}

impl Rendered {
    /// `body` under the message's `headers`, laid out byte for byte as lettre's
    /// `Message::formatted` lays out a message of these headers and this body.
    pub(super) fn lay_out(envelope: Envelope, headers: &Headers, body: MimeBody) -> Self {
        let mut layout = Layout::default();
        layout.text(headers.to_string().as_bytes());
        match body {
            MimeBody::Single(part) => layout.part(part),
            MimeBody::Alternative { frame, text, html } => {
                let boundary = frame.boundary();
                layout.text(frame.headers().to_string().as_bytes());
                layout.text(b"\r\n");
                for part in [text, html] {
                    layout.text(format!("--{boundary}\r\n").as_bytes());
                    layout.part(part);
                }
                layout.text(format!("--{boundary}--\r\n").as_bytes());
            }
        }
        Self {
            envelope,
            pieces: layout.finish(),
        }
    }

    /// The sender and every recipient of `to`, `cc` and `bcc`.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// The message, headers and body, in order: the headers as they are, each body
    /// encoded a part of about 64 KiB of text at a time, as the parts are taken.
    pub fn parts(&self) -> impl Iterator<Item = Cow<'_, [u8]>> {
        self.pieces_in(|body| body.parts())
    }

    /// [`parts`](Self::parts) with the bodies in parts of about `text_bytes` of text.
    #[cfg(test)]
    fn parts_of(&self, text_bytes: usize) -> impl Iterator<Item = Cow<'_, [u8]>> {
        self.pieces_in(move |body| body.parts_of(text_bytes))
    }

    fn pieces_in<'a, P>(
        &'a self,
        parts_of: impl Fn(&'a BodyPart) -> P + 'a,
    ) -> impl Iterator<Item = Cow<'a, [u8]>>
    where
        P: Iterator<Item = Vec<u8>> + Send + 'a,
    {
        self.pieces.iter().flat_map(move |piece| {
            let parts: Box<dyn Iterator<Item = Cow<'a, [u8]>> + Send> = match piece {
                Piece::Formatted(bytes) => Box::new(std::iter::once(Cow::Borrowed(&bytes[..]))),
                Piece::Body(body) => Box::new(parts_of(body).map(Cow::Owned)),
            };
            parts
        })
    }

    /// The message's size in bytes. It encodes the bodies to count them.
    pub fn size(&self) -> usize {
        self.parts().map(|part| part.len()).sum()
    }

    /// Whether every byte of the message is ASCII (else it needs 8BITMIME). The bodies
    /// are always: in 7bit, quoted-printable or base64.
    pub fn is_ascii(&self) -> bool {
        self.pieces.iter().all(|piece| match piece {
            Piece::Formatted(bytes) => bytes.is_ascii(),
            Piece::Body(_) => true,
        })
    }

    /// The message as one buffer: a copy of it all.
    pub fn to_vec(&self) -> Vec<u8> {
        self.parts().collect::<Vec<_>>().concat()
    }
}

/// Pieces in the making: formatted text gathers until a body comes.
#[derive(Default)]
struct Layout {
    pieces: Vec<Piece>,
    open: Vec<u8>,
}

impl Layout {
    fn text(&mut self, text: &[u8]) {
        self.open.extend_from_slice(text);
    }

    /// A single part as lettre formats one: headers, a blank line, the body, CRLF.
    fn part(&mut self, part: Part) {
        self.text(part.headers.to_string().as_bytes());
        self.text(b"\r\n");
        self.pieces
            .push(Piece::Formatted(std::mem::take(&mut self.open)));
        self.pieces.push(Piece::Body(part.body));
        self.text(b"\r\n");
    }

    fn finish(mut self) -> Vec<Piece> {
        self.pieces.push(Piece::Formatted(self.open));
        self.pieces
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use lettre::Message;
    use lettre::message::header::ContentTransferEncoding;

    use super::*;

    fn builder() -> lettre::message::MessageBuilder {
        Message::builder()
            .from("Shop <noreply@shop.example>".parse().unwrap())
            .to("a@example.com".parse().unwrap())
            .subject("Order 42")
            .date(SystemTime::UNIX_EPOCH)
    }

    /// `text` as a request holds it: a JSON string literal.
    fn body(text: &str) -> BodyPart {
        let literal = serde_json::to_string(text).unwrap();
        BodyPart::new(literal.into()).unwrap().expect("not empty")
    }

    /// Bodies for each encoding lettre chooses, short and spanning many parts, with
    /// and without a last line break.
    fn bodies() -> Vec<String> {
        let mut bodies = vec![
            "plain ASCII\r\nlines\r\n".to_string(),
            "non-ASCII: é ü ß €\r\n".to_string(),
            format!("{}\r\nlong line\r\n", "x".repeat(2000)),
            "a space at the end \r\nand a tab\t\r\n=equals= \t".to_string(),
            "日本語のメール。\r\n".repeat(3),
        ];
        let line = "The quick brown fox jumps over the lazy dog, again and again and again.\r\n";
        let ascii_long_lines = line.repeat(900);
        bodies.push(ascii_long_lines.trim_end().to_string());
        bodies.push(ascii_long_lines);
        bodies.push("short line\r\n".repeat(5000));
        bodies.push(format!("{}\r\n", "Grüße aus Köln, ".repeat(40)).repeat(300));
        bodies.push("日本語のメールです。改行もあります。\r\n".repeat(2000));
        bodies.push("日本語".repeat(20_000));
        bodies
    }

    /// The start of `text`, to name it in a failure.
    fn shown(text: &str) -> String {
        text.chars().take(30).collect()
    }

    #[test]
    fn each_body_takes_the_encoding_lettre_chooses() {
        for text in bodies() {
            assert_eq!(
                body(&text).encoding(),
                Body::new(text.clone()).encoding(),
                "{:?}",
                shown(&text)
            );
        }
        let mut seen: Vec<_> = bodies().iter().map(|t| body(t).encoding()).collect();
        seen.dedup();
        for encoding in [
            ContentTransferEncoding::SevenBit,
            ContentTransferEncoding::QuotedPrintable,
            ContentTransferEncoding::Base64,
        ] {
            assert!(seen.contains(&encoding), "no body in {encoding:?}");
        }
    }

    #[test]
    fn laid_out_in_parts_as_lettre_formats_the_same_message() {
        for text in &bodies() {
            let shown = shown(text);
            let html = format!("<p>{text}</p>");
            let single = builder()
                .singlepart(SinglePart::plain(text.clone()))
                .unwrap();
            let laid_out = Rendered::lay_out(
                single.envelope().clone(),
                single.headers(),
                MimeBody::Single(Part::plain(body(text))),
            );
            let formatted = single.formatted();
            assert_eq!(laid_out.to_vec(), formatted, "{shown:?}");
            assert_eq!(laid_out.size(), formatted.len());
            for text_bytes in [1, 7, 100, 4096] {
                let in_parts = laid_out.parts_of(text_bytes).collect::<Vec<_>>().concat();
                assert_eq!(in_parts, formatted, "{shown:?} in parts of {text_bytes}");
            }

            let both = MultiPart::alternative()
                .boundary("b-1")
                .singlepart(SinglePart::plain(text.clone()))
                .singlepart(SinglePart::html(html.clone()));
            let multi = builder().multipart(both).unwrap();
            let laid_out = Rendered::lay_out(
                multi.envelope().clone(),
                multi.headers(),
                MimeBody::Alternative {
                    frame: MultiPart::alternative().boundary("b-1").build(),
                    text: Part::plain(body(text)),
                    html: Part::html(body(&html)),
                },
            );
            let whole = laid_out.to_vec();
            assert_eq!(whole, multi.formatted(), "{shown:?}");
            assert_eq!(laid_out.is_ascii(), whole.is_ascii());
        }
    }

    #[test]
    fn a_large_body_is_sent_in_parts_of_about_64_kib() {
        let text =
            "The quick brown fox jumps over the lazy dog, and then it jumps over it again.\r\n"
                .repeat(20_000);
        let mail = builder()
            .singlepart(SinglePart::plain(String::new()))
            .unwrap();
        let laid_out = Rendered::lay_out(
            mail.envelope().clone(),
            mail.headers(),
            MimeBody::Single(Part::plain(body(&text))),
        );
        let parts: Vec<usize> = laid_out.parts().map(|part| part.len()).collect();
        assert!(parts.len() > 20, "{} parts", parts.len());
        // Quoted-printable adds a soft break to each line of 77 characters.
        assert!(parts.iter().all(|&len| len < 72 * 1024), "{parts:?}");
    }
}
