//! The lifecycle rules of CONTRACT.md §3, checked through the real `drover run` with real hook
//! processes: what each hook received, how many attempts ran, what the store recorded.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use drover::store::{Phase, Stage, Store};

fn script(dir: &Path, name: &str, body: &str) {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn run(dir: &Path, config: &str, extra: &[&str]) -> (i32, PathBuf) {
    std::fs::write(dir.join("workflow.jsonc"), config).unwrap();
    let state = dir.join("state");
    let output = Command::cargo_bin("drover")
        .unwrap()
        .arg("run")
        .arg("--config")
        .arg(dir.join("workflow.jsonc"))
        .arg("--state-dir")
        .arg(&state)
        .args(extra)
        .timeout(std::time::Duration::from_secs(600))
        .output()
        .unwrap();
    (output.status.code().unwrap_or(-1), state)
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn retrying_config(max_retries: u32) -> String {
    format!(
        r#"{{"entrypoint": "Flaky", "options": {{"max_retries": {max_retries}}},
            "steps": [{{"name": "Flaky", "action": {{"kind": "Command", "script": "./flaky.sh"}}, "next": []}}]}}"#
    )
}

#[test]
fn a_task_failing_twice_succeeds_on_the_third_attempt_with_max_retries_2() {
    let dir = tempfile::tempdir().unwrap();
    script(
        dir.path(),
        "flaky.sh",
        "echo \"$DROVER_ATTEMPT\" >> attempts; [ \"$DROVER_ATTEMPT\" -ge 3 ] || exit 1; echo []",
    );
    let (code, _) = run(dir.path(), &retrying_config(2), &[]);
    assert_eq!(code, 0);
    assert_eq!(lines(&dir.path().join("attempts")), ["1", "2", "3"]);
}

#[test]
fn the_same_task_fails_the_run_after_two_attempts_with_max_retries_1() {
    let dir = tempfile::tempdir().unwrap();
    script(
        dir.path(),
        "flaky.sh",
        "echo \"$DROVER_ATTEMPT\" >> attempts; [ \"$DROVER_ATTEMPT\" -ge 3 ] || exit 1; echo []",
    );
    let (code, state) = run(dir.path(), &retrying_config(1), &[]);
    assert_eq!(code, 1);
    assert_eq!(lines(&dir.path().join("attempts")), ["1", "2"]);
    let store = Store::open(&state).unwrap();
    let reader = store.read().unwrap();
    let (_, record) = reader.runs().unwrap().remove(0);
    assert_eq!((record.tasks_completed, record.tasks_failed), (0, 1));
}

#[test]
fn pre_output_reaches_the_action_and_post_can_add_a_child() {
    let dir = tempfile::tempdir().unwrap();
    script(dir.path(), "pre.sh", "sed 's/}$/,\"stamped\":true}/'");
    script(dir.path(), "act.sh", "cat > action_stdin; echo []");
    script(
        dir.path(),
        "post.sh",
        r#"sed 's/"next":\[\]/"next":[{"kind":"Child","value":{"from":"post"}}]/'"#,
    );
    script(dir.path(), "child.sh", "cat > child_stdin; echo []");
    let config = r#"{"entrypoint": "Main", "steps": [
        {"name": "Main", "pre": "./pre.sh", "action": {"kind": "Command", "script": "./act.sh"}, "post": "./post.sh", "next": ["Child"]},
        {"name": "Child", "value_schema": {"type": "object", "required": ["from"]}, "action": {"kind": "Command", "script": "./child.sh"}, "next": []}]}"#;
    let (code, _) = run(
        dir.path(),
        config,
        &["--entrypoint-value", r#"{"file":"a.rs"}"#],
    );
    assert_eq!(code, 0);
    let stdin: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("action_stdin")).unwrap())
            .unwrap();
    assert_eq!(
        stdin,
        serde_json::json!({"kind": "Main", "value": {"file": "a.rs", "stamped": true}})
    );
    let child: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("child_stdin")).unwrap())
            .unwrap();
    assert_eq!(
        child,
        serde_json::json!({"kind": "Child", "value": {"from": "post"}})
    );
}

#[test]
fn a_hanging_pre_hook_is_killed_with_its_grandchild_on_timeout() {
    let dir = tempfile::tempdir().unwrap();
    script(
        dir.path(),
        "hang.sh",
        "sleep 1000 & echo $! > grandchild.pid; wait",
    );
    let config = r#"{"entrypoint": "Slow", "options": {"timeout": 1}, "steps": [
        {"name": "Slow", "pre": "./hang.sh", "action": {"kind": "Command", "script": "echo []"}, "next": []}]}"#;
    let (code, state) = run(dir.path(), config, &[]);
    assert_eq!(code, 1);
    let pid: i32 = std::fs::read_to_string(dir.path().join("grandchild.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // Gone, or a zombie awaiting its reaper: either way no longer running.
    while std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat.contains(") Z "))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "grandchild {pid} survived the timeout"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let store = Store::open(&state).unwrap();
    let reader = store.read().unwrap();
    let (run_id, _) = reader.runs().unwrap().remove(0);
    let mut errors = Vec::new();
    reader
        .for_each_task(run_id, |_, task| {
            errors.push(task.error.clone().unwrap_or_default())
        })
        .unwrap();
    assert_eq!(errors, ["PreHookError: pre hook timed out"]);
}

#[test]
fn max_concurrency_3_is_never_exceeded_and_is_reached() {
    let dir = tempfile::tempdir().unwrap();
    // Each action registers itself in a directory while it runs and records how many it saw.
    script(
        dir.path(),
        "work.sh",
        "mkdir -p running; touch running/$DROVER_TASK_ID; ls running | wc -l >> seen; sleep 0.2; rm running/$DROVER_TASK_ID; echo []",
    );
    script(
        dir.path(),
        "split.sh",
        r#"printf '['; for i in $(seq 1 30); do [ $i = 1 ] || printf ','; printf '{"kind":"Work","value":{"i":%s}}' $i; done; printf ']'"#,
    );
    let config = r#"{"entrypoint": "Split", "options": {"max_concurrency": 3}, "steps": [
        {"name": "Split", "action": {"kind": "Command", "script": "./split.sh"}, "next": ["Work"]},
        {"name": "Work", "action": {"kind": "Command", "script": "./work.sh"}, "next": []}]}"#;
    let (code, _) = run(dir.path(), config, &[]);
    assert_eq!(code, 0);
    let seen: Vec<u32> = lines(&dir.path().join("seen"))
        .iter()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(seen.len(), 30);
    assert_eq!(
        seen.iter().max(),
        Some(&3),
        "overlap seen by the actions: {seen:?}"
    );
}

#[test]
fn with_one_slot_an_always_failing_task_makes_exactly_two_attempts() {
    let dir = tempfile::tempdir().unwrap();
    script(
        dir.path(),
        "fail.sh",
        "echo \"$DROVER_ATTEMPT\" >> fail_attempts; exit 1",
    );
    script(dir.path(), "ok.sh", "echo ok >> ok_runs; echo []");
    let config = r#"{"options": {"max_concurrency": 1, "max_retries": 1}, "steps": [
        {"name": "Fail", "action": {"kind": "Command", "script": "./fail.sh"}, "next": []},
        {"name": "Ok", "action": {"kind": "Command", "script": "./ok.sh"}, "next": []}]}"#;
    let initial =
        r#"[{"kind":"Fail","value":{}},{"kind":"Ok","value":{}},{"kind":"Ok","value":{}}]"#;
    let (code, _) = run(dir.path(), config, &["--initial-state", initial]);
    assert_eq!(code, 1);
    assert_eq!(lines(&dir.path().join("fail_attempts")), ["1", "2"]);
    assert_eq!(lines(&dir.path().join("ok_runs")).len(), 2);
}

#[test]
fn finally_runs_once_after_all_descendants_including_failed_grandchildren() {
    let dir = tempfile::tempdir().unwrap();
    script(
        dir.path(),
        "root.sh",
        r#"cat >/dev/null; echo '[{"kind":"Mid","value":{"i":1}},{"kind":"Mid","value":{"i":2}}]'"#,
    );
    script(
        dir.path(),
        "mid.sh",
        r#"cat >/dev/null; echo '[{"kind":"Leaf","value":{}}]'"#,
    );
    script(
        dir.path(),
        "leaf.sh",
        "cat >/dev/null; sleep 0.1; echo leaf >> order; exit 1",
    );
    script(
        dir.path(),
        "finally.sh",
        "cat > finally_stdin; echo finally >> order; echo []",
    );
    let config = r#"{"entrypoint": "Root", "steps": [
        {"name": "Root", "action": {"kind": "Command", "script": "./root.sh"}, "next": ["Mid"], "finally": "./finally.sh"},
        {"name": "Mid", "action": {"kind": "Command", "script": "./mid.sh"}, "next": ["Leaf"]},
        {"name": "Leaf", "action": {"kind": "Command", "script": "./leaf.sh"}, "next": []}]}"#;
    let (code, state) = run(
        dir.path(),
        config,
        &["--entrypoint-value", r#"{"root":true}"#],
    );
    assert_eq!(code, 1, "the leaves failed");
    assert_eq!(
        lines(&dir.path().join("order")),
        ["leaf", "leaf", "finally"]
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("finally_stdin"))
            .unwrap()
            .trim(),
        r#"{"root":true}"#
    );
    let store = Store::open(&state).unwrap();
    let reader = store.read().unwrap();
    let (run_id, _) = reader.runs().unwrap().remove(0);
    let mut finally_done = 0;
    reader
        .for_each_transition(run_id, |_, t| {
            finally_done += usize::from(t.to == Stage::FinallyDone)
        })
        .unwrap();
    assert_eq!(finally_done, 1);
}

#[test]
fn every_transition_of_every_task_is_stored_in_order() {
    let dir = tempfile::tempdir().unwrap();
    script(
        dir.path(),
        "split.sh",
        r#"cat >/dev/null; echo '[{"kind":"Leaf","value":{}},{"kind":"Leaf","value":{}}]'"#,
    );
    let config = r#"{"entrypoint": "Split", "steps": [
        {"name": "Split", "pre": "cat", "post": "cat", "action": {"kind": "Command", "script": "./split.sh"}, "next": ["Leaf"]},
        {"name": "Leaf", "action": {"kind": "Command", "script": "cat >/dev/null; echo []"}, "next": []}]}"#;
    let (code, state) = run(dir.path(), config, &[]);
    assert_eq!(code, 0);
    let store = Store::open(&state).unwrap();
    let reader = store.read().unwrap();
    let (run_id, _) = reader.runs().unwrap().remove(0);
    let mut tasks = Vec::new();
    reader
        .for_each_task(run_id, |id, task| tasks.push((id, task)))
        .unwrap();
    assert_eq!(tasks.len(), 3);
    for (id, task) in &tasks {
        let stages: Vec<Stage> = reader
            .task_transitions(run_id, *id)
            .unwrap()
            .into_iter()
            .map(|(_, t)| t.to)
            .collect();
        let expected: Vec<Stage> = if task.step == "Split" {
            [
                Phase::Queued,
                Phase::Pre,
                Phase::Action,
                Phase::Post,
                Phase::Completed,
            ]
            .map(Stage::Phase)
            .to_vec()
        } else {
            [Phase::Queued, Phase::Action, Phase::Completed]
                .map(Stage::Phase)
                .to_vec()
        };
        assert_eq!(stages, expected, "{}", task.step);
        assert_eq!(task.phase, Phase::Completed);
    }
}

#[test]
fn a_task_with_70000_children_completes_and_its_finally_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    script(
        dir.path(),
        "split.sh",
        r#"cat >/dev/null; awk 'BEGIN { printf "["; for (i = 0; i < 70000; i++) { if (i) printf ","; printf "{\"kind\":\"Leaf\",\"value\":{\"i\":%d}}", i } print "]" }'"#,
    );
    script(
        dir.path(),
        "finally.sh",
        "cat >/dev/null; echo once >> finally_runs; echo []",
    );
    // Children are created and counted exactly; their actions are cheap to keep this quick.
    let config = r#"{"entrypoint": "Split", "max_concurrency": 16, "steps": [
        {"name": "Split", "action": {"kind": "Command", "script": "./split.sh"}, "next": ["Leaf"], "finally": "./finally.sh"},
        {"name": "Leaf", "action": {"kind": "Command", "script": "echo []"}, "next": []}]}"#;
    let (code, state) = run(dir.path(), config, &[]);
    assert_eq!(code, 0);
    assert_eq!(lines(&dir.path().join("finally_runs")), ["once"]);
    let store = Store::open(&state).unwrap();
    let reader = store.read().unwrap();
    let (_, record) = reader.runs().unwrap().remove(0);
    assert_eq!(
        (
            record.tasks_total,
            record.tasks_completed,
            record.tasks_open
        ),
        (70_001, 70_001, 0)
    );
}
