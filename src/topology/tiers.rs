//! The delay queues of tiers a spec no longer has, for the standalone commands
//! (`mailer topology apply`, `mailer run`). The operator finds them by its owner markers
//! instead (see `controller::reconcile::retire`); here they are found by name: the names
//! `retryQueue.n` for n up to [`MAX_RETRY_TIERS`](crate::mail::MAX_RETRY_TIERS) belong to
//! the pipeline's delay tiers.
//!
//! Each is removed, with its policy (its binding goes with it), only when it holds
//! nothing; one that still holds parked requests is kept whole, so its policy still
//! returns them to the send queue, and the next apply tries again.

use futures::future::try_join_all;

use super::TopologyError;
use super::delete::{DeleteReport, EmptinessCheck, Removal, delete_named};
use super::desired::policy_name;
use super::management::{Management, QueueDepth};
use crate::mail::{MAX_RETRY_TIERS, retry_tier_queue};
use crate::spec::TopologySpec;

/// Removes the empty delay queues of `spec`'s former tiers in `vhost`, emptiness as
/// `check` says (counted live over AMQP, or forced by `mailer topology delete --force`);
/// the report says what went and what was kept. It costs a read of each name a former
/// tier may have (9 for one tier), and no more when there is none.
pub async fn remove_former_tiers(
    management: &Management,
    vhost: &str,
    spec: &TopologySpec,
    check: EmptinessCheck<'_>,
) -> Result<DeleteReport, TopologyError> {
    let queues: Vec<String> = former_tiers(management, vhost, spec)
        .await?
        .into_iter()
        .map(|(queue, _)| queue)
        .collect();
    if queues.is_empty() {
        return Ok(DeleteReport::default());
    }
    let removal = Removal {
        vhost: vhost.to_string(),
        policies: queues.iter().map(|queue| policy_name(queue)).collect(),
        queues,
        ..Removal::default()
    };
    delete_named(management, &removal, check).await
}

/// The delay queues of `spec`'s former tiers that exist in `vhost`, with their depths as
/// the management API last counted them: a read of each name a former tier may have.
pub async fn former_tiers(
    management: &Management,
    vhost: &str,
    spec: &TopologySpec,
) -> Result<Vec<(String, QueueDepth)>, TopologyError> {
    let former: Vec<String> = (spec.retry_tier_count() + 1..=MAX_RETRY_TIERS)
        .map(|tier| retry_tier_queue(&spec.retry_queue, tier))
        .collect();
    let found = try_join_all(
        former
            .iter()
            .map(|queue| management.queue_depth(vhost, queue)),
    )
    .await?;
    Ok(former
        .into_iter()
        .zip(found)
        .filter_map(|(queue, depth)| Some((queue, depth?)))
        .collect())
}

/// What `mailer topology plan` says of [`former_tiers`], one line each.
pub fn describe_plan(former: &[(String, QueueDepth)]) -> Vec<String> {
    former
        .iter()
        .map(|(queue, depth)| format!(
            "would remove queue {queue} of a former delay tier, with its policy, once it is empty (it holds {} messages as last counted)",
            depth.messages
        ))
        .collect()
}

/// What [`remove_former_tiers`] did, one line each.
pub fn describe(report: &DeleteReport) -> Vec<String> {
    let removed = report
        .removed
        .iter()
        .map(|removed| format!("removed {removed} of a former delay tier: it was empty"));
    let kept = report.kept.iter().filter_map(|kept| match kept {
        super::Kept::Queue { name, .. } => Some(format!(
            "kept queue {name} of a former delay tier, with its policy and binding, until it is empty: it still holds parked requests (or they could not be counted); apply again later to remove it"
        )),
        _ => None,
    });
    removed.chain(kept).collect()
}
