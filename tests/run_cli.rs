//! `drover run` / `drover resume` with Command actions and real hook processes (issue 3).
//!
//! CONTRACT.md §2 (entrypoint value checked before anything is dispatched), §3 (the task
//! lifecycle: pre → action → post, retries, the concurrency cap, finally after every
//! descendant, failing hooks), §5 (exit codes 0/1/2/130, `resume`) and §6 (every transition is
//! a record). Every test starts the real `drover` binary in a tempdir; the hooks and actions are
//! shell scripts that record what they received (files beside the config, which is where hooks
//! run) and the test asserts on those records, on the exit code, and on what the store holds
//! (read through the library).
//!
//! Nothing here sleeps to let something happen: waiting is polling for a condition with a
//! generous deadline, and scripts that block do so on a file the test creates (bounded, so that
//! nothing outlives a failed test for long). Every process a test starts is killed by a guard.
#![cfg(target_os = "linux")]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::Command;
use drover::store::{
    FinallyState, HookLogV2, Phase, RunStatus, RunV2, Stage, Store, TaskV1, TransitionV2,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tempfile::TempDir;
use ulid::Ulid;

/// How often conditions are polled; no assertion depends on it.
const POLL: Duration = Duration::from_millis(10);

/// Bounds for conditions that normally hold within milliseconds.
const DEADLINE: Duration = Duration::from_secs(60);

/// Any one `drover` invocation (the 70,000-task run takes about two minutes on two cores);
/// only a hang reaches it.
const RUN_LIMIT: Duration = Duration::from_secs(900);

// ---------------------------------------------------------------------------------------------
// A workspace: `flow/` holds the config and the scripts (and is where hooks run and write their
// records), `state/` is the state directory. drover itself runs in the tempdir root, so a hook
// that used the runner's working directory instead of the config's would be caught.

struct Workspace {
    root: TempDir,
}

struct Ran {
    code: i32,
    stderr: String,
}

impl Workspace {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("flow")).unwrap();
        Self { root }
    }

    fn flow(&self) -> PathBuf {
        self.root.path().join("flow")
    }

    fn state(&self) -> PathBuf {
        self.root.path().join("state")
    }

    fn config_path(&self) -> PathBuf {
        self.flow().join("workflow.json")
    }

    fn file(&self, name: &str) -> PathBuf {
        self.flow().join(name)
    }

    /// Writes an executable `#!/bin/sh` script into `flow/`.
    fn script(&self, name: &str, body: &str) {
        let path = self.file(name);
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn config(&self, config: &Value) {
        fs::write(
            self.config_path(),
            serde_json::to_string_pretty(config).unwrap(),
        )
        .unwrap();
    }

    fn drover(&self) -> Command {
        let mut cmd = Command::cargo_bin("drover").unwrap();
        cmd.current_dir(self.root.path())
            .env_remove("DROVER_STATE_DIR")
            .env_remove("DROVER_CONFIG")
            .env_remove("RUST_LOG")
            .timeout(RUN_LIMIT);
        cmd
    }

    /// `drover run --config flow/workflow.json --state-dir state EXTRA…`
    fn run(&self, extra: &[&str]) -> Ran {
        let output = self
            .drover()
            .arg("run")
            .arg("--config")
            .arg(self.config_path())
            .arg("--state-dir")
            .arg(self.state())
            .args(extra)
            .output()
            .unwrap();
        let ran = Ran {
            code: output.status.code().unwrap_or(-1),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        };
        assert_ne!(ran.code, -1, "drover was killed: {}", ran.stderr);
        ran
    }

    fn lines(&self, name: &str) -> Vec<String> {
        fs::read_to_string(self.file(name))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn json(&self, name: &str) -> Value {
        let text = fs::read_to_string(self.file(name))
            .unwrap_or_else(|e| panic!("{name} was not written: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON ({e}): {text}"))
    }

    /// Reads the state directory's only run.
    fn stored(&self) -> Stored {
        Stored::read(&self.state())
    }

    /// How many runs the state directory holds (0 when nothing was ever stored).
    fn stored_runs(&self) -> usize {
        if !self.state().join(drover::store::STATE_FILE).exists() {
            return 0;
        }
        let store = Store::open(&self.state()).unwrap();
        store.read().unwrap().runs().unwrap().len()
    }
}

/// Everything the store holds about one run.
struct Stored {
    run_id: u128,
    run: RunV2,
    /// In creation order.
    tasks: Vec<(u128, TaskV1)>,
    /// The run's transitions, in sequence order.
    transitions: Vec<(u64, TransitionV2)>,
    /// Each task's transitions as `task_transitions` returns them.
    by_task: HashMap<u128, Vec<(u64, TransitionV2)>>,
    hook_logs: HashMap<u128, Vec<HookLogV2>>,
}

impl Stored {
    fn read(state: &Path) -> Self {
        let store = Store::open(state).unwrap();
        let reader = store.read().unwrap();
        let mut runs = reader.runs().unwrap();
        assert_eq!(runs.len(), 1, "expected exactly one run in {state:?}");
        let (run_id, run) = runs.remove(0);
        let mut tasks = Vec::new();
        reader
            .for_each_task(run_id, |id, task| tasks.push((id, task)))
            .unwrap();
        let mut transitions = Vec::new();
        reader
            .for_each_transition(run_id, |seq, t| transitions.push((seq, t)))
            .unwrap();
        let mut by_task = HashMap::new();
        let mut hook_logs = HashMap::new();
        for (id, _) in &tasks {
            by_task.insert(*id, reader.task_transitions(run_id, *id).unwrap());
            hook_logs.insert(
                *id,
                reader
                    .hook_logs(run_id, *id)
                    .unwrap()
                    .into_iter()
                    .map(|(_, log)| log)
                    .collect(),
            );
        }
        Self {
            run_id,
            run,
            tasks,
            transitions,
            by_task,
            hook_logs,
        }
    }

    fn of_step(&self, step: &str) -> Vec<(u128, &TaskV1)> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.step == step)
            .map(|(id, t)| (*id, t))
            .collect()
    }

    /// The one task of `step`.
    fn only(&self, step: &str) -> (u128, &TaskV1) {
        let mut found = self.of_step(step);
        assert_eq!(found.len(), 1, "expected one `{step}` task");
        found.remove(0)
    }

    fn task(&self, id: u128) -> &TaskV1 {
        &self
            .tasks
            .iter()
            .find(|(i, _)| *i == id)
            .unwrap_or_else(|| panic!("no task {}", Ulid(id)))
            .1
    }

    fn stages(&self, task: u128) -> Vec<Stage> {
        self.by_task[&task].iter().map(|(_, t)| t.to).collect()
    }

    /// Transitions of `task` into `stage`.
    fn entering(&self, task: u128, stage: Stage) -> Vec<&TransitionV2> {
        self.by_task[&task]
            .iter()
            .map(|(_, t)| t)
            .filter(|t| t.to == stage)
            .collect()
    }

    fn count_phase(&self, phase: Phase) -> usize {
        self.tasks.iter().filter(|(_, t)| t.phase == phase).count()
    }

    /// Every task below `task`, at any depth.
    fn descendants(&self, task: u128) -> Vec<u128> {
        let mut out = Vec::new();
        let mut frontier = vec![task];
        while let Some(parent) = frontier.pop() {
            for (id, t) in &self.tasks {
                if t.parent == Some(parent) {
                    out.push(*id);
                    frontier.push(*id);
                }
            }
        }
        out
    }
}

fn ulid(id: u128) -> String {
    Ulid(id).to_string()
}

fn stages(phases: &[Phase]) -> Vec<Stage> {
    phases.iter().copied().map(Stage::Phase).collect()
}

/// Polls `condition` until it holds; panics with `what` after `DEADLINE`.
fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(POLL);
    }
}

/// Whether `pid` is a live (not zombie) process whose command line (arguments joined by
/// spaces) contains `needle`; the check on the command line keeps a recycled pid from counting.
fn running(pid: i32, needle: &str) -> bool {
    if kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    if stat
        .rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
    {
        return false;
    }
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline: Vec<u8> = cmdline
        .into_iter()
        .map(|b| if b == 0 { b' ' } else { b })
        .collect();
    String::from_utf8_lossy(&cmdline).contains(needle)
}

fn read_pid(path: &Path) -> i32 {
    fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{path:?}: {e}"))
        .trim()
        .parse()
        .unwrap()
}

/// SIGKILLs, on drop, the processes a test started or saw started that may still be running:
/// a `drover` child, and pids (checked against their command line, so a recycled pid is left
/// alone) that the scripts published.
#[derive(Default)]
struct Reaper {
    children: Vec<Child>,
    pids: Vec<(i32, String)>,
}

impl Reaper {
    fn watch_pid(&mut self, pid: i32, needle: &str) {
        self.pids.push((pid, needle.to_string()));
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for child in &mut self.children {
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        for (pid, needle) in &self.pids {
            if running(*pid, needle) {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
        }
    }
}

/// Prints `[{"kind": KIND, "value": {"i": 0}}, …]` with `n` tasks, cheaply (awk, not a loop of
/// shell commands).
fn fan_out_script(kind: &str, n: usize) -> String {
    format!(
        r#"cat >/dev/null; awk 'BEGIN {{ printf "["; for (i = 0; i < {n}; i++) {{ if (i) printf ","; printf "{{\"kind\":\"{kind}\",\"value\":{{\"i\":%d}}}}", i }} print "]" }}'"#
    )
}

fn command(script: &str) -> Value {
    json!({"kind": "Command", "script": script})
}

// ---------------------------------------------------------------------------------------------
// Hooks: order and data flow.

#[test]
fn pre_output_reaches_the_action_and_a_child_added_by_the_post_hook_runs() {
    let ws = Workspace::new();
    // Every hook records its stdin, its environment and its working directory.
    let record = r#"input=$(cat)
printf '%s\n' "$input" > "$DROVER_PHASE.$DROVER_STEP.stdin"
env | grep '^DROVER_' | sort > "$DROVER_PHASE.$DROVER_STEP.env"
pwd > "$DROVER_PHASE.$DROVER_STEP.cwd""#;
    ws.script(
        "pre.sh",
        &format!("{record}\nprintf '%s\\n' \"$input\" | sed 's/}}$/,\"stamped\":\"by-pre\"}}/'"),
    );
    ws.script(
        "main.sh",
        &format!("{record}\necho '[{{\"kind\":\"Child\",\"value\":{{\"from\":\"action\"}}}}]'"),
    );
    // Puts one more task at the front of `next`.
    ws.script(
        "post.sh",
        &format!(
            "{record}\nprintf '%s\\n' \"$input\" | sed 's/\"next\":\\[/\"next\":[{{\"kind\":\"Child\",\"value\":{{\"from\":\"post\"}}}},/'"
        ),
    );
    ws.script(
        "child.sh",
        r#"input=$(cat); printf '%s\n' "$input" >> child.stdin; echo []"#,
    );
    ws.config(&json!({
        "entrypoint": "Main",
        "steps": [
            {"name": "Main",
             "value_schema": {"type": "object", "required": ["job"]},
             "pre": "./pre.sh", "action": command("./main.sh"), "post": "./post.sh",
             "next": ["Child"]},
            {"name": "Child",
             "value_schema": {"type": "object", "required": ["from"],
                              "properties": {"from": {"enum": ["action", "post"]}}},
             "action": command("./child.sh"), "next": []},
        ],
    }));
    let ran = ws.run(&["--entrypoint-value", r#"{"job":"build"}"#]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);

    // pre gets the value; the action gets {kind, value} with the pre hook's output as value.
    assert_eq!(ws.json("pre.Main.stdin"), json!({"job": "build"}));
    let stamped = json!({"job": "build", "stamped": "by-pre"});
    assert_eq!(
        ws.json("action.Main.stdin"),
        json!({"kind": "Main", "value": stamped})
    );
    // post gets Success{input, output, next}.
    let answer = json!([{"kind": "Child", "value": {"from": "action"}}]);
    assert_eq!(
        ws.json("post.Main.stdin"),
        json!({"kind": "Success", "input": stamped, "output": answer, "next": answer})
    );
    // The post hook's result replaced the original: both children ran, each once.
    let mut children: Vec<Value> = ws
        .lines("child.stdin")
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    children.sort_by_key(|v| v.to_string());
    assert_eq!(
        children,
        [
            json!({"kind": "Child", "value": {"from": "action"}}),
            json!({"kind": "Child", "value": {"from": "post"}}),
        ]
    );

    let stored = ws.stored();
    let (main_id, main) = stored.only("Main");
    assert_eq!(main.phase, Phase::Completed);
    let children = stored.of_step("Child");
    assert_eq!(children.len(), 2);
    assert!(
        children
            .iter()
            .all(|(_, c)| c.parent == Some(main_id) && c.phase == Phase::Completed)
    );
    assert_eq!(
        stored.run.status,
        RunStatus::Completed,
        "the run record says completed"
    );

    // Environment and working directory of each hook.
    let flow = fs::canonicalize(ws.flow()).unwrap();
    for phase in ["pre", "action", "post"] {
        let cwd = fs::read_to_string(ws.file(&format!("{phase}.Main.cwd"))).unwrap();
        assert_eq!(
            fs::canonicalize(cwd.trim()).unwrap(),
            flow,
            "{phase} ran in the config's directory"
        );
        let expected_keys = [
            "DROVER_ATTEMPT",
            "DROVER_PHASE",
            "DROVER_RUN_ID",
            "DROVER_STATE_DIR",
            "DROVER_STEP",
            "DROVER_TASK_ID",
        ];
        let env: BTreeMap<String, String> = ws
            .lines(&format!("{phase}.Main.env"))
            .iter()
            .filter_map(|l| l.split_once('='))
            .filter(|(k, _)| expected_keys.contains(k))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let expected: BTreeMap<String, String> = [
            ("DROVER_ATTEMPT", "1".to_string()),
            ("DROVER_PHASE", phase.to_string()),
            ("DROVER_RUN_ID", ulid(stored.run_id)),
            ("DROVER_STEP", "Main".to_string()),
            ("DROVER_TASK_ID", ulid(main_id)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let mut env = env;
        let state_dir = env.remove("DROVER_STATE_DIR").unwrap_or_default();
        assert_eq!(env, expected, "environment of the {phase} hook");
        assert_eq!(
            fs::canonicalize(&state_dir).ok(),
            Some(fs::canonicalize(ws.state()).unwrap()),
            "DROVER_STATE_DIR of the {phase} hook: {state_dir:?}"
        );
    }
}

/// Hooks run in the config's directory, not the runner's; `DROVER_STATE_DIR` must still name
/// the state directory from there when `--state-dir` was given as a relative path.
#[test]
fn drover_state_dir_reaches_the_state_directory_from_the_hooks_working_directory() {
    let ws = Workspace::new();
    ws.script(
        "act.sh",
        r#"cat >/dev/null
printf '%s\n' "$DROVER_STATE_DIR" > state_dir_seen
[ -e "$DROVER_STATE_DIR/drover.redb" ] || { echo "no store at $DROVER_STATE_DIR from $(pwd)" >&2; exit 1; }
echo []"#,
    );
    ws.config(&json!({"entrypoint": "Main", "steps": [
        {"name": "Main", "action": command("./act.sh"), "next": []}]}));
    let output = ws
        .drover()
        .args([
            "run",
            "--config",
            "flow/workflow.json",
            "--state-dir",
            "state",
        ])
        .output()
        .unwrap();
    let seen = ws.lines("state_dir_seen");
    assert_eq!(
        output.status.code(),
        Some(0),
        "the hook saw DROVER_STATE_DIR={seen:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn finally_runs_once_after_every_descendant_including_grandchildren_and_failed_ones() {
    let ws = Workspace::new();
    // Every action and finally hook appends one line to `order.log` (O_APPEND, one write each),
    // so the file is the order in which they ran.
    ws.script(
        "note.sh",
        r#"printf '%s %s %s %s\n' "$DROVER_PHASE" "$DROVER_STEP" "$DROVER_TASK_ID" "$DROVER_ATTEMPT" >> order.log"#,
    );
    ws.script(
        "root.sh",
        r#". ./note.sh; cat >/dev/null
echo '[{"kind":"Mid","value":{"m":1}},{"kind":"Mid","value":{"m":2}}]'"#,
    );
    ws.script(
        "mid.sh",
        r#". ./note.sh; m=$(sed -n 's/.*"m":\([0-9]*\).*/\1/p')
echo "[{\"kind\":\"Leaf\",\"value\":{\"m\":$m}}]""#,
    );
    // The grandchild under Mid 2 always fails (after a retry); the other succeeds.
    ws.script(
        "leaf.sh",
        r#". ./note.sh; input=$(cat)
case "$input" in *'"m":2'*) exit 1;; esac
echo []"#,
    );
    // Each Mid's finally spawns a sibling (a child of Root) that Root's finally must wait for.
    ws.script(
        "mid_finally.sh",
        r#". ./note.sh; cat >/dev/null; echo '[{"kind":"Late","value":{}}]'"#,
    );
    ws.script("late.sh", r#". ./note.sh; cat >/dev/null; echo []"#);
    ws.script(
        "root_finally.sh",
        r#". ./note.sh; cat >> root_finally.stdin; echo []"#,
    );
    ws.config(&json!({
        "entrypoint": "Root",
        "steps": [
            {"name": "Root", "pre": "sed 's/}$/,\"stamped\":true}/'",
             "action": command("./root.sh"), "next": ["Mid"], "finally": "./root_finally.sh"},
            {"name": "Mid", "action": command("./mid.sh"), "next": ["Leaf"],
             "finally": "./mid_finally.sh"},
            {"name": "Leaf", "action": command("./leaf.sh"), "next": [],
             "options": {"max_retries": 1}},
            {"name": "Late", "action": command("./late.sh"), "next": []},
        ],
    }));
    let ran = ws.run(&["--entrypoint-value", r#"{"root":"r1"}"#]);
    assert_eq!(ran.code, 1, "a grandchild failed: {}", ran.stderr);

    let stored = ws.stored();
    let (root_id, root) = stored.only("Root");
    assert_eq!(root.phase, Phase::Completed);
    assert_eq!(root.finally, FinallyState::Done);
    let leaves = stored.of_step("Leaf");
    assert_eq!(leaves.len(), 2);
    let failed: Vec<_> = leaves
        .iter()
        .filter(|(_, l)| l.phase == Phase::Failed)
        .collect();
    assert_eq!(failed.len(), 1, "one grandchild failed");
    assert_eq!(failed[0].1.attempt, 2, "after its retry");
    assert_eq!(stored.of_step("Late").len(), 2);
    assert_eq!(
        stored.descendants(root_id).len(),
        6,
        "2 Mid, 2 Leaf, 2 Late"
    );

    let log: Vec<Vec<String>> = ws
        .lines("order.log")
        .iter()
        .map(|l| l.split(' ').map(str::to_string).collect())
        .collect();
    let position = |phase: &str, task: u128| -> Vec<usize> {
        log.iter()
            .enumerate()
            .filter(|(_, l)| l[0] == phase && l[2] == ulid(task))
            .map(|(i, _)| i)
            .collect()
    };
    // Every task with a finally hook: it ran exactly once, after every action of the task and
    // of each of its descendants (every attempt of the failing one included).
    for (id, task) in &stored.tasks {
        let finally = position("finally", *id);
        if task.step != "Root" && task.step != "Mid" {
            assert!(finally.is_empty());
            continue;
        }
        assert_eq!(finally.len(), 1, "{} finally ran once: {log:?}", task.step);
        let mut covered = stored.descendants(*id);
        covered.push(*id);
        for d in covered {
            let actions = position("action", d);
            let attempts = stored.task(d).attempt as usize;
            assert_eq!(actions.len(), attempts, "every attempt of {}", ulid(d));
            assert!(
                actions.iter().all(|a| *a < finally[0]),
                "{} {} ran after the finally of {} {}: {log:?}",
                stored.task(d).step,
                ulid(d),
                task.step,
                ulid(*id)
            );
        }
    }
    // Root's finally, with the original value (not the pre hook's), is the very last thing.
    assert_eq!(
        log.last().unwrap()[..3],
        ["finally", "Root", ulid(root_id).as_str()]
    );
    assert_eq!(ws.json("root_finally.stdin"), json!({"root": "r1"}));
    // The store agrees: Root's finally started after every descendant's last transition.
    let root_finally_seq = stored.by_task[&root_id]
        .iter()
        .find(|(_, t)| t.to == Stage::FinallyRunning)
        .unwrap()
        .0;
    for d in stored.descendants(root_id) {
        let last = stored.by_task[&d].last().unwrap().0;
        assert!(last < root_finally_seq, "{} settled late", ulid(d));
    }
    assert_eq!(stored.entering(root_id, Stage::FinallyDone).len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Retries.

/// Runs a task whose `phase` ("pre", "action" or "post") fails on its first two runs and
/// succeeds on the third. Returns the exit code, the attempts each script saw, and the store.
fn fail_twice_in(phase: &str, max_retries: u32) -> (i32, BTreeMap<String, Vec<String>>, Stored) {
    let ws = Workspace::new();
    // `runs.$phase` counts the runs itself (not trusting DROVER_ATTEMPT) and logs the attempt.
    let body = |name: &str, ok: &str| {
        let fail = if name == phase {
            r#"[ "$(wc -l < runs.$DROVER_PHASE)" -ge 3 ] || exit 1"#
        } else {
            ""
        };
        format!(
            r#"input=$(cat)
echo "$DROVER_ATTEMPT" >> "runs.$DROVER_PHASE"
{fail}
{ok}"#
        )
    };
    ws.script("pre.sh", &body("pre", r#"printf '%s\n' "$input""#));
    ws.script("action.sh", &body("action", "echo []"));
    ws.script("post.sh", &body("post", r#"printf '%s\n' "$input""#));
    ws.config(&json!({
        "entrypoint": "Flaky",
        "options": {"max_retries": max_retries},
        "steps": [{"name": "Flaky", "pre": "./pre.sh", "action": command("./action.sh"),
                   "post": "./post.sh", "next": []}],
    }));
    let ran = ws.run(&[]);
    let runs = ["pre", "action", "post"]
        .into_iter()
        .map(|p| (p.to_string(), ws.lines(&format!("runs.{p}"))))
        .collect();
    (ran.code, runs, ws.stored())
}

#[test]
fn a_task_failing_twice_succeeds_on_the_third_attempt_with_max_retries_2() {
    for phase in ["pre", "action", "post"] {
        let (code, runs, stored) = fail_twice_in(phase, 2);
        assert_eq!(code, 0, "failing in {phase}");
        // Every failure restarts the whole task: pre and action run again each time; the post
        // hook runs on failures too (a PreHookError or an Error result goes through it).
        assert_eq!(runs["pre"], ["1", "2", "3"], "failing in {phase}");
        let action = if phase == "pre" {
            vec!["3"]
        } else {
            vec!["1", "2", "3"]
        };
        assert_eq!(runs["action"], action, "failing in {phase}");
        assert_eq!(runs["post"], ["1", "2", "3"], "failing in {phase}");
        let (_, task) = stored.only("Flaky");
        assert_eq!((task.phase, task.attempt), (Phase::Completed, 3));
        assert_eq!(stored.run.status, RunStatus::Completed);
    }
}

#[test]
fn the_same_task_fails_after_exactly_two_attempts_with_max_retries_1() {
    for phase in ["pre", "action", "post"] {
        let (code, runs, stored) = fail_twice_in(phase, 1);
        assert_eq!(code, 1, "failing in {phase}");
        assert_eq!(runs["pre"], ["1", "2"], "failing in {phase}");
        let action: Vec<&str> = if phase == "pre" {
            vec![]
        } else {
            vec!["1", "2"]
        };
        assert_eq!(runs["action"], action, "failing in {phase}");
        assert_eq!(runs["post"], ["1", "2"], "failing in {phase}");
        let (id, task) = stored.only("Flaky");
        assert_eq!((task.phase, task.attempt), (Phase::Failed, 2));
        assert!(task.error.is_some(), "the reason is kept");
        assert_eq!(
            stored.entering(id, Stage::Phase(Phase::Queued)).len(),
            2,
            "created, then one retry"
        );
        assert_eq!(stored.run.status, RunStatus::Failed);
        assert_eq!(
            (stored.run.tasks_completed, stored.run.tasks_failed),
            (0, 1)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Timeouts kill the whole process group.

#[test]
fn a_hanging_pre_hook_is_killed_with_its_grandchild_on_timeout() {
    let ws = Workspace::new();
    let mut reaper = Reaper::default();
    // The grandchild is a `sleep` in the background; the hook waits for it. The pid file is
    // written atomically so the test never reads half of it.
    ws.script(
        "hang.sh",
        "sleep 1000 & echo $! > grandchild.pid.tmp; mv grandchild.pid.tmp grandchild.pid; wait",
    );
    ws.script("action.sh", "echo ran > action.ran; echo []");
    ws.config(&json!({
        "entrypoint": "Slow",
        "options": {"timeout": 1},
        "steps": [{"name": "Slow", "pre": "./hang.sh", "action": command("./action.sh"),
                   "next": []}],
    }));
    let ran = ws.run(&[]);
    let pid = read_pid(&ws.file("grandchild.pid"));
    reaper.watch_pid(pid, "sleep 1000");
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    // Once the run has ended the grandchild is gone (at most a zombie awaiting its new parent).
    wait_for("the grandchild to die", || !running(pid, "sleep 1000"));
    assert!(!ws.file("action.ran").exists(), "the action was skipped");

    let stored = ws.stored();
    let (id, task) = stored.only("Slow");
    assert_eq!((task.phase, task.attempt), (Phase::Failed, 1));
    assert_eq!(
        task.error.as_deref(),
        Some("PreHookError: pre hook timed out")
    );
    let logs = &stored.hook_logs[&id];
    assert!(
        logs.iter()
            .any(|l| l.phase == "pre" && l.outcome.contains("timed out")),
        "{logs:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The concurrency cap.

/// Replays an event log of `+ TASK` / `- TASK` lines; returns the largest number of tasks
/// registered at once.
fn max_overlap(events: &[String]) -> usize {
    let mut open = HashSet::new();
    let mut max = 0;
    for line in events {
        match line.split_once(' ') {
            Some(("+", task)) => assert!(open.insert(task), "{task} registered twice"),
            Some(("-", task)) => assert!(open.remove(task), "{task} left unregistered"),
            _ => panic!("bad event line {line:?}"),
        }
        max = max.max(open.len());
    }
    assert!(open.is_empty(), "still registered at the end: {open:?}");
    max
}

#[test]
fn max_concurrency_3_is_never_exceeded_and_is_reached() {
    let ws = Workspace::new();
    // A task registers itself (`+ id`) at the start of its pre hook and unregisters (`- id`) at
    // the end of its post hook: all of that time it holds its slot, so every prefix of the log
    // is a moment at which the still-registered tasks really held slots together. The log is
    // appended with single writes (O_APPEND), so its order is the order of the events.
    ws.script(
        "pre.sh",
        r#"printf '+ %s\n' "$DROVER_TASK_ID" >> events; cat"#,
    );
    // The action waits until three tasks are registered at once. With a cap of 3 and 30 tasks
    // queued, the first three therefore overlap whatever the scheduling; the rest pass at once.
    // A runner capping lower would never get there: after 30 s the barrier is dropped for every
    // task (`gave_up`), so that shows up as a lower maximum instead of a hang.
    ws.script(
        "action.sh",
        r#"cat >/dev/null
deadline=$(( $(date +%s) + 30 ))
until [ -e reached ] || [ -e gave_up ]; do
  if [ "$(awk '/^\+/ { n++ } /^-/ { n-- } END { print n + 0 }' events)" -ge 3 ]; then
    : > reached
  elif [ "$(date +%s)" -ge "$deadline" ]; then
    : > gave_up
  else
    sleep 0.01
  fi
done
echo []"#,
    );
    ws.script(
        "post.sh",
        r#"input=$(cat); printf '%s %s\n' - "$DROVER_TASK_ID" >> events; printf '%s\n' "$input""#,
    );
    ws.script("split.sh", &fan_out_script("Work", 30));
    ws.config(&json!({
        "entrypoint": "Split",
        "options": {"max_concurrency": 3},
        "steps": [
            {"name": "Split", "action": command("./split.sh"), "next": ["Work"]},
            {"name": "Work", "pre": "./pre.sh", "action": command("./action.sh"),
             "post": "./post.sh", "next": []},
        ],
    }));
    let ran = ws.run(&[]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let events = ws.lines("events");
    assert_eq!(events.len(), 60, "30 tasks registered and unregistered");
    assert_eq!(
        max_overlap(&events),
        3,
        "most tasks holding a slot at once: {events:?}"
    );
    let stored = ws.stored();
    assert_eq!(stored.count_phase(Phase::Completed), 31);
}

#[test]
fn with_one_slot_an_always_failing_task_makes_exactly_two_attempts_while_others_wait() {
    let ws = Workspace::new();
    // Every action takes a lock directory for its lifetime; failing to take it means two tasks
    // held slots at once.
    let locked = |body: &str| {
        format!(
            r#"cat >/dev/null
mkdir slot.lock 2>/dev/null || echo "$DROVER_STEP $DROVER_TASK_ID" >> overlaps
printf '%s %s %s\n' "$DROVER_STEP" "$DROVER_TASK_ID" "$DROVER_ATTEMPT" >> runs
{body}"#
        )
    };
    ws.script("fail.sh", &locked("rmdir slot.lock; exit 1"));
    ws.script("ok.sh", &locked("rmdir slot.lock; echo []"));
    ws.config(&json!({
        "options": {"max_concurrency": 1, "max_retries": 1},
        "steps": [
            {"name": "Fail", "action": command("./fail.sh"), "next": []},
            {"name": "Ok", "action": command("./ok.sh"), "next": []},
        ],
    }));
    let initial = json!([
        {"kind": "Fail", "value": {}},
        {"kind": "Ok", "value": {"n": 1}},
        {"kind": "Ok", "value": {"n": 2}},
        {"kind": "Ok", "value": {"n": 3}},
    ]);
    let ran = ws.run(&["--initial-state", &initial.to_string()]);
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert!(
        ws.lines("overlaps").is_empty(),
        "two actions ran at once: {:?}",
        ws.lines("overlaps")
    );
    let runs = ws.lines("runs");
    let fail_runs: Vec<&str> = runs
        .iter()
        .filter(|l| l.starts_with("Fail "))
        .map(|l| l.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(fail_runs, ["1", "2"], "{runs:?}");
    assert_eq!(runs.len(), 5, "three Ok runs besides: {runs:?}");

    let stored = ws.stored();
    let (fail_id, fail) = stored.only("Fail");
    assert_eq!((fail.phase, fail.attempt), (Phase::Failed, 2));
    assert_eq!(
        stored.stages(fail_id),
        stages(&[
            Phase::Queued,
            Phase::Action,
            Phase::Queued,
            Phase::Action,
            Phase::Failed
        ])
    );
    let oks = stored.of_step("Ok");
    assert_eq!(oks.len(), 3);
    for (id, ok) in oks {
        assert_eq!((ok.phase, ok.attempt), (Phase::Completed, 1));
        assert_eq!(
            runs.iter().filter(|l| l.contains(&ulid(id))).count(),
            1,
            "each Ok task ran once"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Invalid output of post hooks, finally hooks and actions.

/// A task whose post hook prints `output` on every attempt (`max_retries: 1`): the whole task is
/// restarted once, then fails with the reason. Returns the store and the number of action runs.
fn post_hook_answering(output: &str) -> (Workspace, Stored) {
    let ws = Workspace::new();
    fs::write(ws.file("post.out"), output).unwrap();
    ws.script(
        "action.sh",
        r#"cat >/dev/null; echo "$DROVER_ATTEMPT" >> action.runs; echo '[{"kind":"Child","value":{"n":1}}]'"#,
    );
    ws.script(
        "post.sh",
        r#"cat >/dev/null; echo "$DROVER_ATTEMPT" >> post.runs; cat post.out"#,
    );
    ws.script(
        "child.sh",
        "cat >/dev/null; echo ran >> child.runs; echo []",
    );
    ws.config(&json!({
        "entrypoint": "Main",
        "options": {"max_retries": 1},
        "steps": [
            {"name": "Main", "action": command("./action.sh"), "post": "./post.sh",
             "next": ["Child"]},
            {"name": "Child",
             "value_schema": {"type": "object", "required": ["n"],
                              "properties": {"n": {"type": "integer"}}},
             "action": command("./child.sh"), "next": []},
        ],
    }));
    let ran = ws.run(&[]);
    assert_eq!(ran.code, 1, "the task failed: {}", ran.stderr);
    assert!(!ran.stderr.contains("panicked"), "{}", ran.stderr);
    let stored = ws.stored();
    (ws, stored)
}

fn assert_post_hook_failure_recorded(output: &str, reason: &[&str]) {
    let (ws, stored) = post_hook_answering(output);
    // Restarted once (the action ran again), then failed.
    assert_eq!(ws.lines("action.runs"), ["1", "2"], "post printed {output}");
    assert_eq!(ws.lines("post.runs"), ["1", "2"], "post printed {output}");
    assert!(
        ws.lines("child.runs").is_empty(),
        "nothing was spawned from a rejected result ({output})"
    );
    assert_eq!(stored.tasks.len(), 1, "no child was created ({output})");
    let (id, main) = stored.only("Main");
    assert_eq!((main.phase, main.attempt), (Phase::Failed, 2), "{output}");
    let error = main.error.clone().unwrap_or_default();
    let transitions = &stored.by_task[&id];
    let retried = transitions
        .iter()
        .find(|(_, t)| {
            t.from == Some(Stage::Phase(Phase::Post)) && t.to == Stage::Phase(Phase::Queued)
        })
        .unwrap_or_else(|| panic!("no restart recorded for {output}: {transitions:?}"));
    let failed = transitions
        .iter()
        .find(|(_, t)| {
            t.from == Some(Stage::Phase(Phase::Post)) && t.to == Stage::Phase(Phase::Failed)
        })
        .unwrap_or_else(|| panic!("no failure recorded for {output}: {transitions:?}"));
    for part in reason {
        assert!(error.contains(part), "task error {error:?} lacks {part:?}");
        assert!(
            retried.1.detail.contains(part),
            "restart detail {:?} lacks {part:?}",
            retried.1.detail
        );
        assert!(
            failed.1.detail.contains(part),
            "failure detail {:?} lacks {part:?}",
            failed.1.detail
        );
    }
}

#[test]
fn a_post_hook_naming_an_unknown_step_restarts_the_task_then_fails_it_with_the_reason() {
    assert_post_hook_failure_recorded(
        r#"{"kind":"Success","input":{},"output":[],"next":[{"kind":"Nope","value":{}}]}"#,
        &["unknown step `Nope`"],
    );
}

#[test]
fn a_post_hook_result_with_a_schema_violating_next_value_restarts_then_fails_the_task() {
    assert_post_hook_failure_recorded(
        r#"{"kind":"Success","input":{},"output":[],"next":[{"kind":"Child","value":{"n":"seven"}}]}"#,
        &["Child", "/n", "integer"],
    );
}

#[test]
fn a_post_hook_printing_garbage_restarts_then_fails_the_task() {
    assert_post_hook_failure_recorded("this is not JSON {", &["post hook output is not JSON"]);
}

#[test]
fn a_post_hook_printing_an_array_is_not_taken_as_an_empty_next() {
    assert_post_hook_failure_recorded("[]", &["post hook output must be a result object"]);
}

#[test]
fn a_post_hook_result_of_unknown_kind_restarts_then_fails_the_task() {
    assert_post_hook_failure_recorded(
        r#"{"kind":"Sucess","input":{},"output":[],"next":[]}"#,
        &["unknown kind `Sucess`"],
    );
}

/// Root fans out to A and B; A's finally hook prints `output`. A's finally is recorded as failed
/// with the reason, spawns nothing, and the run goes on: B and Root's own finally still run.
fn assert_finally_failure_recorded(output: &str, reason: &[&str]) {
    let ws = Workspace::new();
    fs::write(ws.file("finally.out"), output).unwrap();
    ws.script(
        "note.sh",
        r#"printf '%s %s\n' "$DROVER_PHASE" "$DROVER_STEP" >> order.log"#,
    );
    ws.script(
        "root.sh",
        r#". ./note.sh; cat >/dev/null; echo '[{"kind":"A","value":{"n":1}},{"kind":"B","value":{"n":2}}]'"#,
    );
    ws.script("leaf.sh", ". ./note.sh; cat >/dev/null; echo []");
    ws.script(
        "a_finally.sh",
        ". ./note.sh; cat >/dev/null; cat finally.out",
    );
    ws.script("root_finally.sh", ". ./note.sh; cat >/dev/null; echo []");
    let schema = json!({"type": "object", "required": ["n"],
                        "properties": {"n": {"type": "integer"}}});
    ws.config(&json!({
        "entrypoint": "Root",
        "steps": [
            {"name": "Root", "action": command("./root.sh"), "next": ["A", "B"],
             "finally": "./root_finally.sh"},
            {"name": "A", "value_schema": schema, "action": command("./leaf.sh"), "next": [],
             "finally": "./a_finally.sh"},
            {"name": "B", "value_schema": schema, "action": command("./leaf.sh"), "next": []},
        ],
    }));
    let ran = ws.run(&[]);
    assert!(!ran.stderr.contains("panicked"), "{}", ran.stderr);
    assert_eq!(
        ran.code, 0,
        "every task completed; a failed finally hook is not a failed task ({output}): {}",
        ran.stderr
    );
    let stored = ws.stored();
    let (a_id, a) = stored.only("A");
    assert_eq!(a.phase, Phase::Completed);
    let FinallyState::Failed(recorded) = &a.finally else {
        panic!("A's finally is {:?} after printing {output}", a.finally);
    };
    let failed = stored.entering(a_id, Stage::FinallyFailed);
    assert_eq!(failed.len(), 1, "{output}");
    assert_eq!(
        failed[0].from,
        Some(Stage::FinallyRunning),
        "{:?}",
        failed[0]
    );
    for part in reason {
        assert!(recorded.contains(part), "{recorded:?} lacks {part:?}");
        assert!(
            failed[0].detail.contains(part),
            "transition detail {:?} lacks {part:?}",
            failed[0].detail
        );
    }
    // Nothing spawned from the rejected output (not even its valid entries).
    assert_eq!(stored.tasks.len(), 3, "{output}");
    assert_eq!(stored.only("B").1.phase, Phase::Completed);
    let (root_id, root) = stored.only("Root");
    assert_eq!(root.finally, FinallyState::Done);
    assert_eq!(stored.entering(root_id, Stage::FinallyDone).len(), 1);
    let order = ws.lines("order.log");
    assert_eq!(
        order.iter().filter(|l| l.starts_with("finally ")).count(),
        2
    );
    assert_eq!(order.last().map(String::as_str), Some("finally Root"));
    assert_eq!(stored.run.status, RunStatus::Completed);
}

#[test]
fn a_finally_hook_naming_an_unknown_step_is_recorded_as_failed_and_the_run_continues() {
    assert_finally_failure_recorded(
        r#"[{"kind":"B","value":{"n":3}},{"kind":"Nope","value":{}}]"#,
        &["unknown step `Nope`"],
    );
}

#[test]
fn a_finally_hook_spawning_a_schema_violating_value_is_recorded_as_failed() {
    assert_finally_failure_recorded(
        r#"[{"kind":"B","value":{"n":"three"}}]"#,
        &["B", "/n", "integer"],
    );
}

#[test]
fn a_finally_hook_printing_garbage_is_recorded_as_failed_and_the_run_continues() {
    assert_finally_failure_recorded("garbage", &["finally hook output is not JSON"]);
}

#[test]
fn a_finally_hook_printing_an_object_is_recorded_as_failed() {
    assert_finally_failure_recorded(r#"{"kind":"B","value":{"n":3}}"#, &["array"]);
}

#[test]
fn a_finally_hook_exit_code_failure_is_recorded_with_the_code() {
    let ws = Workspace::new();
    ws.script("root.sh", "cat >/dev/null; echo []");
    ws.config(&json!({
        "entrypoint": "Root",
        "steps": [{"name": "Root", "action": command("./root.sh"), "next": [],
                   "finally": "echo '[]'; exit 3"}],
    }));
    let ran = ws.run(&[]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let stored = ws.stored();
    let (id, root) = stored.only("Root");
    let failed = stored.entering(id, Stage::FinallyFailed);
    assert_eq!(failed.len(), 1);
    assert!(
        failed[0].detail.contains("exit code 3"),
        "{:?}",
        failed[0].detail
    );
    assert_eq!(root.finally, FinallyState::Failed(failed[0].detail.clone()));
}

/// An action answering `answer` on every attempt (`max_retries: 1`, a pass-through post hook).
/// Returns the attempts it made, what its post hook received, and the store.
fn action_answering(
    answer: &str,
    retry_on_invalid_response: bool,
) -> (Vec<String>, Vec<Value>, Stored) {
    let ws = Workspace::new();
    fs::write(ws.file("answer"), answer).unwrap();
    ws.script(
        "action.sh",
        r#"cat >/dev/null; echo "$DROVER_ATTEMPT" >> attempts; cat answer"#,
    );
    ws.script(
        "post.sh",
        r#"input=$(cat); printf '%s\n' "$input" >> post.stdin; printf '%s\n' "$input""#,
    );
    ws.config(&json!({
        "entrypoint": "Main",
        "options": {"max_retries": 1, "retry_on_invalid_response": retry_on_invalid_response},
        "steps": [
            {"name": "Main", "action": command("./action.sh"), "post": "./post.sh",
             "next": ["Child"]},
            {"name": "Child",
             "value_schema": {"type": "object", "required": ["n"],
                              "properties": {"n": {"type": "integer"}}},
             "action": command("echo []"), "next": []},
            {"name": "Other", "action": command("echo []"), "next": []},
        ],
    }));
    let ran = ws.run(&[]);
    assert!(!ran.stderr.contains("panicked"), "{}", ran.stderr);
    assert_eq!(ran.code, 1, "answering {answer}: {}", ran.stderr);
    let post = ws
        .lines("post.stdin")
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (ws.lines("attempts"), post, ws.stored())
}

#[test]
fn an_invalid_action_answer_is_an_error_retried_only_per_retry_on_invalid_response() {
    let cases: [(&str, &[&str]); 6] = [
        ("not JSON at all", &["not JSON"]),
        (r#"{"kind":"Child","value":{"n":1}}"#, &["array"]),
        (r#"[{"kind":"Nope","value":{}}]"#, &["unknown step `Nope`"]),
        (
            r#"[{"kind":"Other","value":{}}]"#,
            &["may not emit `Other`"],
        ),
        (
            r#"[{"kind":"Child","value":{"n":"one"}}]"#,
            &["/n", "integer"],
        ),
        (
            r#"[{"kind":"Child","value":{"n":1},"extra":1}]"#,
            &["extra"],
        ),
    ];
    for (answer, reason) in cases {
        for retry in [true, false] {
            let (attempts, post, stored) = action_answering(answer, retry);
            let expected: &[&str] = if retry { &["1", "2"] } else { &["1"] };
            assert_eq!(
                attempts, expected,
                "answering {answer} with retry_on_invalid_response: {retry}"
            );
            // The post hook got Error{input, error} with the reason, on every attempt.
            assert_eq!(post.len(), expected.len());
            for result in &post {
                assert_eq!(result["kind"], "Error", "{result}");
                assert_eq!(result["input"], json!({}), "{result}");
                let error = result["error"].as_str().unwrap_or_default();
                for part in reason {
                    assert!(error.contains(part), "{error:?} lacks {part:?}");
                }
            }
            let (_, main) = stored.only("Main");
            assert_eq!(main.phase, Phase::Failed);
            assert_eq!(main.attempt as usize, expected.len());
            assert!(
                main.error
                    .as_deref()
                    .is_some_and(|e| e.starts_with("Error: "))
            );
            assert_eq!(stored.tasks.len(), 1, "nothing spawned from {answer}");
        }
    }
}

#[test]
fn retry_on_invalid_response_false_does_not_stop_retrying_a_failed_action() {
    let ws = Workspace::new();
    ws.script(
        "action.sh",
        r#"cat >/dev/null; echo "$DROVER_ATTEMPT" >> attempts; exit 1"#,
    );
    ws.config(&json!({
        "entrypoint": "Main",
        "options": {"max_retries": 1, "retry_on_invalid_response": false},
        "steps": [{"name": "Main", "action": command("./action.sh"), "next": []}],
    }));
    let ran = ws.run(&[]);
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert_eq!(ws.lines("attempts"), ["1", "2"]);
}

// ---------------------------------------------------------------------------------------------
// Scale.

#[test]
fn a_run_of_10000_trivial_command_tasks_completes() {
    let ws = Workspace::new();
    ws.script("split.sh", &fan_out_script("Leaf", 10_000));
    ws.config(&json!({
        "entrypoint": "Split",
        "options": {"max_concurrency": 16},
        "steps": [
            {"name": "Split", "action": command("./split.sh"), "next": ["Leaf"]},
            {"name": "Leaf", "action": command("echo []"), "next": []},
        ],
    }));
    let started = Instant::now();
    let ran = ws.run(&[]);
    eprintln!("10,000 tasks: drover run took {:?}", started.elapsed());
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let stored = ws.stored();
    assert_eq!(stored.run.status, RunStatus::Completed);
    assert_eq!(
        (
            stored.run.tasks_total,
            stored.run.tasks_completed,
            stored.run.tasks_failed,
            stored.run.tasks_open
        ),
        (10_001, 10_001, 0, 0)
    );
    assert_eq!(stored.count_phase(Phase::Completed), 10_001);
    let (split_id, _) = stored.only("Split");
    let values: HashSet<String> = stored
        .of_step("Leaf")
        .iter()
        .inspect(|(_, t)| assert_eq!(t.parent, Some(split_id)))
        .map(|(_, t)| t.value.clone())
        .collect();
    assert_eq!(values.len(), 10_000, "every child distinct");
}

#[test]
fn a_task_with_70000_children_completes_and_its_finally_runs_once_after_all() {
    let ws = Workspace::new();
    ws.script("split.sh", &fan_out_script("Leaf", 70_000));
    // The finally hook records how many children the store says are settled when it runs.
    ws.script(
        "finally.sh",
        r#"cat > finally.stdin; echo "$DROVER_TASK_ID" >> finally.runs; echo []"#,
    );
    ws.config(&json!({
        "entrypoint": "Split",
        "options": {"max_concurrency": 16},
        "steps": [
            {"name": "Split", "action": command("./split.sh"), "next": ["Leaf"],
             "finally": "./finally.sh"},
            {"name": "Leaf", "action": command("echo []"), "next": []},
        ],
    }));
    let started = Instant::now();
    let ran = ws.run(&["--entrypoint-value", r#"{"big":true}"#]);
    eprintln!("70,000 children: drover run took {:?}", started.elapsed());
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let stored = ws.stored();
    let (split_id, split) = stored.only("Split");
    assert_eq!(ws.lines("finally.runs"), [ulid(split_id)]);
    assert_eq!(ws.json("finally.stdin"), json!({"big": true}));
    assert_eq!(split.finally, FinallyState::Done);
    assert_eq!(
        (
            stored.run.tasks_total,
            stored.run.tasks_completed,
            stored.run.tasks_open
        ),
        (70_001, 70_001, 0)
    );
    let children = stored.of_step("Leaf");
    assert_eq!(children.len(), 70_000);
    assert!(children.iter().all(|(_, c)| c.parent == Some(split_id)));
    // In the store's own order: the finally started after the last child settled.
    let finally_seq = stored.by_task[&split_id]
        .iter()
        .find(|(_, t)| t.to == Stage::FinallyRunning)
        .unwrap()
        .0;
    let last_child = children
        .iter()
        .map(|(id, _)| stored.by_task[id].last().unwrap().0)
        .max()
        .unwrap();
    assert!(last_child < finally_seq);
}

// ---------------------------------------------------------------------------------------------
// The store.

fn allowed_edge(from: Stage, to: Stage) -> bool {
    use Phase::*;
    matches!(
        (from, to),
        (Stage::Phase(Queued), Stage::Phase(Pre | Action))
            | (
                Stage::Phase(Pre),
                Stage::Phase(Action | Post | Queued | Failed)
            )
            | (
                Stage::Phase(Action),
                Stage::Phase(Post | Completed | Queued | Failed)
            )
            | (
                Stage::Phase(Post),
                Stage::Phase(Completed | Queued | Failed)
            )
            | (Stage::Phase(Completed | Failed), Stage::FinallyRunning)
            | (
                Stage::FinallyRunning,
                Stage::FinallyDone | Stage::FinallyFailed
            )
    )
}

#[test]
fn every_transition_of_every_task_is_stored_in_order() {
    let ws = Workspace::new();
    ws.script(
        "root.sh",
        r#"cat >/dev/null; echo '[{"kind":"Flaky","value":{}},{"kind":"Doomed","value":{}},{"kind":"Leaf","value":{"i":1}},{"kind":"Leaf","value":{"i":2}}]'"#,
    );
    // Fails its first attempt only.
    ws.script(
        "flaky.sh",
        r#"cat >/dev/null; [ "$DROVER_ATTEMPT" -ge 2 ] || exit 1; echo []"#,
    );
    ws.config(&json!({
        "entrypoint": "Root",
        "steps": [
            {"name": "Root", "pre": "cat", "action": command("./root.sh"), "post": "cat",
             "next": ["Flaky", "Doomed", "Leaf"], "finally": "cat >/dev/null; echo []"},
            {"name": "Flaky", "action": command("./flaky.sh"), "next": [],
             "options": {"max_retries": 1}},
            {"name": "Doomed", "pre": "exit 4", "post": "cat", "action": command("echo []"),
             "next": [], "finally": "echo garbage"},
            {"name": "Leaf", "action": command("cat >/dev/null; echo []"), "next": []},
        ],
    }));
    let ran = ws.run(&[]);
    assert_eq!(ran.code, 1, "Doomed failed: {}", ran.stderr);
    let stored = ws.stored();
    assert_eq!(stored.tasks.len(), 5);

    // The run's sequence: 0, 1, 2, … with nothing missing, each naming a stored task, and the
    // per-task index lists exactly the same transitions.
    let seqs: Vec<u64> = stored.transitions.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (0..stored.run.next_transition).collect::<Vec<_>>());
    let ids: HashSet<u128> = stored.tasks.iter().map(|(id, _)| *id).collect();
    assert!(
        stored
            .transitions
            .iter()
            .all(|(_, t)| ids.contains(&t.task))
    );
    let mut indexed: Vec<u64> = stored
        .by_task
        .values()
        .flat_map(|ts| ts.iter().map(|(s, _)| *s))
        .collect();
    indexed.sort_unstable();
    assert_eq!(indexed, seqs);
    for (seq, t) in &stored.transitions {
        let (_, same) = stored.by_task[&t.task]
            .iter()
            .find(|(s, _)| s == seq)
            .unwrap();
        assert_eq!(same, t);
    }

    for (id, task) in &stored.tasks {
        let ts = &stored.by_task[id];
        let name = format!("{} {}", task.step, ulid(*id));
        // created → queued, then each transition starts where the previous one ended.
        let (_, first) = &ts[0];
        assert_eq!(
            (first.from, first.to, first.attempt),
            (None, Stage::Phase(Phase::Queued), 1),
            "{name}"
        );
        for pair in ts.windows(2) {
            let ((s0, t0), (s1, t1)) = (&pair[0], &pair[1]);
            assert!(s0 < s1, "{name}: sequence not increasing");
            assert_eq!(t1.from, Some(t0.to), "{name}: {t0:?} then {t1:?}");
            assert!(allowed_edge(t0.to, t1.to), "{name}: {t0:?} then {t1:?}");
            // The attempt number moves by one, and only when a task leaves the queue after a
            // retry (the transition into the queue still carries the failed attempt).
            let after_retry = t0.to == Stage::Phase(Phase::Queued) && t0.from.is_some();
            assert_eq!(t1.attempt, t0.attempt + u32::from(after_retry), "{name}");
        }
        // The last phase transition is the stored phase; the finally stages follow it.
        let last_phase = ts
            .iter()
            .rev()
            .find_map(|(_, t)| match t.to {
                Stage::Phase(p) => Some(p),
                _ => None,
            })
            .unwrap();
        assert_eq!(last_phase, task.phase, "{name}");
        assert!(task.phase.is_settled(), "{name}");
        let last = ts.last().unwrap().1.to;
        match &task.finally {
            FinallyState::None => assert_eq!(last, Stage::Phase(task.phase), "{name}"),
            FinallyState::Done => assert_eq!(last, Stage::FinallyDone, "{name}"),
            FinallyState::Failed(reason) => {
                assert_eq!(last, Stage::FinallyFailed, "{name}");
                assert_eq!(&ts.last().unwrap().1.detail, reason, "{name}");
            }
            other => panic!("{name}: finally left {other:?}"),
        }
        assert_eq!(ts.last().unwrap().1.attempt, task.attempt, "{name}");
    }

    use Phase::*;
    let expect = |step: &str, mut expected: Vec<Stage>, tail: &[Stage]| {
        expected.extend_from_slice(tail);
        for (id, _) in stored.of_step(step) {
            assert_eq!(stored.stages(id), expected, "{step}");
        }
    };
    let finally_done = [Stage::FinallyRunning, Stage::FinallyDone];
    expect(
        "Root",
        stages(&[Queued, Pre, Action, Post, Completed]),
        &finally_done,
    );
    expect(
        "Flaky",
        stages(&[Queued, Action, Queued, Action, Completed]),
        &[],
    );
    expect(
        "Doomed",
        stages(&[Queued, Pre, Post, Failed]),
        &[Stage::FinallyRunning, Stage::FinallyFailed],
    );
    expect("Leaf", stages(&[Queued, Action, Completed]), &[]);
    // Root's finally started after the last transition of every other task.
    let (root_id, _) = stored.only("Root");
    let root_finally_seq = stored.by_task[&root_id]
        .iter()
        .find(|(_, t)| t.to == Stage::FinallyRunning)
        .unwrap()
        .0;
    for d in stored.descendants(root_id) {
        assert!(stored.by_task[&d].last().unwrap().0 < root_finally_seq);
    }
}

// ---------------------------------------------------------------------------------------------
// Input: the entrypoint value and --initial-state.

#[test]
fn an_entrypoint_value_violating_the_schema_exits_2_and_stores_nothing() {
    let ws = Workspace::new();
    ws.script("action.sh", "echo ran >> action.ran; echo []");
    ws.config(&json!({
        "entrypoint": "Main",
        "steps": [{"name": "Main",
                   "value_schema": {"type": "object", "required": ["file"],
                                    "properties": {"file": {"type": "string"}}},
                   "pre": "echo ran >> pre.ran; cat",
                   "action": command("./action.sh"), "next": []}],
    }));
    fs::write(ws.file("bad.json"), r#"{"file": ["a", "b"]}"#).unwrap();
    let cases: [(&[&str], &str); 4] = [
        (&["--entrypoint-value", r#"{"file": 7}"#], "/file"),
        (&["--entrypoint-value", "@flow/bad.json"], "/file"),
        // The default value {} lacks the required field.
        (&[], "file"),
        (&["--entrypoint-value", "{not json"], "JSON"),
    ];
    for (args, mention) in cases {
        let ran = ws.run(args);
        assert_eq!(ran.code, 2, "{args:?}: {}", ran.stderr);
        assert!(
            ran.stderr.contains(mention),
            "{args:?}: the message names {mention}: {}",
            ran.stderr
        );
        assert_eq!(ws.stored_runs(), 0, "{args:?} stored a run");
    }
    assert!(!ws.file("pre.ran").exists() && !ws.file("action.ran").exists());
    // The same config with a valid value runs.
    let ran = ws.run(&["--entrypoint-value", r#"{"file": "a.rs"}"#]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ws.stored_runs(), 1);
}

#[test]
fn initial_state_starts_from_the_given_tasks_instead_of_the_entrypoint() {
    let ws = Workspace::new();
    ws.script("entry.sh", "cat >/dev/null; echo ran >> entry.ran; echo []");
    ws.script(
        "record.sh",
        r#"input=$(cat); printf '%s\n' "$input" >> seen; echo []"#,
    );
    let schema = json!({"type": "object", "required": ["n"],
                        "properties": {"n": {"type": "integer"}}});
    ws.config(&json!({
        "entrypoint": "Entry",
        "steps": [
            {"name": "Entry", "action": command("./entry.sh"), "next": ["A"]},
            {"name": "A", "value_schema": schema, "action": command("./record.sh"), "next": []},
            {"name": "B", "action": command("./record.sh"), "next": []},
        ],
    }));
    fs::write(
        ws.file("initial.json"),
        r#"[{"kind":"A","value":{"n":1}},{"kind":"B","value":"text"},{"kind":"A","value":{"n":2}}]"#,
    )
    .unwrap();
    let ran = ws.run(&["--initial-state", "@flow/initial.json"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(!ws.file("entry.ran").exists(), "the entrypoint did not run");
    let mut seen: Vec<Value> = ws
        .lines("seen")
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    seen.sort_by_key(|v| v.to_string());
    assert_eq!(
        seen,
        [
            json!({"kind": "A", "value": {"n": 1}}),
            json!({"kind": "A", "value": {"n": 2}}),
            json!({"kind": "B", "value": "text"}),
        ]
    );
    let stored = ws.stored();
    let mut tasks: Vec<(String, String)> = stored
        .tasks
        .iter()
        .inspect(|(_, t)| {
            assert_eq!(t.parent, None, "initial tasks are roots");
            assert_eq!(t.phase, Phase::Completed);
        })
        .map(|(_, t)| (t.step.clone(), t.value.clone()))
        .collect();
    tasks.sort();
    assert_eq!(
        tasks,
        [
            ("A".to_string(), r#"{"n":1}"#.to_string()),
            ("A".to_string(), r#"{"n":2}"#.to_string()),
            ("B".to_string(), r#""text""#.to_string()),
        ]
    );
}

#[test]
fn an_initial_state_violating_a_schema_exits_2_and_stores_nothing() {
    let ws = Workspace::new();
    ws.script("record.sh", "cat >> seen; echo []");
    ws.config(&json!({
        "steps": [{"name": "A",
                   "value_schema": {"type": "object", "required": ["n"],
                                    "properties": {"n": {"type": "integer"}}},
                   "action": command("./record.sh"), "next": []}],
    }));
    for initial in [
        r#"[{"kind":"A","value":{"n":1}},{"kind":"A","value":{"n":"x"}}]"#,
        r#"[{"kind":"Nope","value":{}}]"#,
        r#"{"kind":"A","value":{"n":1}}"#,
        "[]",
    ] {
        let ran = ws.run(&["--initial-state", initial]);
        assert_eq!(ran.code, 2, "{initial}: {}", ran.stderr);
        assert_eq!(ws.stored_runs(), 0, "{initial} stored a run");
    }
    // Without an entrypoint, a run needs --initial-state.
    let ran = ws.run(&[]);
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("--initial-state"), "{}", ran.stderr);
    assert_eq!(ws.stored_runs(), 0);
    assert!(!ws.file("seen").exists());
}

// ---------------------------------------------------------------------------------------------
// SIGINT and resume.

#[test]
fn sigint_exits_130_leaves_the_run_interrupted_and_resume_completes_it() {
    let ws = Workspace::new();
    let mut reaper = Reaper::default();
    ws.script(
        "root.sh",
        r#"cat >/dev/null; echo ran >> root.runs; echo '[{"kind":"Block","value":{"b":1}}]'"#,
    );
    // Publishes its pid, then waits for `release` (bounded, so it cannot outlive the test).
    ws.script(
        "block.sh",
        r#"cat >/dev/null
echo "$DROVER_ATTEMPT" >> block.runs
echo $$ > block.pid.tmp; mv block.pid.tmp block.pid
i=0
while [ ! -e release ] && [ "$i" -lt 6000 ]; do sleep 0.01; i=$((i + 1)); done
[ -e release ] || exit 1
echo []"#,
    );
    ws.config(&json!({
        "entrypoint": "Root",
        "steps": [
            {"name": "Root", "action": command("./root.sh"), "next": ["Block"],
             "finally": "cat >/dev/null; echo ran >> finally.runs; echo []"},
            {"name": "Block", "action": command("./block.sh"), "next": []},
        ],
    }));
    let stderr = File::create(ws.root.path().join("run.stderr")).unwrap();
    let child = std::process::Command::new(assert_cmd::cargo::cargo_bin("drover"))
        .current_dir(ws.root.path())
        .env_remove("RUST_LOG")
        .arg("run")
        .arg("--config")
        .arg(ws.config_path())
        .arg("--state-dir")
        .arg(ws.state())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let drover_pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
    reaper.children.push(child);

    wait_for("the Block action to start", || {
        ws.file("block.pid").exists()
    });
    let block_pid = read_pid(&ws.file("block.pid"));
    reaper.watch_pid(block_pid, "block.sh");
    kill(drover_pid, Signal::SIGINT).unwrap();
    let mut status = None;
    wait_for("drover to exit after SIGINT", || {
        status = reaper.children[0].try_wait().unwrap();
        status.is_some()
    });
    let run_stderr = fs::read_to_string(ws.root.path().join("run.stderr")).unwrap();
    assert_eq!(status.unwrap().code(), Some(130), "{run_stderr}");
    wait_for("the interrupted action to be killed", || {
        !running(block_pid, "block.sh")
    });

    let stored = ws.stored();
    assert_eq!(stored.run.status, RunStatus::Interrupted);
    assert!(stored.run.tasks_open > 0);
    let (_, block) = stored.only("Block");
    assert!(!block.phase.is_settled(), "{:?}", block.phase);
    assert_eq!(stored.only("Root").1.phase, Phase::Completed);
    drop(stored);

    fs::write(ws.file("release"), "").unwrap();
    let resumed = ws
        .drover()
        .arg("resume")
        .arg("--state-dir")
        .arg(ws.state())
        .output()
        .unwrap();
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let stored = ws.stored();
    assert_eq!(stored.run.status, RunStatus::Completed);
    assert_eq!(
        (
            stored.run.tasks_total,
            stored.run.tasks_completed,
            stored.run.tasks_open
        ),
        (2, 2, 0)
    );
    // The interrupted action ran again in the same attempt (an interrupt is not a failure);
    // what had completed before the interrupt did not run again.
    let (_, block) = stored.only("Block");
    assert_eq!((block.phase, block.attempt), (Phase::Completed, 1));
    assert_eq!(ws.lines("block.runs"), ["1", "1"]);
    assert_eq!(ws.lines("root.runs").len(), 1);
    assert_eq!(ws.lines("finally.runs").len(), 1);
}
