//! The workflow config file format, exactly as users write it (CONTRACT.md §2).
//!
//! These types are the single source of truth for both parsing (serde) and the published JSON
//! Schema (`drover config schema`, via schemars). Shapes that accept several spellings (hooks,
//! instructions, links) deserialize by hand so that a wrong shape gets a message that says what
//! was expected instead of serde's "did not match any variant".

use schemars::JsonSchema;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// A drover workflow: steps, the entrypoint, and options shared by every step.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "drover workflow config")]
pub struct ConfigFile {
    /// Ignored; lets editors find this schema.
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// The step the first task is aimed at. Required unless `--initial-state` is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<String>,
    /// Tasks in flight at once over all three phases. Also accepted inside `options`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrency: Option<u64>,
    /// Options for every step; a step's own `options` override them field by field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<OptionsFile>,
    /// All steps of the workflow.
    pub steps: Vec<StepFile>,
}

/// Timeouts, retries and concurrency. Every field is optional.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OptionsFile {
    /// At the top level: tasks in flight at once (default unlimited). In a step: a further cap
    /// on that step's tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrency: Option<u64>,
    /// Seconds allowed for EACH phase (pre hook, action, post hook). Default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub timeout: Option<f64>,
    /// Attempts after the first. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
    /// Retry an action that timed out. Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on_timeout: Option<bool>,
    /// Retry an answer that is not a valid array of next tasks. Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on_invalid_response: Option<bool>,
    /// Seconds to wait between attempts: a number, or an exponential backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_delay: Option<RetryDelayFile>,
}

/// A fixed delay in seconds, or `{"initial", "multiplier", "max"}`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum RetryDelayFile {
    Fixed(#[schemars(range(min = 0))] f64),
    Backoff(BackoffFile),
}

/// Delay before retry n (1-based) is `initial * multiplier^(n-1)`, capped at `max`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackoffFile {
    #[schemars(range(min = 0))]
    pub initial: f64,
    /// Default 1 (a fixed delay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub multiplier: Option<f64>,
    /// Default: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max: Option<f64>,
}

impl<'de> Deserialize<'de> for RetryDelayFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::Number(n) => n
                .as_f64()
                .map(RetryDelayFile::Fixed)
                .ok_or_else(|| D::Error::custom("retry_delay must be a number of seconds")),
            object @ Value::Object(_) => BackoffFile::deserialize(object)
                .map(RetryDelayFile::Backoff)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom(
                "retry_delay must be seconds, or {\"initial\": …, \"multiplier\": …, \"max\": …}",
            )),
        }
    }
}

/// One step: the kind of task it accepts, what runs it, and where its tasks may lead.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StepFile {
    /// Unique; tasks aimed at this step have this `kind`.
    pub name: String,
    /// JSON Schema every task value must satisfy, or `{"link": "file.json"}`. Absent: any value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_schema: Option<SchemaSource>,
    pub action: ActionFile,
    /// Steps this step's tasks may emit. `[]` marks a terminal step.
    pub next: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre: Option<HookFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post: Option<HookFile>,
    #[serde(default, rename = "finally", skip_serializing_if = "Option::is_none")]
    pub finally_hook: Option<HookFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<OptionsFile>,
}

/// What runs a task.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", deny_unknown_fields)]
pub enum ActionFile {
    /// Hand the task to an agent through the pool daemon.
    Pool { instructions: TextSource },
    /// Run a shell command: stdin `{"kind","value"}`, stdout the JSON array of next tasks.
    Command { script: String },
}

/// Text given inline, or kept in a file next to the config.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum TextSource {
    Text(String),
    Inline(InlineText),
    Link(Link),
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InlineText {
    pub inline: String,
}

/// A path relative to the config file's directory.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Link {
    pub link: String,
}

impl<'de> Deserialize<'de> for TextSource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(text) => Ok(TextSource::Text(text)),
            Value::Object(map) if map.contains_key("inline") => {
                InlineText::deserialize(Value::Object(map))
                    .map(TextSource::Inline)
                    .map_err(D::Error::custom)
            }
            Value::Object(map) if map.contains_key("link") => Link::deserialize(Value::Object(map))
                .map(TextSource::Link)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom(
                "instructions must be a string, {\"inline\": \"text\"} or {\"link\": \"file.md\"}",
            )),
        }
    }
}

/// A JSON Schema given inline, or `{"link": "file.json"}`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum SchemaSource {
    Link(Link),
    Inline(#[schemars(with = "InlineSchema")] Value),
}

/// Any JSON Schema (an object or a boolean).
#[derive(JsonSchema)]
#[schemars(transparent)]
#[allow(dead_code)]
struct InlineSchema(#[schemars(extend("type" = ["object", "boolean"]))] Value);

impl<'de> Deserialize<'de> for SchemaSource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            // An object whose only key is `link` with a string is a link; no useful schema
            // looks like that.
            Value::Object(map)
                if map.len() == 1 && map.get("link").is_some_and(Value::is_string) =>
            {
                Link::deserialize(Value::Object(map))
                    .map(SchemaSource::Link)
                    .map_err(D::Error::custom)
            }
            schema @ (Value::Object(_) | Value::Bool(_)) => Ok(SchemaSource::Inline(schema)),
            _ => Err(D::Error::custom(
                "value_schema must be a JSON Schema object or {\"link\": \"file.json\"}",
            )),
        }
    }
}

/// A shell hook: the string `"./hook.sh"`, or `{"kind": "Command", "script": "./hook.sh"}`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum HookFile {
    Script(String),
    Command(CommandHook),
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", deny_unknown_fields)]
pub enum CommandHook {
    Command { script: String },
}

impl HookFile {
    pub fn script(&self) -> &str {
        match self {
            HookFile::Script(script) | HookFile::Command(CommandHook::Command { script }) => script,
        }
    }
}

impl<'de> Deserialize<'de> for HookFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(script) => Ok(HookFile::Script(script)),
            object @ Value::Object(_) => CommandHook::deserialize(object)
                .map(HookFile::Command)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom(
                "a hook must be a shell command string or {\"kind\": \"Command\", \"script\": \"…\"}",
            )),
        }
    }
}

/// The JSON Schema (2020-12) of the config format.
pub fn config_json_schema() -> Value {
    let schema = schemars::schema_for!(ConfigFile);
    serde_json::to_value(schema).unwrap_or(Value::Null)
}
