//! Plan and apply: the I/O around the pure [`plan`](super::diff::plan).
//!
//! Apply reads, compares, and writes only what differs, so applying an unchanged spec
//! makes no write at all. Nothing here ever deletes or redeclares a queue that exists
//! (removing is [`super::delete`]'s).
//!
//! A pass over many pipelines ([`plan_all`], [`apply_all`]) reads whether each vhost
//! exists once, then each pipeline's own objects by name, and writes what differs, with
//! no more than [`MAX_IN_FLIGHT`](super::MAX_IN_FLIGHT) requests at once (the client's
//! bound), so its cost grows with the number of pipelines and what changes, not with
//! what else shares their vhosts.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::{join_all, try_join_all};

use super::declare::AmqpDeclarer;
use super::desired::Policy;
use super::desired::Topology;
use super::diff::{self, Change, Observed};
use super::error::TopologyError;
use super::import::POLICY_IMPORT_FROM;
use super::management::Management;
use super::management::snapshot::{DEFINITIONS_FROM, Snapshot};
use super::management::together;

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
    planned(topology, &observed)
}

fn planned(topology: &Topology, observed: &Observed) -> Result<Vec<Change>, TopologyError> {
    diff::plan(topology, observed).map_err(|conflicts| TopologyError::Conflict {
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

/// What [`apply_shared`] changed.
#[derive(Debug, Default)]
pub struct SharedApplied {
    /// The changes made.
    pub changes: Vec<Change>,
    /// Only the vhost and the policies were written: the exchanges, queues and bindings
    /// are left for later (see `defer_rest`).
    pub rest_deferred: bool,
}

/// As [`apply`], for pipelines applied one at a time by work running at once (the
/// controller's reconciles), each holding claims on its topology's exchanges and
/// queues: a vhost's definitions, read at most once per `max_age` and kept current by
/// this client's own writes (see [`super::management::snapshot`]), serve each of its
/// pipelines instead of their objects by name, so a pipeline in sync costs no request of
/// its own and one being made costs no read. A change in the vhost by someone else is
/// found up to `max_age` later than by [`apply`] (a write it makes fail says so at
/// once). With a `policy_window`,
/// the policies to write go together with those of the other work of this client for the
/// same vhost within that window ([`super::management::together`]).
///
/// With `defer_rest: Some(recent)`, when the policies went in a batch with others', or
/// others were written into the vhost within `recent` before them (many pipelines of the
/// vhost being made at once), and exchanges or queues are still to make, it stops there:
/// RabbitMQ sets each policy against every exchange and queue of the vhost, so the
/// others' policies cost least written before any of these exist. The caller makes the
/// rest once the vhost's policies have settled ([`together::policies_settled`]).
pub async fn apply_shared(
    management: &Arc<Management>,
    topology: &Topology,
    max_age: Duration,
    policy_window: Duration,
    defer_rest: Option<Duration>,
) -> Result<SharedApplied, TopologyError> {
    let plan = match management.shared_observe(topology, max_age).await? {
        Some(observed) => planned(topology, &observed)?,
        None => {
            let view = view_of(management, &topology.vhost, 1).await?;
            plan_one(management, topology, Some(&view)).await?
        }
    };
    if policy_window.is_zero() {
        write_plans(
            management,
            None,
            std::slice::from_ref(topology),
            std::slice::from_ref(&plan),
        )
        .await?;
        return Ok(SharedApplied {
            changes: plan,
            rest_deferred: false,
        });
    }
    // The vhost first, then the policies together, then the rest, as write_plans orders.
    let (ahead, others): (Vec<Change>, Vec<Change>) = plan
        .into_iter()
        .partition(|change| matches!(change, Change::CreateVhost(_) | Change::PutPolicy { .. }));
    let vhost = topology.vhost.as_str();
    let creates = ahead
        .iter()
        .filter(|change| matches!(change, Change::CreateVhost(_)));
    write_step(management, creates.map(|c| (vhost, c)).collect()).await?;
    let policies: Vec<Policy> = ahead
        .iter()
        .filter_map(|change| match change {
            Change::PutPolicy { policy, .. } => Some(policy.clone()),
            _ => None,
        })
        .collect();
    let makes_objects = others
        .iter()
        .any(|change| matches!(change, Change::CreateExchange(_) | Change::CreateQueue(_)));
    // The batch logs each policy it writes.
    let hand_over = defer_rest.filter(|_| makes_objects);
    let written =
        together::put_policies_together(management, vhost, policies, policy_window, hand_over)
            .await?;
    let among_others = defer_rest.is_some_and(|recent| written.among_others(recent));
    if among_others && makes_objects {
        return Ok(SharedApplied {
            changes: ahead,
            rest_deferred: true,
        });
    }
    write_plans(
        management,
        None,
        std::slice::from_ref(topology),
        std::slice::from_ref(&others),
    )
    .await?;
    let mut changes = ahead;
    changes.extend(others);
    Ok(SharedApplied {
        changes,
        rest_deferred: false,
    })
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
            .map(|(vhost, change)| management.write(vhost, change)),
    )
    .await?;
    Ok(())
}
