//! The `drover-pool` command line: the pool daemon (`start`, `stop`, `status`, `kick`) and the
//! agent side (`protocol`, `get-task`, `agent`) of CONTRACT.md §4.

use std::ffi::OsString;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::builder::NonEmptyStringValueParser;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};

use super::exit::{self, CliError, CliResult};
use super::logging::{self, LogFormat};
use crate::engine::report::format_duration;
use crate::pool::agent::{self, AgentEnd, AgentError};
use crate::pool::conn;
use crate::pool::paths::{PoolArgs, PoolPaths};
use crate::pool::protocol::{AgentMessage, Reply, Request, StatusReport};
use crate::pool::protocol_text;

/// A failure other than invalid usage (2) or an unreachable daemon (3).
const FAILED: u8 = 1;

const EXIT_CODES: &str = "\
Exit status: 0 success; 1 the daemon refused the request or the command failed; 2 invalid usage \
(or, for get-task/agent, the daemon refused the agent); 3 no pool daemon is running.";

/// drover-pool: the pool daemon of drover and the commands agents use to take part.
///
/// The daemon (`start`) hands tasks from `drover run` to long-lived agents. An agent loops:
/// `get-task` (blocks until a task is assigned), do it, write the answer to the task's
/// `response_file`, `get-task` again, until it receives `Kicked`. `protocol` prints the full
/// protocol for one agent; `agent` runs any program as an agent.
#[derive(Debug, Parser)]
#[command(name = "drover-pool", version, propagate_version = true, after_help = EXIT_CODES)]
pub struct PoolCli {
    /// Log output format (filter logs with RUST_LOG, e.g. RUST_LOG=drover=debug).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "DROVER_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: PoolCommand,
}

#[derive(Debug, Subcommand)]
pub enum PoolCommand {
    /// Print a shell completion script (e.g. `drover-pool completions bash > ~/.local/share/bash-completion/completions/drover-pool`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Run the pool daemon in the foreground until SIGINT/SIGTERM or `drover-pool stop`.
    ///
    /// A second daemon on the same pool is refused; a stale socket left by a killed daemon is
    /// taken over. Queued tasks and assignments survive a restart.
    Start(StartArgs),
    /// Kick every agent and stop the daemon.
    ///
    /// Waiting agents receive `Kicked`; agents that wait for a daemon afterwards exit too,
    /// until the pool is started again.
    Stop(StopArgs),
    /// Show the agents (state, current task, for how long) and the queue depths.
    Status(StatusArgs),
    /// Kick one agent: it receives `Kicked` now if it is waiting, else at its next get-task.
    ///
    /// A kick alone leaves the task a busy agent holds with it until it answers or asks again.
    /// When the agent is dead (context exhausted, terminal closed, crashed), add --abandon.
    Kick(KickArgs),
    /// Print the agent protocol, with the exact commands for agent NAME, as markdown.
    ///
    /// Give this text to an agent (e.g. an LLM coding agent) as its instructions. The printed
    /// commands repeat `--pool`/`--root` only when they are given here as flags.
    Protocol(ProtocolArgs),
    /// Wait for a task as agent NAME and print it as one JSON line on stdout.
    ///
    /// Prints `{"kind": "Task", …}` or `{"kind": "Kicked", "reason": …}` (then the agent must
    /// exit). Waits for the daemon if it is not running, and reconnects if it restarts. Exits 2
    /// if the daemon refuses (e.g. another get-task under NAME is already waiting).
    #[command(alias = "get_task")]
    GetTask(GetTaskArgs),
    /// Run COMMAND as agent NAME until kicked.
    ///
    /// For each task, COMMAND (run directly, no shell) gets the task message (the JSON that
    /// get-task prints) on stdin and the environment variables DROVER_AGENT_NAME,
    /// DROVER_TASK_ID, DROVER_ATTEMPT and DROVER_RESPONSE_FILE; its stdout becomes the answer,
    /// even when it exits non-zero (the runner validates it). Its stderr is passed through.
    Agent(AgentArgs),
}

#[derive(Debug, Args)]
pub struct StartArgs {
    #[command(flatten)]
    pub pool: PoolArgs,
}

#[derive(Debug, Args)]
pub struct StopArgs {
    #[command(flatten)]
    pub pool: PoolArgs,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the status as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub pool: PoolArgs,
}

#[derive(Debug, Args)]
pub struct KickArgs {
    /// The agent to kick.
    #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
    pub name: String,
    /// Also give up, now, the task the agent holds (for an agent that died holding it): the
    /// run records an error for that attempt and retries it per the step's max_retries, so
    /// another agent can take it. A response file the agent writes afterwards is deleted
    /// unread. Harmless for an idle or unknown agent.
    #[arg(long)]
    pub abandon: bool,
    #[command(flatten)]
    pub pool: PoolArgs,
}

#[derive(Debug, Args)]
pub struct ProtocolArgs {
    /// The agent's name, used in the printed commands.
    #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
    pub name: String,
    #[command(flatten)]
    pub pool: PoolArgs,
}

#[derive(Debug, Args)]
pub struct GetTaskArgs {
    /// The agent's name, unique among the agents of the pool.
    #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
    pub name: String,
    #[command(flatten)]
    pub pool: PoolArgs,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The agent's name, unique among the agents of the pool.
    #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
    pub name: String,
    /// Exit (status 0) after answering this many tasks.
    #[arg(long, value_name = "N")]
    pub max_tasks: Option<u64>,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// The program and its arguments, after `--`.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<OsString>,
}

pub fn main() -> ExitCode {
    let matches = PoolCli::command().get_matches();
    let cli = match PoolCli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    logging::init(cli.log_format);
    exit::finish(dispatch(cli.command, &matches))
}

fn dispatch(command: PoolCommand, matches: &ArgMatches) -> CliResult {
    match command {
        PoolCommand::Completions { shell } => {
            super::restore_sigpipe();
            super::print_completions::<PoolCli>(shell, "drover-pool");
            Ok(ExitCode::SUCCESS)
        }
        PoolCommand::Start(args) => start(args),
        PoolCommand::Stop(args) => stop(args),
        PoolCommand::Status(args) => {
            super::restore_sigpipe();
            status(args)
        }
        PoolCommand::Kick(args) => kick(args),
        PoolCommand::Protocol(args) => {
            super::restore_sigpipe();
            let sub = matches.subcommand_matches("protocol");
            let given = |id: &str| {
                sub.is_some_and(|m| m.value_source(id) == Some(ValueSource::CommandLine))
            };
            let pool = args.pool.pool.as_deref().filter(|_| given("pool"));
            let root = args
                .pool
                .root
                .as_ref()
                .filter(|_| given("root"))
                .map(|r| r.to_string_lossy().into_owned());
            print!(
                "{}",
                protocol_text::render(&args.name, pool, root.as_deref())
            );
            Ok(ExitCode::SUCCESS)
        }
        PoolCommand::GetTask(args) => get_task(args),
        PoolCommand::Agent(args) => run_agent(args),
    }
}

/// The pool's paths, after checking that the pool name is usable as a directory name.
fn pool_paths(args: &PoolArgs) -> Result<PoolPaths, CliError> {
    let name = args.name();
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(CliError::invalid(format!(
            "`{name}` is not a valid pool name (it names a directory: no `/`, not empty, `.` or `..`)"
        )));
    }
    Ok(args.paths())
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError {
            code: FAILED,
            message: format!("cannot start the async runtime: {e}"),
        })
}

fn failed(message: impl std::fmt::Display) -> CliError {
    CliError {
        code: FAILED,
        message: message.to_string(),
    }
}

fn no_daemon(paths: &PoolPaths, e: &std::io::Error) -> CliError {
    let stopped = if paths.stopped_marker().exists() {
        " (it was stopped with `drover-pool stop`)"
    } else {
        ""
    };
    CliError::unavailable(format!(
        "no pool daemon is running for pool `{}`{stopped}: cannot connect to {}: {e}; start one with `drover-pool start`",
        paths.name,
        paths.socket().display()
    ))
}

/// One request, one reply, on a fresh connection; no waiting for a daemon.
async fn request(paths: &PoolPaths, request: &Request) -> Result<Reply, CliError> {
    let (mut reader, mut writer) = conn::connect(paths)
        .await
        .map_err(|e| no_daemon(paths, &e))?;
    let lost = |e: std::io::Error| {
        CliError::unavailable(format!(
            "lost the connection to the daemon of pool `{}`: {e}",
            paths.name
        ))
    };
    writer.send(request).await.map_err(lost)?;
    match reader.recv::<Reply>().await.map_err(lost)? {
        Some(reply) => Ok(reply),
        None => Err(CliError::unavailable(format!(
            "the daemon of pool `{}` closed the connection without answering",
            paths.name
        ))),
    }
}

fn unexpected(reply: &Reply) -> CliError {
    failed(format!("unexpected reply from the pool daemon: {reply:?}"))
}

fn start(args: StartArgs) -> CliResult {
    let paths = pool_paths(&args.pool)?;
    crate::pool::daemon::run_blocking(paths).map_err(failed)?;
    Ok(ExitCode::SUCCESS)
}

fn stop(args: StopArgs) -> CliResult {
    let paths = pool_paths(&args.pool)?;
    runtime()?.block_on(async {
        match request(&paths, &Request::Stop).await? {
            Reply::Ok => {}
            Reply::Error { message } => return Err(failed(message)),
            other => return Err(unexpected(&other)),
        }
        // The daemon removes its socket as it exits; wait a little for that to report it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while paths.socket().exists() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if paths.socket().exists() {
            crate::say!(
                "drover-pool: stop requested; the daemon of pool `{}` has not exited yet",
                paths.name
            );
        } else {
            crate::say!("drover-pool: pool `{}` stopped", paths.name);
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn status(args: StatusArgs) -> CliResult {
    let paths = pool_paths(&args.pool)?;
    let reply = runtime()?.block_on(request(&paths, &Request::Status))?;
    let report = match reply {
        Reply::Status(report) => report,
        Reply::Error { message } => return Err(failed(message)),
        other => return Err(unexpected(&other)),
    };
    let text = if args.json {
        serde_json::to_string_pretty(&report).map_err(failed)? + "\n"
    } else {
        render_status(&report, now_ms())
    };
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(|e| failed(format!("cannot write to stdout: {e}")))?;
    Ok(ExitCode::SUCCESS)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn render_status(report: &StatusReport, now_ms: u64) -> String {
    let mut out = String::new();
    if report.agents.is_empty() {
        out.push_str(&format!("pool `{}`: no agents\n", report.pool));
    } else {
        let mut table = Table::new();
        table
            .load_style(UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_header(vec!["agent", "state", "run", "task", "attempt", "since"]);
        for agent in &report.agents {
            let (run, task, attempt) = match &agent.task {
                Some(key) => (
                    key.run_id.clone(),
                    key.task_id.clone(),
                    key.attempt.to_string(),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            let since = if agent.since_ms == 0 {
                "-".to_string()
            } else {
                format_duration(now_ms.saturating_sub(agent.since_ms))
            };
            table.add_row(vec![
                agent.name.clone(),
                agent.state.clone(),
                run,
                task,
                attempt,
                since,
            ]);
        }
        out.push_str(&format!("pool `{}`\n{table}\n", report.pool));
    }
    out.push_str(&format!(
        "queued: {}  assigned: {}  undelivered answers: {}\n",
        report.queued, report.assigned, report.undelivered
    ));
    out
}

fn kick(args: KickArgs) -> CliResult {
    let paths = pool_paths(&args.pool)?;
    let request_kick = Request::Kick {
        name: args.name.clone(),
        abandon: args.abandon,
    };
    match runtime()?.block_on(request(&paths, &request_kick))? {
        Reply::Kicked { message } => {
            crate::say!("drover-pool: {message}");
            Ok(ExitCode::SUCCESS)
        }
        // A daemon that predates --abandon reads it as a plain kick and answers `Ok`.
        Reply::Ok if args.abandon => Err(failed(format!(
            "the daemon of pool `{}` predates --abandon: agent `{}` was kicked, but the task it \
             holds was not given up; restart the daemon (`drover-pool stop`, then \
             `drover-pool start`) and run this again",
            paths.name, args.name
        ))),
        Reply::Ok => {
            crate::say!(
                "drover-pool: kicked agent `{}` of pool `{}`",
                args.name,
                paths.name
            );
            Ok(ExitCode::SUCCESS)
        }
        Reply::Error { message } => Err(failed(message)),
        other => Err(unexpected(&other)),
    }
}

fn get_task(args: GetTaskArgs) -> CliResult {
    let paths = pool_paths(&args.pool)?;
    let message = runtime()?
        .block_on(agent::get_task(&paths, &args.name))
        .map_err(CliError::invalid)?;
    print_message(&message)?;
    Ok(ExitCode::SUCCESS)
}

fn print_message(message: &AgentMessage) -> Result<(), CliError> {
    let mut line = serde_json::to_string(message).map_err(failed)?;
    line.push('\n');
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(line.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| failed(format!("cannot write the message to stdout: {e}")))
}

fn run_agent(args: AgentArgs) -> CliResult {
    let paths = pool_paths(&args.pool)?;
    let end = runtime()?
        .block_on(agent::run_agent(
            &paths,
            &args.name,
            &args.command,
            args.max_tasks,
        ))
        .map_err(|e| match e {
            AgentError::Refused(message) => CliError::invalid(message),
            AgentError::Failed(message) => failed(message),
        })?;
    match end {
        AgentEnd::Kicked { reason } => {
            crate::say!("drover-pool agent `{}`: kicked: {reason}", args.name);
        }
        AgentEnd::Done { answered } => {
            crate::say!(
                "drover-pool agent `{}`: answered {answered} task(s); exiting",
                args.name
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::protocol::{AgentStatus, TaskKey};

    #[test]
    fn the_cli_is_well_formed() {
        PoolCli::command().debug_assert();
    }

    #[test]
    fn get_task_alias_and_trailing_command_parse() {
        let cli = PoolCli::try_parse_from(["drover-pool", "get_task", "--name", "a"])
            .expect("the alias parses");
        assert!(matches!(cli.command, PoolCommand::GetTask(ref a) if a.name == "a"));
        let cli = PoolCli::try_parse_from([
            "drover-pool",
            "agent",
            "--name",
            "a",
            "--max-tasks",
            "2",
            "--",
            "sh",
            "-c",
            "cat",
        ])
        .expect("the agent command parses");
        let PoolCommand::Agent(args) = cli.command else {
            panic!("not agent")
        };
        assert_eq!(args.command, ["sh", "-c", "cat"]);
        assert_eq!(args.max_tasks, Some(2));
        assert!(PoolCli::try_parse_from(["drover-pool", "agent", "--name", "a"]).is_err());
    }

    #[test]
    fn status_shows_agents_and_depths() {
        let report = StatusReport {
            pool: "default".into(),
            agents: vec![
                AgentStatus {
                    name: "a".into(),
                    state: "busy".into(),
                    task: Some(TaskKey {
                        run_id: "R".into(),
                        task_id: "T".into(),
                        attempt: 2,
                    }),
                    since_ms: 10_000,
                },
                AgentStatus {
                    name: "b".into(),
                    state: "idle".into(),
                    task: None,
                    since_ms: 70_000,
                },
            ],
            queued: 3,
            assigned: 1,
            undelivered: 0,
        };
        let text = render_status(&report, 100_000);
        for needle in ["busy", "idle", "1m30s", "30.0s", "queued: 3", "assigned: 1"] {
            assert!(text.contains(needle), "{needle} missing in\n{text}");
        }
    }
}
