//! The worker's configuration: environment variables, each also a flag.

use std::net::SocketAddr;
use std::time::Duration;

use super::consume::Worker;
use crate::mail;

#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// The broker: amqp://user:pass@host:5672/vhost or amqps://…
    #[arg(long, env = "MAIL_AMQP_URL", hide_env_values = true)]
    pub amqp_url: String,
    /// Where mail goes: smtp://[user:pass@]host[:port][?tls=required], smtps://…,
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
}

/// How long each step of the worker may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// One attempt to connect to the broker.
    pub connect: Duration,
    /// A publish's confirm, a cancel, a close.
    pub publish: Duration,
    /// One send, the whole SMTP transaction.
    pub send: Duration,
    /// Waiting for deliveries in flight when stopping.
    pub shutdown: Duration,
}

impl Timeouts {
    /// The longest one delivery can take when nothing hangs: its send, its park or
    /// dead-letter publish and its ack, and some slack. A delivery in flight for longer
    /// means the worker is stuck, and `/livez` says so.
    pub fn longest_delivery(&self) -> Duration {
        self.send + self.publish * 2 + Duration::from_secs(10)
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: crate::amqp::connect::DEFAULT_CONNECT_TIMEOUT,
            publish: crate::amqp::publish::DEFAULT_PUBLISH_TIMEOUT,
            send: Duration::from_secs(60),
            shutdown: Duration::from_secs(30),
        }
    }
}

/// A value the worker cannot start with.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("MAIL_AMQP_URL: {0}")]
    AmqpUrl(String),
    #[error("MAIL_PROVIDER_URL: {0}")]
    ProviderUrl(#[from] crate::provider::ProviderUrlError),
}

impl WorkerArgs {
    /// Checks every value and builds the worker, or names the first value that is wrong.
    pub fn into_worker(self) -> Result<Worker, ConfigError> {
        let user = amqp_user(&self.amqp_url)?;
        let provider =
            crate::provider::from_url_with(&self.provider_url, self.provider_ca_file.as_deref())?;
        let t = self.tuning;
        Ok(Worker {
            amqp_url: self.amqp_url,
            user,
            provider,
            max_attempts: t.max_attempts,
            prefetch: t.prefetch,
            queue: t.queue,
            retry_exchange: t.retry_exchange,
            dead_exchange: t.dead_exchange,
            send_key: t.send_key,
            timeouts: Timeouts {
                connect: t.connect_timeout,
                publish: t.publish_timeout,
                send: t.send_timeout,
                shutdown: t.shutdown_timeout,
            },
        })
    }
}

/// The broker user of an AMQP URL (`guest` when it names none, as AMQP clients assume).
pub fn amqp_user(amqp_url: &str) -> Result<String, ConfigError> {
    let shown = crate::redact::redact_url(amqp_url);
    let url = url::Url::parse(amqp_url).map_err(|e| {
        ConfigError::AmqpUrl(format!(
            "{shown} is not a URL ({e}); write it as amqp://USER:PASSWORD@HOST:5672/VHOST"
        ))
    })?;
    if !matches!(url.scheme(), "amqp" | "amqps") || url.host_str().is_none() {
        return Err(ConfigError::AmqpUrl(format!(
            "{shown} is not an AMQP URL; write it as amqp://USER:PASSWORD@HOST:5672/VHOST (or amqps://)"
        )));
    }
    let (user, _) = crate::redact::credentials(&url);
    Ok(if user.is_empty() {
        "guest".to_string()
    } else {
        user
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn the_user_comes_from_the_url() {
        assert_eq!(
            amqp_user("amqp://mailer%2Dw:pw@h:5672/shop").unwrap(),
            "mailer-w"
        );
        assert_eq!(amqp_user("amqps://h").unwrap(), "guest");
    }

    #[test]
    fn bad_urls_are_named_without_their_password() {
        for url in ["http://u:hunter2@h", "nonsense", "amqp://u:hunter2@"] {
            let e = amqp_user(url).unwrap_err().to_string();
            assert!(e.starts_with("MAIL_AMQP_URL: "), "{e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
    }
}
