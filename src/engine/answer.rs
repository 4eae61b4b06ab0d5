//! Validating lists of next tasks (an agent's or command's answer, a post hook's `next`, a
//! finally hook's output) and the post hook's result. Every rejection names the task index and
//! the field, because an agent given the reason has to be able to fix its answer.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::config::{Step, Workflow};

/// A JSON document kept as its text. Answers are stored and passed on, rarely looked into, and
/// a fan-out answer of 100,000 tasks costs ~3 MB as text but ~30 MB per copy as a `Value`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JsonText(Box<RawValue>);

impl JsonText {
    /// `text` after checking it is one JSON document.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text.trim()).map(JsonText)
    }

    /// `text` after checking it is one JSON document, without the whitespace between tokens.
    pub fn parse_compact(text: &str) -> Result<Self, serde_json::Error> {
        let raw: &RawValue = serde_json::from_str(text.trim())?;
        Ok(Self::compact(raw))
    }

    /// `raw` (valid JSON) without the whitespace between tokens. Not re-serialised through a
    /// `Value`: an integer beyond 64 bits or a decimal with more digits than a float holds
    /// would come out rounded.
    pub fn compact(raw: &RawValue) -> Self {
        let text = raw.get();
        let mut out = String::with_capacity(text.len());
        let mut in_string = false;
        let mut escaped = false;
        for c in text.chars() {
            if in_string {
                out.push(c);
                match (escaped, c) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => in_string = false,
                    _ => {}
                }
            } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
                in_string = c == '"';
                out.push(c);
            }
        }
        // Removing whitespace between tokens keeps a valid document valid.
        RawValue::from_string(out).map_or_else(|_| JsonText(raw.to_owned()), JsonText)
    }

    /// Stored JSON text (written by drover, so valid); `null` if it is not.
    pub fn stored(text: &str) -> Self {
        RawValue::from_string(text.to_string()).map_or_else(|_| JsonText::null(), JsonText)
    }

    /// The compact text of `value`.
    pub fn from_value(value: &Value) -> Self {
        // Serialising a `Value` yields valid JSON; the fallback is unreachable in practice.
        RawValue::from_string(value.to_string()).map_or_else(|_| JsonText::null(), JsonText)
    }

    pub fn null() -> Self {
        JsonText(RawValue::NULL.to_owned())
    }

    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    pub fn into_string(self) -> String {
        String::from(Box::<str>::from(self.0))
    }

    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.as_str()).unwrap_or(Value::Null)
    }
}

impl PartialEq for JsonText {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

/// A task to create: `kind` names its step; `value` is compact JSON text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewTask {
    pub kind: String,
    pub value: JsonText,
}

impl NewTask {
    pub fn new(kind: impl Into<String>, value: &Value) -> Self {
        NewTask {
            kind: kind.into(),
            value: JsonText::from_value(value),
        }
    }
}

/// Which steps a list of tasks may target.
#[derive(Debug, Clone, Copy)]
pub enum Allowed<'a> {
    /// Only the `next` steps of this step (answers and post-hook results).
    NextOf(&'a Step),
    /// Any step of the workflow (finally hooks, initial state).
    AnyStep,
}

/// Why a list of next tasks was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum AnswerError {
    NotJson(String),
    Invalid(String),
}

/// Checks the JSON text `answer` is an array of `{kind, value}` tasks aimed at allowed steps,
/// each value satisfying its step's schema. Only one task at a time is parsed into a `Value`,
/// so memory follows the answer's text, not its number of tasks.
pub fn validate_tasks(
    workflow: &Workflow,
    allowed: Allowed<'_>,
    answer: &str,
) -> Result<Vec<NewTask>, AnswerError> {
    let answer = answer.trim();
    let whole: &RawValue =
        serde_json::from_str(answer).map_err(|e| AnswerError::NotJson(e.to_string()))?;
    let items: Vec<&RawValue> = match whole.get().as_bytes().first() {
        Some(b'[') => {
            serde_json::from_str(whole.get()).map_err(|e| AnswerError::NotJson(e.to_string()))?
        }
        _ => {
            return Err(AnswerError::Invalid(format!(
                "the answer must be a JSON array of tasks [{{\"kind\": …, \"value\": …}}], got {}",
                text_type_name(whole.get())
            )));
        }
    };
    let mut tasks = Vec::with_capacity(items.len());
    let mut problems = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let checked = serde_json::from_str::<Value>(item.get())
            .map_err(|e| e.to_string())
            .and_then(|parsed| validate_task(workflow, allowed, parsed))
            .map(|task| with_raw_value(task, item));
        match checked {
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
        Err(AnswerError::Invalid(problems.join("; ")))
    }
}

/// The task with its value as the answer wrote it (compacted), rather than as the `Value` it was
/// checked as: the checks see the same document, but numbers keep every digit.
fn with_raw_value(mut task: NewTask, item: &RawValue) -> NewTask {
    #[derive(Deserialize)]
    struct RawTask<'a> {
        #[serde(borrow)]
        value: Option<&'a RawValue>,
    }
    // A task object with `value` twice fails here; the checked value (the last one) stays.
    if let Ok(RawTask { value: Some(raw) }) = serde_json::from_str::<RawTask>(item.get()) {
        task.value = JsonText::compact(raw);
    }
    task
}

fn validate_task(
    workflow: &Workflow,
    allowed: Allowed<'_>,
    item: Value,
) -> Result<NewTask, String> {
    let Value::Object(mut object) = item else {
        return Err(format!(
            "must be an object {{\"kind\", \"value\"}}, got {}",
            type_name(&item)
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
        .swap_remove("value")
        .unwrap_or_else(|| Value::Object(Map::new()));
    target
        .check_value(&value)
        .map_err(|failures| format!("value for `{kind}` {}", failures.join(", ")))?;
    Ok(NewTask {
        kind,
        value: JsonText::from_value(&value),
    })
}

/// The type of the JSON document `text` (known to be valid), named as in `type_name`.
fn text_type_name(text: &str) -> &'static str {
    match text.as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
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

/// The result a post hook receives and may replace (CONTRACT.md §3). Read back only by
/// `parse_post_result`, field by field: serde's tagged enums cannot hold raw JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind")]
pub enum TaskResult {
    Success {
        input: JsonText,
        output: JsonText,
        next: Vec<NewTask>,
    },
    Timeout {
        input: JsonText,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<Vec<NewTask>>,
    },
    Error {
        input: JsonText,
        error: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<Vec<NewTask>>,
    },
    PreHookError {
        input: JsonText,
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
    let stdout = stdout.trim();
    let value: Value =
        serde_json::from_str(stdout).map_err(|e| format!("post hook output is not JSON: {e}"))?;
    let Value::Object(object) = value else {
        return Err("post hook output must be a result object with `kind`".into());
    };
    // The documents inside, as the hook wrote them: re-serialising the parsed `Value`s would
    // round numbers that do not fit a float.
    #[derive(Deserialize)]
    struct RawResult<'a> {
        #[serde(borrow)]
        next: Option<&'a RawValue>,
        #[serde(borrow)]
        output: Option<&'a RawValue>,
        #[serde(borrow)]
        input: Option<&'a RawValue>,
    }
    let raw = serde_json::from_str::<RawResult>(stdout)
        .map_err(|e| format!("post hook result is malformed (a field given twice?): {e}"))?;
    // `next` is validated by the workflow rules, not by serde, so the reason names the task.
    let next = match raw.next {
        Some(next) if next.get() != "null" => Some(
            validate_tasks(workflow, Allowed::NextOf(step), next.get())
                .map_err(|e| match e {
                    AnswerError::NotJson(reason) | AnswerError::Invalid(reason) => reason,
                })
                .map_err(|reason| format!("post hook result `next` is invalid: {reason}"))?,
        ),
        _ => None,
    };
    let input = raw.input.map_or_else(JsonText::null, JsonText::compact);
    let error = || match object.get("error") {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(error)) => Ok(error.clone()),
        Some(other) => Err(format!(
            "post hook result is malformed: `error` must be a string, got {}",
            type_name(other)
        )),
    };
    let result = match object.get("kind").and_then(Value::as_str).unwrap_or("") {
        "Success" => TaskResult::Success {
            input,
            output: raw.output.map_or_else(JsonText::null, JsonText::compact),
            next: next.unwrap_or_default(),
        },
        "Timeout" => TaskResult::Timeout { input, next },
        "Error" => TaskResult::Error {
            input,
            error: error()?,
            next,
        },
        "PreHookError" => TaskResult::PreHookError {
            input,
            error: error()?,
            next,
        },
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
    };
    Ok(result)
}
