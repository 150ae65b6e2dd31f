//! `mailer dead show`: everything a dead letter carries, every property and header, and
//! its request pretty-printed (a body that is not JSON shown safely).

use std::fmt::Write as _;

use lapin::BasicProperties;
use lapin::types::FieldTable;

use super::letter::{DeadBy, DeadLetter};
use super::value::{body_text, one_line, rfc3339, timestamp, to_json};

/// The full account of one dead letter.
pub fn render(properties: &BasicProperties, body: &[u8], letter: &DeadLetter) -> String {
    let mut out = String::new();
    let by = match &letter.by {
        DeadBy::Worker => "the worker".to_string(),
        DeadBy::Broker { queue } => format!(
            "RabbitMQ, from queue {}",
            one_line(queue.as_deref().unwrap_or("?"))
        ),
        DeadBy::Unknown => "nobody: it has neither x-mail-dead-reason nor x-death".to_string(),
    };
    let summary = [
        (
            "message id",
            one_line(letter.message_id.as_deref().unwrap_or("-")),
        ),
        ("reason", format!("{} (by {by})", one_line(&letter.reason))),
        (
            "attempts",
            letter.attempts.map_or("-".into(), |n| n.to_string()),
        ),
        ("dead at", letter.dead_at.map_or("-".into(), rfc3339)),
        ("replays", letter.replays.to_string()),
        ("error", one_line(letter.error.as_deref().unwrap_or("-"))),
    ];
    for (name, value) in summary {
        let _ = writeln!(out, "{name}: {value}");
    }

    out.push_str("properties:\n");
    for (name, value) in property_lines(properties) {
        let _ = writeln!(out, "  {name}: {}", one_line(&value));
    }
    out.push_str("headers:\n");
    let empty = FieldTable::default();
    let headers = properties.headers().as_ref().unwrap_or(&empty);
    if headers.inner().is_empty() {
        out.push_str("  (none)\n");
    }
    for (name, value) in headers.inner() {
        let _ = writeln!(
            out,
            "  {}: {}",
            one_line(name.as_str()),
            one_line(&to_json(value).to_string())
        );
    }

    let _ = writeln!(out, "body ({} bytes):", body.len());
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(json) => out.push_str(&serde_json::to_string_pretty(&json).unwrap_or_default()),
        Err(e) => {
            let _ = writeln!(out, "(not JSON: {})", one_line(&e.to_string()));
            out.push_str(&body_text(body));
        }
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// Every AMQP property that is set, by its AMQP name.
fn property_lines(p: &BasicProperties) -> Vec<(&'static str, String)> {
    let text = |v: &Option<lapin::types::ShortString>| v.as_ref().map(|s| s.to_string());
    let mut lines = vec![
        ("content-type", text(p.content_type())),
        ("content-encoding", text(p.content_encoding())),
        ("delivery-mode", p.delivery_mode().map(|m| m.to_string())),
        ("priority", p.priority().map(|m| m.to_string())),
        ("correlation-id", text(p.correlation_id())),
        ("reply-to", text(p.reply_to())),
        ("expiration", text(p.expiration())),
        ("message-id", text(p.message_id())),
        ("timestamp", p.timestamp().map(|t| rfc3339(timestamp(t)))),
        ("type", text(p.kind())),
        ("user-id", text(p.user_id())),
        ("app-id", text(p.app_id())),
        ("cluster-id", text(p.cluster_id())),
    ];
    lines.retain(|(_, value)| value.is_some());
    lines
        .into_iter()
        .map(|(name, value)| (name, value.unwrap_or_default()))
        .collect()
}

#[cfg(test)]
mod tests {
    use lapin::types::{AMQPValue, LongString};

    use super::*;

    fn properties() -> BasicProperties {
        let mut headers = FieldTable::default();
        headers.insert(
            "x-mail-dead-reason".into(),
            AMQPValue::LongString(LongString::from("malformed")),
        );
        headers.insert(
            "x-evil".into(),
            AMQPValue::LongString(LongString::from("\x1b]0;pwned\x07")),
        );
        BasicProperties::default()
            .with_message_id("m-1".into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_timestamp(1_700_000_000)
            .with_headers(headers)
    }

    #[test]
    fn a_json_body_is_pretty_printed_with_every_property_and_header() {
        let body = br#"{"to":["a@example.com"],"subject":"Hi"}"#;
        let letter = DeadLetter::read(&properties(), body);
        let text = render(&properties(), body, &letter);
        assert!(
            text.starts_with("message id: m-1\nreason: malformed (by the worker)\n"),
            "{text}"
        );
        assert!(
            text.contains("  content-type: application/json\n"),
            "{text}"
        );
        assert!(text.contains("  delivery-mode: 2\n"), "{text}");
        assert!(
            text.contains("  timestamp: 2023-11-14T22:13:20Z\n"),
            "{text}"
        );
        assert!(
            text.contains("  x-mail-dead-reason: \"malformed\"\n"),
            "{text}"
        );
        assert!(
            text.contains(r#"  x-evil: "\u001b]0;pwned\u0007""#),
            "JSON escapes control characters: {text}"
        );
        assert!(
            text.ends_with(
                "{\n  \"subject\": \"Hi\",\n  \"to\": [\n    \"a@example.com\"\n  ]\n}\n"
            ),
            "{text}"
        );
        assert!(!text.contains('\x1b') && !text.contains('\x07'));
    }

    #[test]
    fn a_body_that_is_not_json_is_shown_safely() {
        let body = b"{not json \x1b[2J";
        let letter = DeadLetter::read(&properties(), body);
        let text = render(&properties(), body, &letter);
        assert!(text.contains("body (14 bytes):\n(not JSON: "), "{text}");
        assert!(text.ends_with("{not json \\u{1b}[2J\n"), "{text}");
        let binary = render(&properties(), &[0xff, 0xfe], &letter);
        assert!(
            binary.ends_with("(not UTF-8: 2 bytes; hex)\nfffe\n"),
            "{binary}"
        );
    }
}
