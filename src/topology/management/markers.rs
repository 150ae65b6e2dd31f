//! The owner markers in the broker (global parameters, see [`crate::topology::ownership`]):
//! read, shared for a while by the work of a client, written and removed.

use std::collections::BTreeSet;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared, try_join_all};
use rabbitmq_http_client::requests::GlobalRuntimeParameterDefinition;

use super::Management;
use crate::topology::error::TopologyError;
use crate::topology::ownership::{
    Claim, GlobalParameter, Markers, Owner, marked_claims, owner_value, pipeline_marker,
    pipeline_marker_value,
};

/// Markers read once and shared by the work of a client for a while (see
/// [`Management::shared_markers`]).
#[derive(Default)]
pub(in crate::topology) struct SharedMarkers {
    /// Shared, not copied, with each reconcile that asks: with a thousand pipelines a
    /// broker holds thousands of markers, and the reconciles running at once each held
    /// a copy while they waited for their claims. A write through this client copies
    /// them only while a reconcile still holds the version before.
    read: Option<(Instant, Arc<Markers>)>,
    /// The latest read for batches of claims, and when it started
    /// ([`Management::markers_read_after`]).
    locked: Option<(Instant, LockedRead)>,
}

/// What becomes of the claims a pipeline gives up ([`Management::give_up`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// No marker names them any more: they are gone, or never were made.
    Release,
    /// Marked as retained: a later pipeline of the same name may take them over.
    Retain,
}

/// A read of every marker that the batches of claims of several vhosts may share.
type LockedRead = Shared<BoxFuture<'static, Result<Arc<Markers>, TopologyError>>>;

/// What a batch of claims does about the latest read.
enum Next {
    /// It started after the batch's locks were taken: its answer will do.
    Share(LockedRead),
    /// It started before and is still in flight: the next read starts when it ends.
    WaitFor(LockedRead),
}

impl Management {
    /// Every marker in the broker, read now: one request, whatever the number of markers.
    pub async fn markers(&self) -> Result<Markers, TopologyError> {
        let listed: Option<Vec<GlobalParameter>> = self
            .get_json_unless_refused(&["global-parameters"], "list the global parameters")
            .await?;
        match listed {
            Some(parameters) => Ok(Markers::from_parameters(parameters)),
            None => Err(TopologyError::Forbidden {
                endpoint: self.endpoint().to_string(),
                user: self.endpoint().username.clone(),
                action: "list the global parameters (the owner markers)".into(),
            }),
        }
    }

    /// The markers as read at most `max_age` ago, else read now. Only what reads as this
    /// pipeline's own may be decided on them: a marker of its own is removed by no one
    /// but its owner, so it is still there; a claim is always decided on markers read
    /// under its lock. A marker written or removed through this client is written into
    /// or removed from what was read, as a new read would find it: reading again after
    /// each would make the reconciles of a first pass, whose claims write markers all
    /// the time, each wait for a read of its own, one after another.
    pub async fn shared_markers(&self, max_age: Duration) -> Result<Arc<Markers>, TopologyError> {
        let fresh = || {
            self.markers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .read
                .as_ref()
                .filter(|(at, _)| at.elapsed() < max_age)
                .map(|(_, markers)| Arc::clone(markers))
        };
        if let Some(markers) = fresh() {
            return Ok(markers);
        }
        // Work starting together (every pipeline, after a restart) shares one read.
        let _reading = self.markers_read.lock().await;
        if let Some(markers) = fresh() {
            return Ok(markers);
        }
        let markers = Arc::new(self.markers().await?);
        self.markers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .read = Some((Instant::now(), Arc::clone(&markers)));
        Ok(markers)
    }

    /// Every marker, read by a request that started after `locked_at`, when a batch of
    /// claims took its locks: it finds every marker written under those locks before,
    /// as a read of the batch's own would. The batches of other vhosts that took theirs
    /// meanwhile share it: while a read is in flight, the batches that locked after it
    /// started wait for it to end and then share the next. A read per batch was 0.82
    /// reads of every marker per pipeline in a first pass of a thousand pipelines in ten
    /// vhosts; shared, 0.48. The read in flight holds the client, which holds the read
    /// until it ends: clients live as long as the process.
    pub async fn markers_read_after(
        self: &Arc<Self>,
        locked_at: Instant,
    ) -> Result<Arc<Markers>, TopologyError> {
        loop {
            let next = {
                let mut shared = self.markers.lock().unwrap_or_else(PoisonError::into_inner);
                match &shared.locked {
                    Some((started, read)) if *started >= locked_at => Next::Share(read.clone()),
                    Some((_, read)) if read.peek().is_none() => Next::WaitFor(read.clone()),
                    _ => {
                        let management = Arc::clone(self);
                        let read = async move { management.markers().await.map(Arc::new) }
                            .boxed()
                            .shared();
                        shared.locked = Some((Instant::now(), read.clone()));
                        Next::Share(read)
                    }
                }
            };
            match next {
                Next::Share(read) => return read.await,
                Next::WaitFor(read) => {
                    let _ = read.await;
                }
            }
        }
    }

    /// Applies a marker written or removed through this client to the markers read.
    fn markers_changed(&self, change: impl FnOnce(&mut Markers)) {
        let mut shared = self.markers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, markers)) = shared.read.as_mut() {
            change(Arc::make_mut(markers));
        }
    }

    /// A write or removal of a marker failed, perhaps after the broker made it: the next
    /// call reads them again.
    fn markers_unknown(&self) {
        self.markers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .read = None;
    }

    /// Writes `marker` naming `owner` (a claim marker, or a 0.1 release's topology
    /// marker in tests).
    pub async fn set_owner(&self, marker: &str, owner: &Owner) -> Result<(), TopologyError> {
        self.put_marker(marker, owner_value(owner)).await?;
        self.markers_changed(|markers| markers.insert(marker.to_string(), owner.clone()));
        Ok(())
    }

    /// Writes the claim marker of `claim` naming `owner`.
    pub async fn set_owner_of(&self, claim: &Claim, owner: &Owner) -> Result<(), TopologyError> {
        self.set_owner(&claim.marker(), owner).await
    }

    /// Writes the marker of `owner`'s pipeline as holding `claims`, or removes it when
    /// they are none.
    pub async fn set_pipeline_claims(
        &self,
        owner: &Owner,
        claims: &BTreeSet<Claim>,
    ) -> Result<(), TopologyError> {
        let marker = pipeline_marker(&owner.uid);
        if claims.is_empty() {
            self.clear_owner(&marker).await?;
            return Ok(());
        }
        self.put_marker(&marker, pipeline_marker_value(owner, claims))
            .await?;
        self.markers_changed(|markers| markers.set_pipeline(owner, claims.clone()));
        Ok(())
    }

    async fn put_marker(
        &self,
        marker: &str,
        value: serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), TopologyError> {
        let parameter = GlobalRuntimeParameterDefinition {
            name: marker,
            value,
        };
        self.bounded_write(self.api.upsert_global_runtime_parameter(&parameter))
            .await
            .map_err(|e| {
                self.markers_unknown();
                self.error(&format!("write global parameter {marker:?}"), e)
            })
    }

    /// What the marker of the pipeline of `uid` lists, read now by name (empty when
    /// there is none).
    async fn pipeline_claims(&self, uid: &str) -> Result<BTreeSet<Claim>, TopologyError> {
        let marker = pipeline_marker(uid);
        let read: Option<GlobalParameter> = self
            .get_json(
                &["global-parameters", &marker],
                &format!("read global parameter {marker:?}"),
            )
            .await?;
        Ok(read
            .map(|parameter| marked_claims(&parameter.name, &parameter.value))
            .unwrap_or_default()
            .into_iter()
            .collect())
    }

    /// Gives up `claims`, held by `me`: no marker names them as `me`'s any more
    /// ([`GiveUp::Release`]), or they are marked as retained for a later pipeline of its
    /// name ([`GiveUp::Retain`]). The retained markers are written before the
    /// pipeline's marker stops listing them, so they are `me`'s all along.
    pub async fn give_up(
        &self,
        me: &Owner,
        claims: &[&Claim],
        how: GiveUp,
    ) -> Result<(), TopologyError> {
        if claims.is_empty() {
            return Ok(());
        }
        if how == GiveUp::Retain {
            let retained = me.retaining();
            try_join_all(
                claims
                    .iter()
                    .map(|claim| self.set_owner_of(claim, &retained)),
            )
            .await?;
        }
        let listed = self.pipeline_claims(&me.uid).await?;
        let kept: BTreeSet<Claim> = listed
            .iter()
            .filter(|claim| !claims.contains(claim))
            .cloned()
            .collect();
        if kept.len() != listed.len() {
            self.set_pipeline_claims(me, &kept).await?;
        }
        if how == GiveUp::Release {
            // Claim markers of its own from before pipeline markers: removed where there.
            let markers: Vec<String> = claims.iter().map(|claim| claim.marker()).collect();
            try_join_all(markers.iter().map(|marker| self.clear_owner(marker))).await?;
        }
        Ok(())
    }

    /// Removes `marker`; `false` when it was not there.
    pub async fn clear_owner(&self, marker: &str) -> Result<bool, TopologyError> {
        let cleared = match self
            .bounded_write(self.api.clear_global_runtime_parameter(marker))
            .await
        {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => {
                self.markers_unknown();
                Err(self.error(&format!("remove global parameter {marker:?}"), e))
            }
        }?;
        self.markers_changed(|markers| markers.remove(marker));
        Ok(cleared)
    }

    /// Whether what `claim` names exists in the broker now.
    pub async fn claimed_exists(&self, claim: &Claim) -> Result<bool, TopologyError> {
        let found = match claim {
            Claim::Exchange { vhost, name } => self
                .read(self.api.get_exchange_info(vhost, name))
                .await
                .map(|_| ()),
            Claim::Queue { vhost, name } => {
                return Ok(self.queue_info(vhost, name).await?.is_some());
            }
            Claim::User { name } => self.read(self.api.get_user(name)).await.map(|_| ()),
        };
        match found {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(self.error(&format!("read {claim}"), e)),
        }
    }
}
