//! `mailer run`: a pipeline's topology applied and a worker for it, without Kubernetes.

use anyhow::{Result, bail};

use super::Worker;
use super::config::{RetryTiers, Timeouts, amqp_user};
use crate::amqp::address::with_vhost;
use crate::manifest::{self, display_name};
use crate::topology::{self, Management, ManagementEndpoint, Topology};

/// Applies the topology of the one pipeline in `file` and returns the worker for it,
/// with the pipeline's names and numbers and the tuning defaults otherwise.
pub async fn prepare(
    file: &str,
    management_url: &str,
    amqp_url: &str,
    provider_url: &str,
    provider_ca_file: Option<&std::path::Path>,
) -> Result<Worker> {
    let manifest = manifest::read(file)?;
    let [pipeline] = manifest.pipelines.as_slice() else {
        bail!(
            "{file} holds {} MailerPipelines; mailer run runs exactly one",
            manifest.pipelines.len()
        );
    };
    let spec = &pipeline.spec;
    spec.validate()?;
    let management = Management::new(&ManagementEndpoint::parse(management_url)?)?;
    let desired = Topology::desired(
        &spec.rabbitmq.vhost,
        &spec.topology,
        management.capabilities().await?,
    )?;
    let changes = topology::apply(&management, &desired).await?;
    println!(
        "{} (vhost {:?}): topology {}",
        display_name(pipeline),
        desired.vhost,
        match changes.len() {
            0 => "in sync".to_string(),
            n => format!("applied ({n} changes)"),
        }
    );
    let amqp_url = with_vhost(amqp_url, &desired.vhost).map_err(anyhow::Error::msg)?;
    let t = &spec.topology;
    let live = topology::EmptinessCheck::Live(&amqp_url);
    let former = topology::tiers::remove_former_tiers(&management, &desired.vhost, t, live);
    for line in topology::tiers::describe(&former.await?) {
        println!("{line}");
    }
    Ok(Worker {
        user: amqp_user(&amqp_url)?,
        amqp_url,
        // The one worker sends at the pipeline's whole rate.
        provider: crate::provider::rate::limited(
            crate::provider::from_url_with(provider_url, provider_ca_file)?,
            spec.worker
                .provider
                .as_ref()
                .and_then(|p| p.rate_limit)
                .map(f64::from),
        ),
        max_attempts: spec.worker.max_attempts,
        max_request_bytes: spec.worker.max_request_bytes()?,
        prefetch: spec.worker.prefetch,
        queue: t.queue.clone(),
        retry_exchange: t.retry_exchange.clone(),
        retry_tiers: RetryTiers::of_topology(t)?,
        dead_exchange: t.dead_exchange.clone(),
        send_key: t.queue.clone(),
        timeouts: Timeouts::default(),
    })
}
