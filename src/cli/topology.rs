//! `mailer topology plan|apply|delete -f FILE`.

use anyhow::Result;

use crate::manifest::{self, display_name};
use crate::spec::DeletionPolicy;
use crate::topology::live::{amqp_url_for, with_vhost};
use crate::topology::reconcile::EmptinessCheck;
use crate::topology::{self, Management, ManagementEndpoint, Topology};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Plan,
    Apply,
    Delete { force: bool },
}

/// Runs `action` on every pipeline of `file`, printing what it does to standard output.
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
    let capabilities = management.capabilities().await?;
    for pipeline in &manifest.pipelines {
        let name = display_name(pipeline);
        let desired = Topology::desired(
            &pipeline.spec.rabbitmq.vhost,
            &pipeline.spec.topology,
            capabilities,
        )?;
        let vhost = &desired.vhost;
        match action {
            Action::Plan => {
                let changes = topology::plan(&management, &desired).await?;
                print_changes(&name, vhost, "would ", &changes);
            }
            Action::Apply => {
                let changes = topology::apply(&management, &desired).await?;
                print_changes(&name, vhost, "", &changes);
            }
            Action::Delete { force } => {
                let live_url = match amqp_url {
                    Some(url) => with_vhost(url, vhost).map_err(anyhow::Error::msg)?,
                    None => amqp_url_for(&endpoint, vhost),
                };
                let check = if force {
                    EmptinessCheck::Force
                } else {
                    EmptinessCheck::Live(&live_url)
                };
                let policy = pipeline.spec.topology.deletion_policy;
                let report = topology::delete(&management, &desired, policy, check).await?;
                println!("{name} (vhost {vhost:?}, deletionPolicy {policy:?}):");
                if policy == DeletionPolicy::Delete
                    && report.removed.is_empty()
                    && report.kept.is_empty()
                {
                    println!("  nothing to remove");
                }
                for line in report.to_string().lines() {
                    println!("  {line}");
                }
            }
        }
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
