//! The status a pipeline should show, as a pure function of what the reconcile found.
//!
//! A condition keeps its `lastTransitionTime` while its status stays the same, so a
//! status computed twice from the same findings is equal, and is not written again.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::controller::kube::keda::KEDA_GROUP_VERSION;
use crate::controller::objects::autoscaling::{Autoscaling, INSTALL_KEDA};
use crate::controller::reasons;
use crate::spec::{
    MailerPipeline, MailerPipelineStatus, QueueDepths, READY, TOPOLOGY_READY, WORKER_READY,
    WorkerCounts,
};
use crate::text::truncate_bytes;

/// The longest condition message written; a list of conflicts could otherwise exceed
/// what the API server accepts and make every status write fail.
const MAX_MESSAGE_BYTES: usize = 4096;

/// How the RabbitMQ side of the reconcile went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopologyOutcome {
    Ready,
    /// It failed; `reason` is a PascalCase category, `message` says what to do.
    Failed {
        reason: String,
        message: String,
    },
}

/// What a reconcile found, to compute the status from.
#[derive(Debug, Clone, PartialEq)]
pub struct Findings<'a> {
    pub generation: Option<i64>,
    /// The generation applied in full: this one after a success, else as before.
    pub applied_generation: Option<i64>,
    pub topology: TopologyOutcome,
    /// The worker Deployment as it is now, if it exists.
    pub deployment: Option<&'a Deployment>,
    /// How many workers the Deployment asks for: `spec.worker.replicas`, or under
    /// autoscaling what the autoscaler last set.
    pub desired_workers: i32,
    /// Whether KEDA scales the workers, or would if it were installed.
    pub autoscaling: Autoscaling,
    pub deployment_name: &'a str,
    /// `None` when the broker could not be asked.
    pub queues: Option<QueueDepths>,
    pub worker_user: Option<String>,
    /// While the workers say their provider refuses their key: where the key is, e.g.
    /// `key url of Secret smtp`.
    pub provider_refuses_key: Option<String>,
}

/// The status `findings` call for; `previous` only lends the transition times of
/// conditions whose status did not change.
pub fn desired_status(
    previous: Option<&MailerPipelineStatus>,
    findings: &Findings<'_>,
    now: Timestamp,
) -> MailerPipelineStatus {
    let ready_workers = findings
        .deployment
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let updated_workers = findings
        .deployment
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.updated_replicas)
        .unwrap_or(0);
    let desired = findings.desired_workers;
    let name = findings.deployment_name;

    let topology = match &findings.topology {
        TopologyOutcome::Ready => (
            true,
            reasons::RECONCILED.to_string(),
            "the exchanges, queues, bindings, policies and worker user are in RabbitMQ as the spec asks".to_string(),
        ),
        TopologyOutcome::Failed { reason, message } => (false, reason.clone(), message.clone()),
    };
    let worker = if findings.deployment.is_none() {
        let why = if topology.0 {
            "the worker Deployment has not been created yet".to_string()
        } else {
            "the worker Deployment waits until the topology is ready (see TopologyReady)"
                .to_string()
        };
        (false, reasons::DEPLOYMENT_MISSING.to_string(), why)
    } else if findings.autoscaling == Autoscaling::Unavailable {
        (
            false,
            reasons::AUTOSCALING_UNAVAILABLE.to_string(),
            format!(
                "spec.worker.autoscaling is set but KEDA is not installed (the API server does not serve {KEDA_GROUP_VERSION}); {INSTALL_KEDA}. Until then the Deployment keeps the {desired} workers it has"
            ),
        )
    } else if desired == 0 && findings.autoscaling == Autoscaling::On {
        (
            true,
            reasons::SCALED_TO_ZERO.to_string(),
            "KEDA scaled the workers to 0 (autoscaling.minReplicas is 0 and the send queue is empty); one starts when mail arrives"
                .to_string(),
        )
    } else if desired == 0 {
        (
            true,
            reasons::SCALED_TO_ZERO.to_string(),
            "spec.worker.replicas is 0: no worker runs and mail waits in the send queue"
                .to_string(),
        )
    } else if ready_workers >= desired && updated_workers >= desired {
        (
            true,
            reasons::ALL_READY.to_string(),
            format!("{ready_workers} of {desired} workers are ready"),
        )
    } else if let Some(key) = &findings.provider_refuses_key {
        (
            false,
            reasons::PROVIDER_REFUSES_KEY.to_string(),
            format!(
                "{ready_workers} of {desired} workers are ready: their provider refuses the key (HTTP 401 or 403). Nothing is sent and no attempt is spent: mail waits in the send queue. Fix the {key}; the workers restart when it changes"
            ),
        )
    } else {
        (
            false,
            reasons::WORKERS_NOT_READY.to_string(),
            format!(
                "{ready_workers} of {desired} workers are ready; see kubectl describe deployment {name} and the pods' logs"
            ),
        )
    };
    let ready = match (topology.0, worker.0) {
        (true, true) => (
            true,
            reasons::READY.to_string(),
            "the pipeline sends mail".to_string(),
        ),
        (false, _) => (
            false,
            topology.1.clone(),
            format!("topology: {}", topology.2),
        ),
        (true, false) => (false, worker.1.clone(), format!("workers: {}", worker.2)),
    };

    let condition = |type_: &str, (ok, reason, message): (bool, String, String)| {
        let status = if ok { "True" } else { "False" };
        let since = previous
            .and_then(|p| p.condition(type_))
            .filter(|c| c.status == status)
            .map_or(Time(now), |c| c.last_transition_time.clone());
        Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason,
            message: truncate_bytes(message, MAX_MESSAGE_BYTES),
            observed_generation: findings.generation,
            last_transition_time: since,
        }
    };
    MailerPipelineStatus {
        observed_generation: findings.generation,
        applied_generation: findings.applied_generation,
        conditions: vec![
            condition(TOPOLOGY_READY, topology),
            condition(WORKER_READY, worker),
            condition(READY, ready),
        ],
        // Depths that could not be read this time are shown as last read rather than
        // dropped, so the printer columns do not flicker during a broker outage.
        queues: findings
            .queues
            .clone()
            .or_else(|| previous.and_then(|p| p.queues.clone())),
        workers: Some(WorkerCounts {
            ready: ready_workers,
            desired,
        }),
        worker_user: findings.worker_user.clone(),
    }
}

/// Whether the spec is the one the operator last applied in full, so a difference found
/// now was made by someone else (drift) rather than asked for. `observedGeneration` does
/// not tell: it is written after a failed attempt too.
pub fn unchanged_spec(pipeline: &MailerPipeline) -> bool {
    let applied = pipeline.status.as_ref().and_then(|s| s.applied_generation);
    applied.is_some() && applied == pipeline.metadata.generation
}

/// How many dead letters were added since `previous`, when their number grew.
pub fn dead_letters_added(
    previous: Option<&MailerPipelineStatus>,
    current: &MailerPipelineStatus,
) -> Option<i64> {
    let before = previous
        .and_then(|p| p.queues.as_ref())
        .and_then(|q| q.dead)?;
    let now = current.queues.as_ref().and_then(|q| q.dead)?;
    (now > before).then_some(now - before)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DeploymentStatus;

    fn deployment(ready: i32) -> Deployment {
        Deployment {
            status: Some(DeploymentStatus {
                ready_replicas: Some(ready),
                updated_replicas: Some(ready),
                ..DeploymentStatus::default()
            }),
            ..Deployment::default()
        }
    }

    fn findings(deployment: Option<&Deployment>, topology: TopologyOutcome) -> Findings<'_> {
        Findings {
            generation: Some(3),
            applied_generation: Some(3),
            topology,
            deployment,
            desired_workers: 2,
            autoscaling: Autoscaling::Off,
            deployment_name: "shop-worker",
            queues: Some(QueueDepths {
                send: Some(4),
                retry: Some(1),
                dead: Some(0),
                retry_tiers: Vec::new(),
                retry_by_tier: None,
            }),
            worker_user: Some("mailer-worker.prod.shop".into()),
            provider_refuses_key: None,
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn ready_when_the_topology_is_and_every_worker_is() {
        let d = deployment(2);
        let s = desired_status(None, &findings(Some(&d), TopologyOutcome::Ready), at(10));
        assert!(s.is_true(READY) && s.is_true(TOPOLOGY_READY) && s.is_true(WORKER_READY));
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(
            s.workers,
            Some(WorkerCounts {
                ready: 2,
                desired: 2
            })
        );
        assert_eq!(s.queues.unwrap().send, Some(4));
    }

    #[test]
    fn not_ready_says_which_part_and_what_to_do() {
        let d = deployment(1);
        let s = desired_status(None, &findings(Some(&d), TopologyOutcome::Ready), at(10));
        let ready = s.condition(READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "WorkersNotReady")
        );
        assert!(
            ready.message.contains("1 of 2 workers are ready"),
            "{}",
            ready.message
        );
        assert!(
            ready
                .message
                .contains("kubectl describe deployment shop-worker")
        );

        let refused = Findings {
            provider_refuses_key: Some("key url of Secret smtp".into()),
            ..findings(Some(&d), TopologyOutcome::Ready)
        };
        let s = desired_status(None, &refused, at(10));
        let ready = s.condition(READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "ProviderRefusesKey")
        );
        assert!(
            ready.message.contains("refuses the key")
                && ready.message.contains("Fix the key url of Secret smtp"),
            "{}",
            ready.message
        );
        let all_ready = deployment(2);
        let s = desired_status(
            None,
            &Findings {
                deployment: Some(&all_ready),
                ..refused.clone()
            },
            at(10),
        );
        assert!(s.is_true(WORKER_READY), "ready workers are not held back");

        let failed = TopologyOutcome::Failed {
            reason: "MissingSecretKey".into(),
            message: "Secret shop/smtp has no key \"url\"".into(),
        };
        let s = desired_status(None, &findings(None, failed), at(10));
        let ready = s.condition(READY).unwrap();
        assert_eq!(ready.reason, "MissingSecretKey");
        assert!(ready.message.contains("no key \"url\""));
        assert!(
            s.condition(WORKER_READY)
                .unwrap()
                .message
                .contains("waits until the topology")
        );
    }

    #[test]
    fn the_same_findings_give_the_same_status_and_keep_transition_times() {
        let d = deployment(2);
        let f = findings(Some(&d), TopologyOutcome::Ready);
        let first = desired_status(None, &f, at(10));
        let second = desired_status(Some(&first), &f, at(20));
        assert_eq!(first, second);
        let worse = deployment(0);
        let third = desired_status(
            Some(&second),
            &findings(Some(&worse), TopologyOutcome::Ready),
            at(30),
        );
        assert_eq!(
            third
                .condition(TOPOLOGY_READY)
                .unwrap()
                .last_transition_time,
            Time(at(10))
        );
        assert_eq!(
            third.condition(WORKER_READY).unwrap().last_transition_time,
            Time(at(30))
        );
    }

    #[test]
    fn without_keda_autoscaling_says_what_to_install_and_scaled_to_zero_is_ready() {
        let d = deployment(2);
        let mut f = findings(Some(&d), TopologyOutcome::Ready);
        f.autoscaling = Autoscaling::Unavailable;
        let s = desired_status(None, &f, at(10));
        let worker = s.condition(WORKER_READY).unwrap();
        assert_eq!(
            (worker.status.as_str(), worker.reason.as_str()),
            ("False", "AutoscalingUnavailable")
        );
        assert!(
            worker.message.contains("install KEDA"),
            "{}",
            worker.message
        );
        assert!(s.is_true(TOPOLOGY_READY));
        assert_eq!(s.condition(READY).unwrap().reason, "AutoscalingUnavailable");

        let idle = deployment(0);
        let mut f = findings(Some(&idle), TopologyOutcome::Ready);
        f.autoscaling = Autoscaling::On;
        f.desired_workers = 0;
        let s = desired_status(None, &f, at(10));
        assert!(s.is_true(READY));
        assert!(
            s.condition(WORKER_READY)
                .unwrap()
                .message
                .contains("KEDA scaled the workers to 0")
        );
        assert_eq!(s.workers.unwrap().desired, 0);
    }

    #[test]
    fn a_very_long_failure_is_cut_to_what_the_api_server_accepts() {
        let failed = TopologyOutcome::Failed {
            reason: "Conflict".into(),
            message: "x".repeat(100_000),
        };
        let s = desired_status(None, &findings(None, failed), at(10));
        for condition in &s.conditions {
            assert!(
                condition.message.len() <= MAX_MESSAGE_BYTES,
                "{}",
                condition.type_
            );
        }
    }

    #[test]
    fn unread_depths_keep_their_last_value_and_growth_of_dead_letters_is_seen() {
        let d = deployment(2);
        let first = desired_status(None, &findings(Some(&d), TopologyOutcome::Ready), at(10));
        let mut f = findings(Some(&d), TopologyOutcome::Ready);
        f.queues = None;
        assert_eq!(
            desired_status(Some(&first), &f, at(20)).queues,
            first.queues
        );
        let mut more = first.clone();
        more.queues = Some(QueueDepths {
            dead: Some(3),
            ..first.queues.clone().unwrap()
        });
        assert_eq!(dead_letters_added(Some(&first), &more), Some(3));
        assert_eq!(dead_letters_added(Some(&more), &first), None);
        assert_eq!(dead_letters_added(None, &more), None);
    }
}
