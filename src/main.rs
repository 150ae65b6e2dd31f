use std::process::ExitCode;

use clap::{Parser, Subcommand};

use mailer::cli;
use mailer::cli::worker::WorkerArgs;
use mailer::message::request_schema;
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
    /// Consume mail requests and send them: park what failed for now, dead-letter what
    /// never will succeed.
    Worker(WorkerArgs),
    /// Apply a pipeline's topology and run a worker for it in this process: the whole
    /// pipeline without Kubernetes.
    Run(cli::worker::RunArgs),
    /// Publish one mail request, for trying the pipeline by hand.
    Send(cli::worker::SendArgs),
    /// List, inspect, replay and purge a pipeline's dead letters, losing none.
    Dead(cli::dead::DeadArgs),
    /// Print the JSON Schema of a mail request.
    RequestSchema,
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
    Apply {
        #[command(flatten)]
        args: TopologyArgs,
        /// Declare the missing exchanges, queues and bindings over AMQP at this URL (its
        /// vhost is replaced by each pipeline's) rather than through the management API,
        /// which opens a channel inside the broker for each one. Without it everything
        /// goes through the management API; vhosts and policies always do. The queues of
        /// former delay tiers are counted live over it (by default the management URL's
        /// host and credentials on port 5672) before they are removed.
        #[arg(long, env = "MAIL_AMQP_URL", hide_env_values = true)]
        amqp_url: Option<String>,
    },
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

/// Runs [`keep_off_huge_pages`] and [`purge_freed_memory_soon`] before anything else in
/// the process: an `.init_array` entry runs before `main`, and one of priority 100 before
/// mimalloc's own constructor (priority 101), which sets up its first arena and reads its
/// options; from `main` it came after that arena was already on huge pages.
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array.00100")]
static KEEP_OFF_HUGE_PAGES_FIRST: extern "C" fn() = {
    extern "C" fn first() {
        keep_off_huge_pages();
        purge_freed_memory_soon();
    }
    first
};

/// Has mimalloc give freed memory back to the kernel 10 ms after it is freed, not the
/// second its version 3 waits by default (10 ms was version 2's default), unless
/// `MIMALLOC_PURGE_DELAY` is set. A worker frees a 10 MiB request, and renders a mail of
/// that size, several times a second, and with the second's delay it keeps much of what
/// it freed (the figures: docs/benchmarks.md, the worker's notes).
#[cfg(target_os = "linux")]
fn purge_freed_memory_soon() {
    // SAFETY: this runs before `main`, while the process has one thread, so nothing reads
    // the environment meanwhile; both strings are NUL-terminated literals, and `0` keeps
    // a value that is already set.
    let _ = unsafe { libc::setenv(c"MIMALLOC_PURGE_DELAY".as_ptr(), c"10".as_ptr(), 0) };
}

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run())
}

/// Keeps this process's memory off transparent huge pages.
///
/// The process's allocator is mimalloc: `rbase64`, a dependency of the management API
/// client, declares it as the `#[global_allocator]`. mimalloc asks the kernel for huge
/// pages on its arenas (`madvise(MADV_HUGEPAGE)`), and where the host's THP mode is
/// `madvise` (many distributions, and Kubernetes nodes) each touched part of an arena
/// then takes 2 MiB, which adds several MiB to a worker's resident memory
/// (docs/benchmarks.md). This does in the binary what `MIMALLOC_ALLOW_THP=0` did from the
/// environment, for every way the binary is run. It only saves memory, so a kernel that
/// refuses it changes nothing else.
#[cfg(target_os = "linux")]
fn keep_off_huge_pages() {
    const DISABLE: libc::c_ulong = 1;
    const UNUSED: libc::c_ulong = 0;
    // SAFETY: PR_SET_THP_DISABLE sets a flag of this process; its arguments are integers
    // and it reads or writes no memory of ours. It allocates nothing, so it may run before
    // the allocator is set up.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, DISABLE, UNUSED, UNUSED, UNUSED) };
}

async fn run() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            eprintln!("{}", one_line(&e.render().to_string()));
            return ExitCode::from(2);
        }
    };
    let default_level = match cli.command {
        Command::Worker(_) | Command::Run(_) | Command::Controller(_) => "info,lapin=off",
        _ => "warn,lapin=off",
    };
    telemetry::init_logging(default_level, cli.log_format);
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
            TopologyAction::Apply { args, amqp_url } => {
                cli::topology::run(
                    cli::topology::Action::Apply,
                    &args.file,
                    &args.management_url,
                    amqp_url.as_deref(),
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
        Command::Worker(args) => cli::worker::worker(args).await,
        Command::Run(args) => cli::worker::run(args).await,
        Command::Send(args) => cli::worker::send(args).await,
        Command::Dead(args) => cli::dead::run(args).await,
        Command::RequestSchema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&request_schema()).unwrap_or_default()
            );
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&chain(&e)));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes, each cause left out when the message before already says it.
fn chain(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&cause);
        }
    }
    text
}

/// An error message on one line: clap's usage hints and line breaks folded away.
fn one_line(message: &str) -> String {
    message
        .split("\n\nUsage:")
        .next()
        .unwrap_or(message)
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}
