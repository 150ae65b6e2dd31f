//! A body part of a rendered mail, encoded for the wire a part at a time while it is
//! sent.
//!
//! The body stays where it came: its JSON string literal in the request's bytes, which
//! the worker holds anyway until the request is settled. Rendering decodes it once,
//! keeping nothing, to choose the transfer encoding lettre would choose for it (7bit,
//! quoted-printable or base64); sending decodes it again and encodes it in parts of
//! about 64 KiB of text. So a connection sending a 10 MiB mail holds one part at a time
//! rather than the decoded body and its encoding (20 MiB for a moment, then 10 MiB for
//! as long as the mail was sent).
//!
//! The parts laid end to end are what lettre's `Body::new` makes of the whole text
//! (`rendered.rs` tests it byte for byte): quoted-printable starts every line afresh,
//! so text cut after line breaks encodes as it does whole, and base64 is cut at whole
//! lines of 57 bytes.

use lettre::message::Body;
use lettre::message::header::ContentTransferEncoding;

use super::body_text::{self, BodyProblem};

/// About how much decoded text one part holds: it ends at the first line break after
/// this many bytes (so a line longer than that is one part).
pub(super) const PART_TEXT_BYTES: usize = 64 * 1024;

/// Base64 encodes 57 bytes to one line of 76 characters.
const BASE64_LINE_INPUT: usize = 57;

/// A body's text, kept as its JSON string literal, with the transfer encoding chosen
/// for it.
pub(super) struct BodyPart {
    /// The JSON string literal, a slice of the request's bytes (shared, not copied).
    literal: bytes::Bytes,
    encoding: ContentTransferEncoding,
}

impl BodyPart {
    /// The body of the JSON string `literal` (a slice of the request's bytes), with the
    /// transfer encoding lettre chooses for its text; `None` if the text is empty.
    pub(super) fn new(literal: bytes::Bytes) -> Result<Option<Self>, BodyProblem> {
        let mut chooser = EncodingChooser::default();
        let mut text = String::new();
        let inner = body_text::contents(as_text(&literal)?)?;
        let mut at = 0;
        while at < inner.len() {
            text.clear();
            at = body_text::decode_lines(inner, at, PART_TEXT_BYTES, &mut text)?;
            chooser.read(text.as_bytes());
        }
        Ok((chooser.len > 0).then(|| Self {
            encoding: chooser.choice(),
            literal,
        }))
    }

    /// The `Content-Transfer-Encoding` the parts are in.
    pub(super) fn encoding(&self) -> ContentTransferEncoding {
        self.encoding
    }

    /// The encoded body, in parts of about [`PART_TEXT_BYTES`] of text each.
    pub(super) fn parts(&self) -> Parts<'_> {
        self.parts_of(PART_TEXT_BYTES)
    }

    /// The encoded body in parts of about `text_bytes` of text each.
    pub(super) fn parts_of(&self, text_bytes: usize) -> Parts<'_> {
        // `new` decoded this literal: it is a string, and decodes again the same way.
        let inner = as_text(&self.literal)
            .and_then(body_text::contents)
            .unwrap_or_default();
        Parts {
            inner,
            at: 0,
            text_bytes,
            encoding: self.encoding,
            carry: Vec::new(),
            started: false,
        }
    }
}

/// The request's bytes were read as UTF-8 JSON, so a slice of them at a string literal
/// is text.
fn as_text(literal: &[u8]) -> Result<&str, BodyProblem> {
    std::str::from_utf8(literal).map_err(|_| BodyProblem::NotAString("bytes that are not UTF-8"))
}

/// The encoded parts of a [`BodyPart`], made one at a time.
pub(super) struct Parts<'a> {
    /// Between the literal's quotes, still escaped.
    inner: &'a str,
    /// Where in `inner` the next part's text starts.
    at: usize,
    text_bytes: usize,
    encoding: ContentTransferEncoding,
    /// Base64: the text's last bytes that did not fill a line, encoded with the next
    /// part's.
    carry: Vec<u8>,
    /// Whether a base64 part was made: the next starts a new line.
    started: bool,
}

impl Iterator for Parts<'_> {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        loop {
            let done = self.at >= self.inner.len();
            if done && self.carry.is_empty() {
                return None;
            }
            // The text never outgrows the literal (see `body_text::decode_crlf`), and
            // goes past `text_bytes` only to the next line break.
            let mut text = String::with_capacity(self.text_bytes.min(self.inner.len() - self.at));
            if !done {
                match body_text::decode_lines(self.inner, self.at, self.text_bytes, &mut text) {
                    Ok(next) => self.at = next,
                    Err(problem) => {
                        // `BodyPart::new` decoded the same bytes without a problem.
                        tracing::error!(
                            %problem,
                            "a body that decoded when its mail was rendered does not decode \
                             while it is sent: a bug; the body is cut here"
                        );
                        self.at = self.inner.len();
                        self.carry.clear();
                        return None;
                    }
                }
            }
            match self.encoding {
                ContentTransferEncoding::QuotedPrintable => {
                    return Some(encoded(text.into(), self.encoding));
                }
                ContentTransferEncoding::Base64 => {
                    if let Some(part) = self.base64_lines(text.into_bytes()) {
                        return Some(part);
                    }
                }
                // 7bit: the text as it is (8bit and binary are never chosen).
                _ => return Some(text.into_bytes()),
            }
        }
    }
}

impl Parts<'_> {
    /// The whole lines of base64 that the carried bytes and `text` make (all of them
    /// at the end of the body), on a line of their own after the part before.
    fn base64_lines(&mut self, text: Vec<u8>) -> Option<Vec<u8>> {
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(&text);
        let whole = if self.at >= self.inner.len() {
            bytes.len()
        } else {
            bytes.len() / BASE64_LINE_INPUT * BASE64_LINE_INPUT
        };
        self.carry = bytes.split_off(whole);
        if bytes.is_empty() {
            return None;
        }
        // Each encoding's last line has no CRLF of its own.
        let mut part = if self.started {
            b"\r\n".to_vec()
        } else {
            Vec::new()
        };
        self.started = true;
        part.extend_from_slice(&encoded(bytes.into(), self.encoding));
        Some(part)
    }
}

/// `text` in `encoding`, as lettre encodes a body.
fn encoded(text: lettre::message::MaybeString, encoding: ContentTransferEncoding) -> Vec<u8> {
    // Quoted-printable and base64 take any text.
    Body::new_with_encoding(text, encoding)
        .map(Body::into_vec)
        .unwrap_or_else(|text| text)
}

/// What lettre's `Body::new` (email-encoding's `Encoding::choose`, for a server without
/// SMTPUTF8) looks at in a text, read in parts: whether it is ASCII, whether a line has
/// 76 bytes or more, and how many bytes quoted-printable would escape.
struct EncodingChooser {
    len: usize,
    ascii: bool,
    /// Where the last line break was (0 before the first, as lettre counts).
    last_line_break: usize,
    line_too_long: bool,
    escaped: usize,
}

impl Default for EncodingChooser {
    fn default() -> Self {
        Self {
            len: 0,
            ascii: true,
            last_line_break: 0,
            line_too_long: false,
            escaped: 0,
        }
    }
}

/// lettre's longest line, line break included, for 7bit.
const LINE_TOO_LONG: usize = 76;

impl EncodingChooser {
    fn read(&mut self, text: &[u8]) {
        for (i, &byte) in text.iter().enumerate() {
            if byte == b'\n' {
                let at = self.len + i;
                self.line_too_long |= at - self.last_line_break >= LINE_TOO_LONG;
                self.last_line_break = at;
            }
            self.ascii &= byte.is_ascii();
            self.escaped += usize::from(!matches!(byte, b'\t' | b' '..=b'~'));
        }
        self.len += text.len();
    }

    fn choice(&self) -> ContentTransferEncoding {
        let line_too_long = self.line_too_long || self.len - self.last_line_break >= LINE_TOO_LONG;
        if self.ascii && !line_too_long {
            ContentTransferEncoding::SevenBit
        } else if self.escaped <= self.len / 3 {
            ContentTransferEncoding::QuotedPrintable
        } else {
            ContentTransferEncoding::Base64
        }
    }
}
