//! Validating lists of next tasks (an agent's or command's answer, a post hook's `next`, a
//! finally hook's output) and the post hook's result. Every rejection names the task index and
//! the field, because an agent given the reason has to be able to fix its answer.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::config::{Step, Workflow};

/// A task to create: `kind` names its step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewTask {
    pub kind: String,
    pub value: Value,
}

/// Which steps a list of tasks may target.
#[derive(Debug, Clone, Copy)]
pub enum Allowed<'a> {
    /// Only the `next` steps of this step (answers and post-hook results).
    NextOf(&'a Step),
    /// Any step of the workflow (finally hooks, initial state).
    AnyStep,
}

/// Checks `answer` is an array of `{kind, value}` tasks aimed at allowed steps, each value
/// satisfying its step's schema.
pub fn validate_tasks(
    workflow: &Workflow,
    allowed: Allowed<'_>,
    answer: &Value,
) -> Result<Vec<NewTask>, String> {
    let Value::Array(items) = answer else {
        return Err(format!(
            "the answer must be a JSON array of tasks [{{\"kind\": …, \"value\": …}}], got {}",
            type_name(answer)
        ));
    };
    let mut tasks = Vec::with_capacity(items.len());
    let mut problems = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match validate_task(workflow, allowed, item) {
            Ok(task) => tasks.push(task),
            Err(reason) => problems.push(format!("task [{i}]: {reason}")),
        }
        if problems.len() >= 10 {
            problems.push("(further tasks not checked)".into());
            break;
        }
    }
    if problems.is_empty() {
        Ok(tasks)
    } else {
        Err(problems.join("; "))
    }
}

fn validate_task(
    workflow: &Workflow,
    allowed: Allowed<'_>,
    item: &Value,
) -> Result<NewTask, String> {
    let Value::Object(object) = item else {
        return Err(format!(
            "must be an object {{\"kind\", \"value\"}}, got {}",
            type_name(item)
        ));
    };
    if let Some(extra) = object.keys().find(|k| *k != "kind" && *k != "value") {
        return Err(format!(
            "unknown field `{extra}` (a task has only `kind` and `value`)"
        ));
    }
    let kind = match object.get("kind") {
        Some(Value::String(kind)) => kind.clone(),
        Some(other) => return Err(format!("`kind` must be a string, got {}", type_name(other))),
        None => return Err("missing `kind`".into()),
    };
    let Some(target) = workflow.step(&kind) else {
        let near = super::config::hint_for(&kind, workflow.step_names());
        return Err(format!("`kind` names unknown step `{kind}`{near}"));
    };
    if let Allowed::NextOf(from) = allowed
        && !from.next.contains(&kind)
    {
        let options = if from.next.is_empty() {
            "none: it is a terminal step, answer []".to_string()
        } else {
            from.next.join(", ")
        };
        return Err(format!(
            "step `{}` may not emit `{kind}` (allowed: {options})",
            from.name
        ));
    }
    let value = object
        .get("value")
        .cloned()
        .unwrap_or_else(|| Value::Object(Map::new()));
    target
        .check_value(&value)
        .map_err(|failures| format!("value for `{kind}` {}", failures.join(", ")))?;
    Ok(NewTask { kind, value })
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The result a post hook receives and may replace (CONTRACT.md §3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum TaskResult {
    Success {
        input: Value,
        output: Value,
        next: Vec<NewTask>,
    },
    Timeout {
        input: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<Vec<NewTask>>,
    },
    Error {
        input: Value,
        error: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<Vec<NewTask>>,
    },
    PreHookError {
        input: Value,
        error: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<Vec<NewTask>>,
    },
}

impl TaskResult {
    pub fn kind(&self) -> &'static str {
        match self {
            TaskResult::Success { .. } => "Success",
            TaskResult::Timeout { .. } => "Timeout",
            TaskResult::Error { .. } => "Error",
            TaskResult::PreHookError { .. } => "PreHookError",
        }
    }

    /// Tasks to spawn: children on success, recovery tasks on a final failure.
    pub fn next(&self) -> &[NewTask] {
        match self {
            TaskResult::Success { next, .. } => next,
            TaskResult::Timeout { next, .. }
            | TaskResult::Error { next, .. }
            | TaskResult::PreHookError { next, .. } => next.as_deref().unwrap_or(&[]),
        }
    }

    /// Takes the tasks to spawn out of the result.
    pub fn into_next(self) -> Vec<NewTask> {
        match self {
            TaskResult::Success { next, .. } => next,
            TaskResult::Timeout { next, .. }
            | TaskResult::Error { next, .. }
            | TaskResult::PreHookError { next, .. } => next.unwrap_or_default(),
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| {
            format!("{{\"kind\":\"Error\",\"error\":\"unserializable result: {e}\"}}")
        })
    }
}

/// Parses a post hook's stdout into a result whose `next` is valid for `step`.
pub fn parse_post_result(
    workflow: &Workflow,
    step: &Step,
    stdout: &str,
) -> Result<TaskResult, String> {
    let value: Value = serde_json::from_str(stdout.trim())
        .map_err(|e| format!("post hook output is not JSON: {e}"))?;
    let Value::Object(mut object) = value else {
        return Err("post hook output must be a result object with `kind`".into());
    };
    // `next` is validated by the workflow rules, not by serde, so the reason names the task.
    let next = match object.remove("next") {
        None | Some(Value::Null) => None,
        Some(next) => Some(
            validate_tasks(workflow, Allowed::NextOf(step), &next)
                .map_err(|reason| format!("post hook result `next` is invalid: {reason}"))?,
        ),
    };
    object.entry("input").or_insert(Value::Null);
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    match kind.as_str() {
        "Success" => {
            object.entry("output").or_insert(Value::Null);
            object.insert(
                "next".into(),
                serde_json::to_value(next.clone().unwrap_or_default()).unwrap_or_default(),
            );
        }
        "Error" | "PreHookError" => {
            object
                .entry("error")
                .or_insert(Value::String(String::new()));
        }
        "Timeout" => {}
        "" => {
            return Err(
                "post hook result has no `kind` (Success, Timeout, Error or PreHookError)".into(),
            );
        }
        other => {
            let near =
                super::config::hint_for(other, ["Success", "Timeout", "Error", "PreHookError"]);
            return Err(format!("post hook result has unknown kind `{other}`{near}"));
        }
    }
    if kind != "Success" {
        object.remove("next");
    }
    let mut result: TaskResult = serde_json::from_value(Value::Object(object))
        .map_err(|e| format!("post hook result is malformed: {e}"))?;
    match &mut result {
        TaskResult::Success { .. } => {}
        TaskResult::Timeout { next: slot, .. }
        | TaskResult::Error { next: slot, .. }
        | TaskResult::PreHookError { next: slot, .. } => *slot = next,
    }
    Ok(result)
}
