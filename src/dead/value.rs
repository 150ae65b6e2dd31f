//! AMQP field values and untrusted text made safe to print: a dead letter's headers and
//! body come from whoever published the request, and must not drive the terminal.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lapin::types::AMQPValue;
use serde_json::{Map, Value, json};

/// An AMQP value as JSON: strings as text (invalid UTF-8 replaced), timestamps as RFC 3339,
/// byte arrays as hex, tables as objects, arrays as arrays.
pub fn to_json(value: &AMQPValue) -> Value {
    match value {
        AMQPValue::Boolean(v) => json!(v),
        AMQPValue::ShortShortInt(v) => json!(v),
        AMQPValue::ShortShortUInt(v) => json!(v),
        AMQPValue::ShortInt(v) => json!(v),
        AMQPValue::ShortUInt(v) => json!(v),
        AMQPValue::LongInt(v) => json!(v),
        AMQPValue::LongUInt(v) => json!(v),
        AMQPValue::LongLongInt(v) => json!(v),
        AMQPValue::Float(v) => json!(v),
        AMQPValue::Double(v) => json!(v),
        AMQPValue::DecimalValue(v) => json!(format!("{}e-{}", v.value, v.scale)),
        AMQPValue::ShortString(v) => json!(v.as_str()),
        AMQPValue::LongString(v) => json!(String::from_utf8_lossy(v.as_bytes())),
        AMQPValue::FieldArray(v) => Value::Array(v.as_slice().iter().map(to_json).collect()),
        AMQPValue::Timestamp(v) => json!(rfc3339(timestamp(*v))),
        AMQPValue::FieldTable(v) => Value::Object(
            v.inner()
                .iter()
                .map(|(name, value)| (name.to_string(), to_json(value)))
                .collect::<Map<String, Value>>(),
        ),
        AMQPValue::ByteArray(v) => json!(hex(v.as_slice())),
        AMQPValue::Void => Value::Null,
    }
}

/// The value as text when it is a string.
pub fn text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::ShortString(s) => Some(s.to_string()),
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        _ => None,
    }
}

/// The value when it is an integer of any AMQP width.
pub fn integer(value: &AMQPValue) -> Option<i64> {
    match value {
        AMQPValue::ShortShortInt(v) => Some((*v).into()),
        AMQPValue::ShortShortUInt(v) => Some((*v).into()),
        AMQPValue::ShortInt(v) => Some((*v).into()),
        AMQPValue::ShortUInt(v) => Some((*v).into()),
        AMQPValue::LongInt(v) => Some((*v).into()),
        AMQPValue::LongUInt(v) => Some((*v).into()),
        AMQPValue::LongLongInt(v) => Some(*v),
        _ => None,
    }
}

/// The value as a point in time: an AMQP timestamp, or an integer of seconds.
pub fn time(value: &AMQPValue) -> Option<SystemTime> {
    match value {
        AMQPValue::Timestamp(seconds) => Some(timestamp(*seconds)),
        other => integer(other)
            .and_then(|seconds| u64::try_from(seconds).ok())
            .map(timestamp),
    }
}

/// An AMQP timestamp (seconds since the Unix epoch) as a point in time.
pub fn timestamp(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(seconds)
}

/// A point in time as RFC 3339 in UTC, to the second.
pub fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `text` with every control character (line breaks and tabs too) and every invisible
/// character that reorders or hides text escaped, so it prints as one harmless line.
pub fn one_line(text: &str) -> String {
    escape(text, false)
}

/// `text` with line breaks and tabs kept and every other control or invisible formatting
/// character escaped.
pub fn multi_line(text: &str) -> String {
    escape(text, true)
}

fn escape(text: &str, keep_lines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if keep_lines && matches!(c, '\n' | '\t') {
            out.push(c);
        } else if c.is_control() || is_invisible_format(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Zero-width and bidirectional formatting characters, which can make printed text read
/// differently from what it is.
fn is_invisible_format(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// `n dead letters`, or `1 dead letter`.
pub fn dead_letters(n: usize) -> String {
    match n {
        1 => "1 dead letter".to_string(),
        n => format!("{n} dead letters"),
    }
}

/// A body that is not JSON, shown safely: text with control characters escaped, or a hex
/// dump of its first bytes when it is not UTF-8.
pub fn body_text(body: &[u8]) -> String {
    const MAX_HEX_BYTES: usize = 4096;
    match std::str::from_utf8(body) {
        Ok(text) => multi_line(text),
        Err(_) => {
            let shown = &body[..body.len().min(MAX_HEX_BYTES)];
            let mut out = format!("(not UTF-8: {} bytes; hex)\n", body.len());
            for line in shown.chunks(32) {
                out.push_str(&hex(line));
                out.push('\n');
            }
            if body.len() > shown.len() {
                out.push_str(&format!("… {} more bytes\n", body.len() - shown.len()));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::{FieldArray, FieldTable, LongString};

    use super::*;

    #[test]
    fn nested_values_become_json() {
        let mut death = FieldTable::default();
        death.insert("reason".into(), AMQPValue::LongString("expired".into()));
        death.insert("count".into(), AMQPValue::LongLongInt(2));
        death.insert("time".into(), AMQPValue::Timestamp(1_700_000_000));
        let deaths = AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)]));
        assert_eq!(
            to_json(&deaths),
            json!([{"count": 2, "reason": "expired", "time": "2023-11-14T22:13:20Z"}])
        );
        assert_eq!(
            to_json(&AMQPValue::LongString(LongString::from(b"a\xffb".to_vec()))),
            json!("a\u{fffd}b")
        );
    }

    #[test]
    fn integers_and_times_of_any_width() {
        assert_eq!(integer(&AMQPValue::ShortShortUInt(3)), Some(3));
        assert_eq!(integer(&AMQPValue::LongLongInt(-1)), Some(-1));
        assert_eq!(integer(&AMQPValue::Double(1.0)), None);
        assert_eq!(time(&AMQPValue::Timestamp(10)), Some(timestamp(10)));
        assert_eq!(time(&AMQPValue::LongLongInt(10)), Some(timestamp(10)));
        assert_eq!(time(&AMQPValue::LongLongInt(-10)), None);
    }

    #[test]
    fn control_and_invisible_characters_are_escaped() {
        assert_eq!(one_line("a\nb\x1b[31mc"), "a\\nb\\u{1b}[31mc");
        assert_eq!(multi_line("a\nb\t\x07"), "a\nb\t\\u{7}");
        assert_eq!(one_line("evil\u{202e}txt"), "evil\\u{202e}txt");
        assert_eq!(dead_letters(1), "1 dead letter");
        assert_eq!(dead_letters(0), "0 dead letters");
    }

    #[test]
    fn a_binary_body_is_a_hex_dump() {
        let shown = body_text(&[0xff, 0x00, 0x41]);
        assert_eq!(shown, "(not UTF-8: 3 bytes; hex)\nff0041\n");
        assert_eq!(body_text(b"plain\x1b"), "plain\\u{1b}");
    }
}
