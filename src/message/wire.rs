//! A request as it is read off the wire: the fields of [`super::MailRequest`], with the
//! bodies checked but not kept, so that reading a request of 10 MiB does not copy it.
//! The provider that renders the mail reads the bodies again ([`Bodies`]).

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// [`super::MailRequest`] as the worker reads it; `tests.rs` holds the two to the same
/// fields.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WireRequest {
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
    #[serde(default)]
    pub text: Option<BodyCheck>,
    #[serde(default)]
    pub html: Option<BodyCheck>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// The field names of [`WireRequest`], for the test that holds it to `MailRequest`.
#[cfg(test)]
pub(super) const FIELDS: [&str; 9] = [
    "from", "to", "cc", "bcc", "reply_to", "subject", "text", "html", "headers",
];

/// A body field, checked to be a string that decodes (valid escapes, no lone surrogate)
/// as reading it into a `String` would, without keeping it: whether it is empty.
pub(super) struct BodyCheck {
    pub empty: bool,
}

impl<'de> Deserialize<'de> for BodyCheck {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(IsEmpty)
    }
}

/// Takes any JSON string, escaped or not, and keeps only whether it was empty.
struct IsEmpty;

impl<'de> Visitor<'de> for IsEmpty {
    type Value = BodyCheck;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<BodyCheck, E> {
        Ok(BodyCheck {
            empty: value.is_empty(),
        })
    }
}

impl BodyCheck {
    /// Whether a body field gives a body: present, not null and not empty.
    pub fn given(field: &Option<Self>) -> bool {
        field.as_ref().is_some_and(|body| !body.empty)
    }
}

/// The bodies of a request that was checked, read again to render its mail. The other
/// fields are skipped.
#[derive(Deserialize)]
pub(super) struct Bodies {
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub html: Option<String>,
}
