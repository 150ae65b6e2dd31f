//! The arguments of `mailer worker`'s siblings `mailer run` and `mailer send`, turned into
//! calls of [`crate::worker`] and [`crate::message`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::message::publish::{Destination, publish_request};
use crate::message::{MailRequest, parse_request, unique_id};
use crate::worker::WorkerArgs;

/// `mailer worker`: consume until SIGTERM or SIGINT.
pub async fn worker(args: WorkerArgs) -> Result<()> {
    let http_addr = args.tuning.http_addr;
    let worker = args.into_worker()?;
    crate::worker::serve(worker, http_addr).await
}

/// `mailer run`'s arguments.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A YAML file with one MailerPipeline.
    #[arg(short = 'f', long = "file")]
    pub file: String,
    /// The management API, e.g. http://user:password@localhost:15672.
    #[arg(long, env = "RABBITMQ_MANAGEMENT_URL", hide_env_values = true)]
    pub management_url: String,
    /// The broker, e.g. amqp://user:password@localhost:5672; the pipeline's vhost is
    /// used whatever this URL names.
    #[arg(long, env = "MAIL_AMQP_URL", hide_env_values = true)]
    pub amqp_url: String,
    /// Where mail goes: smtp://…, smtps://…, file:///dir or discard://
    #[arg(long, env = "MAIL_PROVIDER_URL", hide_env_values = true)]
    pub provider_url: String,
    /// A CA certificate (PEM) to trust, besides the public ones, for TLS to the provider,
    /// e.g. an internal relay's.
    #[arg(long, env = "MAIL_PROVIDER_CA_FILE")]
    pub provider_ca_file: Option<PathBuf>,
    /// Where /metrics, /livez and /readyz are served.
    #[arg(long, env = "MAIL_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,
}

/// `mailer run`: apply a pipeline's topology, then run a worker for it in this process.
pub async fn run(args: RunArgs) -> Result<()> {
    let worker = crate::worker::standalone::prepare(
        &args.file,
        &args.management_url,
        &args.amqp_url,
        &args.provider_url,
        args.provider_ca_file.as_deref(),
    )
    .await?;
    crate::worker::serve(worker, args.http_addr).await
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
    /// How long connecting may take.
    #[arg(long, env = "MAIL_CONNECT_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
    /// How long the broker may take to confirm the request.
    #[arg(long, env = "MAIL_PUBLISH_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub publish_timeout: Duration,
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
    let message_id = args.message_id.clone().unwrap_or_else(unique_id);
    let body = args.body(&message_id)?;
    let destination = Destination {
        amqp_url: &args.amqp_url,
        exchange: &args.exchange,
        routing_key: &args.routing_key,
        connect_timeout: args.connect_timeout,
        publish_timeout: args.publish_timeout,
    };
    publish_request(&destination, &body, &message_id).await?;
    println!(
        "published {message_id} to {} with routing key {}",
        args.exchange, args.routing_key
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::amqp::connect::DEFAULT_CONNECT_TIMEOUT;
    use crate::amqp::publish::DEFAULT_PUBLISH_TIMEOUT;

    #[test]
    fn the_flag_defaults_are_the_library_defaults() {
        assert_eq!(
            humantime::parse_duration("10s").unwrap(),
            DEFAULT_CONNECT_TIMEOUT
        );
        assert_eq!(
            humantime::parse_duration("30s").unwrap(),
            DEFAULT_PUBLISH_TIMEOUT
        );
    }
}
