//! `mailer worker`, `mailer run` and `mailer send`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use prometheus_client::registry::Registry;

use crate::manifest::{self, display_name};
use crate::redact::redact_url;
use crate::telemetry::{self, Health};
use crate::topology::live::with_vhost;
use crate::topology::{self, Management, ManagementEndpoint, Topology};
use crate::worker::config::amqp_user;
use crate::worker::metrics::WorkerMetrics;
use crate::worker::request::{MailRequest, parse_request};
use crate::worker::{Worker, WorkerArgs};

/// A worker whose main loop has not turned for this long is reported not live.
const STALL_AFTER: Duration = Duration::from_secs(60);

/// `mailer worker`: consume until SIGTERM or SIGINT.
pub async fn worker(args: WorkerArgs) -> Result<()> {
    let http_addr = args.tuning.http_addr;
    let worker = args.into_worker()?;
    serve_and_run(worker, http_addr).await
}

/// `mailer run`: apply a pipeline's topology, then run a worker for it in this process.
pub async fn run(
    file: &str,
    management_url: &str,
    amqp_url: &str,
    provider_url: &str,
    http_addr: SocketAddr,
) -> Result<()> {
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
    let worker = Worker {
        user: amqp_user(&amqp_url)?,
        amqp_url,
        provider: crate::provider::from_url(provider_url)?,
        max_attempts: spec.worker.max_attempts,
        prefetch: spec.worker.prefetch,
        queue: t.queue.clone(),
        retry_exchange: t.retry_exchange.clone(),
        dead_exchange: t.dead_exchange.clone(),
        send_key: t.queue.clone(),
        shutdown_timeout: Duration::from_secs(30),
    };
    serve_and_run(worker, http_addr).await
}

async fn serve_and_run(worker: Worker, http_addr: SocketAddr) -> Result<()> {
    let mut registry = Registry::default();
    let metrics = Arc::new(WorkerMetrics::register(&mut registry));
    let health = Health::new(STALL_AFTER);
    let server = telemetry::spawn_server(http_addr, Arc::new(registry), health.clone())
        .await
        .with_context(|| {
            format!("cannot serve metrics and health on {http_addr} (MAIL_HTTP_ADDR)")
        })?;
    let result = worker.run(metrics, health, shutdown_signal()).await;
    server.abort();
    Ok(result?)
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

/// `mailer send`: one mail request, from flags or as a JSON body.
#[derive(Debug, clap::Args)]
pub struct SendArgs {
    /// The broker, e.g. amqp://user:password@localhost:5672/shop
    #[arg(long, env = "MAIL_AMQP_URL", hide_env_values = true)]
    pub amqp_url: String,
    #[arg(long, default_value = crate::mail::EXCHANGE)]
    pub exchange: String,
    #[arg(long, default_value = crate::mail::SEND_KEY)]
    pub routing_key: String,
    #[arg(long, required_unless_present = "json")]
    pub from: Option<String>,
    /// A recipient; repeat for more.
    #[arg(long, required_unless_present = "json")]
    pub to: Vec<String>,
    #[arg(long, required_unless_present = "json")]
    pub subject: Option<String>,
    #[arg(long)]
    pub text: Option<String>,
    #[arg(long)]
    pub html: Option<String>,
    /// Publish this file's content (`-` for standard input) as the body, as it is and
    /// unchecked, to see what the worker does with it.
    #[arg(long, conflicts_with_all = ["from", "to", "subject", "text", "html"])]
    pub json: Option<String>,
    /// The AMQP message id, which becomes the mail's Message-ID; generated when absent.
    #[arg(long)]
    pub message_id: Option<String>,
}

impl SendArgs {
    /// The body to publish: a file given as it is, or a request built from the flags and
    /// checked as the worker will check it.
    fn body(&self, message_id: &str) -> Result<Vec<u8>> {
        if let Some(path) = &self.json {
            let read = if path == "-" {
                std::io::read_to_string(std::io::stdin())
            } else {
                std::fs::read_to_string(path)
            };
            return Ok(read
                .with_context(|| format!("cannot read {path}"))?
                .into_bytes());
        }
        let request = MailRequest {
            from: self.from.clone().unwrap_or_default(),
            to: self.to.clone(),
            cc: vec![],
            bcc: vec![],
            reply_to: None,
            subject: self.subject.clone().unwrap_or_default(),
            text: self.text.clone(),
            html: self.html.clone(),
            headers: Default::default(),
        };
        let body = serde_json::to_vec(&request)?;
        parse_request(&body, Some(message_id)).context("the request is not valid")?;
        Ok(body)
    }
}

/// Publishes one request and waits for the broker's confirm.
pub async fn send(args: SendArgs) -> Result<()> {
    let message_id = args.message_id.clone().unwrap_or_else(generated_message_id);
    let body = args.body(&message_id)?;
    let url = redact_url(&args.amqp_url);
    let connection = Connection::connect(&args.amqp_url, ConnectionProperties::default())
        .await
        .with_context(|| format!("cannot connect to the broker at {url}"))?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let properties = BasicProperties::default()
        .with_content_type(crate::mail::REQUEST_CONTENT_TYPE.into())
        .with_message_id(message_id.as_str().into())
        .with_delivery_mode(2);
    let options = BasicPublishOptions {
        mandatory: true,
        immediate: false,
    };
    let confirmation = channel
        .basic_publish(
            args.exchange.as_str().into(),
            args.routing_key.as_str().into(),
            options,
            &body,
            properties,
        )
        .await
        .with_context(|| format!("cannot publish to {}", args.exchange))?
        .await?;
    let _ = connection.close(200, "sent".into()).await;
    if !confirmation.is_ack() {
        bail!(
            "the broker refused the request (nack): is {} full?",
            args.routing_key
        );
    }
    if confirmation.take_message().is_some() {
        bail!(
            "no queue took the request: is a queue bound to {} with {}? (mailer topology apply creates it)",
            args.exchange,
            args.routing_key
        );
    }
    println!(
        "published {message_id} to {} with routing key {}",
        args.exchange, args.routing_key
    );
    Ok(())
}

fn generated_message_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("mailer-send-{nanos:x}-{}", std::process::id())
}
