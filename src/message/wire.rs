//! A request as it is read off the wire: the fields of [`super::MailRequest`], with the
//! bodies borrowed as their JSON literals, checked ([`super::body_text`]) but not kept,
//! so that reading a request of 10 MiB does not copy it. The provider that renders the
//! mail reads the bodies again ([`Bodies`]).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;

/// [`super::MailRequest`] as the worker reads it; `tests.rs` holds the two to the same
/// fields.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WireRequest<'a> {
    pub from: String,
    #[serde(default)]
    pub to: Vec<String>,
    #[serde(default)]
    pub cc: Vec<String>,
    #[serde(default)]
    pub bcc: Vec<String>,
    #[serde(default)]
    pub reply_to: Option<String>,
    pub subject: String,
    #[serde(default, borrow)]
    pub text: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub html: Option<&'a RawValue>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// The field names of [`WireRequest`], for the test that holds it to `MailRequest`.
#[cfg(test)]
pub(super) const FIELDS: [&str; 9] = [
    "from", "to", "cc", "bcc", "reply_to", "subject", "text", "html", "headers",
];

/// The bodies of a request that was checked, read again to render its mail. The other
/// fields are skipped.
#[derive(Deserialize)]
pub(super) struct Bodies<'a> {
    #[serde(default, borrow)]
    pub text: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub html: Option<&'a RawValue>,
}
