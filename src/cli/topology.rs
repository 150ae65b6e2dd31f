//! `mailer topology plan|apply|delete -f FILE`.

use anyhow::Result;

use crate::amqp::address::with_vhost;
use crate::manifest::{self, display_name};
use crate::spec::{DeletionPolicy, MailerPipeline};
use crate::topology::EmptinessCheck;
use crate::topology::{self, AmqpDeclarer, Management, ManagementEndpoint, Topology};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Plan,
    Apply,
    Delete { force: bool },
}

/// Runs `action` on every pipeline of `file`, printing what it does to standard output.
/// `amqp_url`: for `Apply`, where exchanges, queues and bindings are declared (else the
/// management API); for `Delete`, where queues are counted live.
pub async fn run(
    action: Action,
    file: &str,
    management_url: &str,
    amqp_url: Option<&str>,
) -> Result<()> {
    let endpoint = ManagementEndpoint::parse(management_url)?;
    let management = Management::new(&endpoint)?;
    let manifest = manifest::read(file)?;
    for note in &manifest.skipped {
        println!("{note}");
    }
    for pipeline in &manifest.pipelines {
        pipeline.spec.validate()?;
    }
    // One version read and one client for the whole file: every pipeline of the pass
    // shares them.
    let capabilities = management.capabilities().await?;
    let desired = manifest
        .pipelines
        .iter()
        .map(|pipeline| {
            Topology::desired(
                &pipeline.spec.rabbitmq.vhost,
                &pipeline.spec.topology,
                capabilities,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (prefix, plans) = match action {
        Action::Plan => ("would ", topology::plan_all(&management, &desired).await?),
        Action::Apply => {
            let declarer = amqp_url.map(AmqpDeclarer::new).transpose()?;
            let applied =
                topology::apply_all_declaring(&management, declarer.as_ref(), &desired).await?;
            ("", applied)
        }
        Action::Delete { force } => {
            for (pipeline, desired) in manifest.pipelines.iter().zip(&desired) {
                delete(&management, &endpoint, amqp_url, pipeline, desired, force).await?;
            }
            return Ok(());
        }
    };
    // After the new tiers exist: a former tier's queue goes once it is empty (a plan says
    // which would). The pipelines' passes run at once, within the client's bound on
    // requests in flight.
    let former = manifest
        .pipelines
        .iter()
        .zip(&desired)
        .map(|(pipeline, desired)| {
            let (management, endpoint) = (&management, &endpoint);
            async move {
                let spec = &pipeline.spec.topology;
                match action {
                    Action::Apply => {}
                    Action::Plan => {
                        let found =
                            topology::tiers::former_tiers(management, &desired.vhost, spec).await?;
                        return Ok(topology::tiers::describe_plan(&found));
                    }
                    Action::Delete { .. } => return Ok(Vec::new()),
                }
                let live_url = live_url(endpoint, amqp_url, &desired.vhost)?;
                let removal = topology::tiers::remove_former_tiers;
                let live = EmptinessCheck::Live(&live_url);
                let report = removal(management, &desired.vhost, spec, live).await?;
                anyhow::Ok(topology::tiers::describe(&report))
            }
        });
    let former = futures::future::try_join_all(former).await?;
    let done = manifest.pipelines.iter().zip(&desired).zip(&plans);
    for (((pipeline, desired), changes), former) in done.zip(former) {
        print_changes(&display_name(pipeline), &desired.vhost, prefix, changes);
        for line in former {
            println!("  {line}");
        }
    }
    Ok(())
}

/// Where the queues of `vhost` are counted live: `amqp_url`, else the management API's
/// host on the AMQP port.
fn live_url(endpoint: &ManagementEndpoint, amqp_url: Option<&str>, vhost: &str) -> Result<String> {
    Ok(match amqp_url {
        Some(url) => with_vhost(url, vhost).map_err(anyhow::Error::msg)?,
        None => endpoint.amqp_url(vhost),
    })
}

/// Deletes what one pipeline's `deletionPolicy` allows and prints what it did.
async fn delete(
    management: &Management,
    endpoint: &ManagementEndpoint,
    amqp_url: Option<&str>,
    pipeline: &MailerPipeline,
    desired: &Topology,
    force: bool,
) -> Result<()> {
    let name = display_name(pipeline);
    let vhost = &desired.vhost;
    let live_url = live_url(endpoint, amqp_url, vhost)?;
    let check = if force {
        EmptinessCheck::Force
    } else {
        EmptinessCheck::Live(&live_url)
    };
    let policy = pipeline.spec.topology.deletion_policy;
    let report = topology::delete(management, desired, policy, check).await?;
    // The queues of tiers the spec no longer has (kept while they held parked requests)
    // are the pipeline's too.
    let former = match policy {
        DeletionPolicy::Delete => {
            let spec = &pipeline.spec.topology;
            topology::tiers::remove_former_tiers(management, vhost, spec, check).await?
        }
        DeletionPolicy::Retain => topology::DeleteReport::default(),
    };
    println!("{name} (vhost {vhost:?}, deletionPolicy {policy:?}):");
    let nothing =
        |report: &topology::DeleteReport| report.removed.is_empty() && report.kept.is_empty();
    if policy == DeletionPolicy::Delete && nothing(&report) && nothing(&former) {
        println!("  nothing to remove");
    }
    for line in report.to_string().lines().chain(former.to_string().lines()) {
        println!("  {line}");
    }
    Ok(())
}

/// Prints each change as a line, after `prefix` (`"would "` for a plan).
fn print_changes(name: &str, vhost: &str, prefix: &str, changes: &[topology::Change]) {
    println!("{name} (vhost {vhost:?}):");
    if changes.is_empty() {
        println!("  in sync: nothing to change");
    }
    for change in changes {
        println!("  {prefix}{change}");
    }
}
