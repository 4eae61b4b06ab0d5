//! `drover inspect`: runs, one run, its task tree, one task — live or after the fact.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use serde::Serialize;
use ulid::Ulid;

use super::exit::{CliError, CliResult};
use super::locations::StateDirArg;
use crate::engine::report::{
    self, RunReport, RunRow, TaskReport, TreeRow, format_duration, format_utc,
};
use crate::engine::run_lock::RunLock;
use crate::store::{self, RunStatus};

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A run to show [default: list all runs]
    pub run_id: Option<String>,
    /// Show the run's task tree.
    #[arg(long, requires = "run_id")]
    pub tree: bool,
    /// Show one task of the run: value, attempts, transitions, results, hook stderr.
    #[arg(
        long,
        value_name = "TASK_ID",
        requires = "run_id",
        conflicts_with = "tree"
    )]
    pub task: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub state: StateDirArg,
}

fn parse_id(text: &str, what: &str) -> Result<Ulid, CliError> {
    Ulid::from_string(text)
        .map_err(|e| CliError::invalid(format!("`{text}` is not a {what} id: {e}")))
}

fn print_json<T: Serialize>(value: &T) -> CliResult {
    let text = serde_json::to_string_pretty(value).map_err(CliError::invalid)?;
    println!("{text}");
    Ok(ExitCode::SUCCESS)
}

fn table(header: Vec<&str>) -> Table {
    let mut table = Table::new();
    table
        .load_style(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    table
}

pub fn run(args: InspectArgs) -> CliResult {
    let state_dir = args.state.resolve();
    let store = store::open_for_reading(&state_dir).map_err(CliError::unavailable)?;
    let reader = store.read().map_err(CliError::unavailable)?;
    let Some(run_text) = &args.run_id else {
        let mut runs = report::runs(&reader).map_err(CliError::unavailable)?;
        for run in &mut runs {
            mark_crashed(run, &state_dir);
        }
        if args.json {
            return print_json(&runs);
        }
        if runs.is_empty() {
            println!("no runs in {}", state_dir.display());
            return Ok(ExitCode::SUCCESS);
        }
        let mut t = table(vec![
            "run",
            "status",
            "started (UTC)",
            "duration",
            "done",
            "failed",
            "pending",
            "config",
        ]);
        for run in &runs {
            t.add_row(vec![
                run.id.clone(),
                run.status.to_string(),
                format_utc(run.started_ms),
                format_duration(run.duration_ms),
                run.tasks_completed.to_string(),
                run.tasks_failed.to_string(),
                run.tasks_pending.to_string(),
                run.config.clone(),
            ]);
        }
        println!("{t}");
        return Ok(ExitCode::SUCCESS);
    };
    let run_id = parse_id(run_text, "run")?;
    if let Some(task_text) = &args.task {
        let task_id = parse_id(task_text, "task")?;
        let task = report::task_report(&reader, run_id, task_id)
            .map_err(CliError::unavailable)?
            .ok_or_else(|| CliError::invalid(format!("run {run_id} has no task {task_id}")))?;
        return if args.json {
            print_json(&task)
        } else {
            print_task(&task)
        };
    }
    let mut report = report::run_report(&reader, run_id, args.tree)
        .map_err(CliError::unavailable)?
        .ok_or_else(|| CliError::invalid(format!("no run {run_id} in {}", state_dir.display())))?;
    mark_crashed(&mut report.run, &state_dir);
    if args.json {
        return print_json(&report);
    }
    print_run(&report);
    Ok(ExitCode::SUCCESS)
}

/// A run stored as running whose runner holds no lock any more died without recording it
/// (SIGKILL, power loss): say so, since it only moves again with `drover resume`.
fn mark_crashed(run: &mut RunRow, state_dir: &Path) {
    if run.status == RunStatus::Running.as_str()
        && let Ok(id) = Ulid::from_string(&run.id)
        && !RunLock::is_held(state_dir, id)
    {
        run.status = CRASHED;
    }
}

const CRASHED: &str = "crashed";

fn print_run(report: &RunReport) {
    let run = &report.run;
    println!("run {}  {}", run.id, run.status);
    if run.status == CRASHED {
        println!(
            "         its runner is gone; continue it with `drover resume {}`",
            run.id
        );
    }
    println!("config   {}", run.config);
    println!(
        "started  {} UTC, {}{}",
        format_utc(run.started_ms),
        format_duration(run.duration_ms),
        if run.ended_ms.is_some() {
            ""
        } else {
            " so far"
        }
    );
    println!(
        "tasks    {} total: {} completed, {} failed, {} pending",
        run.tasks_total, run.tasks_completed, run.tasks_failed, run.tasks_pending
    );
    let mut t = table(vec![
        "step",
        "queued",
        "running",
        "completed",
        "failed",
        "total",
    ]);
    for step in &report.steps {
        t.add_row(vec![
            step.step.clone(),
            step.queued.to_string(),
            step.running.to_string(),
            step.completed.to_string(),
            step.failed.to_string(),
            step.total.to_string(),
        ]);
    }
    println!("{t}");
    if !report.failures.is_empty() {
        println!("failed tasks:");
        for failure in &report.failures {
            println!(
                "  {} {} after {} attempt(s): {}",
                failure.task, failure.step, failure.attempts, failure.error
            );
        }
    }
    if !report.finally_failures.is_empty() {
        println!("failed finally hooks:");
        for failure in &report.finally_failures {
            println!("  {} {}: {}", failure.task, failure.step, failure.error);
        }
    }
    if let Some(tree) = &report.tree {
        println!("task tree:");
        let mut out = String::new();
        render_tree(tree, &mut out);
        print!("{out}");
    }
}

/// Beyond this depth lines are no longer indented (a 10,000-step chain would otherwise print
/// 30,000 columns of guides per line); the depth is written out instead.
const MAX_INDENT: usize = 24;

/// Draws the depth-first rows with box-drawing guides.
fn render_tree(rows: &[TreeRow], out: &mut String) {
    // For each depth on the current path: whether that ancestor was the last of its siblings.
    let mut lasts: Vec<bool> = Vec::new();
    for row in rows {
        lasts.truncate(row.depth);
        let mut prefix = String::new();
        for &last in lasts.iter().skip(1).take(MAX_INDENT) {
            prefix.push_str(if last { "   " } else { "│  " });
        }
        let deep = row.depth > MAX_INDENT + 1;
        if deep {
            prefix.push_str("… ");
        }
        lasts.push(row.last);
        let branch = match (row.depth, row.last) {
            (0, _) => "",
            (_, true) => "└─ ",
            (_, false) => "├─ ",
        };
        let depth = if deep {
            format!(" (depth {})", row.depth)
        } else {
            String::new()
        };
        let attempt = if row.attempt > 1 {
            format!(" (attempt {})", row.attempt)
        } else {
            String::new()
        };
        let finally = row
            .finally
            .as_ref()
            .map(|f| format!(" [finally {f}]"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{prefix}{branch}{} {} {}{attempt}{finally}{depth}",
            row.step, row.id, row.state
        );
    }
}

fn print_task(task: &TaskReport) -> CliResult {
    println!("task {} ({}) in run {}", task.id, task.step, task.run);
    println!("state    {} (attempt {})", task.state, task.attempt);
    if let Some(parent) = &task.parent {
        println!("parent   {parent}");
    }
    if let Some(finally) = &task.finally {
        println!("finally  {finally}");
    }
    println!("value    {}", task.value);
    if let Some(value) = &task.action_value
        && value != &task.value
    {
        println!("action value (after pre hook) {value}");
    }
    if let Some(result) = &task.result {
        println!("result   {result}");
    }
    if let Some(error) = &task.error {
        println!("error    {error}");
    }
    let mut t = table(vec!["#", "time (UTC)", "attempt", "from", "to", "detail"]);
    for tr in &task.transitions {
        t.add_row(vec![
            tr.seq.to_string(),
            format_utc(tr.at_ms),
            tr.attempt.to_string(),
            tr.from.unwrap_or("-").to_string(),
            tr.to.to_string(),
            match &tr.agent {
                Some(agent) => format!("{} (agent {agent})", tr.detail),
                None => tr.detail.clone(),
            },
        ]);
    }
    println!("{t}");
    for log in &task.hook_logs {
        println!(
            "{} attempt {} at {}: {}{}{}",
            log.phase,
            log.attempt,
            format_utc(log.at_ms),
            log.outcome,
            log.agent
                .as_ref()
                .map(|agent| format!(" (agent {agent})"))
                .unwrap_or_default(),
            if log.stderr_truncated {
                " (stderr truncated; last part shown)"
            } else {
                ""
            }
        );
        for line in log.stderr.lines() {
            println!("  | {line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
