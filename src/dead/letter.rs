//! What a dead letter says about itself: why it died and when, how many attempts it had,
//! who it was for, read from its headers and (leniently) from its body.

use std::collections::BTreeSet;
use std::time::SystemTime;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::Value;

use super::value;
use crate::mail::{
    ATTEMPT_HEADER, DEAD_AT_HEADER, DEAD_ATTEMPTS_HEADER, DEAD_ERROR_HEADER, DEAD_REASON_HEADER,
    DEATH_HEADER, REPLAYS_HEADER,
};

/// Who dead-lettered a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadBy {
    /// The worker, which set `x-mail-dead-reason`.
    Worker,
    /// RabbitMQ, from the named queue (the newest `x-death` entry).
    Broker { queue: Option<String> },
    /// Neither says why: a message someone published to the dead exchange by hand.
    Unknown,
}

/// One dead letter as `mailer dead` shows and filters it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    pub message_id: Option<String>,
    /// `x-mail-dead-reason` when the worker set it, else the reason of the newest
    /// `x-death` entry (never `x-first-death-reason`, which may be the `expired` of an
    /// earlier trip through the delay queue), else `unknown`.
    pub reason: String,
    pub by: DeadBy,
    /// The worker's count of attempts; for a request the broker dead-lettered, the
    /// attempt it was on.
    pub attempts: Option<u32>,
    /// When it died: `x-mail-dead-at`, or the time of the newest `x-death` entry.
    pub dead_at: Option<SystemTime>,
    pub to: Vec<String>,
    pub cc: Vec<String>,
    pub bcc: Vec<String>,
    pub subject: Option<String>,
    pub error: Option<String>,
    /// How many times it was replayed before.
    pub replays: u32,
}

/// The reason of a dead letter that says nothing about why it died.
pub const UNKNOWN_REASON: &str = "unknown";

impl DeadLetter {
    pub fn read(properties: &BasicProperties, body: &[u8]) -> Self {
        let empty = FieldTable::default();
        let headers = properties.headers().as_ref().unwrap_or(&empty).inner();
        let header = |name: &str| headers.get(name);
        let newest_death = header(DEATH_HEADER).and_then(newest_death);
        let death_field = |field: &str| newest_death.and_then(|d| d.inner().get(field));

        let worker_reason = header(DEAD_REASON_HEADER).and_then(value::text);
        let broker_reason = death_field("reason").and_then(value::text);
        let (reason, by) = match (worker_reason, broker_reason) {
            (Some(reason), _) => (reason, DeadBy::Worker),
            (None, Some(reason)) => {
                let queue = death_field("queue").and_then(value::text);
                (reason, DeadBy::Broker { queue })
            }
            (None, None) => (UNKNOWN_REASON.to_string(), DeadBy::Unknown),
        };
        let attempts = match by {
            DeadBy::Worker => header(DEAD_ATTEMPTS_HEADER).and_then(value::integer),
            // The broker moves a request as it is: without an attempt header it was on
            // its first attempt.
            DeadBy::Broker { .. } => header(ATTEMPT_HEADER).map_or(Some(1), value::integer),
            DeadBy::Unknown => header(ATTEMPT_HEADER).and_then(value::integer),
        }
        .and_then(|n| u32::try_from(n).ok());
        let dead_at = header(DEAD_AT_HEADER)
            .and_then(value::time)
            .or_else(|| death_field("time").and_then(value::time));
        let error = match &by {
            DeadBy::Worker => header(DEAD_ERROR_HEADER).and_then(value::text),
            DeadBy::Broker { queue } => Some(format!(
                "dead-lettered by RabbitMQ from queue {} ({reason})",
                queue.as_deref().unwrap_or("?")
            )),
            DeadBy::Unknown => None,
        };
        let replays = header(REPLAYS_HEADER)
            .and_then(value::integer)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0);
        let request = serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
        let addresses = |field: &str| match request.get(field) {
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(|item| item.as_str().map(str::to_string))
                .collect(),
            Some(Value::String(one)) => vec![one.clone()],
            _ => Vec::new(),
        };
        Self {
            message_id: properties.message_id().as_ref().map(|id| id.to_string()),
            reason,
            by,
            attempts,
            dead_at,
            to: addresses("to"),
            cc: addresses("cc"),
            bcc: addresses("bcc"),
            subject: request
                .get("subject")
                .and_then(Value::as_str)
                .map(str::to_string),
            error,
            replays,
        }
    }

    /// The lower-cased domains of every recipient (to, cc and bcc).
    pub fn domains(&self) -> BTreeSet<String> {
        self.to
            .iter()
            .chain(&self.cc)
            .chain(&self.bcc)
            .filter_map(|address| domain_of(address))
            .collect()
    }
}

/// The newest entry of an `x-death` array: RabbitMQ puts the latest death first.
fn newest_death(deaths: &AMQPValue) -> Option<&FieldTable> {
    let AMQPValue::FieldArray(deaths) = deaths else {
        return None;
    };
    match deaths.as_slice().first()? {
        AMQPValue::FieldTable(death) => Some(death),
        _ => None,
    }
}

/// The domain of `Name <user@domain>` or `user@domain`, lower-cased.
pub fn domain_of(address: &str) -> Option<String> {
    let address = match (address.rfind('<'), address.rfind('>')) {
        (Some(open), Some(close)) if open < close => &address[open + 1..close],
        _ => address,
    };
    let (_, domain) = address.trim().rsplit_once('@')?;
    let domain = domain.trim().trim_end_matches('.');
    (!domain.is_empty()).then(|| domain.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use lapin::types::{FieldArray, LongString};
    use serde_json::json;

    use super::*;

    fn properties(headers: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert((*name).into(), value.clone());
        }
        BasicProperties::default()
            .with_message_id("order-42".into())
            .with_headers(table)
    }

    fn string(s: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(s))
    }

    fn death(reason: &str, queue: &str, time: u64) -> AMQPValue {
        let mut death = FieldTable::default();
        death.insert("reason".into(), string(reason));
        death.insert("queue".into(), string(queue));
        death.insert("time".into(), AMQPValue::Timestamp(time));
        death.insert("count".into(), AMQPValue::LongLongInt(1));
        AMQPValue::FieldTable(death)
    }

    const BODY: &[u8] = br#"{"from": "a@shop.example", "to": ["Alice <alice@Example.COM>", "bob@example.org"], "bcc": ["c@example.net"], "subject": "Your order", "text": "x"}"#;

    #[test]
    fn the_workers_reason_and_its_headers() {
        let letter = DeadLetter::read(
            &properties(&[
                ("x-mail-dead-reason", string("gave-up")),
                ("x-mail-dead-attempts", AMQPValue::LongLongInt(5)),
                ("x-mail-dead-error", string("smtp: 450 try later")),
                ("x-mail-dead-at", AMQPValue::Timestamp(1_700_000_000)),
                ("x-mail-replays", AMQPValue::LongLongInt(2)),
                (
                    "x-death",
                    AMQPValue::FieldArray(FieldArray::from(vec![death(
                        "expired",
                        "mail.send.retry",
                        1,
                    )])),
                ),
            ]),
            BODY,
        );
        assert_eq!(letter.reason, "gave-up");
        assert_eq!(letter.by, DeadBy::Worker);
        assert_eq!(letter.attempts, Some(5));
        assert_eq!(letter.error.as_deref(), Some("smtp: 450 try later"));
        assert_eq!(letter.dead_at, Some(value::timestamp(1_700_000_000)));
        assert_eq!(letter.replays, 2);
        assert_eq!(letter.message_id.as_deref(), Some("order-42"));
        assert_eq!(letter.subject.as_deref(), Some("Your order"));
        assert_eq!(
            letter.domains(),
            BTreeSet::from([
                "example.com".to_string(),
                "example.net".into(),
                "example.org".into()
            ])
        );
    }

    #[test]
    fn the_brokers_reason_is_its_newest_death_not_its_first() {
        let letter = DeadLetter::read(
            &properties(&[
                ("x-first-death-reason", string("expired")),
                ("x-mail-attempt", AMQPValue::LongLongInt(2)),
                (
                    "x-death",
                    AMQPValue::FieldArray(FieldArray::from(vec![
                        death("delivery_limit", "mail.send", 1_700_000_100),
                        death("expired", "mail.send.retry", 1_700_000_000),
                    ])),
                ),
            ]),
            BODY,
        );
        assert_eq!(letter.reason, "delivery_limit");
        assert_eq!(
            letter.by,
            DeadBy::Broker {
                queue: Some("mail.send".into())
            }
        );
        assert_eq!(letter.attempts, Some(2));
        assert_eq!(letter.dead_at, Some(value::timestamp(1_700_000_100)));
        assert_eq!(
            letter.error.as_deref(),
            Some("dead-lettered by RabbitMQ from queue mail.send (delivery_limit)")
        );
    }

    #[test]
    fn a_letter_that_says_nothing_and_a_body_that_is_not_a_request() {
        let letter = DeadLetter::read(&BasicProperties::default(), b"\xff\x00 not json");
        assert_eq!(letter.reason, UNKNOWN_REASON);
        assert_eq!(letter.by, DeadBy::Unknown);
        assert_eq!(letter.message_id, None);
        assert_eq!(letter.dead_at, None);
        assert!(letter.to.is_empty() && letter.subject.is_none());
        let one = DeadLetter::read(
            &BasicProperties::default(),
            &serde_json::to_vec(&json!({"to": "x@y.example", "subject": 7})).unwrap(),
        );
        assert_eq!(one.to, ["x@y.example"]);
        assert_eq!(one.subject, None);
    }

    #[test]
    fn domains_of_addresses_with_and_without_names() {
        assert_eq!(domain_of("Alice <a@Ex.COM>").as_deref(), Some("ex.com"));
        assert_eq!(domain_of(" b@ex.org. ").as_deref(), Some("ex.org"));
        assert_eq!(domain_of("nobody"), None);
        assert_eq!(domain_of("x@"), None);
    }
}
