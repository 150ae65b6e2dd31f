//! Who owns what in a broker: markers kept in the broker itself as global runtime
//! parameters (`/api/global-parameters`), so every operator that shares the broker sees
//! them, whatever cluster it runs in, and no tenant can write them (global parameters
//! take the administrator tag).
//!
//! A pipeline claims each exchange and queue of its topology and the workers' user the
//! operator makes for it ([`Claim`]); its policies and bindings are those of its queues
//! and exchanges, so they need no claim of their own. A pipeline's marker
//! ([`pipeline_marker`]) names the pipeline (the operator's cluster name, the pipeline's
//! namespace, name and UID: [`Owner`]) and lists what it holds; what it leaves behind is
//! marked claim by claim, as retained ([`Claim::marker`], the format of every marker
//! before one marker per pipeline, still read). RabbitMQ keeps global parameters in its
//! schema database, so they survive restarts and are part of a definitions export. What
//! a pipeline holds is what the markers name its UID as owning ([`Markers::held_by`]):
//! nothing a tenant can write says it.
//!
//! Claims are taken under a lock per claimed name ([`super::claim_lock`]), so two
//! claims racing for one name (two pipelines, two controllers, two clusters) end with
//! exactly one owner.

use std::fmt;

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use serde::{Deserialize, Serialize};

use crate::spec::TopologySpec;

/// What every marker's name starts with.
pub const MARKER_PREFIX: &str = "mailer-owner|";

/// The pipeline that owns something in a broker.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The operator's `--cluster-name`.
    pub cluster: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Left behind on purpose (`deletionPolicy: Retain`, or a queue that still held mail
    /// when its pipeline went): a later pipeline of the same cluster, namespace and name
    /// may take it over; no other may.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retained: bool,
}

impl Owner {
    /// Whether `self` may take what `other` marks: it is `other`, or `other` retained it
    /// for a pipeline of the same cluster, namespace and name.
    pub fn may_take(&self, other: &Owner) -> bool {
        other.uid == self.uid
            || (other.retained
                && other.cluster == self.cluster
                && other.namespace == self.namespace
                && other.name == self.name)
    }

    /// The same owner, leaving what it marks for a later pipeline of its name.
    pub fn retaining(&self) -> Owner {
        Owner {
            retained: true,
            ..self.clone()
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MailerPipeline {}/{} of cluster {:?} (uid {})",
            self.namespace, self.name, self.cluster, self.uid
        )?;
        if self.retained {
            write!(f, ", retained after its deletion")?;
        }
        Ok(())
    }
}

/// One thing a pipeline claims in a broker.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Claim {
    Exchange {
        vhost: String,
        name: String,
    },
    Queue {
        vhost: String,
        name: String,
    },
    /// A user the operator made for the pipeline's workers.
    User {
        name: String,
    },
}

/// Characters escaped in a marker's parts, so that no two claims share a marker: the
/// separator `|`, the escape `%` itself, and control characters.
const MARKER_PART: &AsciiSet = &CONTROLS.add(b'|').add(b'%');

/// `text` escaped as a part of a marker's (or a lock's) name.
pub(in crate::topology) fn part(text: &str) -> String {
    utf8_percent_encode(text, MARKER_PART).to_string()
}

fn unpart(text: &str) -> Option<String> {
    percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

impl Claim {
    /// The name of the global parameter that marks this claim alone (a claim marker),
    /// e.g. `mailer-owner|queue|shop|mail.send` or
    /// `mailer-owner|user|mailer-worker.default.prod.shop`.
    pub fn marker(&self) -> String {
        format!("{MARKER_PREFIX}{}", self.id())
    }

    /// How a pipeline marker lists this claim: its claim marker's name without the
    /// prefix, e.g. `queue|shop|mail.send`.
    pub fn id(&self) -> String {
        match self {
            Self::Exchange { vhost, name } => format!("exchange|{}|{}", part(vhost), part(name)),
            Self::Queue { vhost, name } => format!("queue|{}|{}", part(vhost), part(name)),
            Self::User { name } => format!("user|{}", part(name)),
        }
    }

    /// The claim `marker` marks; `None` for a name that is no claim's marker (the
    /// topology markers of earlier versions included, see [`legacy_topology_marker`]).
    pub fn of_marker(marker: &str) -> Option<Self> {
        let rest = marker.strip_prefix(MARKER_PREFIX)?;
        let parts: Vec<&str> = rest.split('|').collect();
        match parts.as_slice() {
            ["exchange", vhost, name] => Some(Self::Exchange {
                vhost: unpart(vhost)?,
                name: unpart(name)?,
            }),
            ["queue", vhost, name] => Some(Self::Queue {
                vhost: unpart(vhost)?,
                name: unpart(name)?,
            }),
            ["user", name] => Some(Self::User {
                name: unpart(name)?,
            }),
            _ => None,
        }
    }

    /// The vhost of an exchange or queue.
    pub fn vhost(&self) -> Option<&str> {
        match self {
            Self::Exchange { vhost, .. } | Self::Queue { vhost, .. } => Some(vhost),
            Self::User { .. } => None,
        }
    }
}

impl fmt::Display for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exchange { vhost, name } => write!(f, "exchange {name:?} in vhost {vhost:?}"),
            Self::Queue { vhost, name } => write!(f, "queue {name:?} in vhost {vhost:?}"),
            Self::User { name } => write!(f, "user {name:?}"),
        }
    }
}

/// What the topology of `spec` in `vhost` claims: each of its exchanges and queues (the
/// names [`Topology::desired`] gives them), whether or not the rest of the spec is valid.
pub fn topology_claims(vhost: &str, spec: &TopologySpec) -> Vec<Claim> {
    let exchanges = [&spec.exchange, &spec.retry_exchange, &spec.dead_exchange]
        .into_iter()
        .map(|name| Claim::Exchange {
            vhost: vhost.to_string(),
            name: name.clone(),
        });
    let further_tiers = spec.retry_tier_queues().into_iter().skip(1);
    let queues = [&spec.queue, &spec.retry_queue, &spec.dead_queue]
        .into_iter()
        .cloned()
        .chain(further_tiers)
        .map(|name| Claim::Queue {
            vhost: vhost.to_string(),
            name,
        });
    exchanges.chain(queues).collect()
}

/// Whether `claim` is the delay queue of a tier `spec` no longer has, in `vhost`, the
/// pipeline's: `spec.retryQueue.n` for a tier n beyond its tiers. Such a queue drains by
/// itself (its policy returns each parked request to the send queue when its delay is
/// up), so it is kept, still held, while it holds mail, and removed once it is empty.
pub fn is_former_tier(vhost: &str, spec: &TopologySpec, claim: &Claim) -> bool {
    let Claim::Queue { vhost: of, name } = claim else {
        return false;
    };
    of == vhost
        && crate::mail::retry_tier_number(&spec.retry_queue, name)
            .is_some_and(|tier| tier > spec.retry_tier_count())
}

/// The one marker of a whole topology that the operator's 0.1 releases wrote, named by
/// its vhost and send queue. A topology so marked as a pipeline's is that pipeline's to
/// claim, object by object, and the marker goes once it has.
pub fn legacy_topology_marker(vhost: &str, queue: &str) -> String {
    format!("{MARKER_PREFIX}topology|{vhost}|{queue}")
}

mod markers;

/// An owner for tests: pipeline `prod/shop` of cluster `eu`, of UID `uid`.
#[cfg(test)]
fn fixture_owner(uid: &str) -> Owner {
    Owner {
        cluster: "eu".into(),
        namespace: "prod".into(),
        name: "shop".into(),
        uid: uid.into(),
        retained: false,
    }
}

pub(in crate::topology) use markers::{GlobalParameter, owner_value, pipeline_marker_value};
pub use markers::{Markers, marked_claims, pipeline_marker};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::TopologySpec;
    use crate::topology::BrokerCapabilities;

    use super::fixture_owner as owner;

    #[test]
    fn markers_name_what_they_mark_and_read_back() {
        let claims = [
            Claim::Queue {
                vhost: "shop".into(),
                name: "mail.send".into(),
            },
            Claim::Exchange {
                vhost: "/".into(),
                name: "mail".into(),
            },
            Claim::User {
                name: "mailer-worker.default.prod.shop".into(),
            },
        ];
        assert_eq!(claims[0].marker(), "mailer-owner|queue|shop|mail.send");
        assert_eq!(claims[1].marker(), "mailer-owner|exchange|/|mail");
        // The user marker of the 0.1 releases, unchanged.
        assert_eq!(
            claims[2].marker(),
            "mailer-owner|user|mailer-worker.default.prod.shop"
        );
        for claim in &claims {
            assert_eq!(Claim::of_marker(&claim.marker()).as_ref(), Some(claim));
        }
        assert_eq!(Claim::of_marker(&legacy_topology_marker("shop", "q")), None);
        assert_eq!(Claim::of_marker("cluster_name"), None);
    }

    #[test]
    fn no_two_claims_share_a_marker_whatever_their_names_hold() {
        // Without escaping, both would be mailer-owner|exchange|a|queue|b.
        let one = Claim::Exchange {
            vhost: "a|queue".into(),
            name: "b".into(),
        };
        let other = Claim::Exchange {
            vhost: "a".into(),
            name: "queue|b".into(),
        };
        assert_ne!(one.marker(), other.marker());
        assert_eq!(Claim::of_marker(&one.marker()), Some(one.clone()));
        assert_eq!(Claim::of_marker(&other.marker()), Some(other));
        let percent = Claim::Queue {
            vhost: "%7C".into(),
            name: "x".into(),
        };
        assert_eq!(Claim::of_marker(&percent.marker()), Some(percent));
    }

    #[test]
    fn a_topology_claims_each_exchange_and_queue_it_declares() {
        let spec = TopologySpec {
            queue: "orders.send".into(),
            dead_exchange: "orders.dead".into(),
            retry_delays: Some(vec!["1m".into(), "1h".into(), "1d".into()]),
            ..TopologySpec::default()
        };
        let topology =
            crate::topology::Topology::desired("shop", &spec, BrokerCapabilities::RABBITMQ_4)
                .unwrap();
        let mut declared: Vec<Claim> = topology
            .exchanges
            .iter()
            .map(|e| Claim::Exchange {
                vhost: "shop".into(),
                name: e.name.clone(),
            })
            .chain(topology.queues.iter().map(|q| Claim::Queue {
                vhost: "shop".into(),
                name: q.name.clone(),
            }))
            .collect();
        let mut claimed = topology_claims("shop", &spec);
        declared.sort();
        claimed.sort();
        assert_eq!(claimed, declared);
        assert_eq!(claimed.len(), 8, "three delay tiers, three delay queues");
        // Tier 3's queue is one a spec of two tiers no longer has, in its vhost only.
        let tier3 = |vhost: &str| Claim::Queue {
            vhost: vhost.into(),
            name: "mail.send.retry.3".into(),
        };
        let two = TopologySpec {
            retry_delays: Some(vec!["1m".into(), "1h".into()]),
            ..spec.clone()
        };
        assert!(is_former_tier("shop", &two, &tier3("shop")));
        assert!(!is_former_tier("other", &two, &tier3("shop")));
        assert!(
            !is_former_tier("shop", &spec, &tier3("shop")),
            "still a tier"
        );
        let dead = Claim::Queue {
            vhost: "shop".into(),
            name: "mail.send.dead".into(),
        };
        assert!(!is_former_tier("shop", &two, &dead));
    }

    #[test]
    fn only_the_owner_or_its_successor_of_the_same_name_may_take_a_claim() {
        let me = owner("1");
        assert!(me.may_take(&owner("1")));
        assert!(
            !me.may_take(&owner("2")),
            "another pipeline's, not retained"
        );
        assert!(me.may_take(&owner("2").retaining()), "retained for my name");
        let elsewhere = Owner {
            namespace: "staging".into(),
            ..owner("2").retaining()
        };
        assert!(!me.may_take(&elsewhere), "retained for another namespace");
        let other_cluster = Owner {
            cluster: "us".into(),
            ..owner("2").retaining()
        };
        assert!(!me.may_take(&other_cluster));
        assert_eq!(
            owner("1").retaining().to_string(),
            "MailerPipeline prod/shop of cluster \"eu\" (uid 1), retained after its deletion"
        );
    }
}
