//! `drover demo`: a self-contained tour. It needs nothing running and builds nothing extra:
//! the pool daemon runs inside this process, three scripted agents (plain Rust loops speaking
//! the real agent protocol over the real socket) answer the tasks, and a bundled workflow
//! shows fan-out, pre/post hooks, a retry and a finally hook. Afterwards it prints what
//! `drover inspect` shows and removes everything it created.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::{Value, json};

use super::exit::{CliError, CliResult};
use super::inspect_cmd::{self, InspectArgs};
use super::locations::StateDirArg;
use super::run_cmd::{self, PoolConnectArgs, RunArgs};
use crate::pool::paths::{PoolArgs, PoolPaths};
use crate::pool::protocol::{AgentMessage, Reply, Request};

const FILES: &[(&str, &str, bool)] = &[
    ("workflow.jsonc", include_str!("demo/workflow.jsonc"), false),
    ("plan.sh", include_str!("demo/plan.sh"), true),
    ("stamp.sh", include_str!("demo/stamp.sh"), true),
    ("audit.sh", include_str!("demo/audit.sh"), true),
    ("summary.sh", include_str!("demo/summary.sh"), true),
];

const AGENTS: &[&str] = &["ada", "grace", "linus"];
/// What the scripted agents find: (file, problems). 5 fixes in all.
const FINDINGS: &[(&str, &[&str])] = &[
    ("src/lib.rs", &["unwrap on user input", "missing docs"]),
    ("src/parser.rs", &["quadratic loop"]),
    ("src/flaky.rs", &["race in shutdown"]),
    ("src/net.rs", &["no timeout on connect"]),
];
const EXPECTED_TASKS: u64 = 17;
const EXPECTED_FIXES: u64 = 5;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Keep the demo's directory (workflow, hook logs, state) instead of removing it.
    #[arg(long)]
    pub keep: bool,
}

pub fn run(args: DemoArgs) -> CliResult {
    let dir = std::env::temp_dir().join(format!("drover-demo-{}", ulid::Ulid::generate()));
    let result = tour(&dir);
    if args.keep {
        crate::say!("demo files kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn tour(dir: &Path) -> CliResult {
    let workflow_dir = dir.join("workflow");
    crate::store::create_private_dir(&workflow_dir).map_err(CliError::unavailable)?;
    for (name, text, executable) in FILES {
        let path = workflow_dir.join(name);
        std::fs::write(&path, text)
            .map_err(|e| CliError::unavailable(format!("cannot write {}: {e}", path.display())))?;
        if *executable {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).map_err(
                |e| {
                    CliError::unavailable(format!("cannot make {} executable: {e}", path.display()))
                },
            )?;
        }
    }
    let root = dir.join("pool-root");
    let state_dir = dir.join("state");
    let paths = PoolPaths::new(&root, "demo");

    println!(
        "drover demo: a code-review workflow run by {} scripted agents\n",
        AGENTS.len()
    );
    println!(
        "  Plan (Command) fans out one Analyze task per file; agents analyse each file (a pre"
    );
    println!("  hook stamps the value first), answer one Fix per problem, then Verify runs as a");
    println!("  command with a post hook. One agent answers garbage once: that task is retried.");
    println!("  Plan's finally hook writes a summary once everything below it has settled.\n");

    let background = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::unavailable(format!("cannot start the async runtime: {e}")))?;
    let daemon = background.spawn(crate::pool::daemon::run(paths.clone()));
    let agents: Vec<_> = AGENTS
        .iter()
        .map(|name| background.spawn(scripted_agent(paths.clone(), name.to_string())))
        .collect();

    let run_args = RunArgs {
        config: workflow_dir.join("workflow.jsonc"),
        entrypoint_value: Some(json!({"repository": "example"}).to_string()),
        initial_state: None,
        state: StateDirArg {
            state_dir: Some(state_dir.clone()),
        },
        pool: PoolConnectArgs {
            location: PoolArgs {
                pool: Some("demo".into()),
                root: Some(root.clone()),
            },
            pool_wait: 10.0,
        },
    };
    let run_result = run_cmd::run(run_args);

    // Stop the pool: waiting agents are kicked and their loops end.
    background.block_on(async {
        if let Ok((mut reader, mut writer)) = crate::pool::conn::connect(&paths).await
            && writer.send(&Request::Stop).await.is_ok()
        {
            let _ = reader.recv::<Reply>().await;
        }
        for agent in agents {
            let _ = tokio::time::timeout(Duration::from_secs(5), agent).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), daemon).await;
    });
    background.shutdown_timeout(Duration::from_secs(1));

    let code = run_result?;
    let store = crate::store::open_for_reading(&state_dir).map_err(CliError::unavailable)?;
    let (run_id, run) = store
        .read()
        .and_then(|r| r.runs())
        .map_err(CliError::unavailable)?
        .into_iter()
        .next()
        .ok_or_else(|| CliError::unavailable("the demo run was not recorded"))?;
    drop(store);

    println!("\n$ drover inspect {} --tree", ulid::Ulid(run_id));
    inspect_cmd::run(InspectArgs {
        run_id: Some(ulid::Ulid(run_id).to_string()),
        tree: true,
        task: None,
        json: false,
        state: StateDirArg {
            state_dir: Some(state_dir.clone()),
        },
    })?;

    let summary = std::fs::read_to_string(workflow_dir.join("summary.txt")).unwrap_or_default();
    let verified: u64 = summary.trim().parse().unwrap_or(0);
    println!("\nfinally hook summary: {verified} fixes verified");
    let as_designed = code == ExitCode::SUCCESS
        && run.tasks_total == EXPECTED_TASKS
        && run.tasks_completed == EXPECTED_TASKS
        && run.tasks_failed == 0
        && verified == EXPECTED_FIXES;
    if as_designed {
        println!("demo: all {EXPECTED_TASKS} tasks completed as designed.");
        println!("Next: attach real agents — see README.md, \"Attaching LLM agents\".");
        Ok(ExitCode::SUCCESS)
    } else {
        Err(CliError {
            code: crate::cli::exit::FAILED_TASKS,
            message: format!(
                "the demo did not go as designed: {} tasks ({} completed, {} failed), {verified} fixes verified; expected {EXPECTED_TASKS} completed and {EXPECTED_FIXES} fixes",
                run.tasks_total, run.tasks_completed, run.tasks_failed
            ),
        })
    }
}

/// An agent that follows the protocol like a real one, with canned judgement.
async fn scripted_agent(paths: PoolPaths, name: String) {
    loop {
        let message = match crate::pool::agent::get_task(&paths, &name).await {
            Ok(message) => message,
            Err(e) => {
                crate::say!("demo agent {name}: {e}");
                return;
            }
        };
        let AgentMessage::Task {
            attempt,
            response_file,
            task,
            ..
        } = message
        else {
            return;
        };
        // Look busy for a moment so the progress is visible.
        tokio::time::sleep(Duration::from_millis(150 + 50 * (name.len() as u64))).await;
        let answer = answer_for(&task.kind, &task.value.to_value(), attempt);
        if let Err(e) =
            crate::pool::agent::write_atomically(Path::new(&response_file), answer.as_bytes())
        {
            crate::say!("demo agent {name}: {e}");
            return;
        }
    }
}

fn answer_for(kind: &str, value: &Value, attempt: u32) -> String {
    let file = value
        .get("file")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match kind {
        // A confused first answer: not JSON. The runner records an Error and retries.
        "Analyze" if file == "src/flaky.rs" && attempt == 1 => {
            "I think this file is fine?".to_string()
        }
        "Analyze" => {
            let problems = FINDINGS
                .iter()
                .find(|(f, _)| *f == file)
                .map_or(&[][..], |(_, p)| *p);
            let tasks: Vec<Value> = problems
                .iter()
                .map(|problem| json!({"kind": "Fix", "value": {"file": file, "problem": problem}}))
                .collect();
            Value::Array(tasks).to_string()
        }
        "Fix" => json!([{"kind": "Verify", "value": value}]).to_string(),
        _ => "[]".to_string(),
    }
}
