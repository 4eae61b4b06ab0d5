//! The `drover` command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use super::config_cmd::{self, ConfigCommand};
use super::exit::{self, CliResult};
use super::logging::{self, LogFormat};

/// drover: a durable workflow engine for long-lived agents.
///
/// Runs JSON-with-comments workflows whose steps are done by agents (through `drover-pool`) or
/// shell commands, with pre/post/finally hooks, timeouts, retries and fan-out; every transition
/// is recorded so a killed run can be resumed.
#[derive(Debug, Parser)]
#[command(name = "drover", version, propagate_version = true)]
pub struct Cli {
    /// Log output format (filter logs with RUST_LOG, e.g. RUST_LOG=drover=debug).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "DROVER_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a workflow, record a new run and drive it until no task is pending.
    Run(super::run_cmd::RunArgs),
    /// Continue an unfinished run from its stored state.
    ///
    /// Given a run that already finished, it runs nothing and exits with that run's code, after
    /// telling the run's pool that the run ended (for when the daemon was away as it ended).
    Resume(super::run_cmd::ResumeArgs),
    /// Show runs, one run's summary or task tree, or one task's history (live or afterwards).
    Inspect(super::inspect_cmd::InspectArgs),
    /// A self-contained tour: an embedded pool, scripted agents, a workflow with fan-out,
    /// hooks, a retry and a finally hook, then what `inspect` shows.
    Demo(super::demo::DemoArgs),
    /// Print a shell completion script (e.g. `drover completions bash > ~/.local/share/bash-completion/completions/drover`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Inspect, validate and draw workflow configs.
    #[command(subcommand)]
    Config(ConfigCommand),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    exit::finish(dispatch(cli.command))
}

fn dispatch(command: Command) -> CliResult {
    match command {
        Command::Config(command) => {
            super::restore_sigpipe();
            config_cmd::run(command)
        }
        Command::Run(args) => super::run_cmd::run(args),
        Command::Resume(args) => super::run_cmd::resume(args),
        Command::Demo(args) => super::demo::run(args),
        Command::Completions { shell } => {
            super::restore_sigpipe();
            super::print_completions::<Cli>(shell, "drover");
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Inspect(args) => {
            super::restore_sigpipe();
            super::inspect_cmd::run(args)
        }
    }
}
