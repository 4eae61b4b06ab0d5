//! The task lifecycle as pure functions (CONTRACT.md §3): the stored task plus one event in,
//! the updated task, one transition and the next effect out. No I/O, no clock, no randomness:
//! the driver supplies `now_ms`, performs the effect after committing, and turns its outcome
//! into the next event. Each row of the contract's table is one branch here.

use super::answer::{
    Allowed, AnswerError, JsonText, NewTask, TaskResult, parse_post_result, validate_tasks,
};
use super::config::{Step, Workflow};
use crate::store::{Phase, TaskV1};

/// What the driver must do next for this task.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Run the pre hook with this stdin (the task value).
    Pre { stdin: String },
    /// Run the action on this value.
    Action { value: String },
    /// Run the post hook with this stdin (the result).
    Post { stdin: String },
}

/// How a hook process ended.
#[derive(Debug, Clone, PartialEq)]
pub enum HookOutcome {
    /// Exit 0 with this stdout.
    Output(String),
    /// Non-zero exit, killed, or could not start.
    Failed(String),
    TimedOut,
}

/// How an action ended.
#[derive(Debug, Clone, PartialEq)]
pub enum ActionOutcome {
    /// The agent's response file, or the command's stdout after exit 0.
    Answered(String),
    /// The command failed, the agent abandoned the task, …
    Failed(String),
    TimedOut,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub from: Phase,
    pub to: Phase,
    pub detail: String,
    pub effect: Option<Effect>,
    /// Tasks to create as children of this task.
    pub spawn: Vec<NewTask>,
}

/// The task got a concurrency slot.
pub fn start(task: &mut TaskV1, step: &Step, now_ms: u64) -> Decision {
    let from = task.phase;
    task.updated_ms = now_ms;
    task.result = None;
    task.invalid_response = false;
    if step.pre.is_some() {
        task.phase = Phase::Pre;
        task.action_value = None;
        return decision(
            from,
            task.phase,
            format!("attempt {}: pre hook", task.attempt),
            Some(Effect::Pre {
                stdin: task.value.clone(),
            }),
        );
    }
    task.phase = Phase::Action;
    task.action_value = Some(task.value.clone());
    decision(
        from,
        task.phase,
        format!("attempt {}: action", task.attempt),
        Some(Effect::Action {
            value: task.value.clone(),
        }),
    )
}

/// The pre hook ended: its stdout replaces the value (not re-validated), or the action is
/// skipped and the result is `PreHookError`.
pub fn pre_done(
    task: &mut TaskV1,
    workflow: &Workflow,
    step: &Step,
    outcome: HookOutcome,
    now_ms: u64,
) -> Decision {
    task.updated_ms = now_ms;
    let failure = match outcome {
        HookOutcome::Output(stdout) => match JsonText::parse_compact(&stdout) {
            Ok(value) => {
                let value = value.into_string();
                task.phase = Phase::Action;
                task.action_value = Some(value.clone());
                return decision(
                    Phase::Pre,
                    Phase::Action,
                    "pre hook done".into(),
                    Some(Effect::Action { value }),
                );
            }
            Err(e) => format!("pre hook output is not JSON: {e}"),
        },
        HookOutcome::Failed(reason) => format!("pre hook failed: {reason}"),
        HookOutcome::TimedOut => "pre hook timed out".to_string(),
    };
    let result = TaskResult::PreHookError {
        input: JsonText::stored(&task.value),
        error: failure,
        next: None,
    };
    conclude(task, workflow, step, Phase::Pre, result, now_ms)
}

/// The action ended: a valid answer is `Success`, anything else `Timeout` or `Error`.
pub fn action_done(
    task: &mut TaskV1,
    workflow: &Workflow,
    step: &Step,
    outcome: ActionOutcome,
    now_ms: u64,
) -> Decision {
    task.updated_ms = now_ms;
    let input = JsonText::stored(task.action_value.as_deref().unwrap_or(&task.value));
    let result = match outcome {
        ActionOutcome::TimedOut => TaskResult::Timeout { input, next: None },
        ActionOutcome::Failed(error) => TaskResult::Error {
            input,
            error,
            next: None,
        },
        ActionOutcome::Answered(text) => {
            match validate_tasks(workflow, Allowed::NextOf(step), &text) {
                Ok(next) => TaskResult::Success {
                    input,
                    output: JsonText::parse(&text).unwrap_or_else(|_| JsonText::null()),
                    next,
                },
                Err(refused) => {
                    task.invalid_response = true;
                    let error = match refused {
                        AnswerError::NotJson(e) => format!("the answer is not JSON: {e}"),
                        AnswerError::Invalid(reason) => format!("invalid answer: {reason}"),
                    };
                    TaskResult::Error {
                        input,
                        error,
                        next: None,
                    }
                }
            }
        }
    };
    conclude(task, workflow, step, Phase::Action, result, now_ms)
}

/// The post hook ended: a valid result replaces the original; a failure restarts the whole
/// task if the retry policy allows, else the task fails.
pub fn post_done(
    task: &mut TaskV1,
    workflow: &Workflow,
    step: &Step,
    outcome: HookOutcome,
    now_ms: u64,
) -> Decision {
    task.updated_ms = now_ms;
    let failure = match outcome {
        HookOutcome::Output(stdout) => match parse_post_result(workflow, step, &stdout) {
            Ok(result) => {
                if !matches!(result, TaskResult::Error { .. }) {
                    task.invalid_response = false;
                }
                return settle(task, step, Phase::Post, result, now_ms);
            }
            Err(reason) => reason,
        },
        HookOutcome::Failed(reason) => format!("post hook failed: {reason}"),
        HookOutcome::TimedOut => "post hook timed out".to_string(),
    };
    task.error = Some(failure.clone());
    if retries_left(task, step) {
        return retry(task, step, Phase::Post, failure, now_ms);
    }
    task.phase = Phase::Failed;
    decision(Phase::Post, Phase::Failed, failure, None)
}

/// A result exists: hand it to the post hook, or use it as is.
fn conclude(
    task: &mut TaskV1,
    _workflow: &Workflow,
    step: &Step,
    from: Phase,
    result: TaskResult,
    now_ms: u64,
) -> Decision {
    if step.post.is_some() {
        let stdin = result.to_json();
        task.result = Some(stdin.clone());
        task.phase = Phase::Post;
        let detail = format!("{} → post hook", describe(&result));
        return decision(from, Phase::Post, detail, Some(Effect::Post { stdin }));
    }
    settle(task, step, from, result, now_ms)
}

/// The final result of an attempt: complete, retry, or fail (spawning recovery tasks).
fn settle(
    task: &mut TaskV1,
    step: &Step,
    from: Phase,
    result: TaskResult,
    now_ms: u64,
) -> Decision {
    task.result = Some(result.to_json());
    let kind = result.kind();
    let reason = describe(&result);
    // Moved, not cloned: a fan-out answer can hold a very large number of tasks.
    let spawn = result.into_next();
    if kind == "Success" {
        task.phase = Phase::Completed;
        task.error = None;
        let detail = format!("Success, {} next task(s)", spawn.len());
        return Decision {
            from,
            to: Phase::Completed,
            detail,
            effect: None,
            spawn,
        };
    }
    task.error = Some(reason.clone());
    let policy_allows = match kind {
        "Timeout" => step.options.retry_on_timeout,
        "Error" if task.invalid_response => step.options.retry_on_invalid_response,
        _ => true,
    };
    if policy_allows && retries_left(task, step) {
        return retry(task, step, from, reason, now_ms);
    }
    task.phase = Phase::Failed;
    let detail = if spawn.is_empty() {
        reason
    } else {
        format!("{reason}; {} recovery task(s)", spawn.len())
    };
    Decision {
        from,
        to: Phase::Failed,
        detail,
        effect: None,
        spawn,
    }
}

fn retries_left(task: &TaskV1, step: &Step) -> bool {
    task.attempt <= step.options.max_retries
}

fn retry(task: &mut TaskV1, step: &Step, from: Phase, reason: String, now_ms: u64) -> Decision {
    let delay = step.options.retry_delay.before_retry(task.attempt);
    let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
    task.attempt += 1;
    task.phase = Phase::Queued;
    task.ready_at_ms = now_ms.saturating_add(delay_ms);
    task.action_value = None;
    task.result = None;
    let when = if delay_ms == 0 {
        String::new()
    } else {
        format!(" in {:.1}s", delay.as_secs_f64())
    };
    decision(
        from,
        Phase::Queued,
        format!("{reason}; retry as attempt {}{when}", task.attempt),
        None,
    )
}

fn describe(result: &TaskResult) -> String {
    match result {
        TaskResult::Success { next, .. } => format!("Success, {} next task(s)", next.len()),
        TaskResult::Timeout { .. } => "Timeout".to_string(),
        TaskResult::Error { error, .. } => format!("Error: {error}"),
        TaskResult::PreHookError { error, .. } => format!("PreHookError: {error}"),
    }
}

fn decision(from: Phase, to: Phase, detail: String, effect: Option<Effect>) -> Decision {
    Decision {
        from,
        to,
        detail,
        effect,
        spawn: Vec::new(),
    }
}

/// The finally hook ended: its stdout is an array of tasks to spawn as siblings. A failure
/// (non-zero exit, timeout, or output that is not an array of valid tasks) spawns nothing.
pub fn finally_done(workflow: &Workflow, outcome: HookOutcome) -> Result<Vec<NewTask>, String> {
    match outcome {
        HookOutcome::Output(stdout) => {
            validate_tasks(workflow, Allowed::AnyStep, &stdout).map_err(|e| match e {
                AnswerError::NotJson(e) => format!("finally hook output is not JSON: {e}"),
                AnswerError::Invalid(reason) => format!("finally hook output is invalid: {reason}"),
            })
        }
        HookOutcome::Failed(reason) => Err(format!("finally hook failed: {reason}")),
        HookOutcome::TimedOut => Err("finally hook timed out".to_string()),
    }
}
