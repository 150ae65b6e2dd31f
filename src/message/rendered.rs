//! A rendered mail: its envelope and its RFC 5322 message, kept as the pieces lettre
//! built rather than joined into one buffer.
//!
//! lettre's `Message::formatted` copies every part's body into one `Vec` that grows by
//! doubling, while the parts still hold theirs: a 10 MiB mail was held two to three
//! times over for a moment by each connection sending one. Here the small pieces
//! (headers, MIME boundaries) are formatted as lettre formats them, and each body part
//! is sent from where lettre encoded it.

use lettre::address::Envelope;
use lettre::message::header::Headers;
use lettre::message::{MultiPart, SinglePart};

/// A mail ready to send: its envelope, and its message in order.
pub struct Rendered {
    envelope: Envelope,
    pieces: Vec<Piece>,
}

enum Piece {
    /// Headers and boundaries, formatted here.
    Formatted(Vec<u8>),
    /// A part's body, as lettre encoded it.
    Body(SinglePart),
}

impl Piece {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Formatted(bytes) => bytes,
            Self::Body(part) => part.raw_body(),
        }
    }
}

/// The body of a mail, in lettre's parts.
pub(super) enum MimeBody {
    Single(SinglePart),
    /// `multipart/alternative` of the text and the HTML; `frame` is the multipart
    /// without its parts, for its headers and boundary.
    Alternative {
        frame: MultiPart,
        text: SinglePart,
        html: SinglePart,
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

    /// The message, headers and body, in order, in pieces of at most `at_most` bytes.
    pub fn chunks(&self, at_most: usize) -> impl Iterator<Item = &[u8]> {
        self.pieces
            .iter()
            .flat_map(move |piece| piece.bytes().chunks(at_most))
    }

    /// Whether every byte of the message is ASCII (else it needs 8BITMIME).
    pub fn is_ascii(&self) -> bool {
        self.pieces.iter().all(|piece| piece.bytes().is_ascii())
    }

    /// The message as one buffer: a copy of it all.
    pub fn to_vec(&self) -> Vec<u8> {
        let len = self.pieces.iter().map(|piece| piece.bytes().len()).sum();
        let mut message = Vec::with_capacity(len);
        for piece in &self.pieces {
            message.extend_from_slice(piece.bytes());
        }
        message
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
    fn part(&mut self, part: SinglePart) {
        self.text(part.headers().to_string().as_bytes());
        self.text(b"\r\n");
        self.pieces
            .push(Piece::Formatted(std::mem::take(&mut self.open)));
        self.pieces.push(Piece::Body(part));
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

    use super::*;

    fn builder() -> lettre::message::MessageBuilder {
        Message::builder()
            .from("Shop <noreply@shop.example>".parse().unwrap())
            .to("a@example.com".parse().unwrap())
            .subject("Order 42")
            .date(SystemTime::UNIX_EPOCH)
    }

    #[test]
    fn laid_out_as_lettre_formats_the_same_message() {
        let bodies = [
            "plain ASCII\r\nlines\r\n".to_string(),
            "non-ASCII: é ü ß €\r\n".to_string(),
            format!("{}\r\nlong line\r\n", "x".repeat(2000)),
            String::new(),
        ];
        for text in &bodies {
            let html = format!("<p>{text}</p>");
            let single = builder()
                .singlepart(SinglePart::plain(text.clone()))
                .unwrap();
            let laid_out = Rendered::lay_out(
                single.envelope().clone(),
                single.headers(),
                MimeBody::Single(SinglePart::plain(text.clone())),
            );
            assert_eq!(laid_out.to_vec(), single.formatted(), "{text:?}");

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
                    text: SinglePart::plain(text.clone()),
                    html: SinglePart::html(html),
                },
            );
            let whole = laid_out.to_vec();
            assert_eq!(whole, multi.formatted(), "{text:?}");
            assert_eq!(laid_out.is_ascii(), whole.is_ascii());
            for at_most in [1, 7, 64 * 1024] {
                assert_eq!(laid_out.chunks(at_most).collect::<Vec<_>>().concat(), whole);
                assert!(laid_out.chunks(at_most).all(|c| c.len() <= at_most));
            }
        }
    }
}
