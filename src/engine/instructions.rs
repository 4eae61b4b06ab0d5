//! The text an agent gets for a task: the step's own instructions, then exactly what a valid
//! answer looks like for this step. An agent that follows only this text answers correctly.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::config::{Step, Workflow};
use crate::pool::protocol::NextStep;

pub fn next_steps(workflow: &Workflow, step: &Step) -> Vec<NextStep> {
    step.next
        .iter()
        .map(|kind| NextStep {
            kind: kind.clone(),
            value_schema: workflow
                .step(kind)
                .and_then(|s| s.value_schema.clone())
                .unwrap_or_else(|| json!({})),
        })
        .collect()
}

pub fn render(instructions: &str, step: &Step, next: &[NextStep]) -> String {
    let mut text = instructions.trim_end().to_string();
    let _ = write!(text, "\n\n---\n\n## Your answer (step `{}`)\n\n", step.name);
    if next.is_empty() {
        text.push_str(
            "This is a terminal step. When the work is done, write `[]` (an empty JSON array) to \
             `response_file`.\n",
        );
        return text;
    }
    text.push_str(
        "Write a JSON array of next tasks to `response_file`, one object per task: \
         `[{\"kind\": \"<step>\", \"value\": <JSON>}, …]`. `[]` means no follow-up work. \
         Allowed kinds, each value satisfying its JSON Schema:\n",
    );
    for step in next {
        let schema = if step.value_schema == Value::Object(Default::default()) {
            "any JSON value".to_string()
        } else {
            format!(
                "\n```json\n{}\n```",
                serde_json::to_string_pretty(&step.value_schema).unwrap_or_default()
            )
        };
        let _ = write!(text, "\n- `{}`: {schema}\n", step.kind);
    }
    text
}
