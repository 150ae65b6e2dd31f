use serde_json::{Value, json};

use super::*;
use crate::mail;

fn minimal() -> Value {
    json!({
        "from": "Shop <noreply@shop.example>",
        "to": ["a@example.com"],
        "subject": "Your order",
        "text": "Thanks!"
    })
}

fn with(field: &str, value: Value) -> Value {
    let mut request = minimal();
    request[field] = value;
    request
}

fn without(field: &str) -> Value {
    let mut request = minimal();
    request.as_object_mut().expect("an object").remove(field);
    request
}

fn parse(request: &Value) -> Result<Mail, RequestError> {
    parse_request(request.to_string().as_bytes(), Some("order-42"))
}

fn error(request: &Value) -> String {
    parse(request)
        .expect_err("the request is refused")
        .to_string()
}

fn formatted(mail: &Mail) -> String {
    let rendered = mail.clone().render().expect("a checked mail renders");
    String::from_utf8(rendered.to_vec()).expect("the mail is UTF-8")
}

#[test]
fn a_full_request_becomes_a_mail_with_every_field() {
    let request = json!({
        "from": "Shop <noreply@shop.example>",
        "to": ["a@example.com", "B <b@example.com>"],
        "cc": ["c@example.com"],
        "bcc": ["d@example.com"],
        "reply_to": "help@shop.example",
        "subject": "Your order",
        "text": "Thanks!",
        "html": "<p>Thanks!</p>",
        "headers": {"X-Campaign": "autumn"}
    });
    let mail = parse(&request).expect("the request is valid");
    let text = formatted(&mail);
    assert!(
        text.contains("From: Shop <noreply@shop.example>\r\n"),
        "{text}"
    );
    assert!(
        text.contains("To: a@example.com, B <b@example.com>\r\n"),
        "{text}"
    );
    assert!(text.contains("Cc: c@example.com\r\n"), "{text}");
    assert!(text.contains("Reply-To: help@shop.example\r\n"), "{text}");
    assert!(text.contains("Subject: Your order\r\n"), "{text}");
    assert!(text.contains("X-Campaign: autumn\r\n"), "{text}");
    assert!(
        text.contains("Message-ID: <order-42@shop.example>\r\n"),
        "{text}"
    );
    assert!(!text.contains("d@example.com"), "Bcc must not show: {text}");

    let envelope = mail.envelope();
    assert_eq!(
        envelope.from().map(ToString::to_string).as_deref(),
        Some("noreply@shop.example")
    );
    let recipients: Vec<String> = envelope.to().iter().map(ToString::to_string).collect();
    assert_eq!(
        recipients,
        [
            "a@example.com",
            "b@example.com",
            "c@example.com",
            "d@example.com"
        ]
    );
}

#[test]
fn text_alone_is_a_plain_text_mail() {
    let text = formatted(&parse(&minimal()).expect("valid"));
    assert!(
        text.contains("Content-Type: text/plain; charset=utf-8"),
        "{text}"
    );
    assert!(!text.contains("multipart"), "{text}");
    assert!(text.contains("Thanks!"), "{text}");
}

#[test]
fn html_alone_is_an_html_mail() {
    let mut request = without("text");
    request["html"] = json!("<p>Hi</p>");
    let text = formatted(&parse(&request).expect("valid"));
    assert!(
        text.contains("Content-Type: text/html; charset=utf-8"),
        "{text}"
    );
    assert!(!text.contains("text/plain"), "{text}");
}

#[test]
fn text_and_html_are_multipart_alternative() {
    let text = formatted(&parse(&with("html", json!("<p>Hi</p>"))).expect("valid"));
    assert!(text.contains("multipart/alternative"), "{text}");
    let plain = text.find("text/plain").expect("a text part");
    let html = text.find("text/html").expect("an html part");
    assert!(plain < html, "the text part comes first: {text}");
}

#[test]
fn a_mail_needs_a_body() {
    let message = "text and html are both missing or empty; at least one is needed";
    assert_eq!(error(&without("text")), message);
    assert_eq!(error(&with("text", json!(""))), message);
    assert_eq!(error(&with("text", Value::Null)), message);
}

#[test]
fn required_fields_are_named_when_missing() {
    for field in ["from", "subject"] {
        let message = error(&without(field));
        assert!(
            message.contains(&format!("missing field `{field}`")),
            "{message}"
        );
    }
}

#[test]
fn a_mail_needs_a_recipient_in_to_cc_or_bcc() {
    let message = "to, cc and bcc name no recipient; at least one is needed";
    assert_eq!(error(&without("to")), message);
    assert_eq!(error(&with("to", json!([]))), message);
    let mut only_bcc = without("to");
    only_bcc["bcc"] = json!(["x@example.com"]);
    assert!(parse(&only_bcc).is_ok());
}

#[test]
fn unknown_fields_are_refused() {
    let message = error(&with("subjcet", json!("typo")));
    assert!(message.contains("unknown field `subjcet`"), "{message}");
}

#[test]
fn bad_addresses_are_named_by_field_and_index() {
    assert_eq!(
        error(&with("to", json!(["a@example.com", "bob@"]))),
        r#"to[1]: "bob@" is not an email address"#
    );
    assert_eq!(
        error(&with("from", json!("not an address"))),
        r#"from: "not an address" is not an email address"#
    );
    assert_eq!(
        error(&with("cc", json!(["@example.com"]))),
        r#"cc[0]: "@example.com" is not an email address"#
    );
    assert_eq!(
        error(&with("bcc", json!(["a@example.com, b@example.com"]))),
        r#"bcc[0]: "a@example.com, b@example.com" is not an email address"#
    );
    assert_eq!(
        error(&with("reply_to", json!("nobody"))),
        r#"reply_to: "nobody" is not an email address"#
    );
}

#[test]
fn a_long_bad_value_is_cut_short_in_the_error() {
    let long = "x".repeat(5000);
    let message = error(&with("from", json!(long)));
    assert!(message.len() < 200, "{message}");
    assert!(message.contains('…'), "{message}");
}

#[test]
fn line_breaks_in_any_header_are_refused() {
    assert_eq!(
        error(&with("subject", json!("Hi\r\nBcc: victim@example.com"))),
        "subject contains a line break"
    );
    assert_eq!(
        error(&with("subject", json!("Hi\nthere"))),
        "subject contains a line break"
    );
    assert_eq!(
        error(&with("from", json!("a@example.com\r\nBcc: v@example.com"))),
        "from contains a line break"
    );
    assert_eq!(
        error(&with(
            "to",
            json!(["a@example.com", "b@example.com\nBcc: v@x.example"])
        )),
        "to[1] contains a line break"
    );
    assert_eq!(
        error(&with("cc", json!(["Eve\r <e@example.com>"]))),
        "cc[0] contains a line break"
    );
    assert_eq!(
        error(&with("reply_to", json!("r@example.com\n"))),
        "reply_to contains a line break"
    );
    assert_eq!(
        error(&with("headers", json!({"X-A": "1\r\nBcc: v@example.com"}))),
        r#"headers["X-A"] contains a line break"#
    );
    assert_eq!(
        error(&with("headers", json!({"X-A\r\nBcc": "v@example.com"}))),
        "a header name contains a line break"
    );
}

#[test]
fn other_control_characters_are_refused_but_a_tab_is_fine() {
    assert_eq!(
        error(&with("subject", json!("Hi\u{0}"))),
        "subject contains a control character"
    );
    assert!(parse(&with("subject", json!("Hi\tthere"))).is_ok());
}

#[test]
fn header_names_must_be_field_names() {
    for name in ["X Campaign", "X:Campaign", "", "Ünïcode", &"X".repeat(77)] {
        let message = error(&with("headers", json!({ name: "v" })));
        assert!(
            message.starts_with("headers: ") && message.contains("is not a header field name"),
            "{name:?}: {message}"
        );
    }
}

#[test]
fn headers_the_mailer_sets_are_refused_in_any_case() {
    for name in [
        "From",
        "to",
        "CC",
        "Bcc",
        "Reply-To",
        "Sender",
        "subject",
        "Message-ID",
        "Date",
        "MIME-Version",
        "Return-Path",
        "Content-Type",
        "content-transfer-encoding",
        "Content-Disposition",
    ] {
        assert_eq!(
            error(&with("headers", json!({ name: "x" }))),
            format!(
                "headers: {name:?} is set by the mailer and cannot be given as an extra header"
            ),
        );
    }
}

#[test]
fn a_header_given_twice_in_different_case_is_refused() {
    assert_eq!(
        error(&with("headers", json!({"X-Tag": "a", "x-tag": "b"}))),
        r#"headers: "x-tag" is given more than once (header names ignore case)"#
    );
}

#[test]
fn reading_a_request_leaves_its_size_to_the_caller() {
    let mut large = minimal().to_string().into_bytes();
    large.resize(mail::DEFAULT_MAX_REQUEST_BYTES + 1, b' ');
    assert!(
        parse_request(&large, None).is_ok(),
        "the worker's limit decides"
    );
}

#[test]
fn a_body_that_is_not_json_is_refused() {
    let message = parse_request(b"{\"from\": ", None)
        .expect_err("not JSON")
        .to_string();
    assert!(
        message.starts_with("the request is not a mail request: "),
        "{message}"
    );
}

#[test]
fn a_parser_error_quoting_a_long_value_is_cut_short() {
    let message = error(&with("to", json!("x".repeat(5000))));
    assert!(message.contains("invalid type"), "{message}");
    assert!(message.chars().count() < 400, "{message}");
}

#[test]
fn the_message_id_takes_the_domain_of_from_unless_it_has_one() {
    let id = |amqp: &str| {
        parse_request(minimal().to_string().as_bytes(), Some(amqp))
            .map(|mail| mail.message_id().to_owned())
    };
    assert_eq!(id("order-42").as_deref(), Ok("<order-42@shop.example>"));
    assert_eq!(
        id("order-42@orders.example").as_deref(),
        Ok("<order-42@orders.example>")
    );
    let mail = parse(&minimal()).expect("valid");
    assert!(formatted(&mail).contains("Message-ID: <order-42@shop.example>\r\n"));
}

#[test]
fn the_same_request_id_gives_the_same_message_id_on_every_attempt() {
    let first = parse(&minimal()).expect("valid");
    let second = parse(&minimal()).expect("valid");
    assert_eq!(first.message_id(), second.message_id());
}

#[test]
fn without_a_message_id_a_random_one_at_the_domain_of_from_is_made() {
    let body = minimal().to_string();
    let first = parse_request(body.as_bytes(), None).expect("valid");
    let second = parse_request(body.as_bytes(), None).expect("valid");
    assert_ne!(first.message_id(), second.message_id());
    let id = first.message_id();
    assert!(
        id.starts_with('<') && id.ends_with("@shop.example>"),
        "{id}"
    );
    assert_eq!(id.len(), "<@shop.example>".len() + 32, "{id}");
}

#[test]
fn malformed_message_ids_are_refused() {
    for (amqp, problem) in [
        ("", "is empty"),
        ("a\r\nBcc: x", "contains a line break"),
        ("a>b", "contains \"<\" or \">\""),
        ("<a@b>", "contains \"<\" or \">\""),
        ("a b", "contains whitespace"),
        ("a\tb", "contains whitespace"),
        ("ä", "contains a character that is not printable ASCII"),
    ] {
        let message = parse_request(minimal().to_string().as_bytes(), Some(amqp))
            .expect_err("malformed")
            .to_string();
        assert_eq!(
            message,
            format!("the message id {amqp:?} is malformed: it {problem}")
        );
    }
}

#[test]
fn errors_never_quote_the_body() {
    let mut request = with("text", json!("SECRET BODY"));
    request["to"] = json!(["bob@"]);
    assert!(!error(&request).contains("SECRET"));
}

#[test]
fn the_debug_form_of_a_mail_leaves_out_its_body() {
    let shown = format!(
        "{:?}",
        parse(&with("text", json!("SECRET BODY"))).expect("valid")
    );
    assert!(!shown.contains("SECRET"), "{shown}");
    assert!(shown.contains("order-42@shop.example"), "{shown}");
}

#[test]
fn a_request_round_trips_through_json() {
    let request: MailRequest = serde_json::from_value(minimal()).expect("valid");
    assert_eq!(
        serde_json::to_value(&request).expect("serializes"),
        minimal()
    );
}

/// The published schema must match the type. After changing `MailRequest`, regenerate
/// it with `UPDATE_SCHEMAS=1 cargo test --lib` and commit the file.
#[test]
fn the_checked_in_schema_is_up_to_date() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("schemas")
        .join("mail-request.schema.json");
    let generated = serde_json::to_string_pretty(&request_schema()).expect("serializes") + "\n";
    if std::env::var_os("UPDATE_SCHEMAS").is_some() {
        std::fs::write(&path, &generated).expect("the schema is written");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{} is out of date; regenerate it with UPDATE_SCHEMAS=1 cargo test --lib",
        path.display()
    );
}

#[test]
fn the_schema_describes_every_field_and_refuses_unknown_ones() {
    let schema = request_schema();
    assert_eq!(schema["additionalProperties"], json!(false));
    let required = schema["required"].as_array().expect("required fields");
    assert!(required.contains(&json!("from")) && required.contains(&json!("subject")));
    let properties = schema["properties"].as_object().expect("properties");
    for field in [
        "from", "to", "cc", "bcc", "reply_to", "subject", "text", "html", "headers",
    ] {
        let description = properties[field]["description"]
            .as_str()
            .unwrap_or_default();
        assert!(!description.is_empty(), "{field} has no description");
    }
}

#[test]
fn the_worker_reads_the_fields_of_the_published_request() {
    let schema = request_schema();
    let mut published: Vec<&str> = schema["properties"]
        .as_object()
        .expect("properties")
        .keys()
        .map(String::as_str)
        .collect();
    published.sort_unstable();
    let mut read = wire::FIELDS.to_vec();
    read.sort_unstable();
    assert_eq!(read, published);
}

#[test]
fn a_body_is_checked_when_read_and_decoded_again_when_rendered() {
    // JSON escapes, and a dot at the start of a line.
    let body = r#"{"from": "a@shop.example", "to": ["b@example.com"], "subject": "s", "text": "line \"one\"\n.two \u0041"}"#;
    let mail = parse_request(body.as_bytes(), Some("id-1")).expect("valid");
    let shown = formatted(&mail);
    assert!(shown.contains("line \"one\"\r\n.two A"), "{shown}");
    for (field, value, problem) in [
        ("text", json!(5), "text: expected a string, found a number"),
        (
            "html",
            json!(["x"]),
            "html: expected a string, found an array",
        ),
    ] {
        let message = error(&with(field, value));
        assert!(message.contains(problem), "{message}");
    }
    let lone = r#"{"from": "a@shop.example", "to": ["b@example.com"], "subject": "s", "text": "\ud800 alone"}"#;
    let message = parse_request(lone.as_bytes(), None)
        .expect_err("a lone surrogate does not decode")
        .to_string();
    assert_eq!(
        message,
        "the request is not a mail request: text: a lone UTF-16 surrogate in a \\u escape"
    );
}

/// The plain-address path must read every string it takes exactly as lettre's mailbox
/// parser does: the same mailbox, or an error both ways. Strings are drawn from
/// characters around the edges (dots, `@`, atext symbols, a space, a quote, non-ASCII).
/// Indexes below a bound, drawn by a xorshift generator from `seed`: the same on every run.
fn draws(seed: u64) -> impl FnMut(usize) -> usize {
    let mut state = seed;
    move |bound| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % bound as u64) as usize
    }
}

/// Checks that each of `values` that `fast_path_takes` is read by [`parse_mailbox`] as
/// lettre's mailbox parser reads it; returns how many it took.
fn reads_as_the_parser(
    values: impl Iterator<Item = String>,
    fast_path_takes: impl Fn(&str) -> bool,
) -> usize {
    let mut taken = 0;
    for value in values.filter(|value| fast_path_takes(value)) {
        taken += 1;
        let fast = parse_mailbox(&value).ok();
        let parsed = value.parse::<Mailbox>().ok();
        assert_eq!(fast, parsed, "{value:?}");
    }
    taken
}

#[test]
fn a_plain_address_reads_as_the_mailbox_parser_reads_it() {
    let alphabet: Vec<char> = "ab.@@-_+!#'=?`{|}~Z9 \"<é.".chars().collect();
    let mut next = draws(0x9e37_79b9_7f4a_7c15);
    let mut fixed = vec![
        "a@example.com",
        "first.last+tag@sub.example.org",
        "a..b@example.com",
        ".a@example.com",
        "a.@example.com",
        "a@example..com",
        "a@.example.com",
        "a@example.com.",
        "@example.com",
        "a@",
        "a@b@c",
        "x@localhost",
    ]
    .into_iter()
    .map(str::to_string)
    .collect::<Vec<_>>();
    fixed.push(format!("{}@example.com", "u".repeat(65)));
    fixed.push(format!("a@{}.com", "d".repeat(64)));
    let drawn = (0..50_000).map(|_| {
        let len = 1 + next(14);
        (0..len)
            .map(|_| alphabet[next(alphabet.len())])
            .collect::<String>()
    });
    let plain = reads_as_the_parser(fixed.into_iter().chain(drawn), is_plain_address);
    assert!(plain > 1_000, "only {plain} plain addresses drawn");
}

#[test]
fn a_plain_name_and_address_reads_as_the_mailbox_parser_reads_it() {
    // Mostly what the fast path takes, with the characters around its edges mixed in.
    let name_chars: Vec<char> = "abcZ9-_+!'~   .\"()<>,@é".chars().collect();
    let address_chars: Vec<char> = "abcZ9-_+.'~ <>@é".chars().collect();
    let mut next = draws(0x2545_f491_4f6c_dd1d);
    let fixed = [
        "Shop <noreply@shop.example>",
        "Shop Team <noreply@shop.example>",
        "Shop  Team <a@b.example>",
        " Shop <a@b.example>",
        "Shop <a@b.example> ",
        "Shop<a@b.example>",
        "Shop <a@b.example>>",
        "Shop <<a@b.example>",
        "Shop. <a@b.example>",
        "Shop <a..b@example.com>",
        "\"Shop\" <a@b.example>",
        "Shop (us) <a@b.example>",
        " <a@b.example>",
        "<a@b.example>",
        "Shop <>",
        "=?utf-8?q?Shop?= <a@b.example>",
        "=?utf-8?b?U2hvcA==?= <a@b.example>",
    ]
    .map(str::to_string);
    let drawn = (0..50_000).map(|_| {
        let name: String = (0..1 + next(10))
            .map(|_| name_chars[next(name_chars.len())])
            .collect();
        let mut draw_address = |example: bool| -> String {
            if example {
                return "example.com".to_string();
            }
            (0..1 + next(6))
                .map(|_| address_chars[next(address_chars.len())])
                .collect()
        };
        let user = draw_address(false);
        let domain = draw_address(user.len() % 2 == 0);
        format!("{name} <{user}@{domain}>")
    });
    let taken = reads_as_the_parser(fixed.into_iter().chain(drawn), |value| {
        plain_name_addr(value).is_some()
    });
    assert!(taken > 500, "only {taken} plain names and addresses drawn");
}
