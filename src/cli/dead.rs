//! `mailer dead list|stats|show|replay|purge`: the arguments, where they point, and which
//! command of [`crate::dead`] they run.

use std::time::Duration;

use anyhow::{Result, bail};

use crate::amqp::address::amqp_user;
use crate::amqp::address::with_vhost;
use crate::dead::filter::{parse_age, parse_domain, parse_reason};
use crate::dead::inspect::{self, Format};
use crate::dead::replay::{Rate, ReplayOptions};
use crate::dead::{Filter, Target, purge, replay};
use crate::mail;
use crate::manifest::{self, display_name};

#[derive(Debug, clap::Args)]
pub struct DeadArgs {
    #[command(subcommand)]
    pub action: DeadAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum DeadAction {
    /// One line per dead letter: message id, reason, attempts, when it died, recipients,
    /// subject and error.
    List {
        #[command(flatten)]
        source: Source,
        #[command(flatten)]
        filters: Filters,
        /// `text`: a table; `json`: one JSON object per line (message_id, reason,
        /// attempts, dead_at, to, subject, error).
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Counts by reason and by recipient domain, and the oldest and newest dead letter.
    Stats {
        #[command(flatten)]
        source: Source,
        #[command(flatten)]
        filters: Filters,
    },
    /// Every property and header of the dead letters with this message id, and the
    /// request.
    Show {
        /// The message id (the request's AMQP message-id).
        id: String,
        #[command(flatten)]
        source: Source,
        #[command(flatten)]
        filters: Filters,
    },
    /// Publish the matching dead letters again, to the pipeline's exchange, as fresh
    /// requests; each leaves the dead queue once the broker confirmed its copy.
    Replay {
        #[command(flatten)]
        source: Source,
        #[command(flatten)]
        filters: Filters,
        /// Say what would be replayed, and publish nothing.
        #[arg(long)]
        dry_run: bool,
        /// At most this many a second (`10/s`), minute (`600/m`) or hour (`100/h`).
        #[arg(long, value_name = "N/s")]
        rate: Option<Rate>,
    },
    /// Remove the matching dead letters for good; without --yes, only say what would be
    /// removed.
    Purge {
        #[command(flatten)]
        source: Source,
        #[command(flatten)]
        filters: Filters,
        /// Remove them (without it, nothing is removed).
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// Where the dead letters are.
#[derive(Debug, clap::Args)]
pub struct Source {
    /// A YAML file with the MailerPipeline, for its vhost and the names of its exchange
    /// and queues.
    #[arg(
        short = 'f',
        long = "file",
        required_unless_present = "queue",
        conflicts_with = "queue"
    )]
    file: Option<String>,
    /// Which MailerPipeline of the file, when it holds several.
    #[arg(long, requires = "file")]
    pipeline: Option<String>,
    /// The dead queue, without a pipeline file (in the AMQP URL's vhost).
    #[arg(long)]
    queue: Option<String>,
    /// The exchange a replay publishes to, without a pipeline file.
    #[arg(long, default_value = mail::EXCHANGE, conflicts_with = "file")]
    exchange: String,
    /// The routing key a replay publishes with, without a pipeline file.
    #[arg(long, default_value = mail::SEND_KEY, conflicts_with = "file")]
    send_key: String,
    /// The broker, e.g. amqp://user:password@localhost:5672/shop; with a pipeline file,
    /// the pipeline's vhost is used whatever this URL names.
    #[arg(long, env = "MAIL_AMQP_URL", hide_env_values = true)]
    amqp_url: String,
    /// The management API, e.g. http://user:password@localhost:15672, asked for the dead
    /// queue's delivery limit before the first read (every read counts as a delivery, and
    /// a finite limit would drop dead letters: such a queue is not read). By default the
    /// AMQP URL's host and credentials on port 15672 (https on 15671 for amqps://); a
    /// URL without a user takes the AMQP URL's.
    #[arg(long, env = "RABBITMQ_MANAGEMENT_URL", hide_env_values = true)]
    management_url: Option<String>,
}

/// Which dead letters; every filter given must match.
#[derive(Debug, clap::Args)]
pub struct Filters {
    /// Only this reason; repeat for more: malformed, gave-up, rejected, too-large (the
    /// worker's), delivery_limit, expired, maxlen, rejected (RabbitMQ's).
    #[arg(long, value_parser = parse_reason)]
    reason: Vec<String>,
    /// Only those dead at least this long ago, e.g. 30m, 2h or 7d.
    #[arg(long, value_parser = parse_age, value_name = "DURATION")]
    older_than: Option<Duration>,
    /// Only those dead at most this long ago.
    #[arg(long, value_parser = parse_age, value_name = "DURATION")]
    newer_than: Option<Duration>,
    /// Only those with a recipient (to, cc or bcc) in this domain; repeat for more.
    #[arg(long, value_parser = parse_domain, value_name = "DOMAIN")]
    to_domain: Vec<String>,
    /// Only those with this message id; repeat for more.
    #[arg(long, value_name = "ID")]
    message_id: Vec<String>,
    /// At most this many, the first in the queue.
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
}

impl From<Filters> for Filter {
    fn from(f: Filters) -> Self {
        Filter {
            reasons: f.reason,
            older_than: f.older_than,
            newer_than: f.newer_than,
            to_domains: f.to_domain,
            message_ids: f.message_id,
            limit: f.limit,
        }
    }
}

impl Source {
    fn target(&self) -> Result<Target> {
        let Some(file) = &self.file else {
            return Ok(Target {
                amqp_url: self.amqp_url.clone(),
                management_url: self.management_url.clone(),
                dead_queue: self.queue.clone().unwrap_or_default(),
                exchange: self.exchange.clone(),
                send_key: self.send_key.clone(),
            });
        };
        let manifest = manifest::read(file)?;
        let pipeline = match (&self.pipeline, manifest.pipelines.as_slice()) {
            (None, [one]) => one,
            (None, many) => bail!(
                "{file} holds {} MailerPipelines; name one with --pipeline",
                many.len()
            ),
            (Some(name), all) => {
                match all.iter().find(|p| p.metadata.name.as_ref() == Some(name)) {
                    Some(found) => found,
                    None => bail!(
                        "{file} has no MailerPipeline {name:?}; it has {}",
                        all.iter().map(display_name).collect::<Vec<_>>().join(", ")
                    ),
                }
            }
        };
        pipeline.spec.validate()?;
        let t = &pipeline.spec.topology;
        Ok(Target {
            amqp_url: with_vhost(&self.amqp_url, &pipeline.spec.rabbitmq.vhost)
                .map_err(anyhow::Error::msg)?,
            management_url: self.management_url.clone(),
            dead_queue: t.dead_queue.clone(),
            exchange: t.exchange.clone(),
            // The send queue's name is the routing key of every request.
            send_key: t.queue.clone(),
        })
    }
}

/// Runs a `mailer dead` subcommand, printing to standard output.
pub async fn run(args: DeadArgs) -> Result<()> {
    let mut out = std::io::stdout();
    match args.action {
        DeadAction::List {
            source,
            filters,
            output,
        } => {
            let format = match output {
                Output::Text => Format::Text,
                Output::Json => Format::Json,
            };
            inspect::list(&source.target()?, &filters.into(), format, &mut out).await?;
        }
        DeadAction::Stats { source, filters } => {
            inspect::stats(&source.target()?, &filters.into(), &mut out).await?;
        }
        DeadAction::Show {
            id,
            source,
            filters,
        } => {
            inspect::show(&source.target()?, &id, &filters.into(), &mut out).await?;
        }
        DeadAction::Replay {
            source,
            filters,
            dry_run,
            rate,
        } => {
            let target = source.target()?;
            let user = amqp_user(&target.amqp_url).map_err(anyhow::Error::msg)?;
            let options = ReplayOptions { dry_run, rate };
            let stop = crate::telemetry::stop_signal()?;
            replay::replay(&target, &filters.into(), options, &user, stop, &mut out).await?;
        }
        DeadAction::Purge {
            source,
            filters,
            yes,
        } => {
            purge::purge(&source.target()?, &filters.into(), yes, &mut out).await?;
        }
    }
    Ok(())
}
