//! The markers of a broker in both formats, read into who owns each claim (see
//! [`super`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use super::{Claim, MARKER_PREFIX, Owner, part};

/// The name of the marker of the pipeline of `uid`: one global parameter listing every
/// claim the pipeline holds, e.g. `mailer-owner|pipeline|3f0c…`.
pub fn pipeline_marker(uid: &str) -> String {
    format!("{MARKER_PREFIX}pipeline|{}", part(uid))
}

/// What a pipeline's marker holds: who owns, and what.
#[derive(Debug, Clone)]
struct PipelineHolding {
    owner: Owner,
    claims: BTreeSet<Claim>,
}

/// Every marker of a broker, in both formats:
///
/// - one marker per pipeline ([`pipeline_marker`]), whose value is the owner with the
///   list of what it holds under `claims` (each a claim's marker without the
///   `mailer-owner|` prefix). A claim costs one write per pipeline, not one per object;
/// - one marker per claim ([`Claim::marker`]): what the operator wrote before, still
///   read, and what a pipeline leaves behind as retained ([`Owner::retained`]).
///
/// A claim both name is the claim marker's, unless that marker is retained and the
/// pipeline's is not: a pipeline taking over what another retained writes its own marker
/// first, then removes the retained one.
#[derive(Debug, Clone, Default)]
pub struct Markers {
    /// The claim markers and the 0.1 releases' topology markers, by name.
    objects: BTreeMap<String, Owner>,
    /// The pipeline markers, by name.
    pipelines: BTreeMap<String, PipelineHolding>,
    /// Which pipeline marker names each claim (the first by name, should two).
    named_by: BTreeMap<Claim, String>,
}

impl Markers {
    /// Who owns `claim`, if any marker names it.
    pub fn owner(&self, claim: &Claim) -> Option<&Owner> {
        let of_object = self.objects.get(&claim.marker());
        let of_pipeline = self
            .named_by
            .get(claim)
            .and_then(|marker| self.pipelines.get(marker))
            .map(|holding| &holding.owner);
        match (of_object, of_pipeline) {
            (Some(object), Some(pipeline)) if object.retained && !pipeline.retained => {
                Some(pipeline)
            }
            (object, pipeline) => object.or(pipeline),
        }
    }

    /// Who the marker named `marker` names, if anyone.
    pub fn owner_of_marker(&self, marker: &str) -> Option<&Owner> {
        self.objects
            .get(marker)
            .or_else(|| self.pipelines.get(marker).map(|holding| &holding.owner))
    }

    /// Every claim whose owner ([`owner`](Self::owner)) is the pipeline of `uid` and that
    /// it has not left behind ([`Owner::retained`]).
    pub fn held_by(&self, uid: &str) -> BTreeSet<Claim> {
        let in_objects = self
            .objects
            .iter()
            .filter(|(_, owner)| owner.uid == uid && !owner.retained)
            .filter_map(|(marker, _)| Claim::of_marker(marker));
        let in_pipelines = self
            .pipelines
            .values()
            .filter(|holding| holding.owner.uid == uid && !holding.owner.retained)
            .flat_map(|holding| holding.claims.iter().cloned());
        in_objects
            .chain(in_pipelines)
            .filter(|claim| {
                self.owner(claim)
                    .is_some_and(|owner| owner.uid == uid && !owner.retained)
            })
            .collect()
    }

    /// Whether a claim marker of `claim` is there (in the format before pipeline markers,
    /// or retained).
    pub fn has_claim_marker(&self, claim: &Claim) -> bool {
        self.objects.contains_key(&claim.marker())
    }

    /// Counts `marker` as naming `owner`: a claim marker or a topology marker written.
    pub(in crate::topology) fn insert(&mut self, marker: String, owner: Owner) {
        self.objects.insert(marker, owner);
    }

    /// No longer counts `marker`, of either format: it was removed.
    pub(in crate::topology) fn remove(&mut self, marker: &str) {
        self.objects.remove(marker);
        if let Some(holding) = self.pipelines.remove(marker) {
            for claim in &holding.claims {
                if self.named_by.get(claim).is_some_and(|by| by == marker) {
                    self.named_by.remove(claim);
                }
            }
        }
    }

    /// Counts the marker of `owner`'s pipeline as naming `claims`: it was written.
    pub(in crate::topology) fn set_pipeline(&mut self, owner: &Owner, claims: BTreeSet<Claim>) {
        let marker = pipeline_marker(&owner.uid);
        self.remove(&marker);
        self.hold(marker, owner.clone(), claims);
    }

    fn hold(&mut self, marker: String, owner: Owner, claims: BTreeSet<Claim>) {
        for claim in &claims {
            self.named_by
                .entry(claim.clone())
                .or_insert_with(|| marker.clone());
        }
        self.pipelines
            .insert(marker, PipelineHolding { owner, claims });
    }

    /// Markers as read from a list of global parameters: those whose name starts with
    /// [`MARKER_PREFIX`]. A marker whose value does not read as an owner (written by
    /// hand) names an owner no pipeline is.
    pub(in crate::topology) fn from_parameters(parameters: Vec<GlobalParameter>) -> Self {
        let mut markers = Self::default();
        for parameter in parameters {
            if !parameter.name.starts_with(MARKER_PREFIX) {
                continue;
            }
            let claims = listed_claims(&parameter.value);
            let owner = read_owner(&parameter.name, parameter.value);
            match claims {
                Some(claims) => markers.hold(parameter.name, owner, claims),
                None => markers.insert(parameter.name, owner),
            }
        }
        markers
    }
}

/// The claims a marker's value lists under `claims`: `Some` for a pipeline marker.
fn listed_claims(value: &serde_json::Value) -> Option<BTreeSet<Claim>> {
    let listed = value.get("claims")?.as_array()?;
    Some(
        listed
            .iter()
            .filter_map(|id| id.as_str())
            .filter_map(|id| Claim::of_marker(&format!("{MARKER_PREFIX}{id}")))
            .collect(),
    )
}

/// The value of the marker of `owner`'s pipeline holding `claims`.
pub(in crate::topology) fn pipeline_marker_value(
    owner: &Owner,
    claims: &BTreeSet<Claim>,
) -> serde_json::Map<String, serde_json::Value> {
    let mut value = owner_value(owner);
    let ids = claims
        .iter()
        .map(|claim| serde_json::Value::String(claim.id()))
        .collect();
    value.insert("claims".into(), serde_json::Value::Array(ids));
    value
}

/// The value of a marker naming `owner`.
pub(in crate::topology) fn owner_value(
    owner: &Owner,
) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(owner) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    }
}

/// What a global parameter named `name` holding `value` marks, in either format: the
/// claims of a pipeline marker, the claim of a claim marker, nothing for any other (for
/// tools that remove what a set of vhosts or users left).
pub fn marked_claims(name: &str, value: &serde_json::Value) -> Vec<Claim> {
    if !name.starts_with(MARKER_PREFIX) {
        return Vec::new();
    }
    match listed_claims(value) {
        Some(claims) => claims.into_iter().collect(),
        None => Claim::of_marker(name).into_iter().collect(),
    }
}

/// A global parameter as the management API lists it.
#[derive(Deserialize)]
pub(in crate::topology) struct GlobalParameter {
    pub(in crate::topology) name: String,
    #[serde(default)]
    pub(in crate::topology) value: serde_json::Value,
}

fn read_owner(marker: &str, value: serde_json::Value) -> Owner {
    serde_json::from_value(value).unwrap_or_else(|_| Owner {
        cluster: "?".into(),
        namespace: "?".into(),
        name: format!("(global parameter {marker:?}, written by someone else)"),
        uid: "?".into(),
        retained: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::topology::ownership::fixture_owner as owner;

    #[test]
    fn what_a_pipeline_holds_is_what_names_its_uid() {
        let parameters = vec![
            GlobalParameter {
                name: "mailer-owner|queue|shop|mail.send".into(),
                value: serde_json::to_value(owner("1")).unwrap(),
            },
            GlobalParameter {
                name: "mailer-owner|queue|shop|other".into(),
                value: serde_json::to_value(owner("2")).unwrap(),
            },
            GlobalParameter {
                name: "mailer-owner|user|u".into(),
                value: serde_json::to_value(owner("1").retaining()).unwrap(),
            },
            GlobalParameter {
                name: "mailer-owner|queue|shop|by-hand".into(),
                value: serde_json::json!("mine"),
            },
            GlobalParameter {
                name: "cluster_name".into(),
                value: serde_json::json!("rabbit@host"),
            },
        ];
        let markers = Markers::from_parameters(parameters);
        let held: Vec<String> = markers.held_by("1").iter().map(|c| c.marker()).collect();
        // The user it retained is no longer held.
        assert_eq!(held, ["mailer-owner|queue|shop|mail.send"]);
        let by_hand = Claim::Queue {
            vhost: "shop".into(),
            name: "by-hand".into(),
        };
        assert!(
            markers
                .owner(&by_hand)
                .unwrap()
                .name
                .contains("written by someone else"),
            "a marker that is no owner is someone else's"
        );
        assert!(markers.owner_of_marker("cluster_name").is_none());
    }

    fn queue(name: &str) -> Claim {
        Claim::Queue {
            vhost: "shop".into(),
            name: name.into(),
        }
    }

    fn pipeline_parameter(owner: &Owner, claims: &[&Claim]) -> GlobalParameter {
        let claims: BTreeSet<Claim> = claims.iter().map(|c| (*c).clone()).collect();
        GlobalParameter {
            name: pipeline_marker(&owner.uid),
            value: serde_json::Value::Object(pipeline_marker_value(owner, &claims)),
        }
    }

    fn claim_parameter(claim: &Claim, owner: &Owner) -> GlobalParameter {
        GlobalParameter {
            name: claim.marker(),
            value: serde_json::to_value(owner).unwrap(),
        }
    }

    #[test]
    fn a_pipeline_marker_lists_what_it_holds_and_reads_back() {
        let (send, user) = (
            queue("mail|send"),
            Claim::User {
                name: "mailer-worker.default.prod.shop".into(),
            },
        );
        let parameter = pipeline_parameter(&owner("1"), &[&send, &user]);
        assert_eq!(parameter.name, "mailer-owner|pipeline|1");
        assert_eq!(
            parameter.value["claims"],
            serde_json::json!([
                "queue|shop|mail%7Csend",
                "user|mailer-worker.default.prod.shop"
            ])
        );
        assert_eq!(parameter.value["uid"], "1");
        assert_eq!(
            marked_claims(&parameter.name, &parameter.value),
            [send.clone(), user.clone()]
        );
        let markers = Markers::from_parameters(vec![parameter]);
        assert_eq!(markers.held_by("1"), BTreeSet::from([send.clone(), user]));
        assert_eq!(markers.owner(&send).unwrap().uid, "1");
        assert!(markers.held_by("2").is_empty());
        assert!(!markers.has_claim_marker(&send));
    }

    #[test]
    fn both_formats_are_read_and_a_retained_claim_marker_yields_to_a_pipelines() {
        let (old, retained, taken) = (queue("old"), queue("retained"), queue("taken"));
        let markers = Markers::from_parameters(vec![
            // Held by "1" in the format before pipeline markers.
            claim_parameter(&old, &owner("1")),
            // Retained by a pipeline "0" of the same name, and taken over by "1", whose
            // marker was written before the retained one was removed.
            claim_parameter(&retained, &owner("0").retaining()),
            claim_parameter(&taken, &owner("0").retaining()),
            pipeline_parameter(&owner("1"), &[&taken]),
        ]);
        assert_eq!(markers.held_by("1"), BTreeSet::from([old, taken.clone()]));
        assert_eq!(markers.owner(&taken).unwrap().uid, "1");
        assert!(markers.owner(&retained).unwrap().retained);
        assert!(markers.held_by("0").is_empty());
        // A claim marker not retained stands against a pipeline marker naming another.
        let contested = Markers::from_parameters(vec![
            claim_parameter(&retained, &owner("2")),
            pipeline_parameter(&owner("1"), &[&retained]),
        ]);
        assert_eq!(contested.owner(&retained).unwrap().uid, "2");
        assert!(contested.held_by("1").is_empty());
    }

    #[test]
    fn a_pipeline_marker_written_or_removed_replaces_what_it_held() {
        let (a, b) = (queue("a"), queue("b"));
        let mut markers = Markers::from_parameters(vec![pipeline_parameter(&owner("1"), &[&a])]);
        markers.set_pipeline(&owner("1"), BTreeSet::from([b.clone()]));
        assert_eq!(markers.held_by("1"), BTreeSet::from([b.clone()]));
        assert!(markers.owner(&a).is_none(), "no longer listed");
        markers.remove(&pipeline_marker("1"));
        assert!(markers.owner(&b).is_none());
        assert!(markers.held_by("1").is_empty());
    }
}
