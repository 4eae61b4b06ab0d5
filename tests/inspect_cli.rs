//! `drover inspect` and `resume` against real runs: JSON snapshots, a live run seen from a
//! second process, refusal to resume a run another runner holds, and a store from a newer
//! drover refused with a clear error.

use std::path::{Path, PathBuf};
use std::process::{Child, Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::Command;
use serde_json::{Value, json};

fn drover() -> Command {
    Command::cargo_bin("drover").unwrap()
}

/// Kills the runner if a test fails half-way.
struct Runner(Child);

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write_workflow(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("workflow.jsonc");
    std::fs::write(&path, text).unwrap();
    path
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn inspect_json(state: &Path, args: &[&str]) -> Value {
    let output = drover()
        .arg("inspect")
        .args(args)
        .arg("--json")
        .arg("--state-dir")
        .arg(state)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "inspect failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Ids and times differ per run; everything else must not.
fn redact(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                match key.as_str() {
                    "id" | "run" | "parent" | "task" if item.is_string() => {
                        *item = Value::String("[id]".into());
                    }
                    // Sequence numbers interleave with other tasks' transitions; their order
                    // is asserted separately.
                    "started_ms" | "ended_ms" | "duration_ms" | "at_ms" | "config" | "seq" => {
                        if !item.is_null() {
                            *item = Value::String("[varies]".into());
                        }
                    }
                    "detail" => {
                        if let Some(text) = item.as_str()
                            && text.starts_with("created by ")
                        {
                            *item = Value::String("created by [id]".into());
                        }
                    }
                    _ => redact(item),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

const FAN_OUT: &str = r#"{
  "entrypoint": "Split",
  "max_concurrency": 1,
  "steps": [
    {"name": "Split", "action": {"kind": "Command", "script": "cat >/dev/null; echo '[{\"kind\":\"Leaf\",\"value\":{\"n\":1}},{\"kind\":\"Leaf\",\"value\":{\"n\":2}}]'"},
     "next": ["Leaf"], "finally": "cat >/dev/null; echo []"},
    {"name": "Leaf", "value_schema": {"type": "object", "required": ["n"]},
     "pre": "sed 's/}$/,\"pre\":true}/'",
     "action": {"kind": "Command", "script": "if grep -q '\"n\":2'; then echo 'n=2 is broken' >&2; exit 3; fi; echo []"},
     "next": []}
  ]
}"#;

#[test]
fn inspect_json_of_a_finished_run_matches_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_workflow(dir.path(), FAN_OUT);
    let state = dir.path().join("state");
    drover()
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .assert()
        .code(1);

    let mut runs = inspect_json(&state, &[]);
    let run_id = runs[0]["id"].as_str().unwrap().to_string();
    redact(&mut runs);
    insta::assert_json_snapshot!("runs_list", runs);

    let mut report = inspect_json(&state, &[&run_id, "--tree"]);
    // Children are listed in creation order; sort for a stable snapshot.
    redact(&mut report);
    insta::assert_json_snapshot!("run_report_with_tree", report);

    let tree = inspect_json(&state, &[&run_id, "--tree"]);
    let rows = tree["tree"].as_array().unwrap();
    let root_id = rows[0]["id"].clone();
    assert_eq!((rows.len(), &rows[0]["parent"]), (3, &Value::Null));
    let failed = rows.iter().find(|row| row["state"] == "failed").unwrap();
    assert_eq!((&failed["parent"], &failed["depth"]), (&root_id, &json!(1)));
    let failed = failed["id"].as_str().unwrap().to_string();
    let mut task = inspect_json(&state, &[&run_id, "--task", &failed]);
    let seqs: Vec<u64> = task["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["seq"].as_u64().unwrap())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "transitions out of order: {seqs:?}"
    );
    redact(&mut task);
    insta::assert_json_snapshot!("failed_task", task);
}

#[test]
fn inspect_follows_a_live_run_from_a_second_process() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_workflow(
        dir.path(),
        r#"{"entrypoint": "Wait", "steps": [{"name": "Wait",
            "action": {"kind": "Command", "script": "touch started; while [ ! -f release ]; do sleep 0.05; done; cat >/dev/null; echo []"},
            "next": []}]}"#,
    );
    let state = dir.path().join("state");
    let mut runner = Runner(
        StdCommand::new(assert_cmd::cargo::cargo_bin("drover"))
            .arg("run")
            .arg("--config")
            .arg(&config)
            .arg("--state-dir")
            .arg(&state)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("the action to start", || {
        dir.path().join("started").exists()
    });

    let runs = inspect_json(&state, &[]);
    assert_eq!(runs[0]["status"], "running");
    let run_id = runs[0]["id"].as_str().unwrap().to_string();
    let report = inspect_json(&state, &[&run_id, "--tree"]);
    assert_eq!(report["tree"][0]["state"], "action", "{report}");
    assert_eq!(report["run"]["tasks_pending"], 1);

    // A second runner for the same run is refused while this one holds it.
    let refused = drover()
        .args(["resume", &run_id])
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("being run by another drover process"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    std::fs::write(dir.path().join("release"), "").unwrap();
    let status = runner.0.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let runs = inspect_json(&state, &[]);
    assert_eq!(runs[0]["status"], "completed");
    // Resuming a finished run says so and succeeds.
    drover()
        .args(["resume", &run_id])
        .arg("--state-dir")
        .arg(&state)
        .assert()
        .success()
        .stderr(predicates::str::contains("already finished"));
}

#[test]
fn a_store_written_by_a_newer_drover_is_refused_with_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_workflow(
        dir.path(),
        r#"{"entrypoint": "A", "steps": [{"name": "A", "action": {"kind": "Command", "script": "echo []"}, "next": []}]}"#,
    );
    let state = dir.path().join("state");
    drover()
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .assert()
        .success();
    {
        let db = redb::Database::builder()
            .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
            .create(state.join("drover.redb"))
            .unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn
                .open_table(redb::TableDefinition::<&str, u64>::new("meta"))
                .unwrap();
            meta.insert("schema_version", 99).unwrap();
        }
        txn.commit().unwrap();
    }
    let output = drover()
        .arg("inspect")
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("newer drover (schema version 99)")
            && stderr.contains(&format!("up to {}", drover::store::tables::SCHEMA_VERSION)),
        "{stderr}"
    );
    let run = drover()
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(
        run.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// A step that re-emits itself `n` times: a chain as deep as a long polling loop makes.
const CHAIN: &str = r#"{
  "entrypoint": "Poll",
  "steps": [
    {"name": "Poll", "value_schema": {"type": "object", "required": ["n"]},
     "action": {"kind": "Command", "script": "awk -F'[:}]' '{n = $(NF-2) + 0; if (n > 0) printf \"[{\\\"kind\\\":\\\"Poll\\\",\\\"value\\\":{\\\"n\\\":%d}}]\\n\", n - 1; else print \"[]\"}'"},
     "next": ["Poll"]}
  ]
}"#;

#[test]
fn the_tree_of_a_chain_deeper_than_json_parsers_nest_is_flat_and_printed_with_bounded_indent() {
    const DEPTH: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let config = write_workflow(dir.path(), CHAIN);
    let state = dir.path().join("state");
    drover()
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--entrypoint-value")
        .arg(format!(r#"{{"n": {}}}"#, DEPTH - 1))
        .arg("--state-dir")
        .arg(&state)
        .assert()
        .success();
    let runs = inspect_json(&state, &[]);
    let run_id = runs[0]["id"].as_str().unwrap().to_string();
    assert_eq!(runs[0]["tasks_total"], DEPTH);

    // serde_json refuses nesting beyond 128 levels: this parses only because it is flat.
    let report = inspect_json(&state, &[&run_id, "--tree"]);
    let rows = report["tree"].as_array().unwrap();
    assert_eq!(rows.len(), DEPTH);
    for (depth, row) in rows.iter().enumerate() {
        assert_eq!(row["depth"], depth, "{row}");
        let parent = if depth == 0 {
            Value::Null
        } else {
            rows[depth - 1]["id"].clone()
        };
        assert_eq!(row["parent"], parent, "{row}");
        assert_eq!(row["state"], "completed", "{row}");
    }

    let text = drover()
        .arg("inspect")
        .arg(&run_id)
        .arg("--tree")
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    let tree: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "task tree:")
        .skip(1)
        .collect();
    assert_eq!(tree.len(), DEPTH, "{text}");
    let widest = tree.iter().map(|l| l.chars().count()).max().unwrap();
    assert!(widest < 160, "a line {widest} characters wide:\n{text}");
    assert!(
        tree[DEPTH - 1].ends_with(&format!("(depth {})", DEPTH - 1)),
        "{}",
        tree[DEPTH - 1]
    );
    assert!(tree[1].starts_with("└─ Poll "), "{}", tree[1]);
}

/// migrations.md, version 2: a version-1 state file (a run record without `pool`, its config
/// path as typed, relative) is upgraded on open, and its crashed run resumes from another
/// directory with its hooks in the config's directory.
#[test]
fn a_version_1_store_is_upgraded_and_its_crashed_run_resumes() {
    use drover::store::{RunRecord, RunV1, decode};
    use redb::{ReadableDatabase as _, ReadableTable as _};
    let dir = tempfile::tempdir().unwrap();
    let flow = dir.path().join("flow");
    std::fs::create_dir_all(dir.path().join("elsewhere")).unwrap();
    std::fs::create_dir(&flow).unwrap();
    write_workflow(
        &flow,
        r#"{"entrypoint": "Wait", "steps": [{"name": "Wait",
            "action": {"kind": "Command", "script": "pwd -P >> ran; touch started; while [ ! -f release ]; do sleep 0.05; done; cat >/dev/null; echo []"},
            "next": []}]}"#,
    );
    let state = dir.path().join("state");
    let mut runner = Runner(
        StdCommand::new(assert_cmd::cargo::cargo_bin("drover"))
            .current_dir(dir.path())
            .args(["run", "--config", "flow/workflow.jsonc", "--state-dir"])
            .arg(&state)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("the action to start", || flow.join("started").exists());
    runner.0.kill().unwrap();
    runner.0.wait().unwrap();

    // Written back as version 1 wrote it.
    let meta_table = redb::TableDefinition::<&str, u64>::new("meta");
    let runs_table = redb::TableDefinition::<u128, &[u8]>::new("runs");
    let open = || {
        redb::Database::builder()
            .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
            .create(state.join("drover.redb"))
            .unwrap()
    };
    {
        let db = open();
        let txn = db.begin_write().unwrap();
        {
            let mut runs = txn.open_table(runs_table).unwrap();
            let (id, current) = {
                let (key, value) = runs.first().unwrap().unwrap();
                (key.value(), decode::<RunRecord>(value.value()).unwrap())
            };
            let v1 = RunV1 {
                config_path: "flow/workflow.jsonc".into(),
                base_dir: current.base_dir,
                config_snapshot: current.config_snapshot,
                entrypoint_value: current.entrypoint_value,
                status: current.status,
                started_ms: current.started_ms,
                updated_ms: current.updated_ms,
                ended_ms: current.ended_ms,
                tasks_total: current.tasks_total,
                tasks_completed: current.tasks_completed,
                tasks_failed: current.tasks_failed,
                tasks_open: current.tasks_open,
                next_transition: current.next_transition,
            };
            let bytes = postcard::to_stdvec(&RunRecord::V1(v1)).unwrap();
            runs.insert(id, bytes.as_slice()).unwrap();
            let mut meta = txn.open_table(meta_table).unwrap();
            meta.insert("schema_version", 1).unwrap();
        }
        txn.commit().unwrap();
    }

    let runs = inspect_json(&state, &[]);
    assert_eq!(runs[0]["status"], "crashed", "{runs}");
    std::fs::write(flow.join("release"), "").unwrap();
    drover()
        .current_dir(dir.path().join("elsewhere"))
        .arg("resume")
        .arg("--state-dir")
        .arg(&state)
        .assert()
        .code(0);

    let flow_dir = std::fs::canonicalize(&flow).unwrap().display().to_string();
    let ran = std::fs::read_to_string(flow.join("ran")).unwrap();
    assert_eq!(ran.lines().collect::<Vec<_>>(), [&flow_dir, &flow_dir]);
    let db = open();
    let txn = db.begin_read().unwrap();
    let version = txn
        .open_table(meta_table)
        .unwrap()
        .get("schema_version")
        .unwrap()
        .unwrap()
        .value();
    assert_eq!(version, drover::store::tables::SCHEMA_VERSION);
    let runs = txn.open_table(runs_table).unwrap();
    let (_, bytes) = runs.first().unwrap().unwrap();
    match postcard::from_bytes::<RunRecord>(bytes.value()).unwrap() {
        RunRecord::V2(run) => {
            assert_eq!(run.status, drover::store::RunStatus::Completed);
            assert_eq!(run.pool, None);
        }
        other => panic!("the finished run is still stored as {other:?}"),
    }
}
