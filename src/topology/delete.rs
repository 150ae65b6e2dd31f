//! Removing what a pipeline made: by its spec ([`delete`], `mailer topology delete`),
//! or by names its owner markers prove its own ([`delete_named`], the controller). A queue
//! that holds messages is kept unless forced, and so is its policy; the report says what
//! was removed and what was kept, and why.

use std::fmt;

use super::desired::Binding;
use super::desired::Topology;
use super::error::TopologyError;
use super::live::{LiveLoad, LiveQueues};
use super::management::Management;
use crate::spec::DeletionPolicy;

/// What a delete did, and what it left and why.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DeleteReport {
    pub removed: Vec<Removed>,
    /// What was left in place, each with why.
    pub kept: Vec<Kept>,
}

/// One object a delete removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removed {
    Binding(Binding),
    Exchange(String),
    Queue(String),
    Policy(String),
}

impl fmt::Display for Removed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Binding(b) => write!(f, "binding {} -> {}", b.exchange, b.queue),
            Self::Exchange(name) => write!(f, "exchange {name}"),
            Self::Queue(name) => write!(f, "queue {name}"),
            Self::Policy(name) => write!(f, "policy {name}"),
        }
    }
}

/// What a delete left in place, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// `deletionPolicy: Retain` keeps everything.
    Retained { vhost: String },
    /// The vhost does not exist: there was nothing to remove.
    VhostGone { vhost: String },
    /// The broker could not be reached: whatever is left stays.
    Unreachable { vhost: String, error: String },
    /// A queue that holds messages, or whose messages could not be counted.
    Queue { name: String, why: String },
    /// The policy of a queue kept, which the mail kept still needs.
    PolicyOfKeptQueue { name: String },
}

impl Kept {
    /// Whether this was meant to go but is still there: not a vhost that is gone, nor
    /// what `Retain` keeps on purpose.
    pub fn is_left_over(&self) -> bool {
        !matches!(self, Self::Retained { .. } | Self::VhostGone { .. })
    }
}

impl fmt::Display for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Retained { vhost } => {
                write!(f, "everything in vhost {vhost:?} (deletionPolicy Retain)")
            }
            Self::VhostGone { vhost } => write!(f, "nothing: vhost {vhost:?} does not exist"),
            Self::Unreachable { vhost, error } => {
                write!(f, "whatever is left in vhost {vhost:?}: {error}")
            }
            Self::Queue { name, why } => write!(f, "queue {name}: {why}"),
            Self::PolicyOfKeptQueue { name } => write!(f, "policy {name}: its queue is kept"),
        }
    }
}

impl fmt::Display for DeleteReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for removed in &self.removed {
            writeln!(f, "removed {removed}")?;
        }
        for kept in &self.kept {
            writeln!(f, "kept {kept}")?;
        }
        Ok(())
    }
}

/// How delete decides whether a queue holds messages.
#[derive(Debug, Clone, Copy)]
pub enum EmptinessCheck<'a> {
    /// Ask the broker over AMQP (a passive declare), which is live.
    Live(&'a str),
    /// Delete queues whatever they hold.
    Force,
}

/// Removes what `policy` says to remove. `Retain` removes nothing. `Delete` removes the
/// bindings, exchanges, empty queues and policies of the pipeline (the policy of a queue
/// kept stays with it); a queue that holds messages is kept unless forced. A broker that
/// cannot be reached or a vhost that is gone is not an error: there is nothing more this
/// can remove, and the report says so.
pub async fn delete(
    management: &Management,
    topology: &Topology,
    policy: DeletionPolicy,
    emptiness: EmptinessCheck<'_>,
) -> Result<DeleteReport, TopologyError> {
    if policy == DeletionPolicy::Retain {
        return Ok(DeleteReport {
            removed: Vec::new(),
            kept: vec![Kept::Retained {
                vhost: topology.vhost.clone(),
            }],
        });
    }
    let vhost = &topology.vhost;
    let read = async {
        let exists = management.vhost_exists(vhost).await?;
        management.observe_topology(topology, exists).await
    };
    let observed = match read.await {
        Ok(observed) => observed,
        Err(e @ TopologyError::Unreachable { .. }) => return Ok(unreachable(vhost, &e)),
        Err(e) => return Err(e),
    };
    if !observed.vhost_exists {
        return Ok(vhost_gone(vhost));
    }
    // Only what is there, and of the kind the topology declares.
    let removal = Removal {
        vhost: vhost.clone(),
        bindings: topology
            .bindings
            .iter()
            .filter(|b| observed.bindings.contains(b))
            .cloned()
            .collect(),
        exchanges: topology
            .exchanges
            .iter()
            .filter(|exchange| {
                observed
                    .exchanges
                    .iter()
                    .any(|e| e.name == exchange.name && e.kind == exchange.kind.as_str())
            })
            .map(|e| e.name.clone())
            .collect(),
        queues: topology
            .queues
            .iter()
            .filter(|queue| {
                observed
                    .queues
                    .iter()
                    .any(|q| q.name == queue.name && q.queue_type == "quorum")
            })
            .map(|q| q.name.clone())
            .collect(),
        policies: topology
            .policies
            .iter()
            .filter(|policy| observed.policies.iter().any(|p| p.name == policy.name))
            .map(|p| p.name.clone())
            .collect(),
    };
    remove(management, &removal, emptiness).await
}

/// Named objects of one vhost to remove: what [`delete`] found of a topology, or what a
/// pipeline's owner markers prove its own ([`delete_named`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removal {
    pub vhost: String,
    pub bindings: Vec<Binding>,
    pub exchanges: Vec<String>,
    pub queues: Vec<String>,
    /// Policies by name; the policy of a queue that is kept (it holds mail) stays with
    /// it, so the mail kept keeps its dead-lettering and limits.
    pub policies: Vec<String>,
}

/// Removes `removal`'s objects that exist (each queue only when it holds nothing, unless
/// forced), with the same report as [`delete`].
pub async fn delete_named(
    management: &Management,
    removal: &Removal,
    emptiness: EmptinessCheck<'_>,
) -> Result<DeleteReport, TopologyError> {
    match management.vhost_exists(&removal.vhost).await {
        Ok(true) => remove(management, removal, emptiness).await,
        Ok(false) => Ok(vhost_gone(&removal.vhost)),
        Err(e @ TopologyError::Unreachable { .. }) => Ok(unreachable(&removal.vhost, &e)),
        Err(e) => Err(e),
    }
}

fn vhost_gone(vhost: &str) -> DeleteReport {
    DeleteReport {
        removed: Vec::new(),
        kept: vec![Kept::VhostGone {
            vhost: vhost.to_string(),
        }],
    }
}

fn unreachable(vhost: &str, e: &TopologyError) -> DeleteReport {
    DeleteReport {
        removed: Vec::new(),
        kept: vec![Kept::Unreachable {
            vhost: vhost.to_string(),
            error: e.to_string(),
        }],
    }
}

async fn remove(
    management: &Management,
    removal: &Removal,
    emptiness: EmptinessCheck<'_>,
) -> Result<DeleteReport, TopologyError> {
    let mut report = DeleteReport::default();
    let vhost = &removal.vhost;
    // Bindings and exchanges first, so no new request arrives while queues are checked.
    for binding in &removal.bindings {
        management.delete_binding(vhost, binding).await?;
        report.removed.push(Removed::Binding(binding.clone()));
    }
    for exchange in &removal.exchanges {
        management.delete_exchange(vhost, exchange).await?;
        report.removed.push(Removed::Exchange(exchange.clone()));
    }

    let live = match emptiness {
        EmptinessCheck::Live(amqp_url) => Some(LiveQueues::connect(amqp_url).await),
        EmptinessCheck::Force => None,
    };
    let mut kept_queues = Vec::new();
    for queue in &removal.queues {
        let verdict = match &live {
            None => Ok(()),
            Some(Err(e)) => Err(format!(
                "its messages could not be counted ({e}); use --force to delete it anyway"
            )),
            Some(Ok(live)) => holds_nothing(management, live, vhost, queue).await,
        };
        match verdict {
            Ok(()) => {
                management.delete_queue(vhost, queue).await?;
                report.removed.push(Removed::Queue(queue.clone()));
            }
            Err(why) => {
                report.kept.push(Kept::Queue {
                    name: queue.clone(),
                    why,
                });
                kept_queues.push(queue);
            }
        }
    }
    if let Some(Ok(live)) = live {
        live.close().await;
    }

    for policy in &removal.policies {
        let of_kept_queue = kept_queues
            .iter()
            .any(|queue| *policy == super::desired::policy_name(queue));
        if of_kept_queue {
            report.kept.push(Kept::PolicyOfKeptQueue {
                name: policy.clone(),
            });
            continue;
        }
        management.delete_policy(vhost, policy).await?;
        report.removed.push(Removed::Policy(policy.clone()));
    }
    Ok(report)
}

/// `Ok` when the queue holds no message, else why it must be kept. Ready messages are
/// counted live; unacknowledged ones exist only while a consumer holds them, and only the
/// management API counts those.
async fn holds_nothing(
    management: &Management,
    live: &LiveQueues,
    vhost: &str,
    queue: &str,
) -> Result<(), String> {
    match live.load(queue).await {
        Ok(None) => Ok(()),
        Ok(Some(LiveLoad { ready, .. })) if ready > 0 => Err(format!(
            "it holds {ready} messages; move or consume them, or use --force to delete it with them"
        )),
        Ok(Some(LiveLoad { consumers: 0, .. })) => Ok(()),
        Ok(Some(LiveLoad { consumers, .. })) => match management.queue_depth(vhost, queue).await {
            Ok(Some(depth)) if depth.unacknowledged > 0 => Err(format!(
                "{consumers} consumers hold {} unacknowledged messages; stop the workers first, or use --force",
                depth.unacknowledged
            )),
            Ok(_) => Ok(()),
            Err(e) => Err(format!(
                "its unacknowledged messages could not be counted: {e}"
            )),
        },
        Err(e) => Err(format!(
            "its messages could not be counted ({e}); use --force to delete it anyway"
        )),
    }
}
