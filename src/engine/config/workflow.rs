//! The validated, resolved workflow the engine runs: links read, schemas compiled, options
//! merged per step. Built only by `load`, so holding one means the config was valid.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use jsonschema::error::ValidationErrorKind;
use serde_json::Value;

use super::model::ConfigFile;

#[derive(Debug, Clone)]
pub struct Workflow {
    /// The config file it came from.
    pub path: PathBuf,
    /// Hooks run here and links resolve from here.
    pub base_dir: PathBuf,
    pub entrypoint: Option<String>,
    /// Tasks in flight at once over the whole run; `None` is unlimited.
    pub max_concurrency: Option<usize>,
    pub steps: Vec<Step>,
    by_name: HashMap<String, usize>,
    /// The config with every link inlined: what a run snapshots so that it can be resumed
    /// even if the files change.
    pub resolved: ConfigFile,
}

impl Workflow {
    pub(super) fn new(
        path: PathBuf,
        base_dir: PathBuf,
        entrypoint: Option<String>,
        max_concurrency: Option<usize>,
        steps: Vec<Step>,
        resolved: ConfigFile,
    ) -> Self {
        let by_name = steps
            .iter()
            .enumerate()
            .map(|(i, step)| (step.name.clone(), i))
            .collect();
        Self {
            path,
            base_dir,
            entrypoint,
            max_concurrency,
            steps,
            by_name,
            resolved,
        }
    }

    pub fn step(&self, name: &str) -> Option<&Step> {
        self.by_name.get(name).map(|&i| &self.steps[i])
    }

    pub fn step_names(&self) -> impl Iterator<Item = &str> {
        self.steps.iter().map(|step| step.name.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct Step {
    pub name: String,
    /// The resolved schema; `None` accepts any value.
    pub value_schema: Option<Value>,
    pub validator: Option<Arc<jsonschema::Validator>>,
    pub action: Action,
    pub next: Vec<String>,
    pub pre: Option<Hook>,
    pub post: Option<Hook>,
    pub finally_hook: Option<Hook>,
    pub options: StepOptions,
}

impl Step {
    /// Checks a task value against this step's schema. Each failure names the JSON pointer of
    /// the failing field.
    pub fn check_value(&self, value: &Value) -> Result<(), Vec<String>> {
        let Some(validator) = &self.validator else {
            return Ok(());
        };
        let failures: Vec<String> = validator
            .iter_errors(value)
            .map(|error| {
                let mut pointer = error.instance_path().as_str().to_string();
                // A missing or unexpected property is reported against its parent object;
                // name the property itself, which is the field the user has to fix.
                let field = match error.kind() {
                    ValidationErrorKind::Required { property } => property.as_str(),
                    ValidationErrorKind::AdditionalProperties { unexpected }
                    | ValidationErrorKind::UnevaluatedProperties { unexpected }
                        if unexpected.len() == 1 =>
                    {
                        Some(unexpected[0].as_str())
                    }
                    _ => None,
                };
                if let Some(field) = field {
                    pointer.push('/');
                    pointer.push_str(&super::jsonc::escape_pointer_token(field));
                }
                let pointer = if pointer.is_empty() { "/" } else { &pointer };
                format!("at {pointer}: {error}")
            })
            .collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures)
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Pool { instructions: String },
    Command { script: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    pub script: String,
}

/// A step's options after merging the top-level defaults with the step's own.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOptions {
    /// A cap on this step's tasks in flight, on top of the run's cap.
    pub max_concurrency: Option<usize>,
    /// Applies to each phase separately.
    pub timeout: Option<Duration>,
    pub max_retries: u32,
    pub retry_on_timeout: bool,
    pub retry_on_invalid_response: bool,
    pub retry_delay: RetryDelay,
}

impl Default for StepOptions {
    fn default() -> Self {
        Self {
            max_concurrency: None,
            timeout: None,
            max_retries: 0,
            retry_on_timeout: true,
            retry_on_invalid_response: true,
            retry_delay: RetryDelay::none(),
        }
    }
}

/// Delay before retry n (1-based): `initial * multiplier^(n-1)`, capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryDelay {
    pub initial: Duration,
    pub multiplier: f64,
    pub max: Option<Duration>,
}

impl RetryDelay {
    pub fn none() -> Self {
        Self {
            initial: Duration::ZERO,
            multiplier: 1.0,
            max: None,
        }
    }

    pub fn before_retry(&self, retry: u32) -> Duration {
        let exponent = i32::try_from(retry.saturating_sub(1)).unwrap_or(i32::MAX);
        let seconds = self.initial.as_secs_f64() * self.multiplier.powi(exponent);
        let uncapped = Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX);
        match self.max {
            Some(max) => uncapped.min(max),
            None => uncapped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let delay = RetryDelay {
            initial: Duration::from_secs(1),
            multiplier: 2.0,
            max: Some(Duration::from_secs(5)),
        };
        let delays: Vec<u64> = (1..=5).map(|n| delay.before_retry(n).as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 5, 5]);
    }

    #[test]
    fn missing_and_unexpected_fields_are_named_by_their_own_pointer() {
        let schema = serde_json::json!({
            "type": "object",
            "required": ["file"],
            "properties": {"file": {"type": "string"}},
            "additionalProperties": false,
        });
        let step = Step {
            name: "S".to_string(),
            validator: Some(Arc::new(jsonschema::validator_for(&schema).unwrap())),
            value_schema: Some(schema),
            action: Action::Command {
                script: "true".to_string(),
            },
            next: Vec::new(),
            pre: None,
            post: None,
            finally_hook: None,
            options: StepOptions::default(),
        };
        let failures = step
            .check_value(&serde_json::json!({"extra": 1}))
            .unwrap_err();
        assert!(failures.iter().any(|f| f.starts_with("at /file: ")));
        assert!(failures.iter().any(|f| f.starts_with("at /extra: ")));
    }

    #[test]
    fn huge_backoff_saturates_instead_of_panicking() {
        let delay = RetryDelay {
            initial: Duration::from_secs(1),
            multiplier: 10.0,
            max: None,
        };
        assert_eq!(delay.before_retry(1000), Duration::MAX);
    }
}
