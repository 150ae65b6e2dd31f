//! Reading a dead queue only when reading cannot drop a dead letter.
//!
//! Every read of a quorum queue returns what it read, and every return counts as a
//! delivery: once a message was returned more times than the queue's delivery limit,
//! RabbitMQ drops it (or dead-letters it on). The topology lifts the limit of the dead
//! queue on RabbitMQ 4 (whose default is 20) with `delivery-limit: -1` in its policy
//! `mailer.<deadQueue>`; but RabbitMQ applies one policy per queue, so a policy of higher
//! priority takes that away, and an operator policy or an `x-delivery-limit` argument
//! sets a limit no policy of ours can lift (on 3.x too). So before its first read a
//! command asks the management API what the dead queue's delivery limit comes to
//! ([`crate::topology::effective`]) and refuses a finite one.
//!
//! The management API's URL is `--management-url`, else the AMQP URL's host and
//! credentials on port 15672 (15671 over https for amqps). The broker's version is the one
//! its AMQP listener reports ([`server_version`]; the broker logs that look as a
//! connection closed during its handshake), and a management API of another major
//! version is taken for another broker's. When the management API cannot be asked, that
//! version decides: 4.x is refused (its default limit is finite), 3.x is read with a
//! warning (it has no default limit).
//!
//! The API reports a queue's policies with its statistics, every 5 s: a queue declared
//! a few seconds ago is waited for, and a policy changed less than 5 s ago may not be
//! seen yet.

use std::time::{Duration, Instant};

use lapin::uri::AMQPUri;

use super::{DeadError, Target};
use crate::amqp::connect::DEFAULT_CONNECT_TIMEOUT;
use crate::amqp::server::server_version;
use crate::redact::credentials;
use crate::topology::desired::{POLICY_PREFIX, POLICY_PRIORITY};
use crate::topology::effective::{
    DeliveryLimit, EffectivePolicy, LimitSource, QueuePolicy, delivery_limit,
};
use crate::topology::{BrokerCapabilities, Management, ManagementEndpoint, TopologyError};

/// The management API's port beside a plain AMQP listener, and beside amqps.
const MANAGEMENT_PORT: u16 = 15672;
const MANAGEMENT_TLS_PORT: u16 = 15671;
/// How long to wait for the broker to report the policies of a queue declared moments
/// ago: it emits them every 5 s, the first time within 10 s.
const REPORT_WAIT: Duration = Duration::from_secs(15);
const REPORT_POLL: Duration = Duration::from_millis(500);

/// A dead queue that may be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// Reading cannot drop a dead letter.
    Unlimited,
    /// The limit could not be checked, and the broker is a 3.x, which has no default.
    Unchecked { version: String, reason: String },
}

/// Whether the dead queue of `target` may be read: `Err` when its delivery limit is
/// finite, or cannot be checked on RabbitMQ 4 and later.
pub async fn check(target: &Target) -> Result<Checked, DeadError> {
    let vhost = vhost_of(&target.amqp_url);
    let queue = target.dead_queue.as_str();
    let endpoint = management_endpoint(target).map_err(DeadError::BadManagementUrl)?;
    // The broker that is read, as its AMQP listener says; the management API may be
    // another's (the one beside it is a guess).
    let version = match server_version(&target.amqp_url, DEFAULT_CONNECT_TIMEOUT).await {
        Ok(Some(version)) => version,
        Ok(None) => "of an unknown version".to_string(),
        Err(e) => format!("of an unknown version ({e})"),
    };
    let broker = BrokerCapabilities::of_version(&version).ok();
    let reason = match ask(&endpoint, &vhost, queue, broker, &version).await {
        Ok((effective, broker)) => {
            return match delivery_limit(&effective, broker) {
                DeliveryLimit::Unlimited => Ok(Checked::Unlimited),
                DeliveryLimit::Finite { limit, from } => {
                    let (why, advice) = explain(&effective, broker, &from);
                    Err(DeadError::DeliveryLimit {
                        queue: queue.to_string(),
                        vhost,
                        limit,
                        why,
                        advice,
                    })
                }
            };
        }
        Err(reason) => reason,
    };
    match broker {
        Some(broker) if !broker.default_delivery_limit => {
            Ok(Checked::Unchecked { version, reason })
        }
        _ => Err(DeadError::LimitUnchecked {
            queue: queue.to_string(),
            vhost,
            version,
            reason,
        }),
    }
}

/// The queue's policies and the broker's capabilities (`broker`'s, as the AMQP listener
/// of `version` told them, else the management API's), or why the management API could
/// not tell them.
async fn ask(
    endpoint: &ManagementEndpoint,
    vhost: &str,
    queue: &str,
    broker: Option<BrokerCapabilities>,
    version: &str,
) -> Result<(EffectivePolicy, BrokerCapabilities), String> {
    let management = Management::new(endpoint).map_err(|e| unusable(endpoint, e))?;
    let reported = management
        .capabilities()
        .await
        .map_err(|e| unusable(endpoint, e))?;
    if broker.is_some_and(|broker| broker != reported) {
        return Err(format!(
            "the management API at {endpoint} is of another major version than RabbitMQ {version} behind the AMQP URL: is it another broker's?"
        ));
    }
    let broker = broker.unwrap_or(reported);
    let deadline = Instant::now() + REPORT_WAIT;
    loop {
        match management.effective_policy(vhost, queue).await {
            Ok(QueuePolicy::Reported(effective)) => return Ok((effective, broker)),
            Ok(QueuePolicy::Missing) => {
                return Err(format!(
                    "the management API at {endpoint} has no queue {queue:?} in vhost {vhost:?}: is it another broker's?"
                ));
            }
            Ok(QueuePolicy::NotReported) if Instant::now() >= deadline => {
                return Err(format!(
                    "the management API at {endpoint} did not report the queue's policies within {}",
                    humantime::format_duration(REPORT_WAIT)
                ));
            }
            Ok(QueuePolicy::NotReported) => tokio::time::sleep(REPORT_POLL).await,
            Err(e) => return Err(unusable(endpoint, e)),
        }
    }
}

/// Why the management API could not be asked, in a few words.
fn unusable(endpoint: &ManagementEndpoint, e: TopologyError) -> String {
    match e {
        TopologyError::Unreachable { reason, .. } => {
            format!("the management API at {endpoint} cannot be reached: {reason}")
        }
        TopologyError::Unauthorized { user, .. } => {
            format!("the management API at {endpoint} refused user {user:?} (401)")
        }
        TopologyError::Forbidden { user, .. } => format!(
            "user {user:?} may not read the queue through the management API at {endpoint} (403)"
        ),
        other => other.to_string(),
    }
}

/// Why the limit is finite, and what to do so that it is not.
fn explain(
    effective: &EffectivePolicy,
    broker: BrokerCapabilities,
    from: &LimitSource,
) -> (String, String) {
    let ours = format!("{POLICY_PREFIX}{}", effective.queue);
    let lifted = if broker.default_delivery_limit {
        " (delivery-limit: -1)"
    } else {
        ""
    };
    let again = "then run this again.";
    let reapply = |what: &str| {
        format!(
            "Apply the pipeline's topology (mailer topology apply, or let the operator reconcile it) so {ours:?} {what}, {again}"
        )
    };
    let applied = effective.policy.as_deref();
    let shadowing = applied.filter(|applied| *applied != ours).map(|other| {
        (
            format!("policy {other:?} of a higher priority than {ours:?} applies instead"),
            format!(
                "Remove policy {other:?} or lower its priority below {POLICY_PRIORITY} so {ours:?} applies{lifted}, {again}"
            ),
        )
    });
    match from {
        LimitSource::Argument => (
            "queue argument x-delivery-limit, which the queue was declared with".to_string(),
            "A queue's arguments never change and no policy lifts this one: move the dead letters to a queue declared without it (e.g. with a shovel), then read that one with --queue."
                .to_string(),
        ),
        LimitSource::Default => {
            let (why, advice) = match (applied, shadowing) {
                (_, Some(shadowing)) => shadowing,
                (None, None) => (
                    format!("no policy applies to the queue: {ours:?} is missing or does not match it"),
                    reapply(&format!("applies{lifted}")),
                ),
                (Some(_), None) => (
                    format!("{ours:?} applies but does not lift it, as written for RabbitMQ 3"),
                    reapply("gets delivery-limit: -1"),
                ),
            };
            (format!("RabbitMQ 4's default; {why}"), advice)
        }
        LimitSource::Policy {
            operator_policy, ..
        } => match (shadowing, operator_policy) {
            (Some((why, advice)), Some(operator)) => (
                format!("set by it or by operator policy {operator:?}; {why}"),
                advice,
            ),
            (Some((why, advice)), None) => (format!("set by it; {why}"), advice),
            (None, Some(operator)) => (
                format!("set by operator policy {operator:?}, which no policy can override"),
                format!(
                    "Ask the broker's administrator to exempt queue {:?} from operator policy {operator:?}, {again}",
                    effective.queue
                ),
            ),
            (None, None) => (
                format!("set by policy {ours:?} itself"),
                reapply(&format!("is as the pipeline asks{lifted}")),
            ),
        },
    }
}

/// The vhost the AMQP URL names (`/` when it names none).
fn vhost_of(amqp_url: &str) -> String {
    amqp_url
        .parse::<AMQPUri>()
        .map(|uri| uri.vhost)
        .unwrap_or_else(|_| "/".to_string())
}

/// The management API to ask: `--management-url` (with the AMQP URL's credentials when
/// it has none), else the one beside the AMQP listener.
fn management_endpoint(target: &Target) -> Result<ManagementEndpoint, String> {
    let (user, password) = amqp_credentials(&target.amqp_url);
    let endpoint = match &target.management_url {
        Some(given) => {
            let has_user = url::Url::parse(given).is_ok_and(|url| !url.username().is_empty());
            if has_user {
                ManagementEndpoint::parse(given)
            } else {
                ManagementEndpoint::with_credentials(given, &user, &password)
            }
        }
        None => {
            let beside = management_beside(&target.amqp_url).ok_or_else(|| {
                "cannot tell the management API from the AMQP URL; pass --management-url"
                    .to_string()
            })?;
            ManagementEndpoint::with_credentials(&beside, &user, &password)
        }
    };
    endpoint.map_err(|e| e.to_string())
}

/// The management API's URL beside an AMQP listener, without credentials: the same host,
/// http on 15672 for amqp://, https on 15671 for amqps://.
pub fn management_beside(amqp_url: &str) -> Option<String> {
    let url = url::Url::parse(amqp_url).ok()?;
    let (scheme, port) = match url.scheme() {
        "amqp" => ("http", MANAGEMENT_PORT),
        "amqps" => ("https", MANAGEMENT_TLS_PORT),
        _ => return None,
    };
    let host = url.host_str().filter(|host| !host.is_empty())?;
    Some(format!("{scheme}://{host}:{port}"))
}

/// The AMQP URL's user and password, lapin's guest/guest when it names no user.
fn amqp_credentials(amqp_url: &str) -> (String, String) {
    match url::Url::parse(amqp_url) {
        Ok(url) if !url.username().is_empty() => credentials(&url),
        _ => ("guest".to_string(), "guest".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, Value, json};

    use super::*;

    fn target(amqp_url: &str, management_url: Option<&str>) -> Target {
        Target {
            amqp_url: amqp_url.into(),
            management_url: management_url.map(str::to_string),
            dead_queue: "mail.send.dead".into(),
            exchange: "mail".into(),
            send_key: "mail.send".into(),
        }
    }

    #[test]
    fn the_management_api_is_beside_the_amqp_listener_with_its_credentials() {
        assert_eq!(
            management_beside("amqp://u:p@rabbit:5673/shop").as_deref(),
            Some("http://rabbit:15672")
        );
        assert_eq!(
            management_beside("amqps://rabbit.example").as_deref(),
            Some("https://rabbit.example:15671")
        );
        assert_eq!(
            management_beside("amqp://[::1]:5672").as_deref(),
            Some("http://[::1]:15672")
        );
        assert_eq!(management_beside("http://rabbit:15672"), None);
        assert_eq!(management_beside("nonsense"), None);

        let derived =
            management_endpoint(&target("amqp://sh%40p:s3cret@rabbit/shop", None)).unwrap();
        assert_eq!(derived.to_string(), "http://sh%40p:***@rabbit:15672/api");
        assert_eq!(
            (derived.username.as_str(), derived.password()),
            ("sh@p", "s3cret")
        );
        let guest = management_endpoint(&target("amqp://rabbit", None)).unwrap();
        assert_eq!(
            (guest.username.as_str(), guest.password()),
            ("guest", "guest")
        );
    }

    #[test]
    fn a_given_management_url_keeps_its_own_credentials_or_takes_the_amqp_urls() {
        let own = target(
            "amqp://u:p@rabbit",
            Some("https://admin:pw@mgmt:443/rabbit"),
        );
        let own = management_endpoint(&own).unwrap();
        assert_eq!(own.to_string(), "https://admin:***@mgmt/rabbit/api");
        assert_eq!(own.password(), "pw");
        let borrowed =
            management_endpoint(&target("amqp://u:p@rabbit", Some("http://mgmt:8080"))).unwrap();
        assert_eq!(
            (borrowed.username.as_str(), borrowed.password()),
            ("u", "p")
        );
        let bad = management_endpoint(&target("amqp://u:p@h", Some("ftp://u:hunter2@h")))
            .unwrap_err()
            .to_string();
        assert!(bad.contains("http://"), "{bad}");
        assert!(!bad.contains("hunter2"), "{bad}");
    }

    #[test]
    fn the_vhost_is_the_amqp_urls() {
        assert_eq!(vhost_of("amqp://u:p@h:5672/shop%2Feu"), "shop/eu");
        assert_eq!(vhost_of("amqp://u:p@h:5672"), "/");
        assert_eq!(vhost_of("amqp://u:p@h:5672/%2f"), "/");
    }

    fn map(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    fn dead_queue(
        policy: Option<&str>,
        operator: Option<&str>,
        definition: Value,
    ) -> EffectivePolicy {
        EffectivePolicy {
            queue: "mail.send.dead".into(),
            policy: policy.map(str::to_string),
            operator_policy: operator.map(str::to_string),
            definition: map(definition),
            arguments: Map::new(),
        }
    }

    fn refusal(effective: &EffectivePolicy, broker: BrokerCapabilities) -> String {
        let DeliveryLimit::Finite { limit, from } = delivery_limit(effective, broker) else {
            panic!("finite");
        };
        let (why, advice) = explain(effective, broker, &from);
        DeadError::DeliveryLimit {
            queue: effective.queue.clone(),
            vhost: "shop".into(),
            limit,
            why,
            advice,
        }
        .to_string()
    }

    #[test]
    fn a_shadowing_policy_is_named_with_what_to_do() {
        let shadowed = dead_queue(Some("platform.all"), None, json!({"max-length": 1000}));
        assert_eq!(
            refusal(&shadowed, BrokerCapabilities::RABBITMQ_4),
            r#"will not read queue "mail.send.dead" in vhost "shop": its delivery limit is 20 (RabbitMQ 4's default; policy "platform.all" of a higher priority than "mailer.mail.send.dead" applies instead), so every read would bring each dead letter closer to being dropped. Remove policy "platform.all" or lower its priority below 10 so "mailer.mail.send.dead" applies (delivery-limit: -1), then run this again."#
        );
        let on_3 = dead_queue(Some("platform.all"), None, json!({"delivery-limit": 50}));
        assert_eq!(
            refusal(&on_3, BrokerCapabilities::RABBITMQ_3),
            r#"will not read queue "mail.send.dead" in vhost "shop": its delivery limit is 50 (set by it; policy "platform.all" of a higher priority than "mailer.mail.send.dead" applies instead), so every read would bring each dead letter closer to being dropped. Remove policy "platform.all" or lower its priority below 10 so "mailer.mail.send.dead" applies, then run this again."#
        );
    }

    #[test]
    fn every_other_source_of_a_limit_gets_its_own_advice() {
        let v4 = BrokerCapabilities::RABBITMQ_4;
        let operator = dead_queue(
            Some("mailer.mail.send.dead"),
            Some("limits"),
            json!({"delivery-limit": 3}),
        );
        let text = refusal(&operator, v4);
        assert!(
            text.contains(r#"its delivery limit is 3 (set by operator policy "limits", which no policy can override)"#)
                && text.contains(r#"exempt queue "mail.send.dead" from operator policy "limits""#),
            "{text}"
        );
        let none = dead_queue(None, None, json!({}));
        let text = refusal(&none, v4);
        assert!(
            text.contains("no policy applies to the queue")
                && text.contains("mailer topology apply"),
            "{text}"
        );
        let written_for_3 = dead_queue(
            Some("mailer.mail.send.dead"),
            None,
            json!({"overflow": "reject-publish"}),
        );
        let text = refusal(&written_for_3, v4);
        assert!(
            text.contains("as written for RabbitMQ 3") && text.contains("gets delivery-limit: -1"),
            "{text}"
        );
        let mut argument = dead_queue(
            Some("mailer.mail.send.dead"),
            None,
            json!({"delivery-limit": -1}),
        );
        argument.arguments = map(json!({"x-delivery-limit": 1000}));
        let text = refusal(&argument, v4);
        assert!(
            text.contains("its delivery limit is 1000 (queue argument x-delivery-limit")
                && text.contains("arguments never change"),
            "{text}"
        );
        for text in [
            refusal(&operator, v4),
            refusal(&none, v4),
            refusal(&argument, v4),
        ] {
            assert_eq!(text.lines().count(), 1, "{text}");
            assert!(
                text.ends_with("again.") || text.ends_with("--queue."),
                "{text}"
            );
        }
    }
}
