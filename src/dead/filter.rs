//! Which dead letters a command acts on: the same filters for every subcommand.

use std::time::{Duration, SystemTime};

use super::letter::DeadLetter;
use crate::mail::{BrokerDeadReason, DeadReason};

/// Dead letters to act on; an empty list matches anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Any of these reasons.
    pub reasons: Vec<String>,
    /// Dead at least this long ago. A letter that does not say when it died never
    /// matches an age.
    pub older_than: Option<Duration>,
    /// Dead at most this long ago.
    pub newer_than: Option<Duration>,
    /// A recipient (to, cc or bcc) in any of these domains, lower-cased.
    pub to_domains: Vec<String>,
    /// Any of these message ids.
    pub message_ids: Vec<String>,
    /// Act on at most this many matches, the first in the queue.
    pub limit: Option<usize>,
}

impl Filter {
    pub fn matches(&self, letter: &DeadLetter, now: SystemTime) -> bool {
        let age = letter
            .dead_at
            .map(|at| now.duration_since(at).unwrap_or_default());
        (self.reasons.is_empty() || self.reasons.contains(&letter.reason))
            && self
                .older_than
                .is_none_or(|min| age.is_some_and(|age| age >= min))
            && self
                .newer_than
                .is_none_or(|max| age.is_some_and(|age| age <= max))
            && (self.to_domains.is_empty() || {
                let domains = letter.domains();
                self.to_domains.iter().any(|d| domains.contains(d))
            })
            && (self.message_ids.is_empty()
                || letter
                    .message_id
                    .as_ref()
                    .is_some_and(|id| self.message_ids.contains(id)))
    }

    /// Whether `matched` matches are all this filter lets a command act on.
    pub fn is_full(&self, matched: usize) -> bool {
        self.limit.is_some_and(|limit| matched >= limit)
    }
}

/// Every reason a dead letter can have: the worker's, then the broker's.
pub fn known_reasons() -> Vec<&'static str> {
    let mut reasons: Vec<&str> = DeadReason::ALL.iter().map(|r| r.as_str()).collect();
    for reason in BrokerDeadReason::ALL {
        if !reasons.contains(&reason.as_str()) {
            reasons.push(reason.as_str());
        }
    }
    reasons
}

/// A `--reason` value, checked against the reasons that exist.
pub fn parse_reason(value: &str) -> Result<String, String> {
    let known = known_reasons();
    if known.contains(&value) {
        Ok(value.to_string())
    } else {
        Err(format!(
            "{value:?} is not a reason; use one of {}",
            known.join(", ")
        ))
    }
}

/// A `--older-than`/`--newer-than` value such as `30m`, `2h`, `1h30m` or `7d`.
pub fn parse_age(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value)
        .map_err(|e| format!("{value:?} is not a duration such as 30m, 2h or 7d: {e}"))
}

/// A `--to-domain` value, lower-cased, without a leading `@`.
pub fn parse_domain(value: &str) -> Result<String, String> {
    let domain = value.trim().trim_start_matches('@').to_ascii_lowercase();
    if domain.is_empty() || domain.contains(['@', ' ', '<', '>']) {
        return Err(format!("{value:?} is not a domain such as example.com"));
    }
    Ok(domain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dead::letter::DeadBy;

    fn letter(reason: &str, dead_secs_ago: Option<u64>, now: SystemTime) -> DeadLetter {
        DeadLetter {
            message_id: Some(format!("{reason}-1")),
            reason: reason.into(),
            by: DeadBy::Worker,
            attempts: Some(1),
            dead_at: dead_secs_ago.map(|s| now - Duration::from_secs(s)),
            to: vec!["Alice <alice@example.com>".into()],
            cc: vec![],
            bcc: vec!["audit@example.org".into()],
            subject: None,
            error: None,
            replays: 0,
        }
    }

    #[test]
    fn every_filter_narrows() {
        let now = SystemTime::now();
        let gave_up = letter("gave-up", Some(7200), now);
        let anything = Filter::default();
        assert!(anything.matches(&gave_up, now));

        let by_reason = Filter {
            reasons: vec!["rejected".into(), "gave-up".into()],
            ..Filter::default()
        };
        assert!(by_reason.matches(&gave_up, now));
        assert!(!by_reason.matches(&letter("malformed", Some(1), now), now));

        let older = Filter {
            older_than: Some(Duration::from_secs(3600)),
            ..Filter::default()
        };
        assert!(older.matches(&gave_up, now));
        assert!(!older.matches(&letter("gave-up", Some(60), now), now));
        assert!(
            !older.matches(&letter("gave-up", None, now), now),
            "an unknown age matches no age"
        );
        let newer = Filter {
            newer_than: Some(Duration::from_secs(3600)),
            ..Filter::default()
        };
        assert!(!newer.matches(&gave_up, now));
        assert!(newer.matches(&letter("gave-up", Some(60), now), now));

        let domain = |d: &str| Filter {
            to_domains: vec![d.into()],
            ..Filter::default()
        };
        assert!(domain("example.com").matches(&gave_up, now));
        assert!(domain("example.org").matches(&gave_up, now), "bcc counts");
        assert!(!domain("example.net").matches(&gave_up, now));

        let by_id = Filter {
            message_ids: vec!["gave-up-1".into()],
            ..Filter::default()
        };
        assert!(by_id.matches(&gave_up, now));
        assert!(!by_id.matches(&letter("rejected", None, now), now));
    }

    #[test]
    fn values_are_checked() {
        assert_eq!(parse_reason("delivery_limit"), Ok("delivery_limit".into()));
        assert_eq!(parse_reason("too-large"), Ok("too-large".into()));
        let err = parse_reason("gaveup").unwrap_err();
        assert!(
            err.contains(
                "malformed, gave-up, rejected, too-large, delivery_limit, expired, maxlen"
            ),
            "{err}"
        );
        assert_eq!(parse_age("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert!(parse_age("soon").is_err());
        assert_eq!(parse_domain("@Example.COM"), Ok("example.com".into()));
        assert!(parse_domain("a@b.example").is_err());
        let limited = Filter {
            limit: Some(2),
            ..Filter::default()
        };
        assert!(!limited.is_full(1) && limited.is_full(2));
        assert!(!Filter::default().is_full(1_000_000));
    }
}
