//! A body field as its JSON string literal, borrowed from the request (serde_json's
//! `RawValue`), checked and decoded here rather than by serde_json.
//!
//! serde_json decodes an escaped string into a scratch buffer that grows by doubling,
//! then copies it into the `String`: a 10 MiB body of short lines (every line break is
//! an escape) was held two to three times over while it was read, once per delivery in
//! flight, and again when it was rendered. Here checking a body allocates nothing, and
//! decoding it fills one buffer of the literal's length, making the line endings CRLF
//! on the way, as a MIME body's lines end. (lettre does that too, but by inserting each
//! CR in place, moving the rest of the text every time: quadratic in the body's lines,
//! seconds of CPU for a large body; `docs/benchmarks.md`.)

use std::fmt;
use std::ops::ControlFlow;

/// Why a body field is not a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BodyProblem {
    /// The field holds another JSON value; this names its kind.
    NotAString(&'static str),
    /// A `\` not followed by one of JSON's escapes.
    InvalidEscape,
    /// A `\u` escape of half a UTF-16 surrogate pair, without its other half.
    LoneSurrogate,
    /// A control character not escaped, which JSON does not allow in a string.
    ControlCharacter,
}

impl fmt::Display for BodyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotAString(kind) => write!(f, "expected a string, found {kind}"),
            Self::InvalidEscape => f.write_str("an invalid escape in the string"),
            Self::LoneSurrogate => f.write_str("a lone UTF-16 surrogate in a \\u escape"),
            Self::ControlCharacter => f.write_str("a control character not escaped"),
        }
    }
}

/// Checks the JSON value `literal` is a string that decodes, and says whether it is
/// empty. Allocates nothing.
pub(super) fn check(literal: &str) -> Result<bool, BodyProblem> {
    let inner = contents(literal)?;
    decode_each(inner, 0, |_| ControlFlow::Continue(()))?;
    Ok(inner.is_empty())
}

/// The JSON string `literal`, decoded, with a CR put before every LF that has none
/// (a lone CR is kept), in one buffer that is never grown.
pub(super) fn decode_crlf(literal: &str) -> Result<String, BodyProblem> {
    let inner = contents(literal)?;
    // No escape decodes to more bytes than it takes (`\n` to CRLF: two for two), and a
    // literal has no raw line break, so the text never outgrows the literal.
    let mut text = String::with_capacity(inner.len());
    decode_lines(inner, 0, usize::MAX, &mut text)?;
    Ok(text)
}

/// Decodes `inner` (a string's [`contents`]) from byte `from` on into `text`, line
/// endings made CRLF as [`decode_crlf`] makes them, and stops at the first line break
/// after `at_least` bytes were added (or at the end). Returns where to go on from.
///
/// Stopping only after a line break means no CR is pending across the cut: the text
/// decoded in steps is the text decoded at once.
pub(super) fn decode_lines(
    inner: &str,
    from: usize,
    at_least: usize,
    text: &mut String,
) -> Result<usize, BodyProblem> {
    let start = text.len();
    let mut after_cr = false;
    decode_each(inner, from, |piece| match piece {
        Piece::Run(run) => {
            text.push_str(run);
            after_cr = false;
            ControlFlow::Continue(())
        }
        Piece::Char(c) => {
            if c == '\n' && !after_cr {
                text.push('\r');
            }
            text.push(c);
            after_cr = c == '\r';
            if c == '\n' && text.len() - start >= at_least {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
    })
}

/// What a literal decodes to, in order: runs of text as they stand, and escaped
/// characters. A run never holds a control character (so never a CR or an LF).
enum Piece<'a> {
    Run(&'a str),
    Char(char),
}

/// Between the quotes of a JSON string, still escaped (what [`decode_lines`] reads
/// from), or what other kind of value it is.
pub(super) fn contents(literal: &str) -> Result<&str, BodyProblem> {
    let literal = literal.trim_matches(|c: char| c.is_ascii_whitespace());
    if let Some(inner) = literal
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    {
        return Ok(inner);
    }
    Err(BodyProblem::NotAString(match literal.as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }))
}

/// Calls `on` with each piece of `inner` from byte `from` on, until it breaks; returns
/// the byte after the last piece given.
fn decode_each<'a>(
    inner: &'a str,
    from: usize,
    mut on: impl FnMut(Piece<'a>) -> ControlFlow<()>,
) -> Result<usize, BodyProblem> {
    let bytes = inner.as_bytes();
    let (mut at, mut run_start) = (from, from);
    while at < bytes.len() {
        match bytes[at] {
            // Both are ASCII, so `at` is on a character boundary.
            b'\\' => {
                if run_start < at {
                    // A run never breaks: only a line break does, and that is escaped.
                    let _ = on(Piece::Run(&inner[run_start..at]));
                }
                let (c, taken) = escape(&bytes[at..])?;
                at += taken;
                run_start = at;
                if on(Piece::Char(c)).is_break() {
                    return Ok(at);
                }
            }
            byte if byte < 0x20 => return Err(BodyProblem::ControlCharacter),
            _ => at += 1,
        }
    }
    if run_start < bytes.len() {
        let _ = on(Piece::Run(&inner[run_start..]));
    }
    Ok(bytes.len())
}

/// The character of the escape `escape` starts with, and how many bytes it takes.
fn escape(escape: &[u8]) -> Result<(char, usize), BodyProblem> {
    let c = match escape.get(1) {
        Some(b'"') => '"',
        Some(b'\\') => '\\',
        Some(b'/') => '/',
        Some(b'b') => '\u{8}',
        Some(b'f') => '\u{c}',
        Some(b'n') => '\n',
        Some(b'r') => '\r',
        Some(b't') => '\t',
        Some(b'u') => return unicode_escape(escape),
        _ => return Err(BodyProblem::InvalidEscape),
    };
    Ok((c, 2))
}

/// `\uXXXX`, or a surrogate pair `\uD8XX\uDCXX`.
fn unicode_escape(escape: &[u8]) -> Result<(char, usize), BodyProblem> {
    let first = hex4(escape.get(2..6))?;
    let (code, taken) = match first {
        0xD800..=0xDBFF => {
            let second = match escape.get(6..8) {
                Some(b"\\u") => hex4(escape.get(8..12))?,
                _ => return Err(BodyProblem::LoneSurrogate),
            };
            if !(0xDC00..=0xDFFF).contains(&second) {
                return Err(BodyProblem::LoneSurrogate);
            }
            (0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00), 12)
        }
        0xDC00..=0xDFFF => return Err(BodyProblem::LoneSurrogate),
        _ => (first, 6),
    };
    char::from_u32(code)
        .map(|c| (c, taken))
        .ok_or(BodyProblem::LoneSurrogate)
}

fn hex4(digits: Option<&[u8]>) -> Result<u32, BodyProblem> {
    let digits = digits.ok_or(BodyProblem::InvalidEscape)?;
    digits.iter().try_fold(0, |code, &digit| {
        let value = (digit as char)
            .to_digit(16)
            .ok_or(BodyProblem::InvalidEscape)?;
        Ok(code * 16 + value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What serde_json makes of `literal`, with line endings made CRLF as a MIME body's.
    fn by_serde(literal: &str) -> Option<String> {
        let text: String = serde_json::from_str(literal).ok()?;
        let mut out = String::new();
        let mut after_cr = false;
        for c in text.chars() {
            if c == '\n' && !after_cr {
                out.push('\r');
            }
            out.push(c);
            after_cr = c == '\r';
        }
        Some(out)
    }

    #[test]
    fn decodes_as_serde_json_does_with_crlf_line_endings() {
        for literal in [
            r#""""#,
            r#""one line""#,
            r#""a\nb\n""#,
            r#""\n\nx""#,
            r#""a\r\nb\nc\r\n""#,
            r#""a lone \r stays\n""#,
            r#""\r\r\n""#,
            r#""é\nü\n""#,
            r#""quote \" backslash \\ slash \/ \b\f\t""#,
            r#""\u0041\u00e9\u20ac\ud83d\ude00 \u000a after""#,
            r#""\r\u000a""#,
            r#"  "spaces around"  "#,
        ] {
            let decoded = decode_crlf(literal).unwrap_or_else(|e| panic!("{literal}: {e}"));
            assert_eq!(Some(&decoded), by_serde(literal).as_ref(), "{literal}");
            assert!(decoded.capacity() <= literal.len(), "{literal}");
            assert_eq!(check(literal), Ok(decoded.is_empty()), "{literal}");
        }
    }

    #[test]
    fn every_escape_and_character_serde_accepts_is_decoded_the_same() {
        // Each character of the first planes, raw and escaped as \uXXXX, between
        // line breaks; the surrogate range only as the pairs it takes to escape them.
        let mut literal = String::from("\"");
        let mut c = 0x20u32;
        while c < 0x3_0000 {
            if let Some(ch) = char::from_u32(c) {
                if ch != '"' && ch != '\\' {
                    literal.push(ch);
                }
                let mut units = [0u16; 2];
                for unit in ch.encode_utf16(&mut units) {
                    literal.push_str(&format!("\\u{unit:04x}"));
                }
                literal.push_str("\\n");
            }
            c += 7;
        }
        literal.push('"');
        assert_eq!(Some(decode_crlf(&literal).unwrap()), by_serde(&literal));
    }

    #[test]
    fn what_serde_json_refuses_is_refused_with_why() {
        for (literal, problem) in [
            ("5", BodyProblem::NotAString("a number")),
            ("-1", BodyProblem::NotAString("a number")),
            (r#"["x"]"#, BodyProblem::NotAString("an array")),
            (r#"{"a": 1}"#, BodyProblem::NotAString("an object")),
            ("true", BodyProblem::NotAString("a boolean")),
            (r#""\ud800 alone""#, BodyProblem::LoneSurrogate),
            (r#""\udc00""#, BodyProblem::LoneSurrogate),
            (r#""\ud800\u0041""#, BodyProblem::LoneSurrogate),
            (r#""\ud800""#, BodyProblem::LoneSurrogate),
            (r#""\x""#, BodyProblem::InvalidEscape),
            (r#""\u12""#, BodyProblem::InvalidEscape),
            (r#""\u+123""#, BodyProblem::InvalidEscape),
            ("\"raw\nline\"", BodyProblem::ControlCharacter),
        ] {
            assert_eq!(decode_crlf(literal), Err(problem), "{literal}");
            assert_eq!(check(literal), Err(problem), "{literal}");
            if !matches!(problem, BodyProblem::NotAString(_)) {
                assert!(by_serde(literal).is_none(), "serde_json takes {literal}");
            }
        }
    }
}
