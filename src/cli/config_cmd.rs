//! `drover config schema|validate|graph`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use serde_json::json;

use super::entry_value;
use super::exit::{CliError, CliResult};
use crate::engine::config::{self, Action, Workflow};

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the JSON Schema (2020-12) of the config format.
    Schema,
    /// Validate a config and list its steps and transitions.
    Validate(ValidateArgs),
    /// Print the step graph as Graphviz dot or Mermaid.
    Graph(GraphArgs),
    /// Describe a workflow in Markdown, for people and agents.
    Docs(DocsArgs),
}

#[derive(Debug, Args)]
pub struct DocsArgs {
    #[arg(long, short, env = "DROVER_CONFIG")]
    pub config: PathBuf,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The workflow config (JSON with comments).
    #[arg(long, short, env = "DROVER_CONFIG")]
    pub config: PathBuf,
    /// Also check this entrypoint value (JSON text, or @file.json) against the entrypoint's schema.
    #[arg(long, value_name = "JSON")]
    pub entrypoint_value: Option<String>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GraphArgs {
    #[arg(long, short, env = "DROVER_CONFIG")]
    pub config: PathBuf,
    #[arg(long, value_enum, default_value_t = GraphFormat::Dot)]
    pub format: GraphFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum GraphFormat {
    Dot,
    Mermaid,
}

pub fn run(command: ConfigCommand) -> CliResult {
    match command {
        ConfigCommand::Schema => {
            let schema = config::config_json_schema();
            let text = serde_json::to_string_pretty(&schema).map_err(CliError::invalid)?;
            println!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Validate(args) => validate(args),
        ConfigCommand::Docs(args) => {
            let workflow = config::load(&args.config)?;
            print!("{}", docs(&workflow));
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Graph(args) => {
            let workflow = config::load(&args.config)?;
            let text = match args.format {
                GraphFormat::Dot => dot(&workflow),
                GraphFormat::Mermaid => mermaid(&workflow),
            };
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn validate(args: ValidateArgs) -> CliResult {
    let workflow = config::load(&args.config)?;
    if let Some(arg) = args.entrypoint_value.as_deref() {
        let value = entry_value::parse(Some(arg))?;
        entry_value::check(&workflow, &value.to_value())?;
    }
    if args.json {
        let steps: Vec<_> = workflow
            .steps
            .iter()
            .map(|step| {
                json!({
                    "name": step.name,
                    "action": action_kind(&step.action),
                    "next": step.next,
                    "pre": step.pre.is_some(),
                    "post": step.post.is_some(),
                    "finally": step.finally_hook.is_some(),
                    "has_value_schema": step.value_schema.is_some(),
                })
            })
            .collect();
        let report = json!({
            "valid": true,
            "config": workflow.path,
            "entrypoint": workflow.entrypoint,
            "max_concurrency": workflow.max_concurrency,
            "steps": steps,
        });
        println!("{report:#}");
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new();
    table
        .load_style(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(vec![
            "step", "action", "next", "hooks", "timeout", "retries",
        ]);
    for step in &workflow.steps {
        let hooks: Vec<&str> = [
            step.pre.as_ref().map(|_| "pre"),
            step.post.as_ref().map(|_| "post"),
            step.finally_hook.as_ref().map(|_| "finally"),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut name = step.name.clone();
        if workflow.entrypoint.as_deref() == Some(step.name.as_str()) {
            name.push_str(" (entrypoint)");
        }
        let next = if step.next.is_empty() {
            "(terminal)".to_string()
        } else {
            step.next.join(", ")
        };
        let timeout = step
            .options
            .timeout
            .map_or("none".to_string(), |t| format!("{}s", t.as_secs_f64()));
        table.add_row(vec![
            name,
            action_kind(&step.action).to_string(),
            next,
            hooks.join(", "),
            timeout,
            step.options.max_retries.to_string(),
        ]);
    }
    println!(
        "{}: valid, {} steps",
        workflow.path.display(),
        workflow.steps.len()
    );
    println!("{table}");
    match (&workflow.entrypoint, workflow.max_concurrency) {
        (None, _) => println!("no entrypoint: runs must be started with --initial-state"),
        (Some(_), Some(n)) => println!("max_concurrency: {n}"),
        (Some(_), None) => println!("max_concurrency: unlimited"),
    }
    Ok(ExitCode::SUCCESS)
}

fn action_kind(action: &Action) -> &'static str {
    match action {
        Action::Pool { .. } => "Pool",
        Action::Command { .. } => "Command",
    }
}

fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| format!("\"{text}\""))
}

fn dot(workflow: &Workflow) -> String {
    let mut out =
        String::from("digraph workflow {\n  rankdir=LR;\n  node [shape=box, style=rounded];\n");
    for step in &workflow.steps {
        let mut attrs = format!("label={}", quoted(&node_label(step)));
        if step.next.is_empty() {
            attrs.push_str(", peripheries=2");
        }
        let _ = writeln!(out, "  {} [{attrs}];", quoted(&step.name));
    }
    if let Some(entry) = &workflow.entrypoint {
        let _ = writeln!(
            out,
            "  \"__start\" [shape=point];\n  \"__start\" -> {};",
            quoted(entry)
        );
    }
    for step in &workflow.steps {
        for target in &step.next {
            let _ = writeln!(out, "  {} -> {};", quoted(&step.name), quoted(target));
        }
    }
    out.push_str("}\n");
    out
}

fn node_label(step: &config::Step) -> String {
    let hooks: Vec<&str> = [
        step.pre.as_ref().map(|_| "pre"),
        step.post.as_ref().map(|_| "post"),
        step.finally_hook.as_ref().map(|_| "finally"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut label = format!("{} ({})", step.name, action_kind(&step.action));
    if !hooks.is_empty() {
        let _ = write!(label, "\n[{}]", hooks.join(", "));
    }
    label
}

fn mermaid(workflow: &Workflow) -> String {
    let mut out = String::from("flowchart LR\n");
    // Mermaid ids must be plain words, so steps get positional ids and their names as labels.
    let id = |name: &str| {
        workflow
            .steps
            .iter()
            .position(|s| s.name == name)
            .map_or_else(|| "unknown".to_string(), |i| format!("s{i}"))
    };
    for (i, step) in workflow.steps.iter().enumerate() {
        let label = node_label(step)
            .replace('"', "#quot;")
            .replace('\n', "<br/>");
        if step.next.is_empty() {
            let _ = writeln!(out, "  s{i}([\"{label}\"])");
        } else {
            let _ = writeln!(out, "  s{i}[\"{label}\"]");
        }
    }
    if let Some(entry) = &workflow.entrypoint {
        let _ = writeln!(out, "  start((start)) --> {}", id(entry));
    }
    for step in &workflow.steps {
        for target in &step.next {
            let _ = writeln!(out, "  {} --> {}", id(&step.name), id(target));
        }
    }
    out
}

fn docs(workflow: &Workflow) -> String {
    let mut out = String::new();
    let title = workflow.path.file_name().map_or_else(
        || "workflow".to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let _ = writeln!(out, "# Workflow `{title}`\n");
    match &workflow.entrypoint {
        Some(entry) => {
            let _ = writeln!(out, "Starts at step `{entry}`.");
        }
        None => {
            let _ = writeln!(out, "No entrypoint: runs start with `--initial-state`.");
        }
    }
    let cap = workflow
        .max_concurrency
        .map_or("unlimited".to_string(), |n| n.to_string());
    let _ = writeln!(out, "Tasks in flight at once: {cap}.\n");
    let _ = writeln!(out, "```mermaid\n{}```\n", mermaid(workflow));
    for step in &workflow.steps {
        let _ = writeln!(out, "## Step `{}`\n", step.name);
        match &step.action {
            Action::Pool { instructions } => {
                let _ = writeln!(out, "Done by an agent through the pool. Instructions:\n");
                for line in instructions.trim().lines() {
                    let _ = writeln!(out, "> {line}");
                }
                out.push('\n');
            }
            Action::Command { script } => {
                let _ = writeln!(out, "Done by the command `{}`.\n", script.trim());
            }
        }
        match &step.value_schema {
            Some(schema) => {
                let text = serde_json::to_string_pretty(schema).unwrap_or_default();
                let _ = writeln!(out, "Task value schema:\n\n```json\n{text}\n```\n");
            }
            None => {
                let _ = writeln!(out, "Any task value is accepted.\n");
            }
        }
        if step.next.is_empty() {
            let _ = writeln!(out, "Terminal: its tasks emit no further tasks.\n");
        } else {
            let next: Vec<String> = step.next.iter().map(|n| format!("`{n}`")).collect();
            let _ = writeln!(out, "May emit: {}.\n", next.join(", "));
        }
        for (label, hook) in [
            ("pre", &step.pre),
            ("post", &step.post),
            ("finally", &step.finally_hook),
        ] {
            if let Some(hook) = hook {
                let _ = writeln!(out, "- {label} hook: `{}`", hook.script.trim());
            }
        }
        let o = &step.options;
        let timeout = o.timeout.map_or("none".to_string(), |t| {
            format!("{}s per phase", t.as_secs_f64())
        });
        let _ = writeln!(
            out,
            "- timeout: {timeout}; retries: {} (on timeout: {}, on invalid answer: {})\n",
            o.max_retries, o.retry_on_timeout, o.retry_on_invalid_response
        );
    }
    out
}
