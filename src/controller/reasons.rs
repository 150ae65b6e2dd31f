//! Every reason the controller writes, defined once.
//!
//! Condition reasons are what `kubectl get mp` users, the Argo CD health check
//! (`deploy/argocd/health.lua`) and the runbook (`docs/operations.md`) act on, so each is
//! a constant here and [`condition_reasons`] lists them all; tests hold the health check
//! and the runbook to that list. A new reason is added here first.

use crate::controller::error::{CATEGORIES, pascal_case};

/// `TopologyReady=True`: RabbitMQ holds what the spec asks for.
pub const RECONCILED: &str = "Reconciled";
/// `WorkerReady=False`: the worker Deployment does not exist yet.
pub const DEPLOYMENT_MISSING: &str = "DeploymentMissing";
/// `WorkerReady=True`: no worker is asked for; mail waits in the send queue.
pub const SCALED_TO_ZERO: &str = "ScaledToZero";
/// `WorkerReady=True`: every worker asked for is ready and up to date.
pub const ALL_READY: &str = "AllReady";
/// `WorkerReady=False`: some workers are not ready (rolling out, crashing, unschedulable).
pub const WORKERS_NOT_READY: &str = "WorkersNotReady";
/// `WorkerReady=False`: `spec.worker.autoscaling` is set but KEDA is not installed.
pub const AUTOSCALING_UNAVAILABLE: &str = "AutoscalingUnavailable";
/// `WorkerReady=False`: the workers' provider refuses their key (an API's 401 or 403);
/// they send nothing, and spend no attempt, until it takes it. Told by the workers
/// through the broker (`crate::worker::signal`).
pub const PROVIDER_REFUSES_KEY: &str = "ProviderRefusesKey";
/// `Ready=True`: the pipeline sends mail.
pub const READY: &str = "Ready";
/// `TopologyReady=False` on a deleted pipeline, just before it goes: its cleanup left
/// something in RabbitMQ (the message says what).
pub const CLEANUP_INCOMPLETE: &str = "CleanupIncomplete";
/// `TopologyReady=False`: a policy of someone else's applies to one of the pipeline's
/// queues instead of the pipeline's own, or an operator policy overrides it.
pub const POLICY_SHADOWED: &str = "PolicyShadowed";

/// The reasons of conditions that are not failures of a reconcile.
pub const STATE_REASONS: &[&str] = &[
    RECONCILED,
    DEPLOYMENT_MISSING,
    SCALED_TO_ZERO,
    ALL_READY,
    WORKERS_NOT_READY,
    PROVIDER_REFUSES_KEY,
    AUTOSCALING_UNAVAILABLE,
    READY,
    CLEANUP_INCOMPLETE,
    POLICY_SHADOWED,
];

/// Every reason a condition can carry: the states above, and one per error category
/// (`MissingSecretKey`, `Unreachable`, …, see [`super::Error::reason`]).
pub fn condition_reasons() -> Vec<String> {
    STATE_REASONS
        .iter()
        .map(|reason| (*reason).to_string())
        .chain(CATEGORIES.iter().map(|category| pascal_case(category)))
        .collect()
}

/// Events published about a pipeline (besides `ReconcileFailed<Reason>`, one per
/// condition reason of a failure).
pub mod event {
    pub const TOPOLOGY_CREATED: &str = "TopologyCreated";
    pub const TOPOLOGY_UPDATED: &str = "TopologyUpdated";
    pub const TOPOLOGY_REPAIRED: &str = "TopologyRepaired";
    pub const DEAD_LETTERS_GREW: &str = "DeadLettersGrew";
    pub const CLEANED_UP: &str = "CleanedUp";
    /// The queue of a delay tier the spec no longer has was removed, now that it is empty.
    pub const RETRY_TIER_REMOVED: &str = "RetryTierRemoved";
    pub const CLEANUP_INCOMPLETE: &str = "CleanupIncomplete";
    /// The workers' users of a pipeline its RabbitmqCluster no longer allows were removed.
    pub const ACCESS_REVOKED: &str = "AccessRevoked";
    /// The prefix of a failure's event; the condition's reason follows it.
    pub const RECONCILE_FAILED_PREFIX: &str = "ReconcileFailed";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_distinct_pascal_case() {
        let reasons = condition_reasons();
        let mut unique = reasons.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), reasons.len(), "{reasons:?}");
        for reason in &reasons {
            assert!(
                reason.chars().next().is_some_and(char::is_uppercase)
                    && reason.chars().all(char::is_alphanumeric),
                "{reason}"
            );
        }
        assert!(reasons.contains(&"MissingSecretKey".to_string()));
    }
}
