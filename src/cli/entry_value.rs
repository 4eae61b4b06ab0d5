//! `--entrypoint-value`: inline JSON or `@file.json`, checked against the entrypoint's schema.

use std::path::Path;

use serde_json::Value;

use super::exit::CliError;
use crate::engine::answer::JsonText;
use crate::engine::config::Workflow;

/// Parses `--entrypoint-value` (default `{}`), keeping its text: numbers that do not fit a
/// float must reach the first task as they were given.
pub fn parse(arg: Option<&str>) -> Result<JsonText, CliError> {
    let Some(arg) = arg else {
        return JsonText::parse("{}").map_err(CliError::invalid);
    };
    let (text, origin) = match arg.strip_prefix('@') {
        Some(file) => {
            let text = std::fs::read_to_string(Path::new(file)).map_err(|e| {
                CliError::invalid(format!("--entrypoint-value: cannot read `{file}`: {e}"))
            })?;
            (text, file.to_string())
        }
        None => (arg.to_string(), "--entrypoint-value".to_string()),
    };
    JsonText::parse_compact(&text)
        .map_err(|e| CliError::invalid(format!("{origin}: not valid JSON: {e}")))
}

/// Checks `value` against the entrypoint step's schema; every failing field is named.
pub fn check(workflow: &Workflow, value: &Value) -> Result<(), CliError> {
    let Some(entry) = &workflow.entrypoint else {
        return Err(CliError::invalid(format!(
            "{}: no `entrypoint` is set, so there is nothing to check --entrypoint-value against",
            workflow.path.display()
        )));
    };
    let Some(step) = workflow.step(entry) else {
        return Err(CliError::invalid(format!(
            "entrypoint `{entry}` is not a step"
        )));
    };
    step.check_value(value).map_err(|failures| {
        CliError::invalid(format!(
            "the entrypoint value does not satisfy the value_schema of step `{entry}`:\n  {}",
            failures.join("\n  ")
        ))
    })
}
