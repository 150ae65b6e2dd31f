//! Deciding claims: whether a pipeline may take the names it asks for, given the markers
//! and the objects a broker holds, read under the claims' locks. Pure: the reading,
//! locking and writing are [`super::management::claims_together`]'s.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::error::TopologyError;
use super::ownership::{Claim, Markers, Owner};

/// What one pipeline asks to claim.
#[derive(Debug, Clone)]
pub struct ClaimAsk {
    /// Who asks: the owner its markers will name.
    pub owner: Owner,
    /// What it wants and does not hold yet.
    pub claims: Vec<Claim>,
    /// The whole-topology marker a 0.1 release wrote for the pipeline's spec, and the
    /// claims of that topology: taken without markers of their own when that marker
    /// names this pipeline.
    pub legacy: Option<LegacyTopology>,
}

/// A topology that the operator's 0.1 releases marked whole (see
/// [`super::ownership::legacy_topology_marker`]).
#[derive(Debug, Clone)]
pub struct LegacyTopology {
    pub marker: String,
    pub claims: BTreeSet<Claim>,
}

/// Why a claim was not taken.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClaimError {
    /// Another pipeline's marker names it (`owner`, as [`Owner`] displays it).
    #[error("{what} is owned by {owner}")]
    Owned { what: String, owner: String },
    /// It exists with no marker: made by hand, or by someone else.
    #[error("{what} exists and no pipeline's marker names it")]
    Unclaimed { what: String },
    /// The broker could not be read or written.
    #[error(transparent)]
    Broker(#[from] TopologyError),
}

/// What a broker holds, as read under the locks of a batch of claims, and what the
/// batch's claims decided so far took.
#[derive(Debug, Default)]
pub struct Found {
    /// Shared with the batches of other vhosts that read at the same time: with a
    /// thousand pipelines they are thousands of markers.
    markers: Arc<Markers>,
    /// What the claims decided before in the same batch took, over what was read.
    taken: BTreeMap<Claim, Owner>,
    /// Which of the claims asked for with no marker exist.
    pub existing: BTreeSet<Claim>,
}

impl Found {
    pub fn new(markers: Arc<Markers>, existing: BTreeSet<Claim>) -> Self {
        Self {
            markers,
            taken: BTreeMap::new(),
            existing,
        }
    }

    /// Who `claim`'s marker names, counting what the batch took so far.
    pub fn owner(&self, claim: &Claim) -> Option<&Owner> {
        self.taken.get(claim).or_else(|| self.markers.owner(claim))
    }

    /// Counts what `take` marks as `owner`'s, for the claims decided after it.
    pub fn took(&mut self, take: &Take, owner: &Owner) {
        for claim in &take.mark {
            self.taken.insert(claim.clone(), owner.clone());
        }
    }
}

/// What a claim that may go ahead writes.
#[derive(Debug, PartialEq, Eq)]
pub struct Take {
    /// The claims it asked for, its own once written.
    pub mark: Vec<Claim>,
    /// What its pipeline's marker lists once written: what it held and what it takes.
    pub holds: BTreeSet<Claim>,
    /// The markers to remove once that is written: the claim markers of what it holds
    /// (its own from before pipeline markers, or retained for it by a pipeline of its
    /// name), and the 0.1 release's topology marker it takes over.
    pub clear: Vec<String>,
}

/// Whether `ask` may take its claims given what was `found`: each must be unmarked and
/// not there, marked by its owner (or retained for a pipeline of its name), or part of a
/// topology a 0.1 release marked as this pipeline's.
pub fn decide(ask: &ClaimAsk, found: &Found) -> Result<Take, ClaimError> {
    let legacy_ours = ask.legacy.as_ref().filter(|legacy| {
        found
            .markers
            .owner_of_marker(&legacy.marker)
            .is_some_and(|owner| owner.uid == ask.owner.uid)
    });
    let mut of_legacy = false;
    for claim in &ask.claims {
        match found.owner(claim) {
            Some(owner) if ask.owner.may_take(owner) => {}
            Some(owner) => {
                return Err(ClaimError::Owned {
                    what: claim.to_string(),
                    owner: owner.to_string(),
                });
            }
            None if !found.existing.contains(claim) => {}
            None if legacy_ours.is_some_and(|legacy| legacy.claims.contains(claim)) => {
                of_legacy = true;
            }
            None => {
                return Err(ClaimError::Unclaimed {
                    what: claim.to_string(),
                });
            }
        }
    }
    let mut holds = found.markers.held_by(&ask.owner.uid);
    holds.extend(ask.claims.iter().cloned());
    let mut clear: Vec<String> = holds
        .iter()
        .filter(|claim| found.markers.has_claim_marker(claim))
        .map(Claim::marker)
        .collect();
    clear.extend(legacy_ours.filter(|_| of_legacy).map(|l| l.marker.clone()));
    Ok(Take {
        mark: ask.claims.clone(),
        holds,
        clear,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::ownership::legacy_topology_marker;

    fn owner(uid: &str, retained: bool) -> Owner {
        Owner {
            cluster: "eu".into(),
            namespace: "prod".into(),
            name: "shop".into(),
            uid: uid.into(),
            retained,
        }
    }

    fn queue(name: &str) -> Claim {
        Claim::Queue {
            vhost: "shop".into(),
            name: name.into(),
        }
    }

    fn ask(uid: &str, claims: &[Claim]) -> ClaimAsk {
        ClaimAsk {
            owner: owner(uid, false),
            claims: claims.to_vec(),
            legacy: None,
        }
    }

    fn marked(pairs: &[(&Claim, Owner)]) -> Markers {
        let mut markers = Markers::default();
        for (claim, owner) in pairs {
            markers.insert(claim.marker(), owner.clone());
        }
        markers
    }

    #[test]
    fn what_is_unmarked_and_not_there_or_marked_as_its_own_is_taken() {
        let (a, b) = (queue("a"), queue("b"));
        let found = Found::new(
            Arc::new(marked(&[(&a, owner("me", false))])),
            BTreeSet::new(),
        );
        let take = decide(&ask("me", &[a.clone(), b.clone()]), &found).expect("taken");
        assert_eq!(take.mark, vec![a.clone(), b.clone()]);
        assert_eq!(take.holds, BTreeSet::from([a.clone(), b]));
        // Its claim marker from before pipeline markers goes once its pipeline's lists a.
        assert_eq!(take.clear, vec![a.marker()]);
    }

    #[test]
    fn a_take_lists_what_the_pipeline_held_and_clears_what_it_took_over() {
        let (held, retained, new) = (queue("held"), queue("retained"), queue("new"));
        let mut markers = marked(&[(&retained, owner("before", true))]);
        markers.set_pipeline(&owner("me", false), BTreeSet::from([held.clone()]));
        let found = Found::new(Arc::new(markers), BTreeSet::from([retained.clone()]));
        let take = decide(&ask("me", &[retained.clone(), new.clone()]), &found).expect("taken");
        assert_eq!(take.holds, BTreeSet::from([held, retained.clone(), new]));
        assert_eq!(
            take.clear,
            vec![retained.marker()],
            "the retained marker goes"
        );
    }

    #[test]
    fn what_a_batch_took_refuses_the_claims_decided_after_it() {
        let a = queue("a");
        let read = Arc::new(Markers::default());
        let mut found = Found::new(Arc::clone(&read), BTreeSet::new());
        let first = decide(&ask("first", std::slice::from_ref(&a)), &found).expect("taken");
        found.took(&first, &owner("first", false));
        let error = decide(&ask("second", std::slice::from_ref(&a)), &found).unwrap_err();
        assert!(
            matches!(error, ClaimError::Owned { ref owner, .. } if owner.contains("uid first")),
            "{error}"
        );
        assert!(
            read.owner(&a).is_none(),
            "the markers read are shared, not written"
        );
    }

    #[test]
    fn another_pipelines_marker_refuses_unless_it_was_retained_for_this_name() {
        let a = queue("a");
        let found = Found::new(
            Arc::new(marked(&[(&a, owner("other", false))])),
            BTreeSet::from([a.clone()]),
        );
        let error = decide(&ask("me", std::slice::from_ref(&a)), &found).unwrap_err();
        assert!(
            matches!(error, ClaimError::Owned { ref owner, .. } if owner.contains("uid other"))
        );
        let retained = Found::new(
            Arc::new(marked(&[(&a, owner("other", true))])),
            BTreeSet::from([a.clone()]),
        );
        assert!(decide(&ask("me", &[a]), &retained).is_ok());
    }

    #[test]
    fn an_object_there_without_a_marker_refuses_unless_a_legacy_marker_names_this_pipeline() {
        let a = queue("a");
        let found = |legacy_owner: &str| {
            let mut markers = Markers::default();
            markers.insert(
                legacy_topology_marker("shop", "a"),
                owner(legacy_owner, false),
            );
            Found::new(Arc::new(markers), BTreeSet::from([a.clone()]))
        };
        let mut asked = ask("me", std::slice::from_ref(&a));
        let error = decide(&asked, &found("me")).unwrap_err();
        assert!(matches!(error, ClaimError::Unclaimed { .. }), "{error}");
        asked.legacy = Some(LegacyTopology {
            marker: legacy_topology_marker("shop", "a"),
            claims: BTreeSet::from([a.clone()]),
        });
        let take = decide(&asked, &found("me")).expect("the 0.1 topology is its own");
        assert_eq!(take.clear, vec![legacy_topology_marker("shop", "a")]);
        assert!(matches!(
            decide(&asked, &found("other")),
            Err(ClaimError::Unclaimed { .. })
        ));
    }
}
