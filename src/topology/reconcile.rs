//! Plan, apply and delete: the I/O around the pure [`plan`](super::diff::plan).
//!
//! Apply reads, compares, and writes only what differs, so applying an unchanged spec
//! makes no write at all. Nothing here ever deletes or redeclares a queue that exists.
//!
//! A pass over many pipelines ([`plan_all`], [`apply_all`]) reads whether each vhost
//! exists once, then each pipeline's own objects by name, and writes what differs, with
//! no more than [`MAX_IN_FLIGHT`](super::MAX_IN_FLIGHT) requests at once (the client's bound), so its cost
//! grows with the number of pipelines and what changes, not with what else shares their
//! vhosts.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{join_all, try_join_all};

use super::declare::AmqpDeclarer;
use super::desired::{Binding, Policy};
use super::diff::{self, Change, Observed};
use super::import::POLICY_IMPORT_FROM;
use super::live::{LiveLoad, LiveQueues};
use super::management::Management;
use super::snapshot::{DEFINITIONS_FROM, Snapshot};
use super::together;
use super::{Topology, TopologyError};
use crate::spec::DeletionPolicy;

/// What apply would change, without changing anything.
pub async fn plan(
    management: &Management,
    topology: &Topology,
) -> Result<Vec<Change>, TopologyError> {
    let mut plans = plan_all(management, std::slice::from_ref(topology)).await?;
    Ok(plans.pop().unwrap_or_default())
}

/// Makes RabbitMQ hold `topology` and returns what was changed (nothing when it already
/// did). Conflicts stop it before the first write.
pub async fn apply(
    management: &Management,
    topology: &Topology,
) -> Result<Vec<Change>, TopologyError> {
    let mut applied = apply_all(management, std::slice::from_ref(topology)).await?;
    Ok(applied.pop().unwrap_or_default())
}

/// What apply would change for each of `topologies`, in their order, without changing
/// anything. Whether each vhost exists is read once; a vhost with at least
/// [`DEFINITIONS_FROM`] of the pipelines has its definitions read once for all of them,
/// the others' objects are read by name. A vhost that is missing is to be created by the
/// first of its pipelines only.
///
/// When pipelines cannot be planned, the pass fails with the error of the first of them;
/// conflicts of later pipelines in the same vhost are added to its conflicts.
pub async fn plan_all(
    management: &Management,
    topologies: &[Topology],
) -> Result<Vec<Vec<Change>>, TopologyError> {
    let mut pipelines_in: HashMap<&str, usize> = HashMap::new();
    for topology in topologies {
        *pipelines_in.entry(topology.vhost.as_str()).or_default() += 1;
    }
    let vhosts: Vec<(&str, usize)> = pipelines_in.into_iter().collect();
    let found = try_join_all(
        vhosts
            .iter()
            .map(|(vhost, pipelines)| view_of(management, vhost, *pipelines)),
    )
    .await?;
    let views: HashMap<&str, VhostView> = vhosts.iter().map(|(v, _)| *v).zip(found).collect();
    let results = join_all(
        topologies
            .iter()
            .map(|topology| plan_one(management, topology, views.get(topology.vhost.as_str()))),
    )
    .await;
    let mut plans = first_failure(results)?;
    // A missing vhost is created once, by the first of its pipelines.
    let mut created = HashSet::new();
    for plan in &mut plans {
        plan.retain(|change| match change {
            Change::CreateVhost(name) => created.insert(name.clone()),
            _ => true,
        });
    }
    Ok(plans)
}

/// How a pass reads the pipelines of one vhost.
enum VhostView {
    Missing,
    ByName,
    Definitions(Arc<Snapshot>),
}

async fn view_of(
    management: &Management,
    vhost: &str,
    pipelines: usize,
) -> Result<VhostView, TopologyError> {
    if !management.vhost_exists(vhost).await? {
        return Ok(VhostView::Missing);
    }
    if pipelines < DEFINITIONS_FROM {
        return Ok(VhostView::ByName);
    }
    Ok(match management.snapshot(vhost).await? {
        Some(snapshot) => VhostView::Definitions(Arc::new(snapshot)),
        None => VhostView::ByName,
    })
}

async fn plan_one(
    management: &Management,
    topology: &Topology,
    view: Option<&VhostView>,
) -> Result<Vec<Change>, TopologyError> {
    let observed = match view {
        None | Some(VhostView::Missing) => Observed::default(),
        Some(VhostView::ByName) => management.observe_topology(topology, true).await?,
        Some(VhostView::Definitions(snapshot)) => {
            management.observe_in_snapshot(topology, snapshot).await?
        }
    };
    diff::plan(topology, &observed).map_err(|conflicts| TopologyError::Conflict {
        vhost: topology.vhost.clone(),
        conflicts,
    })
}

/// The plans, or the error of the first pipeline that has one, with the conflicts of
/// later pipelines in the same vhost added to it.
fn first_failure(
    results: Vec<Result<Vec<Change>, TopologyError>>,
) -> Result<Vec<Vec<Change>>, TopologyError> {
    let mut plans = Vec::with_capacity(results.len());
    let mut failure: Option<TopologyError> = None;
    for result in results {
        match (result, &mut failure) {
            (Ok(plan), None) => plans.push(plan),
            (Err(e), None) => failure = Some(e),
            (
                Err(TopologyError::Conflict { vhost, conflicts }),
                Some(TopologyError::Conflict {
                    vhost: first,
                    conflicts: all,
                }),
            ) if vhost == *first => all.extend(conflicts),
            _ => {}
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(plans),
    }
}

/// Makes RabbitMQ hold every one of `topologies` and returns what was changed for each,
/// in their order. Every pipeline is planned before the first write, so a conflict in any
/// of them stops the pass with nothing written.
///
/// The writes go in four steps, each finished before the next starts, each with as many
/// writes in flight as the client allows ([`MAX_IN_FLIGHT`](super::MAX_IN_FLIGHT)): the
/// vhosts; then policies, so that no queue exists even for a moment without its policy's
/// dead-lettering and limits; then exchanges and queues; then bindings, which need their
/// exchange and queue. Policies go alone and first because RabbitMQ matches each policy
/// it is given against every exchange and queue of the vhost: written among new
/// exchanges and queues, each would cost more the more of them exist (with many
/// pipelines in one vhost, far more: `docs/benchmarks.md`). A vhost several pipelines
/// need is created once (see [`plan_all`]). Many policies of one vhost go in one
/// definitions import ([`super::import`]). The first failed write stops the pass.
pub async fn apply_all(
    management: &Management,
    topologies: &[Topology],
) -> Result<Vec<Vec<Change>>, TopologyError> {
    apply_all_declaring(management, None, topologies).await
}

/// [`apply_all`], with the exchanges, queues and bindings declared over AMQP by
/// `declarer` when there is one (see [`super::declare`]); the vhosts and policies, and
/// every read, still go through the management API.
pub async fn apply_all_declaring(
    management: &Management,
    declarer: Option<&AmqpDeclarer>,
    topologies: &[Topology],
) -> Result<Vec<Vec<Change>>, TopologyError> {
    let plans = plan_all(management, topologies).await?;
    write_plans(management, declarer, topologies, &plans).await?;
    Ok(plans)
}

/// As [`apply`], for pipelines applied one at a time by work running at once (the
/// controller's reconciles): a vhost's definitions, read at most once per `max_age` and
/// only while nothing has been written there through this client for as long (a vhost
/// being built is read by name), serve each of its pipelines instead of their objects by
/// name, so a pipeline in sync costs no request of its own. A change in the vhost by
/// someone else is found up to `max_age` later than by [`apply`]. With a `policy_window`,
/// the policies to write go together with those of the other work of this client for the
/// same vhost within that window ([`super::together`]).
pub async fn apply_shared(
    management: &Arc<Management>,
    topology: &Topology,
    max_age: Duration,
    policy_window: Duration,
) -> Result<Vec<Change>, TopologyError> {
    let view = match management.shared_snapshot(&topology.vhost, max_age).await? {
        Some(snapshot) => VhostView::Definitions(snapshot),
        None => view_of(management, &topology.vhost, 1).await?,
    };
    let plan = plan_one(management, topology, Some(&view)).await?;
    if policy_window.is_zero() {
        write_plans(
            management,
            None,
            std::slice::from_ref(topology),
            std::slice::from_ref(&plan),
        )
        .await?;
        return Ok(plan);
    }
    // The vhost first, then the policies together, then the rest, as write_plans orders.
    let (vhosts, rest): (Vec<&Change>, Vec<&Change>) = plan
        .iter()
        .partition(|change| matches!(change, Change::CreateVhost(_)));
    let vhost = topology.vhost.as_str();
    write_step(management, vhosts.into_iter().map(|c| (vhost, c)).collect()).await?;
    let (policies, others): (Vec<&Change>, Vec<Change>) = {
        let (policies, others): (Vec<&Change>, Vec<&Change>) = rest
            .into_iter()
            .partition(|change| matches!(change, Change::PutPolicy { .. }));
        (policies, others.into_iter().cloned().collect())
    };
    let policy_list = policies
        .iter()
        .filter_map(|change| match change {
            Change::PutPolicy { policy, .. } => Some(policy.clone()),
            _ => None,
        })
        .collect();
    together::put_policies_together(management, vhost, policy_list, policy_window).await?;
    for change in &policies {
        tracing::info!(vhost = %vhost, change = %change, "topology changed");
    }
    write_plans(management, None, std::slice::from_ref(topology), &[others]).await?;
    Ok(plan)
}

/// Writes `plans`, each of the pipeline of the same index in `topologies`, in the steps
/// [`apply_all`] says; exchanges, queues and bindings over AMQP when `declarer` is given.
async fn write_plans(
    management: &Management,
    declarer: Option<&AmqpDeclarer>,
    topologies: &[Topology],
    plans: &[Vec<Change>],
) -> Result<(), TopologyError> {
    let mut steps: [Vec<(&str, &Change)>; 4] = Default::default();
    for (topology, changes) in topologies.iter().zip(plans) {
        for change in changes {
            let step = match change {
                Change::CreateVhost(_) => 0,
                Change::PutPolicy { .. } => 1,
                Change::CreateExchange(_) | Change::CreateQueue(_) => 2,
                Change::CreateBinding(_) => 3,
            };
            steps[step].push((topology.vhost.as_str(), change));
        }
    }
    let [vhosts, policies, exchanges_and_queues, bindings] = steps;
    write_step(management, vhosts).await?;
    // Connected before the next write, so a URL the broker refuses changes nothing more.
    let declaring = match declarer {
        Some(declarer) if !(exchanges_and_queues.is_empty() && bindings.is_empty()) => {
            let vhosts: Vec<&str> = exchanges_and_queues
                .iter()
                .chain(&bindings)
                .map(|(vhost, _)| *vhost)
                .collect();
            Some(declarer.open(&vhosts).await?)
        }
        _ => None,
    };
    let written = async {
        write_policies(management, policies).await?;
        for step in [exchanges_and_queues, bindings] {
            match &declaring {
                Some(declaring) => declaring.write_all(management, &step).await?,
                None => write_step(management, step).await?,
            }
        }
        Ok::<(), TopologyError>(())
    }
    .await;
    if let Some(declaring) = declaring {
        declaring.close().await;
    }
    written
}

/// Writes the policies of a step: a vhost with at least [`POLICY_IMPORT_FROM`] of them
/// in one definitions import (when this user may import), the others one by one.
async fn write_policies(
    management: &Management,
    step: Vec<(&str, &Change)>,
) -> Result<(), TopologyError> {
    let mut by_vhost: HashMap<&str, Vec<&Change>> = HashMap::new();
    for (vhost, change) in &step {
        by_vhost.entry(vhost).or_default().push(change);
    }
    let mut one_by_one = Vec::new();
    for (vhost, changes) in by_vhost {
        let policies: Vec<&Policy> = changes
            .iter()
            .filter_map(|change| match change {
                Change::PutPolicy { policy, .. } => Some(policy),
                _ => None,
            })
            .collect();
        if policies.len() >= POLICY_IMPORT_FROM
            && management.import_policies(vhost, &policies).await?
        {
            for change in changes {
                tracing::info!(vhost = %vhost, change = %change, "topology changed");
            }
            continue;
        }
        one_by_one.extend(changes.into_iter().map(|change| (vhost, change)));
    }
    write_step(management, one_by_one).await
}

/// Writes one step's changes through the management API, as many at once as it allows.
async fn write_step(
    management: &Management,
    step: Vec<(&str, &Change)>,
) -> Result<(), TopologyError> {
    try_join_all(
        step.into_iter()
            .map(|(vhost, change)| write_one(management, vhost, change)),
    )
    .await?;
    Ok(())
}

async fn write_one(
    management: &Management,
    vhost: &str,
    change: &Change,
) -> Result<(), TopologyError> {
    management.write(vhost, change).await?;
    tracing::info!(vhost = %vhost, change = %change, "topology changed");
    Ok(())
}

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
