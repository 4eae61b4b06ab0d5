//! `drover run` and `drover resume`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use serde_json::Value;
use ulid::Ulid;

use super::entry_value;
use super::exit::{self, CliError, CliResult};
use super::locations::StateDirArg;
use super::progress::Progress;
use crate::engine::answer::{Allowed, NewTask, validate_tasks};
use crate::engine::config::{self, Action, Workflow};
use crate::engine::driver::{self, Driver, RunSummary};
use crate::engine::run_lock::RunLock;
use crate::store::{RunStatus, Store};

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
}

#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The run to continue [default: the newest unfinished run]
    pub run_id: Option<String>,
    #[command(flatten)]
    pub state: StateDirArg,
}

pub fn run(args: RunArgs) -> CliResult {
    let workflow = config::load(&args.config)?;
    refuse_pool_steps(&workflow)?;
    let (entry_value, first_tasks) = first_tasks(&workflow, &args)?;
    let state_dir = args.state.resolve();
    let store = Arc::new(Store::open(&state_dir).map_err(CliError::unavailable)?);
    let snapshot = serde_json::to_string(&workflow.resolved).map_err(CliError::invalid)?;
    let run_id = driver::create_run(&store, &workflow, snapshot, &entry_value, first_tasks)
        .map_err(CliError::unavailable)?;
    eprintln!(
        "drover: run {run_id} started (state: {})",
        state_dir.display()
    );
    drive(store, run_id, Arc::new(workflow), state_dir)
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
        None => {
            let runs = reader.runs().map_err(CliError::unavailable)?;
            let newest = runs
                .into_iter()
                .find(|(_, run)| matches!(run.status, RunStatus::Running | RunStatus::Interrupted))
                .ok_or_else(|| {
                    CliError::invalid(format!("no unfinished run in {}", state_dir.display()))
                })?;
            (Ulid(newest.0), newest.1)
        }
    };
    drop(reader);
    if matches!(run.status, RunStatus::Completed | RunStatus::Failed) {
        eprintln!(
            "drover: run {run_id} already finished: {}",
            run.status.as_str()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let workflow =
        config::load_text(&run.config_snapshot, Path::new(&run.config_path)).map_err(|e| {
            CliError::invalid(format!(
                "the config snapshot stored with run {run_id} no longer loads:\n{e}"
            ))
        })?;
    refuse_pool_steps(&workflow)?;
    eprintln!("drover: resuming run {run_id}");
    drive(store, run_id, Arc::new(workflow), state_dir)
}

fn refuse_pool_steps(workflow: &Workflow) -> Result<(), CliError> {
    if let Some(step) = workflow
        .steps
        .iter()
        .find(|s| matches!(s.action, Action::Pool { .. }))
    {
        return Err(CliError::invalid(format!(
            "{}: step `{}` has a Pool action, and this build of drover cannot dispatch to a pool yet",
            workflow.path.display(),
            step.name
        )));
    }
    Ok(())
}

fn first_tasks(workflow: &Workflow, args: &RunArgs) -> Result<(Value, Vec<NewTask>), CliError> {
    if let Some(state) = &args.initial_state {
        let value = entry_value::parse(Some(state)).map_err(|e| {
            CliError::invalid(e.message.replace("--entrypoint-value", "--initial-state"))
        })?;
        let tasks = validate_tasks(workflow, Allowed::AnyStep, &value)
            .map_err(|reason| CliError::invalid(format!("--initial-state: {reason}")))?;
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
    entry_value::check(workflow, &value)?;
    let task = NewTask {
        kind: entry.clone(),
        value: value.clone(),
    };
    Ok((value, vec![task]))
}

fn drive(
    store: Arc<Store>,
    run_id: Ulid,
    workflow: Arc<Workflow>,
    state_dir: PathBuf,
) -> CliResult {
    let _lock = RunLock::acquire(&state_dir, run_id).map_err(CliError::invalid)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::unavailable(format!("cannot start the async runtime: {e}")))?;
    let driver = Driver::new(store, run_id, workflow, state_dir, runtime.handle().clone());
    let interrupt = driver.interrupter();
    runtime.spawn(async move {
        wait_for_stop_signal().await;
        interrupt();
    });
    let mut progress = Progress::new();
    let result = driver.run(&mut progress);
    progress.finish();
    let summary = result.map_err(CliError::unavailable)?;
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    report(&summary);
    Ok(ExitCode::from(match summary.status {
        RunStatus::Completed => 0,
        RunStatus::Failed => exit::FAILED_TASKS,
        RunStatus::Interrupted | RunStatus::Running => exit::INTERRUPTED,
    }))
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
            eprintln!("drover: run {id} interrupted; continue it with `drover resume {id}`");
        }
        status => eprintln!(
            "drover: run {id} {}: {} tasks, {} completed, {} failed",
            status.as_str(),
            summary.total,
            summary.completed,
            summary.failed
        ),
    }
}
