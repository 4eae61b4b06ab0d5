//! `drover run` and `drover resume`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use ulid::Ulid;

use super::entry_value;
use super::exit::{self, CliError, CliResult};
use super::locations::StateDirArg;
use super::progress::Progress;
use crate::engine::answer::{Allowed, AnswerError, JsonText, NewTask, validate_tasks};
use crate::engine::config::{self, Action, Workflow};
use crate::engine::driver::{self, Driver, RunSummary};
use crate::engine::run_lock::RunLock;
use crate::pool::paths::PoolArgs;
use crate::pool::runner_client::{PoolClient, tell_run_ended};
use crate::store::{PoolRef, RunStatus, RunV2, Store};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The workflow config (JSON with comments).
    #[arg(long, short, env = "DROVER_CONFIG")]
    pub config: PathBuf,
    /// The entrypoint task's value: JSON text, or @file.json [default: {}]
    #[arg(long, value_name = "JSON", conflicts_with = "initial_state")]
    pub entrypoint_value: Option<String>,
    /// Start from these tasks instead of the entrypoint: a JSON array [{"kind", "value"}, …]
    /// (or @file.json); each may target any step.
    #[arg(long, value_name = "JSON")]
    pub initial_state: Option<String>,
    #[command(flatten)]
    pub state: StateDirArg,
    #[command(flatten)]
    pub pool: PoolConnectArgs,
}

#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The run to continue [default: the newest unfinished run]
    pub run_id: Option<String>,
    #[command(flatten)]
    pub state: StateDirArg,
    #[command(flatten)]
    pub pool: PoolConnectArgs,
}

#[derive(Debug, Clone, Args)]
pub struct PoolConnectArgs {
    #[command(flatten)]
    pub location: PoolArgs,
    /// Seconds to wait at start for the pool daemon (only when the workflow has Pool steps)
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub pool_wait: f64,
}

pub fn run(args: RunArgs) -> CliResult {
    let workflow = config::load(&args.config)?;
    let (entry_value, first_tasks) = first_tasks(&workflow, &args)?;
    let state_dir = args.state.resolve();
    let store = Arc::new(Store::open(&state_dir).map_err(CliError::unavailable)?);
    let snapshot = serde_json::to_string(&workflow.resolved).map_err(CliError::invalid)?;
    let run_id = Ulid::generate();
    let workflow = Arc::new(workflow);
    // The pool is reached before the run is recorded, so an unreachable pool records nothing.
    let mut session = Session::start(
        store.clone(),
        run_id,
        workflow.clone(),
        state_dir.clone(),
        &args.pool.location,
        args.pool.pool_wait,
    )?;
    driver::create_run(
        &store,
        run_id,
        &workflow,
        snapshot,
        entry_value.as_str(),
        first_tasks,
        session.pool.clone(),
    )
    .map_err(CliError::unavailable)?;
    crate::say!(
        "drover: run {run_id} started (state: {})",
        state_dir.display()
    );
    session.drive()
}

pub fn resume(args: ResumeArgs) -> CliResult {
    let state_dir = args.state.resolve();
    let store = Arc::new(Store::open(&state_dir).map_err(CliError::unavailable)?);
    let reader = store.read().map_err(CliError::unavailable)?;
    let (run_id, run) = match &args.run_id {
        Some(text) => {
            let id = Ulid::from_string(text)
                .map_err(|e| CliError::invalid(format!("`{text}` is not a run id: {e}")))?;
            let run = reader
                .run(id.0)
                .map_err(CliError::unavailable)?
                .ok_or_else(|| {
                    CliError::invalid(format!("no run {id} in {}", state_dir.display()))
                })?;
            (id, run)
        }
        None => newest_resumable(reader.runs().map_err(CliError::unavailable)?, &state_dir)?,
    };
    drop(reader);
    let finished = match run.status {
        RunStatus::Completed => {
            crate::say!("drover: run {run_id} already finished: completed");
            Some(ExitCode::SUCCESS)
        }
        RunStatus::Failed => {
            crate::say!(
                "drover: run {run_id} already finished: failed ({} of {} tasks)",
                run.tasks_failed,
                run.tasks_total
            );
            Some(ExitCode::from(exit::FAILED_TASKS))
        }
        RunStatus::Running | RunStatus::Interrupted => None,
    };
    if let Some(code) = finished {
        if let Some(pool) = &run.pool {
            tell_pool_run_ended(run_id, pool, args.pool.pool_wait);
        }
        return Ok(code);
    }
    // Hooks run where the config was when the run started, wherever `resume` is run from
    // (`config_path` may be relative to `run`'s working directory in runs stored before v2).
    let base_dir = Path::new(&run.base_dir);
    let config_path = Path::new(&run.config_path)
        .file_name()
        .map_or_else(|| base_dir.join("config"), |name| base_dir.join(name));
    let workflow = config::load_text(&run.config_snapshot, &config_path).map_err(|e| {
        CliError::invalid(format!(
            "the config snapshot stored with run {run_id} no longer loads:\n{e}"
        ))
    })?;
    let location = pool_for_resume(run_id, run.pool.as_ref(), &args.pool.location);
    let mut session = Session::start(
        store.clone(),
        run_id,
        Arc::new(workflow),
        state_dir,
        &location,
        args.pool.pool_wait,
    )?;
    if session.pool.is_some() && session.pool != run.pool {
        let pool = session.pool.clone();
        store
            .write(|w| {
                if let Some(mut stored) = w.run(run_id.0)? {
                    stored.pool = pool;
                    w.put_run(run_id.0, &stored)?;
                }
                Ok(())
            })
            .map_err(CliError::unavailable)?;
    }
    crate::say!("drover: resuming run {run_id}");
    session.drive()
}

/// How long `resume` of a finished run waits for its pool daemon (at most; --pool-wait may
/// shorten it), and then for its reply: the run's outcome must not wait long on housekeeping.
const RUN_ENDED_WAIT: Duration = Duration::from_secs(2);

/// Tells the pool a finished run used that the run is over, in case its runner could not (the
/// daemon was away during the runner's final flush): otherwise the pool would keep the run's
/// answers for good. Only says on stderr when that fails; the run's exit code stands.
fn tell_pool_run_ended(run_id: Ulid, pool: &PoolRef, pool_wait: f64) {
    let location = PoolArgs {
        pool: Some(pool.name.clone()),
        root: Some(PathBuf::from(&pool.root)),
    };
    // An unusable --pool-wait only shortens the wait to nothing; it is no reason to fail here.
    let connect_wait = Duration::try_from_secs_f64(pool_wait)
        .unwrap_or(Duration::ZERO)
        .min(RUN_ENDED_WAIT);
    let told = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
        .and_then(|runtime| {
            runtime.block_on(tell_run_ended(
                &location.paths(),
                &run_id.to_string(),
                connect_wait,
                RUN_ENDED_WAIT,
            ))
        });
    if let Err(reason) = told {
        crate::say!(
            "drover: could not tell pool `{}` ({}) that run {run_id} ended: {reason}; it keeps \
             what it holds of the run until `drover resume {run_id}` reaches it",
            pool.name,
            pool.root
        );
    }
}

/// The newest run that is unfinished and not being run by a live drover process.
fn newest_resumable(runs: Vec<(u128, RunV2)>, state_dir: &Path) -> Result<(Ulid, RunV2), CliError> {
    let mut live = 0;
    for (id, run) in runs {
        if !matches!(run.status, RunStatus::Running | RunStatus::Interrupted) {
            continue;
        }
        if RunLock::is_held(state_dir, Ulid(id)) {
            live += 1;
            continue;
        }
        return Ok((Ulid(id), run));
    }
    Err(CliError::invalid(if live > 0 {
        format!(
            "no run to resume in {}: {live} unfinished run(s) are being run by live drover processes",
            state_dir.display()
        )
    } else {
        format!("no unfinished run in {}", state_dir.display())
    }))
}

/// A run goes back to the pool it started with, where the agent work it already handed out
/// is kept; a pool named explicitly (flag or environment) wins, with a warning when it differs.
fn pool_for_resume(run_id: Ulid, stored: Option<&PoolRef>, given: &PoolArgs) -> PoolArgs {
    let Some(stored) = stored else {
        return given.clone();
    };
    if given.pool.is_none() && given.root.is_none() {
        return PoolArgs {
            pool: Some(stored.name.clone()),
            root: Some(PathBuf::from(&stored.root)),
        };
    }
    let chosen = pool_ref(given);
    if &chosen != stored {
        crate::say!(
            "drover: warning: run {run_id} sent its agent tasks to pool `{}` in {}; resuming \
             with pool `{}` in {}: tasks the first pool still holds are dispatched again",
            stored.name,
            stored.root,
            chosen.name,
            chosen.root
        );
    }
    given.clone()
}

fn pool_ref(location: &PoolArgs) -> PoolRef {
    PoolRef {
        name: location.name().to_string(),
        root: location.root().display().to_string(),
    }
}

fn first_tasks(workflow: &Workflow, args: &RunArgs) -> Result<(JsonText, Vec<NewTask>), CliError> {
    if let Some(state) = &args.initial_state {
        let value = entry_value::parse(Some(state)).map_err(|e| {
            CliError::invalid(e.message.replace("--entrypoint-value", "--initial-state"))
        })?;
        let tasks = validate_tasks(workflow, Allowed::AnyStep, value.as_str()).map_err(|e| {
            let (AnswerError::NotJson(reason) | AnswerError::Invalid(reason)) = e;
            CliError::invalid(format!("--initial-state: {reason}"))
        })?;
        if tasks.is_empty() {
            return Err(CliError::invalid(
                "--initial-state: the array is empty, so there is nothing to run",
            ));
        }
        return Ok((value, tasks));
    }
    let Some(entry) = &workflow.entrypoint else {
        return Err(CliError::invalid(format!(
            "{}: the config has no `entrypoint`; give one, or start with --initial-state",
            workflow.path.display()
        )));
    };
    let value = entry_value::parse(args.entrypoint_value.as_deref())?;
    entry_value::check(workflow, &value.to_value())?;
    let task = NewTask {
        kind: entry.clone(),
        value: value.clone(),
    };
    Ok((value, vec![task]))
}

/// Everything a run needs before its first dispatch: the run lock, the async runtime, and the
/// pool connection when the workflow has Pool steps.
struct Session {
    runtime: tokio::runtime::Runtime,
    driver: Option<Driver>,
    /// The pool connected to, when the workflow has Pool steps.
    pool: Option<PoolRef>,
    _lock: RunLock,
}

impl Session {
    fn start(
        store: Arc<Store>,
        run_id: Ulid,
        workflow: Arc<Workflow>,
        state_dir: PathBuf,
        pool_location: &PoolArgs,
        pool_wait: f64,
    ) -> Result<Self, CliError> {
        let lock = RunLock::acquire(&state_dir, run_id).map_err(CliError::invalid)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| CliError::unavailable(format!("cannot start the async runtime: {e}")))?;
        let mut driver = Driver::new(
            store,
            run_id,
            workflow.clone(),
            state_dir,
            runtime.handle().clone(),
        );
        let mut pool = None;
        if workflow
            .steps
            .iter()
            .any(|s| matches!(s.action, Action::Pool { .. }))
        {
            let wait = Duration::try_from_secs_f64(pool_wait).map_err(|_| {
                CliError::invalid(format!(
                    "--pool-wait {pool_wait} is not a number of seconds"
                ))
            })?;
            let client = runtime
                .block_on(PoolClient::connect(
                    pool_location.paths(),
                    run_id.to_string(),
                    wait,
                    driver.late_answer_sink(),
                ))
                .map_err(CliError::unavailable)?;
            driver.attach_pool(client);
            pool = Some(pool_ref(pool_location));
        }
        Ok(Self {
            runtime,
            driver: Some(driver),
            pool,
            _lock: lock,
        })
    }

    fn drive(&mut self) -> CliResult {
        let driver = self
            .driver
            .take()
            .ok_or_else(|| CliError::unavailable("internal: the run was already driven"))?;
        let interrupt = driver.interrupter();
        self.runtime.spawn(async move {
            wait_for_stop_signal().await;
            interrupt();
        });
        let mut progress = Progress::new();
        let result = driver.run(&mut progress);
        progress.finish();
        let summary = result.map_err(CliError::unavailable)?;
        report(&summary);
        Ok(ExitCode::from(match summary.status {
            RunStatus::Completed => 0,
            RunStatus::Failed => exit::FAILED_TASKS,
            RunStatus::Interrupted | RunStatus::Running => exit::INTERRUPTED,
        }))
    }
}

async fn wait_for_stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn report(summary: &RunSummary) {
    let id = summary.run_id;
    match summary.status {
        RunStatus::Interrupted | RunStatus::Running => {
            crate::say!("drover: run {id} interrupted; continue it with `drover resume {id}`");
        }
        status => crate::say!(
            "drover: run {id} {}: {} tasks, {} completed, {} failed",
            status.as_str(),
            summary.total,
            summary.completed,
            summary.failed
        ),
    }
    if summary.pool_not_told {
        crate::say!(
            "drover: the pool did not confirm that run {id} ended (its daemon was away); it \
             keeps what it holds of the run until told: run `drover resume {id}` once the pool \
             is up"
        );
    }
}
