//! The arguments of `mailer worker` (environment variables, each also a flag) and of its
//! siblings `mailer run` and `mailer send`, turned into calls of [`crate::worker`] and
//! [`crate::message`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::mail;
use crate::message::send::{Destination, publish_request};
use crate::message::{MailRequest, parse_request, size, unique_id};
use crate::worker::Worker;
use crate::worker::config::{ConfigError, RetryTiers, Timeouts, amqp_user};

#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// The broker: amqp://user:pass@host:5672/vhost or amqps://…
    #[arg(long, env = "MAIL_AMQP_URL", hide_env_values = true)]
    pub amqp_url: String,
    /// Where mail goes: smtp://[user:pass@]host[:port][?tls=required], smtps://…,
    /// ses://KEY_ID:SECRET@REGION, sendgrid://:KEY@api.sendgrid.com,
    /// postmark://:TOKEN@api.postmarkapp.com, mailgun://:KEY@DOMAIN[?region=eu],
    /// file:///dir or discard://
    #[arg(long, env = "MAIL_PROVIDER_URL", hide_env_values = true)]
    pub provider_url: String,
    /// A CA certificate (PEM) to trust, besides the public ones, for TLS to the provider,
    /// e.g. an internal relay's.
    #[arg(long, env = "MAIL_PROVIDER_CA_FILE")]
    pub provider_ca_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub tuning: WorkerTuning,
}

/// Everything but the two URLs, shared with `mailer run`.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerTuning {
    /// Attempts before a request that keeps failing for now is dead-lettered as gave-up.
    #[arg(long, env = "MAIL_MAX_ATTEMPTS", default_value_t = mail::DEFAULT_MAX_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,
    /// The largest request body read, in bytes or as a quantity (e.g. 32Mi; 1Ki to
    /// 512Mi); a larger request is dead-lettered as too-large. RabbitMQ 4 refuses messages
    /// over 16 MiB unless its max_message_size is raised.
    #[arg(long, env = "MAIL_MAX_REQUEST_BYTES", default_value = size::DEFAULT_LIMIT,
          value_parser = parse_limit, value_name = "SIZE")]
    pub max_request_bytes: usize,
    /// Unacknowledged deliveries held, and processed, at once.
    #[arg(long, env = "MAIL_PREFETCH", default_value_t = mail::DEFAULT_PREFETCH,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub prefetch: u16,
    /// The queue to consume.
    #[arg(long, env = "MAIL_QUEUE", default_value = mail::SEND_QUEUE)]
    pub queue: String,
    /// The exchange requests that failed for now are parked through.
    #[arg(long, env = "MAIL_RETRY_EXCHANGE", default_value = mail::RETRY_EXCHANGE)]
    pub retry_exchange: String,
    /// The routing key of each delay tier on the retry exchange, in tier order, separated
    /// by commas (the pipeline's `retryDelays`: `mail.send,mail.send.retry.2,…`); a request
    /// whose attempt n failed for now parks in tier min(n, tiers). Without it, one tier
    /// routed by the send key.
    #[arg(long, env = "MAIL_RETRY_KEYS", value_delimiter = ',')]
    pub retry_keys: Option<Vec<String>>,
    /// The delay of each tier of MAIL_RETRY_KEYS, in tier order, separated by commas
    /// (`30s,5m,30m`). With them, a provider that asks to wait (an HTTP API's
    /// `Retry-After`) parks the request in the first tier that waits that long, if that is
    /// later than its attempt's tier (the last tier at most). Without them, the attempt
    /// alone picks the tier.
    #[arg(long, env = "MAIL_RETRY_DELAYS", value_delimiter = ',', value_parser = humantime::parse_duration)]
    pub retry_delays: Option<Vec<Duration>>,
    /// The exchange requests that never will succeed are published to.
    #[arg(long, env = "MAIL_DEAD_EXCHANGE", default_value = mail::DEAD_EXCHANGE)]
    pub dead_exchange: String,
    /// The routing key parked and dead requests are published with.
    #[arg(long, env = "MAIL_SEND_KEY", default_value = mail::SEND_KEY)]
    pub send_key: String,
    /// Where /metrics, /livez and /readyz are served.
    #[arg(long, env = "MAIL_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,
    /// How long a stopping worker waits for deliveries in flight, e.g. 30s.
    #[arg(long, env = "MAIL_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,
    /// How long one attempt to connect to the broker may take; failed attempts are
    /// retried with backoff before the worker gives up.
    #[arg(long, env = "MAIL_CONNECT_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
    /// How long the broker may take to confirm a park or dead-letter publish (and to
    /// answer a cancel or close); a publish that times out failed.
    #[arg(long, env = "MAIL_PUBLISH_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub publish_timeout: Duration,
    /// How long one send may take, the whole SMTP transaction; a send that takes longer
    /// failed for now (class `timeout`).
    #[arg(long, env = "MAIL_SEND_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub send_timeout: Duration,
    /// The most mails per second this worker sends, e.g. 14 or 2.5; no limit when
    /// absent. Over it a send waits for its turn (nothing is parked, no attempt spent).
    /// The operator sets it to the pipeline's rateLimit shared by its pods.
    #[arg(long, env = "MAIL_RATE_LIMIT", value_parser = parse_rate, value_name = "MAILS_PER_SECOND")]
    pub rate_limit: Option<f64>,
    /// How long, after a lost broker connection, the worker goes on connecting again
    /// (not ready meanwhile) before it exits non-zero.
    #[arg(long, env = "MAIL_RECONNECT_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub reconnect_timeout: Duration,
}

impl WorkerArgs {
    /// Checks every value and builds the worker, or names the first value that is wrong.
    pub fn into_worker(self) -> Result<Worker, ConfigError> {
        let user = amqp_user(&self.amqp_url)?;
        let t = self.tuning;
        let provider = crate::provider::rate::limited(
            crate::provider::from_url_with(&self.provider_url, self.provider_ca_file.as_deref())?,
            t.rate_limit,
        );
        let retry_tiers = RetryTiers::new(&t.send_key, t.retry_keys, t.retry_delays)?;
        Ok(Worker {
            amqp_url: self.amqp_url,
            user,
            provider,
            max_attempts: t.max_attempts,
            max_request_bytes: t.max_request_bytes,
            prefetch: t.prefetch,
            queue: t.queue,
            retry_exchange: t.retry_exchange,
            retry_tiers,
            dead_exchange: t.dead_exchange,
            send_key: t.send_key,
            timeouts: Timeouts {
                connect: t.connect_timeout,
                publish: t.publish_timeout,
                send: t.send_timeout,
                shutdown: t.shutdown_timeout,
                reconnect: t.reconnect_timeout,
            },
        })
    }
}

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
    /// Where mail goes: smtp://…, smtps://…, ses://…, sendgrid://…, postmark://…,
    /// mailgun://…, file:///dir or discard://
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
    /// The largest request published, in bytes or as a quantity (e.g. 32Mi): the workers'
    /// limit (spec.worker.maxRequestSize), over which they dead-letter it as too-large.
    #[arg(long, env = "MAIL_MAX_REQUEST_BYTES", default_value = size::DEFAULT_LIMIT,
          value_parser = parse_limit, value_name = "SIZE")]
    pub max_request_bytes: usize,
}

/// `--max-request-bytes`: bytes or a quantity, within [`size::LIMIT_RANGE`].
fn parse_limit(text: &str) -> Result<usize, String> {
    size::parse_limit(text).map_err(|e| e.to_string())
}

/// `--rate-limit`: a positive number of mails per second.
fn parse_rate(text: &str) -> Result<f64, String> {
    crate::provider::rate::parse_rate(text).map_err(|e| e.to_string())
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
    if let Err(e) = size::check(body.len(), args.max_request_bytes) {
        anyhow::bail!(
            "{e} (--max-request-bytes, MAIL_MAX_REQUEST_BYTES); not published, since the \
             workers would dead-letter it as too-large. To send it, raise the limit here \
             and the pipeline's spec.worker.maxRequestSize (and, above 16 MiB on RabbitMQ \
             4, the broker's max_message_size)"
        );
    }
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
    use super::*;
    use crate::amqp::connect::DEFAULT_CONNECT_TIMEOUT;
    use crate::amqp::publish::DEFAULT_PUBLISH_TIMEOUT;

    #[test]
    fn the_flag_defaults_are_the_timeouts_defaults() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: WorkerArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from([
            "worker",
            "--amqp-url",
            "amqp://h",
            "--provider-url",
            "discard://",
        ]);
        let worker = cli.unwrap().args.into_worker().unwrap();
        assert_eq!(worker.timeouts, Timeouts::default());
        assert_eq!(worker.max_request_bytes, mail::DEFAULT_MAX_REQUEST_BYTES);
    }

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
