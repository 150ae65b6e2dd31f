use std::process::ExitCode;

use clap::{Parser, Subcommand};

use mailer::cli;
use mailer::telemetry::{self, LogFormat};

/// A mail-sending pipeline on RabbitMQ: operator, worker and tools in one binary.
#[derive(Parser)]
#[command(name = "mailer", version, about, propagate_version = true)]
struct Cli {
    /// Log line format.
    #[arg(long, global = true, env = "MAIL_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the MailerPipeline CustomResourceDefinition as YAML.
    Crd,
    /// Run the operator: reconcile MailerPipelines into RabbitMQ topology and workers.
    Controller(cli::controller::ControllerArgs),
    /// Show, make or remove a pipeline's exchanges, queues, bindings and policies,
    /// without Kubernetes.
    Topology {
        #[command(subcommand)]
        action: TopologyAction,
    },
}

#[derive(clap::Args)]
struct TopologyArgs {
    /// A YAML file with one or more MailerPipeline documents (`-` for standard input).
    #[arg(short = 'f', long = "file")]
    file: String,
    /// The management API, e.g. http://user:password@localhost:15672.
    #[arg(long, env = "RABBITMQ_MANAGEMENT_URL", hide_env_values = true)]
    management_url: String,
}

#[derive(Subcommand)]
enum TopologyAction {
    /// Print what apply would change, and change nothing.
    Plan(TopologyArgs),
    /// Create or repair what is missing or differs, and print what was changed.
    Apply(TopologyArgs),
    /// Remove what the pipeline's deletionPolicy allows.
    Delete {
        #[command(flatten)]
        args: TopologyArgs,
        /// Delete queues even when they hold messages (the messages are lost).
        #[arg(long)]
        force: bool,
        /// The AMQP URL used to count messages live; by default the management URL's
        /// host and credentials on port 5672.
        #[arg(long, env = "MAIL_AMQP_URL", hide_env_values = true)]
        amqp_url: Option<String>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // A long-running role says what it does; a one-shot command only what went wrong.
    let level = match cli.command {
        Command::Controller(_) => "info",
        _ => "warn",
    };
    telemetry::init_logging(level, cli.log_format);
    let result = match cli.command {
        Command::Controller(args) => match args.into_options() {
            Ok(options) => mailer::controller::run(options).await,
            Err(e) => Err(e),
        },
        Command::Crd => cli::crd::yaml()
            .map(|yaml| print!("{yaml}"))
            .map_err(anyhow::Error::from),
        Command::Topology { action } => match action {
            TopologyAction::Plan(a) => {
                cli::topology::run(
                    cli::topology::Action::Plan,
                    &a.file,
                    &a.management_url,
                    None,
                )
                .await
            }
            TopologyAction::Apply(a) => {
                cli::topology::run(
                    cli::topology::Action::Apply,
                    &a.file,
                    &a.management_url,
                    None,
                )
                .await
            }
            TopologyAction::Delete {
                args,
                force,
                amqp_url,
            } => {
                let action = cli::topology::Action::Delete { force };
                cli::topology::run(
                    action,
                    &args.file,
                    &args.management_url,
                    amqp_url.as_deref(),
                )
                .await
            }
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
