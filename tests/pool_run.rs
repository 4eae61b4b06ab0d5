//! `drover run` with `Pool` steps, end to end (CONTRACT.md §3, §4, §5): the real `drover` and
//! `drover-pool` binaries and real agent processes in a temporary directory.
//!
//! Agents are `drover-pool agent --name N --root R -- sh -c '…'` processes (their stdout is the
//! answer, written atomically), or the test itself calling `drover-pool get-task` and writing
//! the response file when a test needs to control exactly when and how an answer is written.
//! Agent scripts append `$DROVER_AGENT_NAME $DROVER_TASK_ID $DROVER_ATTEMPT` to a log, so the
//! log says what every agent was handed; the runner's store, read through the library, says
//! what was recorded.
//!
//! Every spawned process is owned by a guard that SIGKILLs it on drop. Waits poll a condition
//! with a generous deadline; the only sleeps that are not polls are the pause of
//! `a_response_file_is_read_only_once_complete` and the stopped runner's wait past its timeout
//! in `an_answer_arriving_as_the_action_times_out_is_used_or_recorded_late`, which are the
//! scenarios themselves (an answer written in two chunks; a timeout overdue), not assertions.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use drover::pool::protocol::AgentMessage;
use drover::store::{Phase, RunStatus, RunV2, Stage, Store, TaskV1, TransitionV2};
use serde_json::{Value, json};
use ulid::Ulid;

mod common;
use common::{Done, Proc, wait_until};

/// Generous bound for conditions that normally hold within a second or two.
const DEADLINE: Duration = Duration::from_secs(120);
/// Bound for a whole run of the 500-task fan-out (a debug build on a small machine).
const LONG_DEADLINE: Duration = Duration::from_secs(600);

/// The scripts' wait for the release file: bounded (60 s), and over once the test's
/// directory is gone, so a shell loop orphaned by a failed test ends by itself.
const RELEASE_WAIT: &str = r#"i=0; while [ ! -e "$RELEASE" ] && [ -d "${RELEASE%/*}" ] && [ "$i" -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done"#;

#[track_caller]
fn assert_has(haystack: &str, needle: &str) {
    assert!(
        haystack.contains(needle),
        "expected {needle:?} in:\n{haystack}"
    );
}

/// What the store holds about the one run of a state directory.
struct RunState {
    id: u128,
    run: RunV2,
    /// In creation order.
    tasks: Vec<(u128, TaskV1)>,
    transitions: HashMap<u128, Vec<TransitionV2>>,
}

impl RunState {
    fn of_step(&self, step: &str) -> Vec<(u128, &TaskV1)> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.step == step)
            .map(|(id, t)| (*id, t))
            .collect()
    }

    #[track_caller]
    fn only(&self, step: &str) -> (u128, &TaskV1) {
        let tasks = self.of_step(step);
        assert_eq!(tasks.len(), 1, "one `{step}` task expected: {tasks:?}");
        tasks[0]
    }

    fn transitions(&self, task: u128) -> &[TransitionV2] {
        self.transitions.get(&task).map_or(&[], Vec::as_slice)
    }

    /// Transitions of `task` to `Queued` or `Failed` that record an `Error` result.
    fn errors(&self, task: u128) -> Vec<&TransitionV2> {
        self.transitions(task)
            .iter()
            .filter(|t| t.detail.contains("Error"))
            .collect()
    }
}

/// The transition that ended the first attempt's action. (A retry transition is recorded
/// under the attempt it starts, so the first attempt's error carries attempt 2.)
#[track_caller]
fn first_action_end(state: &RunState, task: u128) -> &TransitionV2 {
    state
        .transitions(task)
        .iter()
        .find(|t| t.from == Some(Stage::Phase(Phase::Action)))
        .expect("the action ended")
}

/// Agent log lines: `name task attempt`.
fn log_lines(path: &Path) -> Vec<(String, String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let mut words = line.split_whitespace().map(str::to_string);
            let mut next = || words.next().unwrap_or_default();
            (next(), next(), next())
        })
        .collect()
}

/// A temporary directory holding the pool root, the runner's state directory, the workflow
/// config (hooks and Command actions run there) and the processes' output.
struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        // Short: the pool socket path must fit in a sockaddr_un.
        let dir = tempfile::Builder::new()
            .prefix("dr")
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir(dir.path().join("logs")).expect("logs dir");
        Env { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn root(&self) -> &str {
        self.dir.path().to_str().expect("utf-8 temp path")
    }

    fn state(&self) -> PathBuf {
        self.path("state")
    }

    fn state_arg(&self) -> String {
        self.state().display().to_string()
    }

    fn logs(&self) -> PathBuf {
        self.path("logs")
    }

    fn agent_log(&self) -> PathBuf {
        self.path("agents.log")
    }

    fn release(&self) -> PathBuf {
        self.path("release")
    }

    fn responses(&self) -> PathBuf {
        self.path("pools/default/responses")
    }

    /// `BIN ARGS` with no location inherited from the environment, in the temp directory,
    /// with `AGENT_LOG` and `RELEASE` naming this test's files.
    fn command(&self, bin: &str, args: &[&str]) -> Command {
        let mut command = Command::new(bin);
        command
            .args(args)
            .current_dir(self.dir.path())
            .env_remove("DROVER_POOL")
            .env_remove("DROVER_ROOT")
            .env_remove("DROVER_STATE_DIR")
            .env_remove("DROVER_CONFIG")
            .env_remove("RUST_LOG")
            .env("AGENT_LOG", self.agent_log())
            .env("RELEASE", self.release())
            .stdin(Stdio::null());
        command
    }

    /// `drover-pool SUB --root ROOT ARGS…`, spawned.
    fn spawn_pool(&self, sub: &str, args: &[&str]) -> Proc {
        let mut all = vec![sub, "--root", self.root()];
        all.extend_from_slice(args);
        let command = self.command(env!("CARGO_BIN_EXE_drover-pool"), &all);
        Proc::spawn(&self.logs(), command, sub)
    }

    #[track_caller]
    fn run_pool(&self, sub: &str, args: &[&str]) -> Done {
        Done::of(self.spawn_pool(sub, args), DEADLINE)
    }

    /// `drover ARGS`, spawned.
    fn spawn_drover(&self, args: &[&str]) -> Proc {
        let command = self.command(env!("CARGO_BIN_EXE_drover"), args);
        Proc::spawn(&self.logs(), command, args[0])
    }

    /// Starts a daemon and waits until it answers `status`.
    #[track_caller]
    fn start_daemon(&self) -> Proc {
        let mut daemon = self.spawn_pool("start", &[]);
        wait_until("the daemon answers status", DEADLINE, || {
            if let Some(status) = daemon.exited() {
                panic!(
                    "the daemon exited early ({status}); stderr:\n{}",
                    daemon.stderr()
                );
            }
            self.status_json().is_some()
        });
        daemon
    }

    fn status_json(&self) -> Option<Value> {
        let done = self.run_pool("status", &["--json"]);
        if !done.status.success() {
            return None;
        }
        Some(serde_json::from_str(&done.stdout).expect("status --json prints JSON"))
    }

    /// Waits until every agent in `names` is waiting in get-task.
    #[track_caller]
    fn wait_idle(&self, names: &[String]) {
        wait_until(&format!("agents {names:?} are waiting"), DEADLINE, || {
            self.status_json().is_some_and(|status| {
                let agents = status["agents"].as_array().expect("agents array");
                names.iter().all(|name| {
                    agents
                        .iter()
                        .any(|a| a["name"] == name.as_str() && a["state"] == "idle")
                })
            })
        });
    }

    /// `drover-pool agent --name NAME --root ROOT -- sh -c SCRIPT`.
    fn agent(&self, name: &str, script: &str) -> Proc {
        self.spawn_pool("agent", &["--name", name, "--", "sh", "-c", script])
    }

    /// `drover-pool get-task --name NAME`, to completion: the task it was handed.
    #[track_caller]
    fn get_task(&self, name: &str) -> (String, u32, PathBuf) {
        let done = self.run_pool("get-task", &["--name", name]);
        assert!(done.status.success(), "get-task: {}", done.stderr);
        task_of(&done.stdout)
    }

    fn write_config(&self, config: &Value) -> String {
        let path = self.path("workflow.json");
        std::fs::write(
            &path,
            serde_json::to_string_pretty(config).expect("config encodes"),
        )
        .expect("config written");
        path.display().to_string()
    }

    /// A run of a Pool task `Slow` (timing out after `timeout` s, no retries; allowed to emit
    /// `Leaf` when `with_leaf`) beside a `Hold` task that keeps the run going until the test
    /// releases it, so that whatever happens to `Slow` happens while its runner is live.
    fn spawn_slow_beside_hold(&self, timeout: u64, with_leaf: bool) -> (String, Proc) {
        let mut steps = vec![
            pool_step(
                "Slow",
                if with_leaf { &["Leaf"] } else { &[] },
                json!({"timeout": timeout, "max_retries": 0}),
            ),
            hold_step(),
        ];
        if with_leaf {
            steps.push(leaf_step("Leaf", json!({})));
        }
        let config = self.write_config(&json!({ "steps": steps }));
        let run = self.spawn_run(&config, &["--initial-state", SLOW_BESIDE_HOLD]);
        (config, run)
    }

    /// `drover run --config C --state-dir S --root R EXTRA…`, spawned.
    fn spawn_run(&self, config: &str, extra: &[&str]) -> Proc {
        let state = self.state_arg();
        let mut args = vec![
            "run",
            "--config",
            config,
            "--state-dir",
            &state,
            "--root",
            self.root(),
        ];
        args.extend_from_slice(extra);
        self.spawn_drover(&args)
    }

    /// The one run of the state directory, if it has been recorded.
    fn read_run(&self) -> Option<RunState> {
        if !self.state().join(drover::store::STATE_FILE).exists() {
            return None;
        }
        let store = Store::open(&self.state()).expect("the state store opens");
        let reader = store.read().expect("a read snapshot");
        let runs = reader.runs().expect("runs");
        assert!(
            runs.len() <= 1,
            "at most one run expected, found {}",
            runs.len()
        );
        let (id, run) = runs.into_iter().next()?;
        let mut tasks = Vec::new();
        reader
            .for_each_task(id, |task_id, task| tasks.push((task_id, task)))
            .expect("tasks");
        let mut transitions = HashMap::new();
        for (task_id, _) in &tasks {
            let list = reader
                .task_transitions(id, *task_id)
                .expect("transitions")
                .into_iter()
                .map(|(_, t)| t)
                .collect();
            transitions.insert(*task_id, list);
        }
        Some(RunState {
            id,
            run,
            tasks,
            transitions,
        })
    }

    #[track_caller]
    fn run_state(&self) -> RunState {
        self.read_run().expect("a run was recorded")
    }

    /// `drover inspect RUN --task TASK --json`.
    #[track_caller]
    fn inspect_task(&self, run: u128, task: u128) -> Value {
        let state = self.state_arg();
        let done = Done::of(
            self.spawn_drover(&[
                "inspect",
                &Ulid(run).to_string(),
                "--task",
                &Ulid(task).to_string(),
                "--json",
                "--state-dir",
                &state,
            ]),
            DEADLINE,
        );
        assert!(done.status.success(), "inspect: {}", done.stderr);
        serde_json::from_str(&done.stdout).expect("inspect --json prints JSON")
    }
}

/// The task in one line of `get-task` output: (task id, attempt, response file).
#[track_caller]
fn task_of(stdout: &str) -> (String, u32, PathBuf) {
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON line expected, got:\n{stdout}");
    match serde_json::from_str(lines[0]).expect("an agent message") {
        AgentMessage::Task {
            task_id,
            attempt,
            response_file,
            ..
        } => (task_id, attempt, PathBuf::from(response_file)),
        other => panic!("expected a task, got {other:?}"),
    }
}

#[track_caller]
fn assert_exit(done: &Done, code: i32) {
    assert_eq!(
        done.status.code(),
        Some(code),
        "exit status {}; stderr:\n{}",
        done.status,
        done.stderr
    );
}

/// A Command step that ends its branch.
fn leaf_step(name: &str, schema: Value) -> Value {
    json!({
        "name": name,
        "value_schema": schema,
        "action": {"kind": "Command", "script": "cat >/dev/null; echo '[]'"},
        "next": []
    })
}

/// Logs what the agent was handed, then answers `[]`.
const LOG_AND_ANSWER_EMPTY: &str = r#"cat >/dev/null
echo "$DROVER_AGENT_NAME $DROVER_TASK_ID $DROVER_ATTEMPT" >> "$AGENT_LOG"
echo '[]'"#;

/// A root Command step printing `count` tasks of `target` ({"i": 0..count}).
fn fan_out_step(count: usize, target: &str) -> Value {
    let script = format!(
        r#"cat >/dev/null; i=0; sep=''; printf '['
while [ "$i" -lt {count} ]; do printf '%s{{"kind":"{target}","value":{{"i":%d}}}}' "$sep" "$i"; sep=','; i=$((i + 1)); done
echo ']'"#
    );
    json!({
        "name": "Fan",
        "action": {"kind": "Command", "script": script},
        "next": [target]
    })
}

/// A Pool step `Work` (with `options`) that may emit `Leaf`, a Command step answering `[]`.
fn work_then_leaf(options: Value) -> Value {
    json!({
        "entrypoint": "Work",
        "steps": [pool_step("Work", &["Leaf"], options), leaf_step("Leaf", json!({}))]
    })
}

/// The initial state of `Env::spawn_slow_beside_hold`.
const SLOW_BESIDE_HOLD: &str = r#"[{"kind": "Slow", "value": {}}, {"kind": "Hold", "value": {}}]"#;

/// A Command step that waits for the release file: a run that keeps going while a test makes
/// something happen to its other tasks.
fn hold_step() -> Value {
    json!({
        "name": "Hold",
        "action": {"kind": "Command", "script": format!("cat >/dev/null; {RELEASE_WAIT}; echo '[]'")},
        "next": []
    })
}

fn pool_step(name: &str, next: &[&str], options: Value) -> Value {
    json!({
        "name": name,
        "action": {"kind": "Pool", "instructions": format!("Do the {name} task.")},
        "next": next,
        "options": options
    })
}

// ---------------------------------------------------------------------------------------------

/// §4: several agents wait at once and tasks go to waiting agents; every task is answered
/// exactly once.
#[test]
fn many_agents_share_a_fan_out_and_each_task_is_answered_once() {
    const TASKS: usize = 500;
    const AGENTS: usize = 16;
    let env = Env::new();
    let _daemon = env.start_daemon();
    let names: Vec<String> = (0..AGENTS).map(|i| format!("agent{i:02}")).collect();
    let mut agents: Vec<Proc> = names
        .iter()
        .map(|name| env.agent(name, LOG_AND_ANSWER_EMPTY))
        .collect();
    env.wait_idle(&names);

    let config = env.write_config(&json!({
        "entrypoint": "Fan",
        "steps": [
            fan_out_step(TASKS, "Work"),
            {
                "name": "Work",
                "value_schema": {"type": "object", "required": ["i"]},
                "action": {"kind": "Pool", "instructions": "Answer []."},
                "next": []
            }
        ]
    }));
    let started = Instant::now();
    let done = Done::of(env.spawn_run(&config, &[]), LONG_DEADLINE);
    assert_exit(&done, 0);
    eprintln!(
        "{TASKS} pool tasks over {AGENTS} agents in {:?}",
        started.elapsed()
    );

    let state = env.run_state();
    assert_eq!(state.run.status, RunStatus::Completed);
    assert_eq!(state.tasks.len(), TASKS + 1);
    assert_eq!(state.run.tasks_completed, (TASKS + 1) as u64);
    assert_eq!(state.run.tasks_failed, 0);
    assert!(
        state
            .tasks
            .iter()
            .all(|(_, t)| t.phase == Phase::Completed && t.attempt == 1),
        "every task completed at its first attempt"
    );
    let work: BTreeSet<String> = state
        .of_step("Work")
        .iter()
        .map(|(id, _)| Ulid(*id).to_string())
        .collect();
    assert_eq!(work.len(), TASKS);

    let log = log_lines(&env.agent_log());
    assert_eq!(log.len(), TASKS, "one agent run per task");
    let handed: BTreeSet<String> = log.iter().map(|(_, task, _)| task.clone()).collect();
    assert_eq!(handed.len(), TASKS, "no task was handed out twice");
    assert_eq!(handed, work, "the agents got exactly the run's Work tasks");
    assert!(log.iter().all(|(_, _, attempt)| attempt == "1"));
    let mut per_agent: BTreeMap<&str, usize> = BTreeMap::new();
    for (agent, _, _) in &log {
        *per_agent.entry(agent.as_str()).or_default() += 1;
    }
    eprintln!("tasks per agent: {per_agent:?}");
    assert!(
        per_agent.len() > 1,
        "more than one agent did work: {per_agent:?}"
    );
    for agent in &mut agents {
        agent.assert_alive();
    }
}

/// Logs what the agent was handed, holds its task until two tasks have been handed out (so
/// each of two agents gets one; bounded, like `RELEASE_WAIT`), then answers `[]`.
const LOG_HOLD_UNTIL_TWO_AND_ANSWER_EMPTY: &str = r#"cat >/dev/null
echo "$DROVER_AGENT_NAME $DROVER_TASK_ID $DROVER_ATTEMPT" >> "$AGENT_LOG"
i=0; while [ "$(wc -l < "$AGENT_LOG")" -lt 2 ] && [ -d "${AGENT_LOG%/*}" ] && [ "$i" -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done
echo '[]'"#;

/// `inspect RUN --task TASK --json` says which agent did a Pool task's work: the transition
/// that ended the action names the agent whose own log says it was handed the task, for
/// every task of a fan-out shared by two agents; a Command task names none.
#[test]
fn inspect_names_the_agent_that_answered_each_pool_task() {
    const TASKS: usize = 6;
    let env = Env::new();
    let _daemon = env.start_daemon();
    let names = ["agent-1".to_string(), "agent-2".to_string()];
    let mut agents: Vec<Proc> = names
        .iter()
        .map(|name| env.agent(name, LOG_HOLD_UNTIL_TWO_AND_ANSWER_EMPTY))
        .collect();
    env.wait_idle(&names);
    let config = env.write_config(&json!({
        "entrypoint": "Fan",
        "steps": [fan_out_step(TASKS, "Work"), pool_step("Work", &[], json!({}))]
    }));
    let done = Done::of(env.spawn_run(&config, &[]), DEADLINE);
    assert_exit(&done, 0);

    let handled_by: HashMap<String, String> = log_lines(&env.agent_log())
        .into_iter()
        .map(|(agent, task, _)| (task, agent))
        .collect();
    assert_eq!(handled_by.len(), TASKS, "one agent run per task");
    let workers: BTreeSet<&String> = handled_by.values().collect();
    assert_eq!(workers.len(), 2, "both agents did work: {handled_by:?}");

    let state = env.run_state();
    assert_eq!(state.tasks.len(), TASKS + 1);
    for (id, task) in &state.tasks {
        let report = env.inspect_task(state.id, *id);
        let action_ends: Vec<&Value> = report["transitions"]
            .as_array()
            .expect("transitions")
            .iter()
            .filter(|t| t["from"] == "action")
            .collect();
        assert_eq!(action_ends.len(), 1, "{report:#}");
        let end = action_ends[0];
        if task.step == "Fan" {
            assert!(end.get("agent").is_none(), "a Command has no agent: {end}");
            continue;
        }
        let agent = &handled_by[&Ulid(*id).to_string()];
        assert_eq!(end["agent"], agent.as_str(), "{report:#}");
    }
    for agent in &mut agents {
        agent.assert_alive();
    }
}

/// §4: a response file is read only once it is complete (written and closed). The answer is
/// written in two chunks with a pause between them while the file stays open; read early, the
/// first chunk (`[`) would not be JSON and the task (no retries) would fail.
#[test]
fn a_response_file_is_read_only_once_complete() {
    let env = Env::new();
    let _daemon = env.start_daemon();
    let config = env.write_config(&json!({
        "entrypoint": "Work",
        "steps": [pool_step("Work", &[], json!({"max_retries": 0}))]
    }));
    let mut run = env.spawn_run(&config, &[]);
    let (task_id, attempt, response_file) = env.get_task("chunky");
    assert_eq!(attempt, 1);

    let mut file = File::create(&response_file).expect("response file created");
    file.write_all(b"[").expect("first chunk");
    file.sync_all().expect("first chunk on disk");
    // The pause between the chunks, with the file open and holding `[`.
    std::thread::sleep(Duration::from_secs(1));
    run.assert_alive();
    let state = env.run_state();
    let (id, task) = state.only("Work");
    assert_eq!(Ulid(id).to_string(), task_id);
    assert_eq!(
        (task.phase, task.attempt),
        (Phase::Action, 1),
        "the task still waits for its answer while the file is open: {task:?}"
    );
    file.write_all(b"]").expect("second chunk");
    drop(file);

    let done = Done::of(run, DEADLINE);
    assert_exit(&done, 0);
    let state = env.run_state();
    let (id, task) = state.only("Work");
    assert_eq!((task.phase, task.attempt), (Phase::Completed, 1));
    assert!(state.errors(id).is_empty(), "{:?}", state.transitions(id));
    assert!(
        state.transitions(id).iter().all(|t| t.attempt == 1),
        "no second attempt: {:?}",
        state.transitions(id)
    );
    let result: Value = serde_json::from_str(task.result.as_deref().expect("a result"))
        .expect("the result is JSON");
    assert_eq!(result["kind"], "Success");
    assert_eq!(result["output"], json!([]));
}

/// Three Pool tasks whose agent answers badly on attempt 1: not JSON, a kind not in `next`,
/// and a value failing the target step's schema. Attempt 2 (if any) gets a valid answer.
fn invalid_answers_workflow(env: &Env, options: Value) -> String {
    env.write_config(&json!({
        "steps": [
            pool_step("Work", &["Leaf"], options),
            leaf_step("Leaf", json!({
                "type": "object",
                "required": ["n"],
                "properties": {"n": {"type": "integer"}}
            })),
            leaf_step("Other", json!({}))
        ]
    }))
}

const INVALID_ANSWERS: &str = r#"input=$(cat)
echo "$DROVER_AGENT_NAME $DROVER_TASK_ID $DROVER_ATTEMPT" >> "$AGENT_LOG"
if [ "$DROVER_ATTEMPT" -ge 2 ]; then echo '[{"kind":"Leaf","value":{"n":1}}]'; exit 0; fi
case "$input" in
  *'"case":"garbage"'*) echo 'this is not JSON';;
  *'"case":"kind"'*) echo '[{"kind":"Other","value":{}}]';;
  *'"case":"schema"'*) echo '[{"kind":"Leaf","value":{"n":"one"}}]';;
  *) echo "unexpected task: $input" >&2; echo '[]';;
esac"#;

const INVALID_CASES: &str = r#"[
    {"kind": "Work", "value": {"case": "garbage"}},
    {"kind": "Work", "value": {"case": "kind"}},
    {"kind": "Work", "value": {"case": "schema"}}
]"#;

/// The reason each case's first answer must be rejected with.
fn expected_reasons(case: &str) -> &'static [&'static str] {
    match case {
        "garbage" => &["not JSON"],
        "kind" => &["task [0]", "may not emit `Other`"],
        "schema" => &["task [0]", "value for `Leaf`"],
        other => panic!("unknown case {other}"),
    }
}

fn case_of(task: &TaskV1) -> String {
    let value: Value = serde_json::from_str(&task.value).expect("a JSON value");
    value["case"].as_str().expect("a case").to_string()
}

/// §3/§4: an answer that is not JSON, names a kind not in `next`, or whose value fails the
/// target schema is an `Error` for the task, retried while `max_retries` allows.
#[test]
fn invalid_answers_are_errors_and_are_retried() {
    let env = Env::new();
    let _daemon = env.start_daemon();
    let _agent = env.agent("fixer", INVALID_ANSWERS);
    let config = invalid_answers_workflow(&env, json!({"max_retries": 1}));
    let done = Done::of(
        env.spawn_run(&config, &["--initial-state", INVALID_CASES]),
        DEADLINE,
    );
    assert_exit(&done, 0);

    let state = env.run_state();
    assert_eq!(state.run.status, RunStatus::Completed);
    let work = state.of_step("Work");
    assert_eq!(work.len(), 3);
    for (id, task) in &work {
        let case = case_of(task);
        assert_eq!(
            (task.phase, task.attempt),
            (Phase::Completed, 2),
            "{case}: completed by its second attempt: {:?}",
            state.transitions(*id)
        );
        let errors = state.errors(*id);
        assert_eq!(errors.len(), 1, "{case}: one error: {errors:?}");
        let error = errors[0];
        assert_eq!(
            first_action_end(&state, *id),
            error,
            "{case}: the first attempt's action ended in the error"
        );
        assert_eq!(error.to, Stage::Phase(Phase::Queued), "{case}: retried");
        for reason in expected_reasons(&case) {
            assert_has(&error.detail, reason);
        }
        assert_has(&error.detail, "retry as attempt 2");
        let result: Value =
            serde_json::from_str(task.result.as_deref().expect("a result")).expect("JSON");
        assert_eq!(result["kind"], "Success", "{case}");
        assert_eq!(
            result["output"],
            json!([{"kind": "Leaf", "value": {"n": 1}}])
        );
    }
    // Only the valid answers were applied: one Leaf per Work task, no Other.
    let leaves = state.of_step("Leaf");
    assert_eq!(leaves.len(), 3);
    for (_, leaf) in &leaves {
        assert_eq!(leaf.value, r#"{"n":1}"#);
        assert!(work.iter().any(|(id, _)| leaf.parent == Some(*id)));
    }
    assert!(state.of_step("Other").is_empty());
    let log = log_lines(&env.agent_log());
    assert_eq!(log.len(), 6, "two attempts per task: {log:?}");
}

/// §2/§3: with `retry_on_invalid_response: false` an invalid answer fails the task at once,
/// retries left or not.
#[test]
fn invalid_answers_fail_at_once_without_retry_on_invalid_response() {
    let env = Env::new();
    let _daemon = env.start_daemon();
    let _agent = env.agent("fixer", INVALID_ANSWERS);
    let config = invalid_answers_workflow(
        &env,
        json!({"max_retries": 1, "retry_on_invalid_response": false}),
    );
    let done = Done::of(
        env.spawn_run(&config, &["--initial-state", INVALID_CASES]),
        DEADLINE,
    );
    assert_exit(&done, 1);

    let state = env.run_state();
    assert_eq!(state.run.status, RunStatus::Failed);
    assert_eq!(state.run.tasks_failed, 3);
    for (id, task) in state.of_step("Work") {
        let case = case_of(task);
        assert_eq!((task.phase, task.attempt), (Phase::Failed, 1), "{case}");
        let error = task.error.as_deref().expect("the failure's reason");
        for reason in expected_reasons(&case) {
            assert_has(error, reason);
        }
        let last = state.transitions(id).last().expect("transitions");
        assert_eq!(last.to, Stage::Phase(Phase::Failed), "{case}");
        assert!(state.transitions(id).iter().all(|t| t.attempt == 1));
    }
    assert!(state.of_step("Leaf").is_empty());
    assert!(state.of_step("Other").is_empty());
    let log = log_lines(&env.agent_log());
    assert_eq!(log.len(), 3, "one attempt per task: {log:?}");
    assert!(log.iter().all(|(_, _, attempt)| attempt == "1"));
}

/// §4: killed and restarted mid-run, the pool keeps its queue and the assignments of agents
/// still working, picks up answers written while it was down, and the runner and `agent`
/// processes reconnect; nothing is lost and no task is handed out twice.
///
/// The kill lands mid-run by construction: the agents answer the tasks {"i": 0..GATE} at once
/// and block on the others (logging them to a second file) until the test creates the release
/// file, which it does only once the daemon is dead, so those answers are written while no
/// daemon runs. At the kill, GATE tasks are answered, each agent holds one, the rest are
/// queued. The kill waits until the runner has acknowledged every answer: a kill while an
/// answer is unacknowledged is the next test (it hits a bug).
#[test]
fn a_daemon_killed_mid_run_and_restarted_loses_nothing_and_repeats_nothing() {
    daemon_restart_scenario(false);
}

/// As above, plus a first kill while answers flow (once `FIRST_KILL_AFTER` tasks were handed
/// out), restarted at once: the store then holds answers the runner has not acknowledged yet.
#[test]
fn a_daemon_killed_while_answers_flow_and_restarted_loses_nothing_and_repeats_nothing() {
    daemon_restart_scenario(true);
}

fn daemon_restart_scenario(kill_while_answers_flow: bool) {
    const TASKS: usize = 300;
    const AGENTS: usize = 4;
    const GATE: usize = 200;
    const FIRST_KILL_AFTER: usize = 100;
    let env = Env::new();
    let mut daemon = env.start_daemon();
    let blocked_log = env.path("blocked.log");
    let script = format!(
        r#"i=$(sed -n 's/.*"value":{{"i":\([0-9]*\)}}.*/\1/p')
echo "$DROVER_AGENT_NAME $DROVER_TASK_ID $DROVER_ATTEMPT" >> "$AGENT_LOG"
if [ "$i" -ge {GATE} ]; then
  echo "$DROVER_AGENT_NAME $DROVER_TASK_ID $DROVER_ATTEMPT" >> '{blocked}'
  {RELEASE_WAIT}
fi
echo '[]'"#,
        blocked = blocked_log.display()
    );
    let names: Vec<String> = (0..AGENTS).map(|i| format!("agent{i}")).collect();
    let mut agents: Vec<Proc> = names.iter().map(|name| env.agent(name, &script)).collect();
    env.wait_idle(&names);
    let config = env.write_config(&json!({
        "entrypoint": "Fan",
        "steps": [fan_out_step(TASKS, "Work"), pool_step("Work", &[], json!({}))]
    }));
    let mut run = env.spawn_run(&config, &[]);

    if kill_while_answers_flow {
        wait_until("tasks are being answered", DEADLINE, || {
            log_lines(&env.agent_log()).len() >= FIRST_KILL_AFTER
        });
        daemon.kill();
        let handed = log_lines(&env.agent_log()).len();
        eprintln!("first kill: {handed} of {TASKS} tasks handed out");
        assert!(handed < TASKS, "the gate keeps the run going");
        run.assert_alive();
        daemon = env.start_daemon();
    }

    wait_until("every agent holds a blocked task", DEADLINE, || {
        log_lines(&blocked_log).len() >= AGENTS
    });
    if !kill_while_answers_flow {
        wait_until("the runner acknowledged every answer", DEADLINE, || {
            env.status_json().is_some_and(|s| s["undelivered"] == 0)
        });
    }
    let handed = log_lines(&env.agent_log()).len();
    assert!(
        handed <= GATE + AGENTS,
        "blocked agents take no more tasks: {handed} handed out"
    );
    daemon.kill();
    eprintln!("kill: {handed} of {TASKS} tasks handed out, {AGENTS} held");
    run.assert_alive();

    // The blocked agents answer while no daemon is running.
    std::fs::write(env.release(), "").expect("release file");
    let run_id = Ulid(env.run_state().id).to_string();
    let held: Vec<PathBuf> = log_lines(&blocked_log)
        .iter()
        .map(|(_, task, attempt)| {
            env.responses()
                .join(format!("{run_id}-{task}-{attempt}.json"))
        })
        .collect();
    assert_eq!(held.len(), AGENTS, "one blocked task per agent");
    wait_until("the held tasks' answers are written", DEADLINE, || {
        held.iter().all(|path| path.exists())
    });

    let _daemon = env.start_daemon();
    let done = Done::of(run, DEADLINE);
    assert_exit(&done, 0);
    assert_has(&done.stderr, "reconnecting");

    let state = env.run_state();
    assert_eq!(state.run.status, RunStatus::Completed);
    assert_eq!(state.tasks.len(), TASKS + 1);
    assert!(
        state
            .tasks
            .iter()
            .all(|(_, t)| t.phase == Phase::Completed && t.attempt == 1),
        "every task completed at its first attempt"
    );
    let work: BTreeSet<String> = state
        .of_step("Work")
        .iter()
        .map(|(id, _)| Ulid(*id).to_string())
        .collect();
    let log = log_lines(&env.agent_log());
    let mut times: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, task, _) in &log {
        *times.entry(task.as_str()).or_default() += 1;
    }
    times.retain(|_, n| *n > 1);
    assert!(
        times.is_empty(),
        "tasks handed out more than once: {times:?}"
    );
    assert_eq!(log.len(), TASKS, "one agent run per task");
    let handed: BTreeSet<String> = log.into_iter().map(|(_, task, _)| task).collect();
    assert_eq!(handed, work, "each Work task handed out exactly once");
    for agent in &mut agents {
        agent.assert_alive();
    }
}

/// §4/§5: with no daemon, `drover run` gives up after `--pool-wait` with exit 3 and a clear
/// message, and records no run.
#[test]
fn run_without_a_pool_exits_3_and_records_nothing() {
    let env = Env::new();
    let config = env.write_config(&json!({
        "entrypoint": "Work",
        "steps": [pool_step("Work", &[], json!({}))]
    }));
    let started = Instant::now();
    let done = Done::of(env.spawn_run(&config, &["--pool-wait", "1"]), DEADLINE);
    assert_exit(&done, 3);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "gave up after about --pool-wait, not much later: {:?}",
        started.elapsed()
    );
    assert_has(&done.stderr, "no pool daemon answered");
    assert_has(&done.stderr, "within 1s");
    assert_has(&done.stderr, "drover-pool start");
    assert!(
        !done.stderr.contains("started"),
        "no run started: {}",
        done.stderr
    );
    assert!(env.read_run().is_none(), "no run recorded");
}

/// §3/§4: an action timeout recalls the pool task; the agent's late answer is recorded for
/// inspection (a `late-answer` log entry naming the agent) and never applied (it spawns
/// nothing).
///
/// A second root task (a Command that waits for the release file) keeps the run going until
/// the late answer has been recorded, so the test does not depend on when it arrives.
#[test]
fn a_timed_out_pool_task_fails_and_its_late_answer_is_recorded_not_applied() {
    let env = Env::new();
    let _daemon = env.start_daemon();
    let _agent = env.agent(
        "slowpoke",
        r#"cat >/dev/null
echo "$DROVER_AGENT_NAME $DROVER_TASK_ID $DROVER_ATTEMPT" >> "$AGENT_LOG"
sleep 3
echo '[{"kind":"Leaf","value":{"late":true}}]'"#,
    );
    let (_config, mut run) = env.spawn_slow_beside_hold(1, true);

    let late_recorded = |state: &RunState| {
        let (id, _) = state.only("Slow");
        let store = Store::open(&env.state()).expect("store");
        let reader = store.read().expect("snapshot");
        reader
            .hook_logs(state.id, id)
            .expect("hook logs")
            .iter()
            .any(|(_, log)| log.phase == "late-answer")
    };
    wait_until("the late answer is recorded", DEADLINE, || {
        run.assert_alive();
        env.read_run()
            .is_some_and(|state| !state.of_step("Slow").is_empty() && late_recorded(&state))
    });
    std::fs::write(env.release(), "").expect("release file");
    let done = Done::of(run, DEADLINE);
    assert_exit(&done, 1);

    let state = env.run_state();
    assert_eq!(state.run.status, RunStatus::Failed);
    let (id, task) = state.only("Slow");
    assert_eq!((task.phase, task.attempt), (Phase::Failed, 1));
    assert_eq!(task.error.as_deref(), Some("Timeout"));
    let result: Value =
        serde_json::from_str(task.result.as_deref().expect("a result")).expect("JSON");
    assert_eq!(result["kind"], "Timeout");
    assert!(
        state.of_step("Leaf").is_empty(),
        "the late answer spawned nothing"
    );
    assert_eq!(
        log_lines(&env.agent_log()).len(),
        1,
        "no retry was dispatched"
    );

    let report = env.inspect_task(state.id, id);
    assert_eq!(report["state"], "failed");
    let late: Vec<&Value> = report["hook_logs"]
        .as_array()
        .expect("hook_logs")
        .iter()
        .filter(|log| log["phase"] == "late-answer")
        .collect();
    assert_eq!(late.len(), 1, "{report:#}");
    assert_eq!(late[0]["attempt"], 1);
    assert_eq!(late[0]["agent"], "slowpoke", "{report:#}");
    assert_has(
        late[0]["stderr"].as_str().expect("the answer text"),
        r#""late":true"#,
    );
}

/// The pid of the process whose arguments are exactly `args` (a test's own daemon: its
/// arguments name the test's unique temporary root).
fn pid_with_args(args: &[&str]) -> Option<nix::unistd::Pid> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).skip(1).collect();
        let wanted = args.iter().map(|a| a.as_bytes()).chain([&b""[..]]);
        if argv.len() == args.len() + 1 && argv.iter().copied().eq(wanted) {
            return Some(nix::unistd::Pid::from_raw(pid));
        }
    }
    None
}

/// §4 ("once running, it rides out a daemon restart … and nothing is lost"): a recall the
/// runner wrote to a daemon that died before reading it is sent again after reconnecting.
/// The daemon is stopped (SIGSTOP) while the task waits in its queue, so the recall the action
/// timeout sends sits unread in the socket when the daemon is SIGKILLed. Lost, the task would
/// stay queued in the restarted pool and be handed to the next agent, though the run gave it up.
#[test]
fn a_recall_lost_with_a_killed_daemon_is_sent_again_after_reconnecting() {
    let env = Env::new();
    let mut daemon = env.start_daemon();
    let (_config, mut run) = env.spawn_slow_beside_hold(1, false);
    wait_until("the pool task is queued", DEADLINE, || {
        run.assert_alive();
        env.status_json().is_some_and(|s| s["queued"] == 1)
    });
    let pid = pid_with_args(&["start", "--root", env.root()]).expect("the daemon's pid");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("daemon stopped");
    wait_until("the action timed out", DEADLINE, || {
        run.assert_alive();
        env.read_run().is_some_and(|state| {
            state
                .of_step("Slow")
                .first()
                .is_some_and(|(_, t)| t.phase == Phase::Failed)
        })
    });
    daemon.kill();
    let _daemon = env.start_daemon();
    wait_until(
        "the restarted pool forgets the recalled task",
        DEADLINE,
        || {
            run.assert_alive();
            env.status_json()
                .is_some_and(|s| s["queued"] == 0 && s["assigned"] == 0)
        },
    );
    // An agent now gets nothing: the task was not left to be handed out.
    let mut agent = env.agent("late", LOG_AND_ANSWER_EMPTY);
    env.wait_idle(&["late".to_string()]);

    std::fs::write(env.release(), "").expect("release file");
    let done = Done::of(run, DEADLINE);
    assert_exit(&done, 1);
    assert_has(&done.stderr, "reconnecting");
    let state = env.run_state();
    let (_, task) = state.only("Slow");
    assert_eq!((task.phase, task.attempt), (Phase::Failed, 1));
    assert_eq!(task.error.as_deref(), Some("Timeout"));
    agent.assert_alive();
    assert!(
        log_lines(&env.agent_log()).is_empty(),
        "no agent was handed the recalled task"
    );
    let status = env.status_json().expect("status");
    assert_eq!(status["queued"], 0, "{status}");
}

/// §3/§4: an answer that reaches the runner just as its action times out is either used (it
/// came in time) or recorded as a late answer and acknowledged; never dropped. The runner is
/// stopped (SIGSTOP) from before the answer is written until after the timeout has passed, so
/// when it resumes the answer and the timeout are due at once.
#[test]
fn an_answer_arriving_as_the_action_times_out_is_used_or_recorded_late() {
    let env = Env::new();
    let _daemon = env.start_daemon();
    let (config, mut run) = env.spawn_slow_beside_hold(2, true);
    let initial = SLOW_BESIDE_HOLD;
    let state_dir = env.state_arg();
    let (_, _, response_file) = env.get_task("x");
    let handed_at = Instant::now();
    let pid = pid_with_args(&[
        "run",
        "--config",
        &config,
        "--state-dir",
        &state_dir,
        "--root",
        env.root(),
        "--initial-state",
        initial,
    ])
    .expect("the runner's pid");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("runner stopped");
    let answer = json!([{"kind": "Leaf", "value": {"answered": "at the timeout"}}]);
    std::fs::write(&response_file, answer.to_string()).expect("answer written");
    wait_until("the pool has the answer", DEADLINE, || {
        env.status_json().is_some_and(|s| s["undelivered"] == 1)
    });
    // The scenario itself, not a synchronisation: the runner stays stopped until its action
    // timeout is overdue.
    std::thread::sleep(Duration::from_secs(3).saturating_sub(handed_at.elapsed()));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("runner resumed");

    let late_logs = |state: &RunState| {
        let (id, _) = state.only("Slow");
        let store = Store::open(&env.state()).expect("store");
        let reader = store.read().expect("snapshot");
        reader
            .hook_logs(state.id, id)
            .expect("hook logs")
            .into_iter()
            .filter(|(_, log)| log.phase == "late-answer")
            .map(|(_, log)| log)
            .collect::<Vec<_>>()
    };
    wait_until("the answer is used or recorded late", DEADLINE, || {
        run.assert_alive();
        env.read_run().is_some_and(|state| {
            let (_, task) = state.only("Slow");
            task.phase == Phase::Completed || !late_logs(&state).is_empty()
        })
    });
    std::fs::write(env.release(), "").expect("release file");
    let done = Done::of(run, DEADLINE);
    let state = env.run_state();
    let (_, task) = state.only("Slow");
    if task.phase == Phase::Completed {
        assert_exit(&done, 0);
        let (_, leaf) = state.only("Leaf");
        assert_eq!(leaf.value, r#"{"answered":"at the timeout"}"#);
    } else {
        assert_exit(&done, 1);
        assert_eq!(task.error.as_deref(), Some("Timeout"));
        assert!(
            state.of_step("Leaf").is_empty(),
            "a late answer spawns nothing"
        );
        let late = late_logs(&state);
        assert_eq!(late.len(), 1, "{late:?}");
        assert_has(&late[0].stderr, "at the timeout");
    }
    wait_until("the pool forgets the answer", DEADLINE, || {
        env.status_json().is_some_and(|s| s["undelivered"] == 0)
    });
}

/// §4: an agent that calls get-task again while holding an unanswered task abandons it; the
/// task gets `Error{"agent requested a new task without answering"}` (and, retries allowing,
/// its next attempt goes to the next waiting agent — here that same get-task).
#[test]
fn get_task_again_without_answering_abandons_the_task() {
    let env = Env::new();
    let _daemon = env.start_daemon();
    let config = env.write_config(&json!({
        "entrypoint": "Work",
        "steps": [pool_step("Work", &[], json!({"max_retries": 1}))]
    }));
    let run = env.spawn_run(&config, &[]);
    let (first_id, first_attempt, _) = env.get_task("x");
    assert_eq!(first_attempt, 1);

    // The same agent asks again without writing the response file.
    let (second_id, second_attempt, response_file) = env.get_task("x");
    assert_eq!(second_id, first_id, "the abandoned task is retried");
    assert_eq!(second_attempt, 2);
    std::fs::write(&response_file, "[]").expect("answer written");
    let done = Done::of(run, DEADLINE);
    assert_exit(&done, 0);

    let state = env.run_state();
    let (id, task) = state.only("Work");
    assert_eq!(Ulid(id).to_string(), first_id);
    assert_eq!((task.phase, task.attempt), (Phase::Completed, 2));
    let errors = state.errors(id);
    assert_eq!(errors.len(), 1, "{:?}", state.transitions(id));
    assert_eq!(first_action_end(&state, id), errors[0]);
    assert_has(&errors[0].detail, "retry as attempt 2");
    assert_has(
        &errors[0].detail,
        "Error: agent requested a new task without answering",
    );
    assert_eq!(errors[0].agent.as_deref(), Some("x"));
}

/// §4: `kick` of a busy agent takes effect at its next get-task, and what it held is settled
/// then, never stranded. `x` asks again without answering: it is kicked and its task gets
/// `Error{"agent requested a new task without answering"}` (no retries: the task fails, the
/// run exits 1). `y` answers first: until then its task stays assigned to it, the answer is
/// used, and its next get-task is kicked too.
#[test]
fn a_kicked_busy_agent_settles_its_task_when_it_asks_again() {
    const KICKED: &str = "kicked by drover-pool kick";
    let env = Env::new();
    let _daemon = env.start_daemon();
    let config = env.write_config(&json!({
        "steps": [pool_step("Work", &[], json!({"max_retries": 0}))]
    }));
    let mut run = env.spawn_run(
        &config,
        &[
            "--initial-state",
            r#"[{"kind": "Work", "value": {"n": 1}}, {"kind": "Work", "value": {"n": 2}}]"#,
        ],
    );
    let (x_task, _, _) = env.get_task("x");
    let (y_task, _, y_response) = env.get_task("y");
    for name in ["x", "y"] {
        let done = env.run_pool("kick", &["--name", name]);
        assert!(done.status.success(), "kick {name}: {}", done.stderr);
    }
    let held_by = |status: &Value, name: &str| -> Option<String> {
        status["agents"]
            .as_array()
            .expect("agents array")
            .iter()
            .find(|a| a["name"] == name)
            .and_then(|a| a["task"]["task_id"].as_str().map(str::to_string))
    };
    let status = env.status_json().expect("status");
    assert_eq!(
        status["assigned"], 2,
        "a kick alone settles nothing: {status}"
    );
    assert_eq!(held_by(&status, "x"), Some(x_task.clone()), "{status}");
    assert_eq!(held_by(&status, "y"), Some(y_task.clone()), "{status}");

    let done = env.run_pool("get-task", &["--name", "x"]);
    assert!(done.status.success(), "get-task x: {}", done.stderr);
    assert_eq!(
        serde_json::from_str::<AgentMessage>(done.stdout.trim()).expect("an agent message"),
        AgentMessage::Kicked {
            reason: KICKED.into()
        }
    );
    wait_until("x's task is recorded as failed", DEADLINE, || {
        run.assert_alive();
        env.read_run().is_some_and(|state| {
            state
                .tasks
                .iter()
                .any(|(id, t)| Ulid(*id).to_string() == x_task && t.phase == Phase::Failed)
        })
    });
    let status = env.status_json().expect("status");
    assert_eq!(status["assigned"], 1, "y still holds its task: {status}");
    assert_eq!(held_by(&status, "y"), Some(y_task.clone()), "{status}");

    std::fs::write(&y_response, "[]").expect("y's answer written");
    let done = Done::of(run, DEADLINE);
    assert_exit(&done, 1);
    let done = env.run_pool("get-task", &["--name", "y"]);
    assert!(done.status.success(), "get-task y: {}", done.stderr);
    assert_eq!(
        serde_json::from_str::<AgentMessage>(done.stdout.trim()).expect("an agent message"),
        AgentMessage::Kicked {
            reason: KICKED.into()
        }
    );

    let state = env.run_state();
    assert_eq!(state.run.status, RunStatus::Failed);
    let task = |wanted: &str| {
        state
            .tasks
            .iter()
            .find(|(id, _)| Ulid(*id).to_string() == wanted)
            .map(|(id, t)| (*id, t))
            .expect("the task was recorded")
    };
    let (x_id, x) = task(&x_task);
    assert_eq!((x.phase, x.attempt), (Phase::Failed, 1));
    assert_eq!(
        x.error.as_deref(),
        Some("Error: agent requested a new task without answering")
    );
    let errors = state.errors(x_id);
    assert_eq!(errors.len(), 1, "{:?}", state.transitions(x_id));
    assert_eq!(errors[0].to, Stage::Phase(Phase::Failed), "{:?}", errors[0]);
    let (_, y) = task(&y_task);
    assert_eq!((y.phase, y.attempt), (Phase::Completed, 1));
    let result: Value = serde_json::from_str(y.result.as_deref().expect("a result")).expect("JSON");
    assert_eq!(result["output"], json!([]));

    wait_until("the pool holds nothing for the run", DEADLINE, || {
        env.status_json()
            .is_some_and(|s| s["assigned"] == 0 && s["queued"] == 0 && s["undelivered"] == 0)
    });
    let status = env.status_json().expect("status");
    assert_eq!(held_by(&status, "x"), None, "{status}");
    assert_eq!(held_by(&status, "y"), None, "{status}");
}

/// `kick --abandon` of an agent that died holding a task: the task is given up at once (the
/// attempt fails with an error naming the kick, and the step's retry goes to another agent),
/// the dead agent's later answer changes nothing (its file is deleted unread, it spawns no
/// task and is not recorded), and its next get-task is kicked.
#[test]
fn kick_abandon_gives_up_the_task_of_a_dead_agent_and_another_agent_takes_the_retry() {
    const REASON: &str = "agent `A` was kicked with --abandon while holding the task";
    let env = Env::new();
    let _daemon = env.start_daemon();
    let config = env.write_config(&work_then_leaf(json!({"max_retries": 1})));
    let mut run = env.spawn_run(&config, &[]);
    // A takes the task and never answers: it died.
    let (task_id, attempt, a_response) = env.get_task("A");
    assert_eq!(attempt, 1);

    let done = env.run_pool("kick", &["--name", "A", "--abandon"]);
    assert_exit(&done, 0);
    assert_has(
        &done.stderr,
        &format!("gave up its task {task_id} (attempt 1)"),
    );
    // Durable before the reply: the pool already counts the task as answered, or (once the
    // runner has recorded the error) queued again as attempt 2.
    let status = env.status_json().expect("status");
    assert_eq!(status["assigned"], 0, "{status}");
    wait_until("attempt 2 waits in the queue", DEADLINE, || {
        run.assert_alive();
        env.status_json()
            .is_some_and(|s| s["queued"] == 1 && s["assigned"] == 0 && s["undelivered"] == 0)
    });

    // A was alive after all and answers attempt 1, with a task that would be spawned if the
    // answer were applied.
    std::fs::write(&a_response, r#"[{"kind": "Leaf", "value": {"from": "A"}}]"#)
        .expect("A's answer written");
    wait_until("the pool deletes A's late response file", DEADLINE, || {
        run.assert_alive();
        !a_response.exists()
    });
    // A asks again: kicked, and attempt 2 stays queued for someone else.
    let done = env.run_pool("get-task", &["--name", "A"]);
    assert_exit(&done, 0);
    match serde_json::from_str::<AgentMessage>(done.stdout.trim()).expect("an agent message") {
        AgentMessage::Kicked { reason } => assert_has(&reason, "--abandon"),
        other => panic!("A was handed {other:?}"),
    }
    let status = env.status_json().expect("status");
    assert_eq!(status["queued"], 1, "{status}");
    // Idempotent: A is gone by now, and a repeated kick says so without failing.
    let done = env.run_pool("kick", &["--name", "A", "--abandon"]);
    assert_exit(&done, 0);
    assert_has(&done.stderr, "no agent named `A`");

    let _b = env.agent("B", "cat >/dev/null; echo []");
    let done = Done::of(run, DEADLINE);
    assert_exit(&done, 0);

    let state = env.run_state();
    assert_eq!(state.run.status, RunStatus::Completed);
    let (id, task) = state.only("Work");
    assert_eq!(Ulid(id).to_string(), task_id);
    assert_eq!((task.phase, task.attempt), (Phase::Completed, 2));
    assert!(
        state.of_step("Leaf").is_empty(),
        "A's answer spawned nothing"
    );
    let report = env.inspect_task(state.id, id);
    let action_ends: Vec<&Value> = report["transitions"]
        .as_array()
        .expect("transitions")
        .iter()
        .filter(|t| t["from"] == "action")
        .collect();
    assert_eq!(action_ends.len(), 2, "{report:#}");
    let detail = |t: &Value| t["detail"].as_str().expect("detail").to_string();
    assert_eq!(action_ends[0]["agent"], "A", "{report:#}");
    assert_has(&detail(action_ends[0]), &format!("Error: {REASON}"));
    assert_has(&detail(action_ends[0]), "retry as attempt 2");
    assert_eq!(action_ends[1]["agent"], "B", "{report:#}");
    assert_eq!(action_ends[1]["attempt"], 2, "{report:#}");
    let result: Value =
        serde_json::from_str(task.result.as_deref().expect("a result")).expect("JSON");
    assert_eq!(result["output"], json!([]), "B's answer was used");
    assert!(
        report["hook_logs"]
            .as_array()
            .expect("hook_logs")
            .iter()
            .all(|log| log["phase"] != "late-answer"),
        "A's answer was not even recorded as late: {report:#}"
    );
    wait_until("the pool holds nothing for the run", DEADLINE, || {
        env.status_json()
            .is_some_and(|s| s["assigned"] == 0 && s["queued"] == 0 && s["undelivered"] == 0)
    });
}

/// §5: `resume` re-attaches a pool task the pool still holds instead of dispatching it again,
/// and an answer written while no runner was running is used.
#[test]
fn resume_reattaches_pool_work_and_uses_an_answer_written_while_the_runner_was_dead() {
    let env = Env::new();
    let _daemon = env.start_daemon();
    let config = env.write_config(&work_then_leaf(json!({"max_retries": 0})));
    let mut run = env.spawn_run(&config, &[]);
    let (task_id, attempt, response_file) = env.get_task("x");
    assert_eq!(attempt, 1);
    let state = env.run_state();
    let (id, task) = state.only("Work");
    assert_eq!(Ulid(id).to_string(), task_id);
    assert_eq!(task.phase, Phase::Action);

    run.kill();
    let answer = json!([{"kind": "Leaf", "value": {"written": "while the runner was dead"}}]);
    std::fs::write(&response_file, answer.to_string()).expect("answer written");
    wait_until("the pool holds the undelivered answer", DEADLINE, || {
        env.status_json()
            .is_some_and(|s| s["undelivered"] == 1 && s["assigned"] == 0)
    });
    // Another agent waits, and would get the task if it were dispatched again.
    let mut other = env.spawn_pool("get-task", &["--name", "y"]);
    env.wait_idle(&["y".to_string()]);

    let state_dir = env.state_arg();
    let mut resume = env.spawn_drover(&["resume", "--state-dir", &state_dir, "--root", env.root()]);
    wait_until(
        "resume ends (or the task is handed out again)",
        DEADLINE,
        || resume.exited().is_some() || other.exited().is_some(),
    );
    assert!(
        other.exited().is_none(),
        "resume dispatched the task again: agent `y` got {}",
        other.stdout()
    );
    let done = Done::of(resume, DEADLINE);
    assert_exit(&done, 0);

    let state = env.run_state();
    assert_eq!(state.run.status, RunStatus::Completed);
    let (id, task) = state.only("Work");
    assert_eq!((task.phase, task.attempt), (Phase::Completed, 1));
    assert!(state.transitions(id).iter().all(|t| t.attempt == 1));
    let result: Value =
        serde_json::from_str(task.result.as_deref().expect("a result")).expect("JSON");
    assert_eq!(
        result["output"], answer,
        "the answer written while dead was used"
    );
    let (_, leaf) = state.only("Leaf");
    assert_eq!(leaf.parent, Some(id));
    assert_eq!(leaf.value, r#"{"written":"while the runner was dead"}"#);

    other.assert_alive();
    assert_eq!(other.stdout(), "", "the task was not handed out again");
    let status = env.status_json().expect("status");
    assert_eq!(status["queued"], 0, "{status}");
    assert_eq!(status["assigned"], 0, "{status}");
}

/// §4: "Killed and restarted, [the pool] … delivers answers that arrived while the runner was
/// away once the runner reconnects." The runner and then the daemon are SIGKILLed while the
/// pool holds an answer the runner never received; the daemon is restarted and the run
/// resumed.
#[test]
fn a_restarted_daemon_still_delivers_an_answer_its_runner_never_received() {
    let env = Env::new();
    let mut daemon = env.start_daemon();
    let config = env.write_config(&work_then_leaf(json!({"max_retries": 0})));
    let mut run = env.spawn_run(&config, &[]);
    let (_, _, response_file) = env.get_task("x");
    run.kill();
    let answer = json!([{"kind": "Leaf", "value": {"kept": "across a daemon restart"}}]);
    std::fs::write(&response_file, answer.to_string()).expect("answer written");
    wait_until("the pool holds the undelivered answer", DEADLINE, || {
        env.status_json().is_some_and(|s| s["undelivered"] == 1)
    });
    daemon.kill();

    // Fails here with the bug: the daemon exits 1 at start.
    let _daemon = env.start_daemon();
    let state_dir = env.state_arg();
    let done = Done::of(
        env.spawn_drover(&["resume", "--state-dir", &state_dir, "--root", env.root()]),
        DEADLINE,
    );
    assert_exit(&done, 0);
    let state = env.run_state();
    let (id, task) = state.only("Work");
    assert_eq!((task.phase, task.attempt), (Phase::Completed, 1));
    let (_, leaf) = state.only("Leaf");
    assert_eq!(leaf.parent, Some(id));
    assert_eq!(leaf.value, r#"{"kept":"across a daemon restart"}"#);
    // Who answered is kept with the answer across the restart too.
    assert_eq!(first_action_end(&state, id).agent.as_deref(), Some("x"));
}

/// What the agent does once the run whose task it holds has ended.
#[derive(Clone, Copy, PartialEq)]
enum AfterTheRun {
    /// Writes its answer.
    Answers,
    /// Writes its answer while the daemon is down; the daemon is then restarted.
    AnswersWhileTheDaemonIsDown,
    /// Asks for a new task without answering.
    AsksAgain,
}

/// A run whose Pool action times out (1 s) while the agent holds the task ends (exit 1); what
/// the agent does afterwards never reaches a runner, and the pool keeps none of it: `status`
/// settles to nothing queued, assigned or undelivered, the response file is gone, and so it
/// stays after a daemon restart.
fn ended_run_scenario(after: AfterTheRun) {
    let env = Env::new();
    let mut daemon = env.start_daemon();
    let config = env.write_config(&json!({
        "entrypoint": "Slow",
        "steps": [pool_step("Slow", &[], json!({"timeout": 1, "max_retries": 0}))]
    }));
    let run = env.spawn_run(&config, &[]);
    let (_, _, response_file) = env.get_task("x");
    let done = Done::of(run, DEADLINE);
    assert_exit(&done, 1);
    let state = env.run_state();
    assert_eq!(state.run.status, RunStatus::Failed);
    let (_, task) = state.only("Slow");
    assert_eq!(task.error.as_deref(), Some("Timeout"));
    let status = env.status_json().expect("status");
    assert_eq!(status["assigned"], 1, "the agent still holds it: {status}");

    let mut asking = None;
    match after {
        AfterTheRun::Answers => {
            std::fs::write(&response_file, "[]").expect("answer written");
        }
        AfterTheRun::AnswersWhileTheDaemonIsDown => {
            daemon.kill();
            std::fs::write(&response_file, "[]").expect("answer written");
            daemon = env.start_daemon();
        }
        AfterTheRun::AsksAgain => {
            asking = Some(env.spawn_pool("get-task", &["--name", "x"]));
            env.wait_idle(&["x".to_string()]);
        }
    }
    let settled = |status: &Value| {
        status["queued"] == 0 && status["assigned"] == 0 && status["undelivered"] == 0
    };
    wait_until("the pool keeps nothing of the ended run", DEADLINE, || {
        env.status_json().is_some_and(|s| settled(&s)) && !response_file.exists()
    });
    if let Some(mut asking) = asking {
        asking.assert_alive();
        asking.kill();
    }

    daemon.kill();
    let _daemon = env.start_daemon();
    let status = env.status_json().expect("status");
    assert!(
        settled(&status),
        "nothing came back with a restart: {status}"
    );
    assert!(!response_file.exists());
}

#[test]
fn a_late_answer_for_an_ended_run_is_discarded_with_its_file() {
    ended_run_scenario(AfterTheRun::Answers);
}

#[test]
fn a_late_answer_written_while_the_daemon_was_down_is_discarded_when_it_restarts() {
    ended_run_scenario(AfterTheRun::AnswersWhileTheDaemonIsDown);
}

#[test]
fn a_task_of_an_ended_run_is_forgotten_when_its_agent_asks_again() {
    ended_run_scenario(AfterTheRun::AsksAgain);
}

/// A run that ends while its pool daemon is down cannot tell the pool (`RunEnded`): the runner
/// says so, with the command that repairs it, and `drover resume RUN` of the finished run
/// tells the pool once it is back (and says it could not while it is not), exiting with the
/// run's code either way. The pool then forgets the run's late answer it was keeping.
#[test]
fn resume_of_a_finished_run_tells_the_pool_the_run_ended_when_its_runner_could_not() {
    let env = Env::new();
    let mut daemon = env.start_daemon();
    let (_config, mut run) = env.spawn_slow_beside_hold(1, false);
    let (_, _, response_file) = env.get_task("x");
    wait_until("the pool task timed out", DEADLINE, || {
        run.assert_alive();
        env.read_run().is_some_and(|state| {
            state
                .of_step("Slow")
                .first()
                .is_some_and(|(_, t)| t.phase == Phase::Failed)
        })
    });
    // The daemon goes away before the run ends, and the agent answers meanwhile.
    daemon.kill();
    std::fs::write(&response_file, "[]").expect("late answer written");
    std::fs::write(env.release(), "").expect("release file");
    let done = Done::of(run, DEADLINE);
    assert_exit(&done, 1);
    let run_id = Ulid(env.run_state().id).to_string();
    assert_has(&done.stderr, "did not confirm");
    assert_has(&done.stderr, &format!("`drover resume {run_id}`"));

    // No daemon: resume cannot tell it, says so, and still exits with the run's code. No
    // --root: the run's recorded pool is used.
    let state_dir = env.state_arg();
    let resume = || env.spawn_drover(&["resume", &run_id, "--state-dir", &state_dir]);
    let done = Done::of(resume(), DEADLINE);
    assert_exit(&done, 1);
    assert_has(
        &done.stderr,
        &format!("could not tell pool `default` ({})", env.root()),
    );

    // The daemon is back, holding the late answer no runner will acknowledge.
    let _daemon = env.start_daemon();
    wait_until("the pool holds the late answer", DEADLINE, || {
        env.status_json()
            .is_some_and(|s| s["undelivered"] == 1 && s["assigned"] == 0 && s["queued"] == 0)
    });
    let done = Done::of(resume(), DEADLINE);
    assert_exit(&done, 1);
    assert_has(&done.stderr, "already finished: failed");
    assert!(
        !done.stderr.contains("could not tell"),
        "the pool was told: {}",
        done.stderr
    );
    wait_until("the pool forgets the ended run", DEADLINE, || {
        env.status_json()
            .is_some_and(|s| s["undelivered"] == 0 && s["assigned"] == 0 && s["queued"] == 0)
    });
    assert!(!response_file.exists(), "the answer's file went with it");
    let state = env.run_state();
    assert_eq!(state.run.status, RunStatus::Failed, "the run is as it was");
}

/// A task value holding numbers no float holds reaches an agent as the runner stored it,
/// through `get-task` and through `drover-pool agent` alike (the daemon keeps the value as
/// text, and neither side re-encodes it through a float).
#[test]
fn a_pool_task_value_reaches_agents_with_every_digit() {
    const BIG: &str = "1234567890123456789012345";
    const LONG: &str = "0.1000000000000000055511151231257827";
    let env = Env::new();
    let _daemon = env.start_daemon();
    let config = env.write_config(&json!({
        "steps": [pool_step("Work", &[], json!({}))]
    }));
    let initial = format!(
        r#"[{{"kind": "Work", "value": {{"id": {BIG}, "x": {LONG}, "by": "get-task"}}}},
            {{"kind": "Work", "value": {{"id": {BIG}, "x": {LONG}, "by": "agent"}}}}]"#
    );
    let run = env.spawn_run(&config, &["--initial-state", &initial]);
    let exact = |by: &str| format!(r#""value":{{"id":{BIG},"x":{LONG},"by":"{by}"}}"#);

    // One task through get-task, whose stdout is the message as the agent sees it.
    let done = env.run_pool("get-task", &["--name", "x"]);
    assert!(done.status.success(), "get-task: {}", done.stderr);
    let (_, _, response_file) = task_of(&done.stdout);
    let by = if done.stdout.contains(r#""by":"agent""#) {
        "agent"
    } else {
        "get-task"
    };
    assert!(done.stdout.contains(&exact(by)), "{}", done.stdout);
    std::fs::write(&response_file, "[]").expect("answer written");

    // The other through a program run as an agent, which gets the message on its stdin.
    let other = if by == "agent" { "get-task" } else { "agent" };
    let _agent = env.agent("y", r#"cat >> "$AGENT_LOG"; echo []"#);
    let done = Done::of(run, DEADLINE);
    assert_exit(&done, 0);
    let seen = std::fs::read_to_string(env.agent_log()).expect("the agent's log");
    assert!(seen.contains(&exact(other)), "{seen}");
}
