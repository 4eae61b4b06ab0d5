//! What `inspect` shows, computed from the store: run lists, per-run summaries, task trees and
//! one task's full history. Serializable as is for `--json`; the CLI only formats.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use serde_json::Value;
use ulid::Ulid;

use crate::store::{FinallyState, Phase, Reader, RunV2, StoreError, TaskV1};

#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    pub id: String,
    pub status: &'static str,
    pub config: String,
    pub started_ms: u64,
    pub ended_ms: Option<u64>,
    pub duration_ms: u64,
    pub tasks_total: u64,
    pub tasks_completed: u64,
    pub tasks_failed: u64,
    /// Not yet finished (includes tasks waiting for descendants or a finally hook).
    pub tasks_pending: u64,
}

impl RunRow {
    pub fn new(id: u128, run: &RunV2) -> Self {
        let end = run.ended_ms.unwrap_or(run.updated_ms);
        Self {
            id: Ulid(id).to_string(),
            status: run.status.as_str(),
            config: run.config_path.clone(),
            started_ms: run.started_ms,
            ended_ms: run.ended_ms,
            duration_ms: end.saturating_sub(run.started_ms),
            tasks_total: run.tasks_total,
            tasks_completed: run.tasks_completed,
            tasks_failed: run.tasks_failed,
            tasks_pending: run.tasks_open,
        }
    }
}

/// Every run, newest first; reads only run records.
pub fn runs(reader: &Reader) -> Result<Vec<RunRow>, StoreError> {
    Ok(reader
        .runs()?
        .iter()
        .map(|(id, run)| RunRow::new(*id, run))
        .collect())
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct StepCounts {
    pub step: String,
    pub queued: u64,
    pub running: u64,
    pub completed: u64,
    pub failed: u64,
    pub total: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    pub task: String,
    pub step: String,
    pub attempts: u32,
    pub error: String,
}

/// One task of a run's tree. The tree is a flat list in depth-first order (a parent before its
/// children, siblings in creation order) with each task's parent and depth: a polling step that
/// re-emits itself makes chains thousands deep, and nested JSON that deep overflows stacks and
/// the recursion limits of JSON parsers, while a flat list is as easy to read as a fan-out.
#[derive(Debug, Clone, Serialize)]
pub struct TreeRow {
    pub id: String,
    pub parent: Option<String>,
    pub depth: usize,
    pub step: String,
    pub state: &'static str,
    pub attempt: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finally: Option<String>,
    /// The last of its siblings (for drawing).
    #[serde(skip)]
    pub last: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub run: RunRow,
    pub steps: Vec<StepCounts>,
    pub failures: Vec<Failure>,
    pub finally_failures: Vec<Failure>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree: Option<Vec<TreeRow>>,
}

pub fn run_report(
    reader: &Reader,
    run_id: Ulid,
    with_tree: bool,
) -> Result<Option<RunReport>, StoreError> {
    let Some(run) = reader.run(run_id.0)? else {
        return Ok(None);
    };
    let mut steps: BTreeMap<String, StepCounts> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut finally_failures = Vec::new();
    let mut tasks: Vec<(u128, TaskV1)> = Vec::new();
    reader.for_each_task(run_id.0, |id, task| {
        let counts = steps
            .entry(task.step.clone())
            .or_insert_with(|| StepCounts {
                step: task.step.clone(),
                ..Default::default()
            });
        counts.total += 1;
        match task.phase {
            Phase::Queued => counts.queued += 1,
            Phase::Completed => counts.completed += 1,
            Phase::Failed => {
                counts.failed += 1;
                failures.push(Failure {
                    task: Ulid(id).to_string(),
                    step: task.step.clone(),
                    attempts: task.attempt,
                    error: task.error.clone().unwrap_or_default(),
                });
            }
            _ => counts.running += 1,
        }
        if let FinallyState::Failed(reason) = &task.finally {
            finally_failures.push(Failure {
                task: Ulid(id).to_string(),
                step: task.step.clone(),
                attempts: task.attempt,
                error: reason.clone(),
            });
        }
        if with_tree {
            tasks.push((id, task));
        }
    })?;
    Ok(Some(RunReport {
        run: RunRow::new(run_id.0, &run),
        steps: steps.into_values().collect(),
        failures,
        finally_failures,
        tree: with_tree.then(|| build_tree(tasks)),
    }))
}

fn finally_label(state: &FinallyState) -> Option<String> {
    match state {
        FinallyState::None => None,
        FinallyState::Waiting => Some("waiting".into()),
        FinallyState::Running => Some("running".into()),
        FinallyState::Done => Some("done".into()),
        FinallyState::Failed(reason) => Some(format!("failed: {reason}")),
    }
}

fn build_tree(tasks: Vec<(u128, TaskV1)>) -> Vec<TreeRow> {
    let mut children: HashMap<Option<u128>, Vec<u128>> = HashMap::new();
    let mut by_id: HashMap<u128, TaskV1> = HashMap::with_capacity(tasks.len());
    for (id, task) in tasks {
        children.entry(task.parent).or_default().push(id);
        by_id.insert(id, task);
    }
    let mut rows = Vec::with_capacity(by_id.len());
    // (task, depth, last among its siblings); children pushed in reverse so that they pop in
    // creation order.
    let mut stack: Vec<(u128, usize, bool)> = Vec::new();
    let push_children = |stack: &mut Vec<_>, kids: Vec<u128>, depth: usize| {
        let count = kids.len();
        for (i, kid) in kids.into_iter().enumerate().rev() {
            stack.push((kid, depth, i + 1 == count));
        }
    };
    push_children(&mut stack, children.remove(&None).unwrap_or_default(), 0);
    while let Some((id, depth, last)) = stack.pop() {
        let Some(task) = by_id.remove(&id) else {
            continue;
        };
        push_children(
            &mut stack,
            children.remove(&Some(id)).unwrap_or_default(),
            depth + 1,
        );
        rows.push(TreeRow {
            id: Ulid(id).to_string(),
            parent: task.parent.map(|p| Ulid(p).to_string()),
            depth,
            step: task.step,
            state: task.phase.as_str(),
            attempt: task.attempt,
            finally: finally_label(&task.finally),
            last,
        });
    }
    rows
}

#[derive(Debug, Clone, Serialize)]
pub struct TransitionRow {
    pub seq: u64,
    pub at_ms: u64,
    pub attempt: u32,
    pub from: Option<&'static str>,
    pub to: &'static str,
    pub detail: String,
    /// The agent that held the task, on the transition that ended a Pool action.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HookLogRow {
    pub seq: u64,
    pub at_ms: u64,
    pub attempt: u32,
    pub phase: String,
    pub outcome: String,
    pub stderr: String,
    pub stderr_truncated: bool,
    /// The agent that sent a late answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TaskReport {
    pub id: String,
    pub run: String,
    pub step: String,
    pub parent: Option<String>,
    pub state: &'static str,
    pub attempt: u32,
    pub value: Value,
    pub action_value: Option<Value>,
    pub result: Option<Value>,
    pub error: Option<String>,
    pub open_children: u64,
    pub finally: Option<String>,
    pub transitions: Vec<TransitionRow>,
    pub hook_logs: Vec<HookLogRow>,
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

pub fn task_report(
    reader: &Reader,
    run_id: Ulid,
    task_id: Ulid,
) -> Result<Option<TaskReport>, StoreError> {
    let Some(task) = reader.task(run_id.0, task_id.0)? else {
        return Ok(None);
    };
    let transitions = reader
        .task_transitions(run_id.0, task_id.0)?
        .into_iter()
        .map(|(seq, t)| TransitionRow {
            seq,
            at_ms: t.at_ms,
            attempt: t.attempt,
            from: t.from.map(|s| s.as_str()),
            to: t.to.as_str(),
            agent: t.agent,
            detail: t.detail,
        })
        .collect();
    let hook_logs = reader
        .hook_logs(run_id.0, task_id.0)?
        .into_iter()
        .map(|(seq, log)| HookLogRow {
            agent: log.agent,
            seq,
            at_ms: log.at_ms,
            attempt: log.attempt,
            phase: log.phase,
            outcome: log.outcome,
            stderr: log.stderr,
            stderr_truncated: log.stderr_truncated,
        })
        .collect();
    Ok(Some(TaskReport {
        id: task_id.to_string(),
        run: run_id.to_string(),
        step: task.step.clone(),
        parent: task.parent.map(|p| Ulid(p).to_string()),
        state: task.phase.as_str(),
        attempt: task.attempt,
        value: json(&task.value),
        action_value: task.action_value.as_deref().map(json),
        result: task.result.as_deref().map(json),
        error: task.error.clone(),
        open_children: reader.open_children(run_id.0, task_id.0)?,
        finally: finally_label(&task.finally),
        transitions,
        hook_logs,
    }))
}

/// `YYYY-MM-DD HH:MM:SS.mmm` UTC, without a date library.
pub fn format_utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        ms % 1000
    )
}

pub fn format_duration(ms: u64) -> String {
    let secs = ms / 1000;
    match secs {
        0..60 => format!("{:.1}s", ms as f64 / 1000.0),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formatting_matches_known_instants() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00.000");
        assert_eq!(format_utc(951_782_400_123), "2000-02-29 00:00:00.123");
        assert_eq!(format_utc(1_795_305_600_000), "2026-11-22 00:00:00.000");
    }
}
