//! Issue 5: SIGKILL during Command-action and hook phases — those phases rerun, nothing is lost.
//!
//! CONTRACT.md §3 (hooks in their own process group, finally once all descendants settled,
//! counters stored), §5 (`resume` continues a run, re-running what was in flight: at-least-once)
//! and §6 (every transition is a record; a SIGKILLed writer's file is repaired on open).
//!
//! Every hook and action of the workflow below appends `<phase> <task> <attempt> <step>` to
//! `actions.log` as its first act, so the log says what ran, in which runner "epoch" (the test
//! writes a `# kill N` line after each SIGKILL, once every orphaned hook of the killed runner is
//! dead) and in which order. The store, read through the library, says what was recorded.
//!
//! - `soak_20_kills` (and `soak_200_kills`, `#[ignore]`, by hand:
//!   `cargo test --release --test soak_command -- --ignored`): a fan-out of Command tasks with
//!   pre/post/finally hooks; the runner is SIGKILLed at seeded pseudo-random points (the seed is
//!   printed; `SOAK_SEED=N` replays it) and resumed each time, then the last resume runs to the
//!   end.
//! - `kill_during_{pre,post,finally}_hook_reruns_it_once`: the hook of one chosen task blocks on
//!   a release file; the runner is killed exactly then, and the hook must run again on resume
//!   with the same attempt number, while everything that had already been recorded does not.
//!
//! Linux only: orphaned hooks are found through /proc (their environment carries a tag unique to
//! the test).
#![cfg(target_os = "linux")]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use drover::store::{FinallyState, Phase, RunStatus, RunV2, Stage, Store, TaskV1, TransitionV2};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, getpgid};
use serde_json::{Value, json};
use tempfile::TempDir;
use ulid::Ulid;

mod common;
use common::soak::{Rng, run_recorded, sweep};

/// Marks the runner and everything it starts, for the sweep.
const TAG_VAR: &str = "DROVER_SOAK_TAG";

/// `max_concurrency` of the workflow: at most this many tasks are in pre/action/post at once, so
/// at most this many phases can be cut short by one kill.
const MAX_CONCURRENCY: usize = 8;

/// How often conditions are polled. Polling only; no assertion depends on it.
const POLL: Duration = Duration::from_millis(2);

/// Generous bounds for conditions that normally hold within milliseconds.
const PROGRESS_DEADLINE: Duration = Duration::from_secs(120);

const PHASES: [&str; 4] = ["pre", "action", "post", "finally"];
/// Index into `PHASES` of the finally hook; the others hold a concurrency slot.
const FINALLY: usize = 3;

// ---------------------------------------------------------------------------------------------
// The workflow: Root {"n": N} → Child {"i": k} ×N → Grand {"i": k, "j": 0..(1 + k % 2)}.

/// Sourced by every script. `note` logs the run; `maybe_block` blocks the chosen phase of the
/// task Child {"i": 1} until `release` exists, after publishing its pid in `block.pid`.
const COMMON_SH: &str = r#"
note() {
  printf '%s %s %s %s\n' "$DROVER_PHASE" "$DROVER_TASK_ID" "$DROVER_ATTEMPT" "$DROVER_STEP" >> actions.log
}
is_chosen() {
  [ "$DROVER_STEP" = Child ] || return 1
  case "$1" in *'"i":1,'*|*'"i":1}'*) return 0;; esac
  return 1
}
maybe_block() {
  [ "$DROVER_PHASE" = "$BLOCK_PHASE" ] || return 0
  is_chosen "$1" || return 0
  echo $$ > block.pid.tmp && mv block.pid.tmp block.pid
  while [ ! -e release ]; do sleep 0.01; done
}
"#;

/// Adds `"pre":1` to the value; the action checks it arrived.
const PRE_SH: &str = r#". ./common.sh
note
input=$(cat)
maybe_block "$input"
sleep 0.02
printf '%s\n' "$input" | sed 's/}$/,"pre":1}/'
"#;

const ACTION_SH: &str = r#". ./common.sh
note
input=$(cat)
case "$input" in
  *'"pre":1'*) ;;
  *) echo "the action did not get the pre hook's output: $input" >&2; exit 1;;
esac
sleep 0.05
num() { printf '%s' "$input" | sed -n "s/.*\"$1\":\([0-9][0-9]*\).*/\1/p"; }
case "$DROVER_STEP" in
  Root)
    n=$(num n); i=0; sep=''
    printf '['
    while [ "$i" -lt "$n" ]; do
      printf '%s{"kind":"Child","value":{"i":%d}}' "$sep" "$i"; sep=','; i=$((i + 1))
    done
    printf ']\n';;
  Child)
    i=$(num i); c=$((1 + i % 2)); j=0; sep=''
    printf '['
    while [ "$j" -lt "$c" ]; do
      printf '%s{"kind":"Grand","value":{"i":%d,"j":%d}}' "$sep" "$i" "$j"; sep=','; j=$((j + 1))
    done
    printf ']\n';;
  Grand) printf '[]\n';;
  *) echo "unknown step $DROVER_STEP" >&2; exit 1;;
esac
"#;

/// Passes the result through unchanged.
const POST_SH: &str = r#". ./common.sh
note
input=$(cat)
maybe_block "$input"
case "$input" in
  *'"kind":"Success"'*) ;;
  *) echo "post expected a Success result: $input" >&2; exit 1;;
esac
sleep 0.03
printf '%s\n' "$input"
"#;

/// Prints `[]`, except in the finally-kill test, where the chosen task's finally spawns one
/// sibling (so "spawned exactly once" is checked too).
const FINALLY_SH: &str = r#". ./common.sh
note
input=$(cat)
maybe_block "$input"
sleep 0.04
if [ "$BLOCK_PHASE" = finally ] && is_chosen "$input"; then
  printf '[{"kind":"Grand","value":{"i":1,"j":99}}]\n'
else
  printf '[]\n'
fi
"#;

fn write_workflow(dir: &Path, block: Option<&str>) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let common = format!("BLOCK_PHASE={}\n{COMMON_SH}", block.unwrap_or("none"));
    for (name, text) in [
        ("common.sh", common.as_str()),
        ("pre.sh", PRE_SH),
        ("action.sh", ACTION_SH),
        ("post.sh", POST_SH),
        ("finally.sh", FINALLY_SH),
    ] {
        fs::write(dir.join(name), text).unwrap();
    }
    let hook = |script: &str| json!({"kind": "Command", "script": format!("sh ./{script}")});
    let step = |name: &str, next: &[&str], finally: bool| {
        let mut step = json!({
            "name": name,
            "action": hook("action.sh"),
            "next": next,
            "pre": hook("pre.sh"),
            "post": hook("post.sh"),
        });
        if finally {
            step["finally"] = hook("finally.sh");
        }
        step
    };
    let config = json!({
        "entrypoint": "Root",
        "options": {"max_concurrency": MAX_CONCURRENCY},
        "steps": [
            step("Root", &["Child"], true),
            step("Child", &["Grand"], true),
            step("Grand", &[], false),
        ],
    });
    let path = dir.join("workflow.json");
    fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    path
}

fn has_finally(step: &str) -> bool {
    matches!(step, "Root" | "Child")
}

/// The children a task must have, as sorted (step, value) pairs: what the deterministic scripts
/// emit, plus the sibling the chosen finally hook adds under Root in the finally-kill test.
fn expected_children(step: &str, value: &Value, block: Option<&str>) -> Vec<(String, String)> {
    let int = |key: &str| {
        value[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} in {value}"))
    };
    let mut out: Vec<(String, Value)> = match step {
        "Root" => (0..int("n"))
            .map(|i| ("Child".to_string(), json!({"i": i})))
            .collect(),
        "Child" => {
            let i = int("i");
            (0..1 + i % 2)
                .map(|j| ("Grand".to_string(), json!({"i": i, "j": j})))
                .collect()
        }
        _ => Vec::new(),
    };
    if step == "Root" && block == Some("finally") {
        out.push(("Grand".to_string(), json!({"i": 1, "j": 99})));
    }
    let mut out: Vec<(String, String)> = out.into_iter().map(|(s, v)| (s, v.to_string())).collect();
    out.sort();
    out
}

fn expected_total(children: u64, block: Option<&str>) -> u64 {
    let grand: u64 = (0..children).map(|i| 1 + i % 2).sum();
    1 + children + grand + u64::from(block == Some("finally"))
}

// ---------------------------------------------------------------------------------------------
// Processes.

/// A workflow in a tempdir, its state dir, and the runner currently driving it. Dropping it
/// kills the runner and every hook it left behind.
struct Lab {
    dir: TempDir,
    wf: PathBuf,
    config: PathBuf,
    state: PathBuf,
    tag: String,
    children: u64,
    runner: Option<Child>,
    /// Runner processes started so far; the current one's output is `runner-<epoch>.log`.
    epoch: usize,
    run_recorded: bool,
}

impl Lab {
    fn new(children: u64, block: Option<&'static str>) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("drover-soak-")
            .tempdir()
            .unwrap();
        let wf = dir.path().join("wf");
        let config = write_workflow(&wf, block);
        let state = dir.path().join("state");
        let tag = dir.path().display().to_string();
        Self {
            dir,
            wf,
            config,
            state,
            tag,
            children,
            runner: None,
            epoch: 0,
            run_recorded: false,
        }
    }

    fn log_path(&self) -> PathBuf {
        self.wf.join("actions.log")
    }

    fn log_text(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn runner_log(&self, epoch: usize) -> PathBuf {
        self.dir.path().join(format!("runner-{epoch:04}.log"))
    }

    /// The last lines of the current runner's output, for failure messages.
    fn runner_tail(&self) -> String {
        let text = fs::read_to_string(self.runner_log(self.epoch)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn drover(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_drover"));
        for var in [
            "DROVER_CONFIG",
            "DROVER_STATE_DIR",
            "DROVER_POOL",
            "DROVER_ROOT",
            "DROVER_LOG_FORMAT",
        ] {
            command.env_remove(var);
        }
        command.env(TAG_VAR, &self.tag);
        command
    }

    fn spawn(&mut self, args: &[&str]) {
        assert!(self.runner.is_none(), "a runner is already live");
        self.epoch += 1;
        let out = File::create(self.runner_log(self.epoch)).unwrap();
        let child = self
            .drover()
            .args(args)
            .arg("--state-dir")
            .arg(&self.state)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("drover starts");
        self.runner = Some(child);
    }

    fn start(&mut self) {
        let children = format!("{{\"n\":{}}}", self.children);
        let config = self.config.display().to_string();
        self.spawn(&["run", "--config", &config, "--entrypoint-value", &children]);
    }

    /// `drover resume`; or `drover run` again if the kill came before the run was recorded.
    fn resume(&mut self) {
        if !self.run_recorded {
            self.run_recorded = run_recorded(&self.runner_log(self.epoch), &self.state);
        }
        if self.run_recorded {
            self.spawn(&["resume"]);
        } else {
            eprintln!("killed before the run was recorded: starting it again");
            self.start();
        }
    }

    fn runner_exited(&mut self) -> Option<ExitStatus> {
        self.runner.as_mut()?.try_wait().unwrap()
    }

    /// SIGKILLs the runner and every hook it left behind, then marks the log. Returns the
    /// runner's status (an exit code, not a signal, means it had finished on its own).
    fn kill_runner(&mut self) -> ExitStatus {
        let status = self.kill_runner_keeping_hooks();
        sweep(TAG_VAR, &self.tag).unwrap();
        self.mark_kill();
        status
    }

    /// SIGKILLs only the runner; the hooks it started live on (in their own process groups).
    fn kill_runner_keeping_hooks(&mut self) -> ExitStatus {
        let mut child = self.runner.take().expect("a live runner");
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
        // Not reaped yet (`try_wait` reaps an exited child and keeps its status), so the pid
        // cannot have been recycled.
        if child.try_wait().unwrap().is_none() {
            kill(pid, Signal::SIGKILL).unwrap();
        }
        child.wait().unwrap()
    }

    /// Starts a new epoch in the log: everything after this line ran under the next runner.
    fn mark_kill(&self) {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        writeln!(log, "# kill after runner {}", self.epoch).unwrap();
    }

    /// Waits for the runner to exit on its own.
    fn wait_runner(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.runner_exited() {
                self.runner = None;
                sweep(TAG_VAR, &self.tag).unwrap();
                return status;
            }
            if Instant::now() > deadline {
                let tail = self.runner_tail();
                self.kill_runner();
                panic!("the runner did not finish within {limit:?}; its output:\n{tail}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until `done` holds; fails if the runner exits first or nothing happens in time.
    fn wait_for(&mut self, what: &str, mut done: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + PROGRESS_DEADLINE;
        while !done(self) {
            if let Some(status) = self.runner_exited() {
                panic!(
                    "the runner exited ({status}) while waiting for {what}; its output:\n{}",
                    self.runner_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "waited {PROGRESS_DEADLINE:?} for {what}; runner output:\n{}",
                self.runner_tail()
            );
            std::thread::sleep(POLL);
        }
    }

    fn inspect_json(&self, args: &[&str]) -> Value {
        let output = self
            .drover()
            .arg("inspect")
            .args(args)
            .arg("--json")
            .arg("--state-dir")
            .arg(&self.state)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "drover inspect {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).expect("inspect --json prints JSON")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut child) = self.runner.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = sweep(TAG_VAR, &self.tag);
    }
}

// ---------------------------------------------------------------------------------------------
// What the store says.

struct Recorded {
    run_id: u128,
    run: RunV2,
    tasks: BTreeMap<u128, TaskV1>,
    open_children: HashMap<u128, u64>,
    transitions: HashMap<u128, Vec<(u64, TransitionV2)>>,
    children: HashMap<u128, Vec<u128>>,
}

impl Recorded {
    fn load(state: &Path) -> Self {
        let store = Store::open(state).expect("the state store opens");
        let reader = store.read().unwrap();
        let runs = reader.runs().unwrap();
        assert_eq!(runs.len(), 1, "exactly one run was recorded");
        let (run_id, run) = runs.into_iter().next().unwrap();
        let mut tasks = BTreeMap::new();
        reader
            .for_each_task(run_id, |id, task| {
                assert!(tasks.insert(id, task).is_none(), "task {} twice", Ulid(id));
            })
            .unwrap();
        let mut transitions: HashMap<u128, Vec<(u64, TransitionV2)>> = HashMap::new();
        let mut last_seq = None;
        reader
            .for_each_transition(run_id, |seq, t| {
                assert!(last_seq < Some(seq), "transition sequence not increasing");
                last_seq = Some(seq);
                transitions.entry(t.task).or_default().push((seq, t));
            })
            .unwrap();
        assert!(
            last_seq.is_none_or(|seq| seq < run.next_transition),
            "a transition beyond the run's counter"
        );
        for (&id, task) in &tasks {
            let indexed = reader.task_transitions(run_id, id).unwrap();
            assert_eq!(
                Some(&indexed),
                transitions.get(&id),
                "the per-task transition index disagrees with the run's transitions for {} ({})",
                Ulid(id),
                task.step
            );
            for (seq, log) in reader.hook_logs(run_id, id).unwrap() {
                assert_eq!(
                    log.outcome,
                    "exit code 0",
                    "hook log #{seq} of task {} ({} {}): {log:?}",
                    Ulid(id),
                    task.step,
                    task.value
                );
            }
        }
        for id in transitions.keys() {
            assert!(tasks.contains_key(id), "transitions of unknown task {id}");
        }
        let open_children = tasks
            .keys()
            .map(|&id| (id, reader.open_children(run_id, id).unwrap()))
            .collect();
        let mut children: HashMap<u128, Vec<u128>> = HashMap::new();
        for (&id, task) in &tasks {
            if let Some(parent) = task.parent {
                assert!(
                    tasks.contains_key(&parent),
                    "task {} lost its parent",
                    Ulid(id)
                );
                children.entry(parent).or_default().push(id);
            }
        }
        Self {
            run_id,
            run,
            tasks,
            open_children,
            transitions,
            children,
        }
    }

    fn describe(&self, id: u128) -> String {
        let task = &self.tasks[&id];
        format!("{} ({} {})", Ulid(id), task.step, task.value)
    }

    fn descendants(&self, id: u128) -> Vec<u128> {
        let mut out = Vec::new();
        let mut stack = vec![id];
        while let Some(next) = stack.pop() {
            for &child in self.children.get(&next).into_iter().flatten() {
                out.push(child);
                stack.push(child);
            }
        }
        out
    }

    fn seq_of(&self, id: u128, stage: Stage) -> u64 {
        self.transitions[&id]
            .iter()
            .find(|(_, t)| t.to == stage)
            .map(|(seq, _)| *seq)
            .unwrap_or_else(|| panic!("{} never reached {stage:?}", self.describe(id)))
    }

    /// Everything issue 5 promises about the store after a run that was killed and resumed.
    fn check(&self, children: u64, block: Option<&str>) {
        let expected = expected_total(children, block);
        let run = &self.run;
        assert_eq!(run.status, RunStatus::Completed, "run status: {run:?}");
        assert_eq!(run.tasks_total, expected, "tasks_total: {run:?}");
        assert_eq!(run.tasks_completed, expected, "tasks_completed: {run:?}");
        assert_eq!(run.tasks_failed, 0, "tasks_failed: {run:?}");
        assert_eq!(run.tasks_open, 0, "tasks_open: {run:?}");
        assert!(
            run.ended_ms.is_some(),
            "a completed run has an end: {run:?}"
        );
        assert_eq!(self.tasks.len() as u64, expected, "tasks stored");

        let roots: Vec<u128> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.parent.is_none())
            .map(|(&id, _)| id)
            .collect();
        assert_eq!(roots.len(), 1, "exactly one root task");
        let root = &self.tasks[&roots[0]];
        assert_eq!(root.step, "Root");
        assert_eq!(
            serde_json::from_str::<Value>(&root.value).unwrap(),
            json!({"n": children})
        );

        for (&id, task) in &self.tasks {
            let what = self.describe(id);
            assert_eq!(task.phase, Phase::Completed, "{what}: {task:?}");
            assert_eq!(task.attempt, 1, "{what} needed no retry: {task:?}");
            assert_eq!(self.open_children[&id], 0, "{what}: {task:?}");
            assert_eq!(task.error, None, "{what}: {task:?}");
            let finally = if has_finally(&task.step) {
                FinallyState::Done
            } else {
                FinallyState::None
            };
            assert_eq!(task.finally, finally, "{what}: {task:?}");

            // Each parent has exactly the children its action (and a finally) emitted: none
            // lost, none duplicated by a rerun.
            let value: Value = serde_json::from_str(&task.value).unwrap();
            let mut got: Vec<(String, String)> = self
                .children
                .get(&id)
                .into_iter()
                .flatten()
                .map(|c| {
                    let child = &self.tasks[c];
                    let value: Value = serde_json::from_str(&child.value).unwrap();
                    (child.step.clone(), value.to_string())
                })
                .collect();
            got.sort();
            assert_eq!(
                got,
                expected_children(&task.step, &value, block),
                "children of {what}"
            );

            // The transitions: exactly the lifecycle, once, as a chain.
            let transitions = &self.transitions[&id];
            let mut stages = vec![
                Stage::Phase(Phase::Queued),
                Stage::Phase(Phase::Pre),
                Stage::Phase(Phase::Action),
                Stage::Phase(Phase::Post),
                Stage::Phase(Phase::Completed),
            ];
            if has_finally(&task.step) {
                stages.extend([Stage::FinallyRunning, Stage::FinallyDone]);
            }
            let got: Vec<Stage> = transitions.iter().map(|(_, t)| t.to).collect();
            assert_eq!(got, stages, "transitions of {what}: {transitions:#?}");
            let mut from = None;
            for (seq, t) in transitions {
                assert_eq!(t.from, from, "transition #{seq} of {what} breaks the chain");
                assert_eq!(t.attempt, 1, "transition #{seq} of {what}");
                assert_eq!(t.task, id);
                from = Some(t.to);
            }
            assert_eq!(
                transitions
                    .iter()
                    .filter(|(_, t)| t.to == Stage::FinallyDone)
                    .count(),
                usize::from(has_finally(&task.step)),
                "FinallyDone of {what}"
            );

            // Causality: a child is created when its parent completes (or, for a finally
            // sibling, later); a finally runs after every descendant's last transition.
            if let Some(parent) = task.parent {
                let created = transitions[0].0;
                let parent_done = self.seq_of(parent, Stage::Phase(Phase::Completed));
                assert!(
                    created > parent_done,
                    "{what} created (#{created}) before its parent completed (#{parent_done})"
                );
            }
            if has_finally(&task.step) {
                let started = self.seq_of(id, Stage::FinallyRunning);
                for d in self.descendants(id) {
                    let last = self.transitions[&d].last().unwrap().0;
                    assert!(
                        last < started,
                        "finally of {what} started (#{started}) before descendant {} was done (#{last})",
                        self.describe(d)
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What the log says.

#[derive(Debug, Clone)]
struct Entry {
    line: usize,
    epoch: usize,
    phase: usize,
    task: u128,
}

fn parse_log(text: &str, recorded: &Recorded) -> Vec<Entry> {
    let mut epoch = 0;
    let mut out = Vec::new();
    for (line, text) in text.lines().enumerate() {
        if text.starts_with('#') {
            epoch += 1;
            continue;
        }
        let fields: Vec<&str> = text.split(' ').collect();
        assert_eq!(fields.len(), 4, "log line {line} is malformed: {text:?}");
        let phase = PHASES
            .iter()
            .position(|p| *p == fields[0])
            .unwrap_or_else(|| panic!("log line {line}: unknown phase in {text:?}"));
        let task = Ulid::from_string(fields[1])
            .unwrap_or_else(|e| panic!("log line {line}: bad task id in {text:?}: {e}"))
            .0;
        let stored = recorded
            .tasks
            .get(&task)
            .unwrap_or_else(|| panic!("log line {line}: {text:?} names a task the store lacks"));
        assert_eq!(
            fields[2], "1",
            "log line {line}: {text:?}: a rerun keeps the attempt number"
        );
        assert_eq!(fields[3], stored.step, "log line {line}: {text:?}");
        out.push(Entry {
            line,
            epoch,
            phase,
            task,
        });
    }
    out
}

#[derive(Debug, Default)]
struct LogStats {
    runs: [usize; 4],
    /// Runs of a (phase, task) already seen in an earlier epoch: phases cut short by a kill.
    reruns: [usize; 4],
}

/// At-least-once, at most once per runner, in lifecycle order, and re-runs bounded by what a
/// kill can have cut short.
fn check_log(entries: &[Entry], recorded: &Recorded, kills: usize) -> LogStats {
    let mut stats = LogStats::default();
    let mut seen_in_epoch: HashSet<(usize, usize, u128)> = HashSet::new();
    let mut first_epoch: HashMap<(usize, u128), usize> = HashMap::new();
    let mut slot_reruns_by_epoch: HashMap<usize, HashSet<u128>> = HashMap::new();
    let mut last_phase: HashMap<u128, usize> = HashMap::new();
    let mut first_line: HashMap<(usize, u128), usize> = HashMap::new();
    let mut any_first_line: HashMap<u128, usize> = HashMap::new();
    let mut last_line: HashMap<u128, usize> = HashMap::new();
    for e in entries {
        let what = format!(
            "{} of {} (log line {})",
            PHASES[e.phase],
            recorded.describe(e.task),
            e.line
        );
        assert!(
            seen_in_epoch.insert((e.epoch, e.phase, e.task)),
            "{what} ran twice under one runner"
        );
        stats.runs[e.phase] += 1;
        let first = *first_epoch.entry((e.phase, e.task)).or_insert(e.epoch);
        if first < e.epoch {
            stats.reruns[e.phase] += 1;
            if e.phase != FINALLY {
                slot_reruns_by_epoch
                    .entry(e.epoch)
                    .or_default()
                    .insert(e.task);
            }
        }
        let previous = last_phase.insert(e.task, e.phase).unwrap_or(0);
        assert!(
            previous <= e.phase,
            "{what} ran after its {} had: the lifecycle went backwards",
            PHASES[previous]
        );
        first_line.entry((e.phase, e.task)).or_insert(e.line);
        any_first_line.entry(e.task).or_insert(e.line);
        last_line.insert(e.task, e.line);
    }

    for (&id, task) in &recorded.tasks {
        for (phase, name) in PHASES.iter().enumerate() {
            let ran = first_epoch.contains_key(&(phase, id));
            let should = phase != FINALLY || has_finally(&task.step);
            assert_eq!(
                ran,
                should,
                "{name} of {} ran: {ran}, expected: {should}",
                recorded.describe(id)
            );
        }
        // A child starts after its parent's post hook started (it is created when the parent
        // completes); a finally starts after everything below it ran.
        if let Some(parent) = task.parent {
            let parent_post = first_line[&(2, parent)];
            assert!(
                any_first_line[&id] > parent_post,
                "{} ran before its parent's post hook",
                recorded.describe(id)
            );
        }
        if has_finally(&task.step) {
            let finally = first_line[&(FINALLY, id)];
            for d in recorded.descendants(id) {
                assert!(
                    last_line[&d] < finally,
                    "the finally of {} started before descendant {} stopped running",
                    recorded.describe(id),
                    recorded.describe(d)
                );
            }
        }
    }

    for (epoch, tasks) in &slot_reruns_by_epoch {
        assert!(
            tasks.len() <= MAX_CONCURRENCY,
            "runner {} re-ran phases of {} tasks, but at most {MAX_CONCURRENCY} can be in flight",
            epoch + 1,
            tasks.len()
        );
    }
    let tasks = recorded.tasks.len();
    let slot_runs: usize = stats.runs[..FINALLY].iter().sum();
    assert!(
        stats.runs[1] <= tasks + kills * MAX_CONCURRENCY,
        "{} action runs for {tasks} tasks and {kills} kills",
        stats.runs[1]
    );
    assert!(
        slot_runs <= 3 * tasks + kills * MAX_CONCURRENCY,
        "{slot_runs} pre/action/post runs for {tasks} tasks and {kills} kills"
    );
    let finally_tasks = recorded
        .tasks
        .values()
        .filter(|t| has_finally(&t.step))
        .count();
    assert!(
        stats.runs[FINALLY] <= finally_tasks * (kills + 1),
        "{} finally runs for {finally_tasks} finally hooks and {kills} kills",
        stats.runs[FINALLY]
    );
    stats
}

fn check_inspect(lab: &Lab, recorded: &Recorded) {
    let id = Ulid(recorded.run_id).to_string();
    let report = lab.inspect_json(&[&id, "--tree"]);
    assert_eq!(report["run"]["status"], "completed", "{report:#}");
    assert_eq!(report["run"]["tasks_total"], recorded.run.tasks_total);
    let rows = report["tree"].as_array().map_or(0, Vec::len);
    assert_eq!(rows as u64, recorded.run.tasks_total);
}

// ---------------------------------------------------------------------------------------------
// The soak.

/// Follows the log as it grows: how many distinct (phase, task) runs have started so far —
/// progress through the workflow, not counting re-runs.
#[derive(Default)]
struct Progress {
    offset: usize,
    seen: HashSet<String>,
}

impl Progress {
    fn update(&mut self, log: &Path) -> usize {
        let mut bytes = Vec::new();
        if let Ok(mut file) = File::open(log) {
            // Only what was appended since the last look.
            file.seek(SeekFrom::Start(self.offset as u64)).unwrap();
            file.read_to_end(&mut bytes).unwrap();
        }
        let complete = bytes
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |end| end + 1);
        for line in String::from_utf8_lossy(&bytes[..complete]).lines() {
            if !line.starts_with('#') {
                let key: Vec<&str> = line.split(' ').take(2).collect();
                self.seen.insert(key.join(" "));
            }
        }
        self.offset += complete;
        self.seen.len()
    }
}

struct Soak {
    children: u64,
    kills: usize,
    /// Half the kills come after a random delay of up to this long (cut short at the kill's
    /// progress point); they land anywhere, including in startup and commits.
    max_delay_ms: u64,
    /// How long the last resume may take to finish the run (a hang is a failure).
    finish_within: Duration,
}

fn soak(params: Soak) {
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            (nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)
        });
    eprintln!(
        "soak: seed {seed} (replay with SOAK_SEED={seed}), {} kills",
        params.kills
    );
    let mut rng = Rng(seed);

    // Kill points spread over the whole run, as progress through it: every phase, the finally
    // hooks at the end included, gets its share. The last point leaves work undone (the
    // children's last finally hooks and the root's), so the budget is always spent before the
    // run can end on its own.
    let tasks = expected_total(params.children, None);
    let finally_tasks = 1 + params.children;
    let runs = usize::try_from(3 * tasks + finally_tasks).unwrap();
    let last_point = runs - usize::try_from(params.children / 10 + 4).unwrap();
    let mut points: Vec<usize> = (0..params.kills)
        .map(|_| rng.range(1, last_point as u64) as usize)
        .collect();
    points.sort_unstable();

    let began = Instant::now();
    let mut lab = Lab::new(params.children, None);
    let mut progress = Progress::default();
    lab.start();
    let mut kills = 0;
    let mut after_delay = 0;
    let mut finished_early = None;
    for &point in &points {
        let waited = Instant::now();
        let delay = rng
            .next()
            .is_multiple_of(2)
            .then(|| Duration::from_millis(rng.range(0, params.max_delay_ms)));
        after_delay += usize::from(delay.is_some());
        let deadline = Instant::now() + PROGRESS_DEADLINE;
        loop {
            if lab.runner_exited().is_some()
                || progress.update(&lab.log_path()) >= point
                || delay.is_some_and(|d| waited.elapsed() >= d)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "seed {seed}: no progress to {point} in {PROGRESS_DEADLINE:?}; runner output:\n{}",
                lab.runner_tail()
            );
            std::thread::sleep(POLL);
        }
        let status = lab.kill_runner();
        if status.code().is_some() {
            // Ended on its own: the checks below say whether it did its work; then the kill
            // budget is found short.
            eprintln!("soak: runner {} exited on its own ({status})", lab.epoch);
            finished_early = Some(status);
            break;
        }
        kills += 1;
        lab.resume();
    }
    let status = match finished_early {
        Some(status) => status,
        None => lab.wait_runner(params.finish_within),
    };
    assert_eq!(
        status.code(),
        Some(0),
        "seed {seed}: the last runner failed ({status}); its output:\n{}",
        lab.runner_tail()
    );

    let recorded = Recorded::load(&lab.state);
    recorded.check(params.children, None);
    let entries = parse_log(&lab.log_text(), &recorded);
    let stats = check_log(&entries, &recorded, kills);
    check_inspect(&lab, &recorded);
    assert_eq!(
        kills, params.kills,
        "seed {seed}: the run ended on its own after {kills} kills, before its last kill point"
    );
    eprintln!(
        "soak: seed {seed}: {kills} kills ({after_delay} after a delay), {} tasks, \
         runs pre/action/post/finally {:?}, re-runs {:?}, {} runners, {:.1}s",
        recorded.tasks.len(),
        stats.runs,
        stats.reruns,
        lab.epoch,
        began.elapsed().as_secs_f64()
    );
}

#[test]
fn soak_20_kills() {
    soak(Soak {
        children: 60,
        kills: 20,
        max_delay_ms: 300,
        finish_within: Duration::from_secs(180),
    });
}

#[test]
#[ignore = "long soak (200 kills, minutes); run with --release --ignored"]
fn soak_200_kills() {
    soak(Soak {
        children: 400,
        kills: 200,
        max_delay_ms: 200,
        finish_within: Duration::from_secs(900),
    });
}

// ---------------------------------------------------------------------------------------------
// One kill at an exact point.

fn kill_while_blocked(phase: &'static str) {
    let children = 3;
    let mut lab = Lab::new(children, Some(phase));
    lab.start();
    let marker = lab.wf.join("block.pid");
    lab.wait_for(
        &format!("the {phase} hook of Child {{\"i\":1}} to block"),
        |_| marker.exists(),
    );
    let hook: i32 = fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
    let group = getpgid(Some(Pid::from_raw(hook))).expect("the blocked hook is alive");
    let status = lab.kill_runner_keeping_hooks();
    assert_eq!(status.signal(), Some(9), "the runner was killed");
    match killpg(group, Signal::SIGKILL) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => panic!("cannot kill the hook's process group: {e}"),
    }
    sweep(TAG_VAR, &lab.tag).unwrap();
    lab.mark_kill();
    fs::write(lab.wf.join("release"), "").unwrap();
    lab.resume();
    let status = lab.wait_runner(PROGRESS_DEADLINE);
    assert_eq!(
        status.code(),
        Some(0),
        "the resume failed ({status}); its output:\n{}",
        lab.runner_tail()
    );

    let recorded = Recorded::load(&lab.state);
    recorded.check(children, Some(phase));
    let entries = parse_log(&lab.log_text(), &recorded);
    check_log(&entries, &recorded, 1);
    check_inspect(&lab, &recorded);

    let chosen: Vec<u128> = recorded
        .tasks
        .iter()
        .filter(|(_, t)| t.step == "Child" && t.value == r#"{"i":1}"#)
        .map(|(&id, _)| id)
        .collect();
    assert_eq!(chosen.len(), 1, "one Child {{\"i\":1}}");
    let chosen = chosen[0];
    let blocked = PHASES.iter().position(|p| *p == phase).unwrap();
    for (index, name) in PHASES.iter().enumerate() {
        let epochs: Vec<usize> = entries
            .iter()
            .filter(|e| e.task == chosen && e.phase == index)
            .map(|e| e.epoch)
            .collect();
        let expected = if index == blocked {
            // Cut short by the kill, run again by the resume (same attempt: parse_log checks).
            vec![0, 1]
        } else if index < blocked {
            // Recorded before the kill: not repeated.
            vec![0]
        } else {
            vec![1]
        };
        assert_eq!(
            epochs,
            expected,
            "runners that ran the {name} of {}",
            recorded.describe(chosen)
        );
    }
}

#[test]
fn kill_during_pre_hook_reruns_it_once() {
    kill_while_blocked("pre");
}

#[test]
fn kill_during_post_hook_reruns_it_once() {
    kill_while_blocked("post");
}

#[test]
fn kill_during_finally_hook_reruns_it_once() {
    kill_while_blocked("finally");
}
