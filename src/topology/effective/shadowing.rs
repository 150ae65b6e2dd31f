//! Whether a policy of ours applies as written: [`shadowing`].

use std::fmt;

use serde_json::Value;

use super::EffectivePolicy;
use crate::topology::desired::Policy;

/// A policy of ours that does not apply as written: another policy applies instead, none
/// does, or an operator policy changes what it sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Shadowing {
    pub queue: String,
    /// The name of our policy.
    pub ours: String,
    /// The policy that applies to the queue, if any: ours when only an operator policy
    /// changes it.
    pub applied: Option<String>,
    pub operator_policy: Option<String>,
    /// What ours sets that the queue does not get, by key.
    pub lost: Vec<LostSetting>,
}

/// A key our policy sets, and what the queue has of it instead.
#[derive(Debug, Clone, PartialEq)]
pub struct LostSetting {
    pub key: String,
    pub ours: Value,
    /// The effective value, or `None` when the key is not set at all.
    pub now: Option<Value>,
}

impl Shadowing {
    /// Whether our policy is the one that applies (and only an operator policy changes it).
    pub fn ours_applies(&self) -> bool {
        self.applied.as_deref() == Some(self.ours.as_str())
    }
}

/// Whether `ours`, written for `effective.queue`, does not apply as written; `None` when
/// it applies and the queue gets every key it sets, with the same value. Keys that only
/// the other policy or the operator policy set are not our loss, and are not listed.
pub fn shadowing(ours: &Policy, effective: &EffectivePolicy) -> Option<Shadowing> {
    let lost: Vec<LostSetting> = ours
        .definition
        .iter()
        .filter_map(|(key, value)| {
            let now = effective.definition.get(key);
            let kept = now.is_some_and(|now| same_value(now, value));
            (!kept).then(|| LostSetting {
                key: key.clone(),
                ours: value.clone(),
                now: now.cloned(),
            })
        })
        .collect();
    let ours_applies = effective.policy.as_deref() == Some(ours.name.as_str());
    if ours_applies && lost.is_empty() {
        return None;
    }
    Some(Shadowing {
        queue: effective.queue.clone(),
        ours: ours.name.clone(),
        applied: effective.policy.clone(),
        operator_policy: effective.operator_policy.clone(),
        lost,
    })
}

/// JSON values equal as RabbitMQ takes them: numbers by value (300000 and 300000.0).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        _ => a == b,
    }
}

impl fmt::Display for Shadowing {
    /// One line, for a Kubernetes condition's message or a command's error.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (queue, ours) = (&self.queue, &self.ours);
        match (&self.applied, &self.operator_policy) {
            (Some(applied), _) if applied != ours => write!(
                f,
                "policy {applied:?} applies to queue {queue:?} instead of {ours:?} (one of a higher priority wins)"
            )?,
            (None, _) => write!(
                f,
                "no policy applies to queue {queue:?}: {ours:?} is missing or does not match it"
            )?,
            (Some(_), Some(operator)) => write!(
                f,
                "operator policy {operator:?} overrides {ours:?} on queue {queue:?}"
            )?,
            (Some(_), None) => write!(
                f,
                "queue {queue:?} does not yet have what {ours:?} sets (the broker reports a policy's changes within 5 s)"
            )?,
        }
        let taken: Vec<String> = self
            .lost
            .iter()
            .filter(|lost| lost.now.is_none())
            .map(|lost| format!("{} {}", lost.key, lost.ours))
            .collect();
        let changed: Vec<String> = self
            .lost
            .iter()
            .filter_map(|lost| {
                let now = lost.now.as_ref()?;
                Some(format!("{} from {} to {now}", lost.key, lost.ours))
            })
            .collect();
        if !taken.is_empty() {
            write!(f, "; it takes away {}", taken.join(", "))?;
        }
        if !changed.is_empty() {
            write!(f, "; it changes {}", changed.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, json};

    use super::*;

    fn map(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    fn effective(policy: Option<&str>, definition: Value) -> EffectivePolicy {
        EffectivePolicy {
            queue: "mail.send.dead".into(),
            policy: policy.map(str::to_string),
            operator_policy: None,
            definition: map(definition),
            arguments: Map::new(),
        }
    }

    fn retry_policy() -> Policy {
        Policy {
            name: "mailer.mail.send.retry".into(),
            pattern: r"^mail\.send\.retry$".into(),
            definition: map(json!({
                "message-ttl": 300000,
                "dead-letter-exchange": "mail",
                "overflow": "reject-publish",
            })),
        }
    }

    fn retry_queue(policy: Option<&str>, definition: Value) -> EffectivePolicy {
        EffectivePolicy {
            queue: "mail.send.retry".into(),
            ..effective(policy, definition)
        }
    }

    #[test]
    fn ours_applied_as_written_is_not_shadowed() {
        let ours = retry_policy();
        let applied = retry_queue(
            Some("mailer.mail.send.retry"),
            json!({"message-ttl": 300000.0, "dead-letter-exchange": "mail", "overflow": "reject-publish", "max-length": 10}),
        );
        assert_eq!(shadowing(&ours, &applied), None);
    }

    #[test]
    fn a_policy_of_higher_priority_takes_away_what_ours_sets() {
        let ours = retry_policy();
        let other = retry_queue(
            Some("platform.all"),
            json!({"overflow": "reject-publish", "max-length": 1000}),
        );
        let shadowed = shadowing(&ours, &other).expect("shadowed");
        assert_eq!(shadowed.applied.as_deref(), Some("platform.all"));
        assert!(!shadowed.ours_applies());
        let keys: Vec<&str> = shadowed.lost.iter().map(|l| l.key.as_str()).collect();
        assert_eq!(keys, ["dead-letter-exchange", "message-ttl"]);
        assert_eq!(
            shadowed.to_string(),
            r#"policy "platform.all" applies to queue "mail.send.retry" instead of "mailer.mail.send.retry" (one of a higher priority wins); it takes away dead-letter-exchange "mail", message-ttl 300000"#
        );
    }

    #[test]
    fn another_policy_that_sets_the_same_is_still_named() {
        let ours = retry_policy();
        let same = retry_queue(
            Some("copy"),
            json!({"message-ttl": 300000, "dead-letter-exchange": "mail", "overflow": "reject-publish"}),
        );
        let shadowed = shadowing(&ours, &same).expect("another policy applies");
        assert!(shadowed.lost.is_empty());
        assert_eq!(
            shadowed.to_string(),
            r#"policy "copy" applies to queue "mail.send.retry" instead of "mailer.mail.send.retry" (one of a higher priority wins)"#
        );
    }

    #[test]
    fn no_policy_at_all_loses_everything() {
        let ours = retry_policy();
        let none = retry_queue(None, json!({}));
        let shadowed = shadowing(&ours, &none).expect("shadowed");
        assert_eq!(shadowed.lost.len(), 3);
        assert!(
            shadowed.to_string().starts_with(
                r#"no policy applies to queue "mail.send.retry": "mailer.mail.send.retry" is missing or does not match it; it takes away "#
            ),
            "{shadowed}"
        );
    }

    #[test]
    fn an_operator_policy_that_changes_a_key_of_ours_shadows_it() {
        let ours = Policy {
            name: "mailer.mail.send.dead".into(),
            pattern: r"^mail\.send\.dead$".into(),
            definition: map(json!({"delivery-limit": -1, "overflow": "reject-publish"})),
        };
        let mut overridden = effective(
            Some("mailer.mail.send.dead"),
            json!({"delivery-limit": 3, "overflow": "reject-publish", "max-length": 500}),
        );
        overridden.operator_policy = Some("limits".into());
        let shadowed = shadowing(&ours, &overridden).expect("shadowed");
        assert!(shadowed.ours_applies());
        assert_eq!(
            shadowed.lost,
            [LostSetting {
                key: "delivery-limit".into(),
                ours: json!(-1),
                now: Some(json!(3)),
            }]
        );
        assert_eq!(
            shadowed.to_string(),
            r#"operator policy "limits" overrides "mailer.mail.send.dead" on queue "mail.send.dead"; it changes delivery-limit from -1 to 3"#
        );
    }

    #[test]
    fn a_policy_changed_since_the_last_report_is_said_to_be_pending() {
        let ours = retry_policy();
        let stale = retry_queue(
            Some("mailer.mail.send.retry"),
            json!({"message-ttl": 60000, "dead-letter-exchange": "mail", "overflow": "reject-publish"}),
        );
        let shadowed = shadowing(&ours, &stale).expect("differs");
        assert_eq!(
            shadowed.to_string(),
            r#"queue "mail.send.retry" does not yet have what "mailer.mail.send.retry" sets (the broker reports a policy's changes within 5 s); it changes message-ttl from 300000 to 60000"#
        );
    }
}
