//! What each API checks of a request, and how it answers, as its documentation says:
//! SES v2 `SendEmail`, SendGrid v3 `mail/send`, Postmark `/email`, Mailgun
//! `messages.mime`.

use std::time::{Instant, SystemTime};

use axum::http::{HeaderMap, Method, Uri};
use base64::Engine;
use serde_json::{Value, json};

use super::sigv4::{self, Expected};
use super::{Answer, DOMAIN, KEY_ID, REGION, Received, Service};

/// A request the service refuses, and why.
pub struct Refused {
    pub status: u16,
    pub problem: String,
    pub answer: Answer,
}

fn refused(status: u16, problem: impl Into<String>, answer: Answer) -> Refused {
    Refused {
        status,
        problem: problem.into(),
        answer,
    }
}

/// Checks a request as `service` does; the mail it carries when it passes.
pub fn check(
    service: Service,
    key: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Received, Refused> {
    match service {
        Service::Ses => ses(key, method, uri, headers, body),
        Service::SendGrid => sendgrid(key, method, uri, headers, body),
        Service::Postmark => postmark(key, method, uri, headers, body),
        Service::Mailgun => mailgun(key, method, uri, headers, body),
    }
}

/// The service's answer to a mail it took.
pub fn accepted(service: Service, received: &Received) -> Answer {
    match service {
        Service::Ses => Answer::new(200, json!({"MessageId": "0102-stand-in"}).to_string()),
        Service::SendGrid => Answer::new(202, "").with_header("x-message-id", "stand-in"),
        Service::Postmark => Answer::new(
            200,
            json!({
                "To": received.json.get("To").cloned().unwrap_or_default(),
                "SubmittedAt": "2026-12-04T13:00:00.0000000-05:00",
                "MessageID": "b7bc2f4a-e38e-4336-af7d-e6c392c2f817",
                "ErrorCode": 0,
                "Message": "OK"
            })
            .to_string(),
        ),
        Service::Mailgun => Answer::new(
            200,
            json!({"id": received.message_id, "message": "Queued. Thank you."}).to_string(),
        ),
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn is_json(headers: &HeaderMap) -> bool {
    header(headers, "content-type").is_some_and(|t| t.starts_with("application/json"))
}

fn ses(
    key: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Received, Refused> {
    let error = |status: u16, kind: &str, message: &str| {
        refused(
            status,
            format!("{kind}: {message}"),
            Answer::new(status, json!({ "message": message }).to_string())
                .with_header("x-amzn-ErrorType", format!("{kind}:")),
        )
    };
    if method != Method::POST || uri.path() != mailer::provider::http::ses::PATH {
        return Err(error(404, "UnknownOperationException", uri.path()));
    }
    let expected = Expected {
        key_id: KEY_ID,
        secret: key,
        region: REGION,
        service: "ses",
        now: SystemTime::now(),
    };
    if let Err(problem) = sigv4::verify(&expected, method, uri, headers, body) {
        return Err(error(403, "InvalidSignatureException", &problem));
    }
    let bad = |message: &str| error(400, "BadRequestException", message);
    if !is_json(headers) {
        return Err(bad("the body must be application/json"));
    }
    let request: Value = serde_json::from_slice(body).map_err(|e| bad(&e.to_string()))?;
    if !request["FromEmailAddress"].is_string() {
        return Err(bad("FromEmailAddress is missing"));
    }
    let mut recipients = Vec::new();
    for list in ["ToAddresses", "CcAddresses", "BccAddresses"] {
        match &request["Destination"][list] {
            Value::Null => {}
            Value::Array(addresses) => {
                for address in addresses {
                    let address = address
                        .as_str()
                        .ok_or_else(|| bad("an address is no string"))?;
                    recipients.push(address.to_string());
                }
            }
            _ => return Err(bad(&format!("Destination.{list} is no list"))),
        }
    }
    if recipients.is_empty() {
        return Err(bad("the Destination names no recipient"));
    }
    if recipients.len() > 50 {
        return Err(bad("more than 50 recipients"));
    }
    let content = request["Content"]
        .as_object()
        .ok_or_else(|| bad("Content is missing"))?;
    if content.len() != 1 {
        return Err(bad(
            "Content must be exactly one of Simple, Raw and Template",
        ));
    }
    let data = content
        .get("Raw")
        .and_then(|raw| raw["Data"].as_str())
        .ok_or_else(|| bad("Content.Raw.Data is missing"))?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|_| bad("Content.Raw.Data is not base64"))?;
    let raw = String::from_utf8(raw).map_err(|_| bad("the raw message is not UTF-8"))?;
    let message_id =
        mime_header(&raw, "message-id").ok_or_else(|| bad("the raw message has no Message-ID"))?;
    if mime_header(&raw, "from").is_none() {
        return Err(bad("the raw message has no From"));
    }
    Ok(Received {
        at: Instant::now(),
        message_id,
        recipients,
        json: request,
        raw: Some(raw),
    })
}

fn sendgrid(
    key: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Received, Refused> {
    let error = |status: u16, field: Option<&str>, message: &str| {
        refused(
            status,
            format!("{}: {message}", field.unwrap_or("-")),
            Answer::new(
                status,
                json!({"errors": [{"message": message, "field": field, "help": null}]}).to_string(),
            ),
        )
    };
    if method != Method::POST || uri.path() != mailer::provider::http::sendgrid::PATH {
        return Err(error(404, None, "Not Found"));
    }
    if header(headers, "authorization") != Some(&format!("Bearer {key}")) {
        return Err(error(
            401,
            None,
            "The provided authorization grant is invalid, expired, or revoked",
        ));
    }
    if !is_json(headers) {
        return Err(error(415, None, "Content-Type should be application/json."));
    }
    let request: Value =
        serde_json::from_slice(body).map_err(|_| error(400, None, "Bad Request"))?;
    let bad = |field: &str, message: &str| error(400, Some(field), message);
    let personalizations = request["personalizations"]
        .as_array()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| bad("personalizations", "The personalizations field is required and must have at least one personalization."))?;
    let mut recipients = Vec::new();
    for personalization in personalizations {
        let to = personalization["to"].as_array().filter(|to| !to.is_empty());
        if to.is_none() {
            return Err(bad(
                "personalizations.0.to",
                "The to array is required for all personalization objects, and must have at least one email object with a valid email address.",
            ));
        }
        for list in ["to", "cc", "bcc"] {
            for person in personalization[list].as_array().into_iter().flatten() {
                let email = person["email"]
                    .as_str()
                    .ok_or_else(|| bad(list, "Each email address must have an email field."))?;
                recipients.push(email.to_string());
            }
        }
    }
    if !request["from"]["email"].is_string() {
        return Err(bad(
            "from.email",
            "The from object must be provided for every email send.",
        ));
    }
    if request["subject"].as_str().is_none_or(str::is_empty) {
        return Err(bad("subject", "The subject is required."));
    }
    let content = request["content"]
        .as_array()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            bad(
                "content",
                "Unless a valid template_id is provided, the content parameter is required.",
            )
        })?;
    for (index, part) in content.iter().enumerate() {
        let kind = part["type"].as_str().unwrap_or_default();
        if kind.is_empty() || part["value"].as_str().is_none_or(str::is_empty) {
            return Err(bad("content", "Each content must have a type and a value."));
        }
        if kind == "text/plain" && index != 0 {
            return Err(bad("content", "If present, text/plain must be first."));
        }
    }
    let mut message_id = String::new();
    if let Some(extra) = request["headers"].as_object() {
        for (name, value) in extra {
            let reserved = [
                "from",
                "to",
                "cc",
                "bcc",
                "subject",
                "reply-to",
                "content-type",
                "content-transfer-encoding",
                "x-sg-id",
                "x-sg-eid",
                "received",
                "dkim-signature",
            ];
            if reserved.contains(&name.to_ascii_lowercase().as_str()) {
                return Err(bad("headers", &format!("{name} is a reserved header.")));
            }
            let value = value
                .as_str()
                .ok_or_else(|| bad("headers", "Header values must be strings."))?;
            if name.eq_ignore_ascii_case("message-id") {
                message_id = value.to_string();
            }
        }
    }
    Ok(Received {
        at: Instant::now(),
        message_id,
        recipients,
        json: request,
        raw: None,
    })
}

fn postmark(
    key: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Received, Refused> {
    let error = |status: u16, code: u16, message: &str| {
        refused(
            status,
            format!("ErrorCode {code}: {message}"),
            Answer::new(
                status,
                json!({"ErrorCode": code, "Message": message}).to_string(),
            ),
        )
    };
    if method != Method::POST || uri.path() != mailer::provider::http::postmark::PATH {
        return Err(error(404, 0, "Not Found"));
    }
    if header(headers, "x-postmark-server-token") != Some(key) {
        return Err(error(
            401,
            10,
            "The Server Token you provided in the X-Postmark-Server-Token request header was invalid.",
        ));
    }
    if !is_json(headers) || header(headers, "accept") != Some("application/json") {
        return Err(error(
            415,
            0,
            "Accept and Content-Type must be application/json.",
        ));
    }
    let request: Value = serde_json::from_slice(body).map_err(|_| {
        error(
            422,
            402,
            "The JSON input you provided is syntactically incorrect.",
        )
    })?;
    let bad = |message: &str| error(422, 300, message);
    if request["From"].as_str().is_none_or(str::is_empty) {
        return Err(bad("Invalid 'From' address: ''."));
    }
    let mut recipients = Vec::new();
    for field in ["To", "Cc", "Bcc"] {
        let Some(list) = request[field].as_str() else {
            continue;
        };
        let addresses: Vec<String> = list.split(',').map(address).collect();
        if addresses.len() > 50 {
            return Err(bad(&format!("{field} has more than 50 recipients.")));
        }
        recipients.extend(addresses);
    }
    if !request["To"].is_string() {
        return Err(bad("Zero recipients specified"));
    }
    if !request["TextBody"].is_string() && !request["HtmlBody"].is_string() {
        return Err(bad("Provide either email TextBody or HtmlBody or both."));
    }
    let mut message_id = String::new();
    for entry in request["Headers"].as_array().into_iter().flatten() {
        let (Some(name), Some(value)) = (entry["Name"].as_str(), entry["Value"].as_str()) else {
            return Err(bad("Headers must be a list of Name and Value."));
        };
        if name.eq_ignore_ascii_case("message-id") {
            message_id = value.to_string();
        }
    }
    Ok(Received {
        at: Instant::now(),
        message_id,
        recipients,
        json: request,
        raw: None,
    })
}

fn mailgun(
    key: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Received, Refused> {
    let bad = |status: u16, message: &str| {
        refused(
            status,
            message.to_string(),
            Answer::new(status, json!({ "message": message }).to_string()),
        )
    };
    if method != Method::POST || uri.path() != mailer::provider::http::mailgun::path(DOMAIN) {
        return Err(bad(404, &format!("Domain not found: {}", uri.path())));
    }
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("api:{key}"));
    if header(headers, "authorization") != Some(&format!("Basic {basic}")) {
        return Err(refused(401, "Forbidden", Answer::new(401, "Forbidden")));
    }
    let boundary = header(headers, "content-type")
        .and_then(|t| t.strip_prefix("multipart/form-data; boundary="))
        .ok_or_else(|| bad(400, "the body must be multipart/form-data"))?;
    let fields = form_fields(body, boundary).ok_or_else(|| bad(400, "malformed multipart body"))?;
    let field = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.clone())
    };
    let to = field("to").ok_or_else(|| bad(400, "to parameter is missing"))?;
    let raw = field("message").ok_or_else(|| bad(400, "message parameter is missing"))?;
    let message_id =
        mime_header(&raw, "message-id").ok_or_else(|| bad(400, "the message has no Message-ID"))?;
    Ok(Received {
        at: Instant::now(),
        message_id,
        recipients: to.split(',').map(address).collect(),
        json: json!({ "to": to }),
        raw: Some(raw),
    })
}

/// The bare address of `Name <address>` or `address`.
fn address(text: &str) -> String {
    let text = text.trim();
    match (text.rfind('<'), text.rfind('>')) {
        (Some(open), Some(close)) if open < close => text[open + 1..close].to_string(),
        _ => text.to_string(),
    }
}

/// The named form fields of a `multipart/form-data` body.
fn form_fields(body: &[u8], boundary: &str) -> Option<Vec<(String, String)>> {
    let body = std::str::from_utf8(body).ok()?;
    let delimiter = format!("--{boundary}");
    let mut fields = Vec::new();
    let mut parts = body.split(delimiter.as_str());
    parts.next()?;
    for part in parts {
        if part.starts_with("--") {
            return Some(fields);
        }
        let part = part.strip_prefix("\r\n")?;
        let (head, value) = part.split_once("\r\n\r\n")?;
        let name = head.split("name=\"").nth(1)?.split('"').next()?.to_string();
        fields.push((name, value.strip_suffix("\r\n")?.to_string()));
    }
    None
}

/// The value of a MIME message's header `name` (lowercase), unfolded.
pub fn mime_header(message: &str, name: &str) -> Option<String> {
    let head = message.split("\r\n\r\n").next()?;
    let unfolded = head.replace("\r\n ", " ").replace("\r\n\t", " ");
    unfolded.split("\r\n").find_map(|line| {
        let (field, value) = line.split_once(':')?;
        field
            .eq_ignore_ascii_case(name)
            .then(|| value.trim().to_string())
    })
}
