//! Issue 5: SIGKILL the runner while Pool tasks are out with real agents — resume re-attaches
//! them, answers given while the runner was dead are used, nothing is settled twice.
//!
//! CONTRACT.md §3 (finally once all descendants settled, counters stored), §4 (the pool
//! persists its queue and assignments; a task is identified by (run, task, attempt) and
//! submitting it again is idempotent), §5 (`resume` re-attaches a pool task still held by the
//! pool instead of dispatching it again; hooks and Command actions are at-least-once) and §6
//! (every transition is a record).
//!
//! The workflow: `Root` (a Command action) emits `Analyze {"i": k}` for k in 0..N; each Analyze
//! (a Pool task) is answered with one `Fix {"i": k}` when k is odd and `[]` otherwise; `Fix` (a
//! Pool task) is answered with `[]`. Root and Analyze have a `finally` hook that appends
//! `finally <task id> <step>` to `finally.log` and prints `[]`; the root's, the last thing the
//! run does, first waits for the test's release file, so the run cannot end before the last
//! planned kill.
//!
//! A real `drover-pool start` daemon and five `drover-pool agent` processes stay up for the
//! whole test. The agents' command waits a small random time (`sleep 0.0X`), appends
//! `answered <task id> <attempt> <agent>` to `agents.log`, then prints the answer. The runner
//! (`drover run`, then `drover resume` after every kill) is SIGKILLed at seeded pseudo-random
//! moments (the seed is printed; `SOAK_SEED=N` replays the kill schedule, not the agents'
//! delays; `SOAK_KEEP=1` keeps the temporary directory with the logs and the state): each kill waits for a seeded point of progress — distinct answers and finally hooks
//! in the two logs, polled, and at least one more since the runner started — or, for about a
//! quarter of them, for a random delay since the runner started if that comes first (kills
//! during startup and re-attachment). After every third kill the runner stays dead until the
//! agents have answered everything the pool held (polled through `drover-pool status`), so
//! answers wait in the pool for the resumed runner. Then the release file is written and the
//! last resume must run the workflow to its end (exit 0), and then:
//!
//! - the store: every task completed exactly once (one transition into `completed`), the task
//!   counts and values are exactly what the deterministic answers produce, no parent has two
//!   children with the same value, every finally reached `FinallyDone` exactly once and after
//!   everything below it (the hook itself may have run more than once: at-least-once);
//! - the agents' log: every (task id, attempt) was answered at most once — no task the pool
//!   had handed out was dispatched again by a resumed runner — and a task answered in two
//!   attempts has a retry recorded in the store (and, as nothing in this workflow can fail, no
//!   retry is recorded at all).
//!
//! `soak_pool_20_kills` runs by default; `soak_pool_200_kills` is `#[ignore]`d, by hand:
//! `cargo test --release --test soak_pool -- --ignored --nocapture`.
//!
//! Every process the test starts is owned by a guard that kills it on drop; hooks orphaned by a
//! killed runner (and agent commands orphaned by a killed agent) are found through /proc by a
//! tag in their environment and killed too. Linux only.
#![cfg(target_os = "linux")]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use drover::store::{FinallyState, Phase, RunStatus, RunV2, Stage, Store, TaskV1, TransitionV2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tempfile::TempDir;
use ulid::Ulid;

mod common;
use common::soak::{Rng, run_recorded, sweep};

/// Tasks in pre/action/post at once: more than there are agents, so agents rarely idle, and
/// few enough that the pool's queue drains soon after a kill and progress needs the runner.
const MAX_CONCURRENCY: usize = 8;
const AGENTS: usize = 5;

/// How often conditions are polled. Polling only; no assertion depends on it.
const POLL: Duration = Duration::from_millis(2);
/// Generous bound for conditions that normally hold within a second.
const PROGRESS_DEADLINE: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// The workflow.

/// Root's action: `{"n": N}` → `[Analyze {"i": 0}, …, Analyze {"i": N-1}]`.
const ROOT_SH: &str = r#"input=$(cat)
n=$(printf '%s' "$input" | sed -n 's/.*"n":\([0-9][0-9]*\).*/\1/p')
i=0; sep=''
printf '['
while [ "$i" -lt "$n" ]; do
  printf '%s{"kind":"Analyze","value":{"i":%d}}' "$sep" "$i"; sep=','; i=$((i + 1))
done
printf ']\n'
"#;

/// The finally hook of Root — the last thing the run does — waits for the test's release file,
/// so the run cannot end before every planned kill has landed. The wait is bounded (30 min),
/// and over once the test's directory is gone, so an orphaned hook ends by itself.
const FINALLY_SH: &str = r#"cat >/dev/null
printf 'finally %s %s\n' "$DROVER_TASK_ID" "$DROVER_STEP" >> finally.log
if [ "$DROVER_STEP" = Root ]; then
  i=0
  while [ ! -e "$RELEASE" ] && [ -d "${RELEASE%/*}" ] && [ "$i" -lt 180000 ]; do
    sleep 0.01; i=$((i + 1))
  done
fi
printf '[]\n'
"#;

/// The agents' command (`sh -c`): stdin is the task message `get-task` prints.
const AGENT_SH: &str = r#"input=$(cat)
kind=$(printf '%s' "$input" | sed -n 's/.*"task":{"kind":"\([A-Za-z]*\)","value":{"i":\([0-9]*\)}.*/\1/p')
i=$(printf '%s' "$input" | sed -n 's/.*"task":{"kind":"\([A-Za-z]*\)","value":{"i":\([0-9]*\)}.*/\2/p')
r=$(od -An -N1 -tu1 /dev/urandom | tr -d ' ')
sleep "0.0$((r % 10))"
case "$kind" in
  Analyze)
    if [ $((i % 2)) -eq 1 ]; then answer="[{\"kind\":\"Fix\",\"value\":{\"i\":$i}}]"; else answer='[]'; fi;;
  Fix) answer='[]';;
  *) echo "unexpected task message: $input" >&2; exit 1;;
esac
printf 'answered %s %s %s\n' "$DROVER_TASK_ID" "$DROVER_ATTEMPT" "$DROVER_AGENT_NAME" >> "$AGENTS_LOG"
printf '%s\n' "$answer"
"#;

fn write_workflow(dir: &Path) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("root.sh"), ROOT_SH).unwrap();
    fs::write(dir.join("finally.sh"), FINALLY_SH).unwrap();
    let finally = json!({"kind": "Command", "script": "sh ./finally.sh"});
    let item = json!({
        "type": "object",
        "required": ["i"],
        "properties": {"i": {"type": "integer", "minimum": 0}},
        "additionalProperties": false
    });
    let config = json!({
        "entrypoint": "Root",
        // A retry would hide a lost or doubly dispatched task as an ordinary failure; allowing
        // one lets the run end so the checks can say exactly which task it was.
        "options": {"max_concurrency": MAX_CONCURRENCY, "max_retries": 1},
        "steps": [
            {
                "name": "Root",
                "value_schema": {"type": "object", "required": ["n"]},
                "action": {"kind": "Command", "script": "sh ./root.sh"},
                "next": ["Analyze"],
                "finally": finally,
            },
            {
                "name": "Analyze",
                "value_schema": item,
                "action": {"kind": "Pool", "instructions": "Analyze item i; odd items need a Fix."},
                "next": ["Fix"],
                "finally": finally,
            },
            {
                "name": "Fix",
                "value_schema": item,
                "action": {"kind": "Pool", "instructions": "Fix item i."},
                "next": [],
            },
        ],
    });
    let path = dir.join("workflow.json");
    fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    path
}

fn has_finally(step: &str) -> bool {
    matches!(step, "Root" | "Analyze")
}

/// What the deterministic answers produce from `items` Analyze tasks.
struct Expected {
    items: u64,
}

impl Expected {
    fn fixes(&self) -> u64 {
        self.items / 2
    }

    fn tasks(&self) -> u64 {
        1 + self.items + self.fixes()
    }

    /// Pool tasks: one answer each.
    fn answers(&self) -> u64 {
        self.items + self.fixes()
    }

    fn finallies(&self) -> u64 {
        1 + self.items
    }

    /// The children a task must have, as sorted (step, value) pairs.
    fn children(&self, step: &str, value: &Value) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = match step {
            "Root" => (0..self.items)
                .map(|i| ("Analyze".to_string(), json!({"i": i}).to_string()))
                .collect(),
            "Analyze" => {
                let i = value["i"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("i in {value}"));
                if i % 2 == 1 {
                    vec![("Fix".to_string(), json!({"i": i}).to_string())]
                } else {
                    Vec::new()
                }
            }
            _ => Vec::new(),
        };
        out.sort();
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Processes.

/// A long-lived process (the daemon, an agent) whose output goes to a file. SIGKILLed when
/// dropped.
struct Proc {
    child: Child,
    label: String,
    err: PathBuf,
}

impl Proc {
    fn spawn(mut command: Command, logs: &Path, label: &str) -> Proc {
        let out = logs.join(format!("{label}.out"));
        let err = logs.join(format!("{label}.err"));
        let child = command
            .stdin(Stdio::null())
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(&err).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("`{label}` starts: {e}"));
        Proc {
            child,
            label: label.to_string(),
            err,
        }
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    #[track_caller]
    fn assert_alive(&mut self) {
        if let Some(status) = self.exited() {
            panic!(
                "`{}` exited ({status}); stderr:\n{}",
                self.label,
                fs::read_to_string(&self.err).unwrap_or_default()
            );
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Marks the runner and everything it starts (hooks, Command actions).
const RUNNER_TAG: &str = "DROVER_SOAK_RUNNER";
/// Marks the agents and the commands they run.
const AGENT_TAG: &str = "DROVER_SOAK_AGENT";

/// The pool (daemon and agents, up all along), the workflow, the state directory and the
/// runner currently driving the run. Dropping it kills all of them and what they left behind.
struct Lab {
    dir: TempDir,
    wf: PathBuf,
    config: PathBuf,
    state: PathBuf,
    tag: String,
    items: u64,
    runner: Option<Child>,
    /// Runner processes started so far; the current one's output is `runner-<epoch>.log`.
    epoch: usize,
    run_recorded: bool,
    agents: Vec<Proc>,
    daemon: Option<Proc>,
}

impl Lab {
    fn new(items: u64) -> Self {
        // Short: the pool socket path must fit in a sockaddr_un.
        let mut dir = tempfile::Builder::new().prefix("dsp").tempdir().unwrap();
        if std::env::var_os("SOAK_KEEP").is_some() {
            dir.disable_cleanup(true);
            eprintln!("soak: SOAK_KEEP is set: keeping {}", dir.path().display());
        }
        let wf = dir.path().join("wf");
        let config = write_workflow(&wf);
        fs::create_dir(dir.path().join("logs")).unwrap();
        let state = dir.path().join("state");
        let tag = dir.path().display().to_string();
        let mut lab = Self {
            dir,
            wf,
            config,
            state,
            tag,
            items,
            runner: None,
            epoch: 0,
            run_recorded: false,
            agents: Vec::new(),
            daemon: None,
        };
        lab.start_pool();
        lab
    }

    fn root(&self) -> &str {
        self.dir.path().to_str().expect("a UTF-8 temp path")
    }

    fn logs(&self) -> PathBuf {
        self.dir.path().join("logs")
    }

    fn agents_log(&self) -> PathBuf {
        self.dir.path().join("agents.log")
    }

    fn finally_log(&self) -> PathBuf {
        self.wf.join("finally.log")
    }

    /// Lets the root's finally hook end, and with it the run.
    fn release(&self) -> PathBuf {
        self.dir.path().join("release")
    }

    /// `BIN` with no drover location inherited from the environment.
    fn command(&self, bin: &str) -> Command {
        let mut command = Command::new(bin);
        for var in [
            "DROVER_CONFIG",
            "DROVER_STATE_DIR",
            "DROVER_POOL",
            "DROVER_ROOT",
            "DROVER_LOG_FORMAT",
            "RUST_LOG",
        ] {
            command.env_remove(var);
        }
        command.current_dir(self.dir.path());
        command
    }

    fn pool_command(&self, args: &[&str]) -> Command {
        let mut command = self.command(env!("CARGO_BIN_EXE_drover-pool"));
        command.args(args).arg("--root").arg(self.root());
        command
    }

    fn pool_status(&self) -> Option<Value> {
        let output = self
            .pool_command(&["status", "--json"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        if !output.status.success() {
            return None;
        }
        Some(serde_json::from_slice(&output.stdout).expect("status --json prints JSON"))
    }

    /// Starts the daemon and the agents and waits until every agent waits for a task.
    fn start_pool(&mut self) {
        let logs = self.logs();
        self.daemon = Some(Proc::spawn(self.pool_command(&["start"]), &logs, "daemon"));
        let names: Vec<String> = (0..AGENTS).map(|i| format!("agent{i}")).collect();
        for name in &names {
            let mut command = self.pool_command(&["agent", "--name", name]);
            command
                .args(["--", "sh", "-c", AGENT_SH])
                .env(AGENT_TAG, &self.tag)
                .env("AGENTS_LOG", self.agents_log());
            self.agents.push(Proc::spawn(command, &logs, name));
        }
        let deadline = Instant::now() + PROGRESS_DEADLINE;
        loop {
            self.assert_pool_alive();
            let idle = self.pool_status().is_some_and(|status| {
                let agents = status["agents"].as_array().expect("an agents array");
                names.iter().all(|name| {
                    agents
                        .iter()
                        .any(|a| a["name"] == name.as_str() && a["state"] == "idle")
                })
            });
            if idle {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the agents {names:?} did not all wait for tasks within {PROGRESS_DEADLINE:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[track_caller]
    fn assert_pool_alive(&mut self) {
        self.daemon.as_mut().unwrap().assert_alive();
        for agent in &mut self.agents {
            agent.assert_alive();
        }
    }

    /// With the runner dead: if the pool holds tasks (queued or at an agent), waits until the
    /// agents have answered all of them and returns how many answers wait for a runner.
    fn wait_pool_drained(&mut self, seed: u64) -> Option<u64> {
        let count = |status: &Value, key: &str| {
            status[key]
                .as_u64()
                .unwrap_or_else(|| panic!("`{key}` in pool status {status}"))
        };
        let status = self.pool_status().expect("the pool answers status");
        if count(&status, "queued") + count(&status, "assigned") == 0 {
            return None;
        }
        let deadline = Instant::now() + PROGRESS_DEADLINE;
        loop {
            self.assert_pool_alive();
            let status = self.pool_status().expect("the pool answers status");
            if count(&status, "queued") + count(&status, "assigned") == 0 {
                let undelivered = count(&status, "undelivered");
                assert!(
                    undelivered > 0,
                    "seed {seed}: the agents answered the pool's tasks while the runner was \
                     dead, but the pool holds no undelivered answer: {status}"
                );
                return Some(undelivered);
            }
            assert!(
                Instant::now() < deadline,
                "seed {seed}: the agents did not answer the pool's tasks within \
                 {PROGRESS_DEADLINE:?}: {status}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// With the runner dead: how many tasks the store has in their action, and how many
    /// finally hooks it has running (0, 0 before the run was recorded).
    fn in_flight(&self) -> (usize, usize) {
        let store = Store::open(&self.state).expect("the state store opens");
        let reader = store.read().unwrap();
        let Some((run, _)) = reader.runs().unwrap().into_iter().next() else {
            return (0, 0);
        };
        let (mut actions, mut finallies) = (0, 0);
        reader
            .for_each_task(run, |_, task| {
                actions += usize::from(task.phase == Phase::Action);
                finallies += usize::from(task.finally == FinallyState::Running);
            })
            .unwrap();
        (actions, finallies)
    }

    fn runner_log(&self, epoch: usize) -> PathBuf {
        self.logs().join(format!("runner-{epoch:04}.log"))
    }

    /// The last lines of the current runner's output, for failure messages.
    fn runner_tail(&self) -> String {
        let text = fs::read_to_string(self.runner_log(self.epoch)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn spawn_runner(&mut self, args: &[&str]) {
        assert!(self.runner.is_none(), "a runner is already live");
        self.epoch += 1;
        let out = File::create(self.runner_log(self.epoch)).unwrap();
        let child = self
            .command(env!("CARGO_BIN_EXE_drover"))
            .args(args)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--root")
            .arg(self.root())
            .env(RUNNER_TAG, &self.tag)
            .env("RELEASE", self.release())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("drover starts");
        self.runner = Some(child);
    }

    fn start(&mut self) {
        let value = json!({"n": self.items}).to_string();
        let config = self.config.display().to_string();
        self.spawn_runner(&["run", "--config", &config, "--entrypoint-value", &value]);
    }

    /// `drover resume`; or `drover run` again if the kill came before the run was recorded.
    fn resume(&mut self) {
        if !self.run_recorded {
            self.run_recorded = run_recorded(&self.runner_log(self.epoch), &self.state);
        }
        if self.run_recorded {
            self.spawn_runner(&["resume"]);
        } else {
            eprintln!("soak: killed before the run was recorded: starting it again");
            self.start();
        }
    }

    fn runner_exited(&mut self) -> Option<ExitStatus> {
        self.runner.as_mut()?.try_wait().unwrap()
    }

    /// SIGKILLs the runner only: its hooks live on (their own process groups), the daemon and
    /// the agents stay up. Returns the runner's status (an exit code, not a signal, means it
    /// had ended on its own).
    fn kill_runner(&mut self) -> ExitStatus {
        let mut child = self.runner.take().expect("a live runner");
        // Not reaped yet (`try_wait` keeps an exited child's status), so the pid cannot have
        // been recycled.
        if child.try_wait().unwrap().is_none() {
            let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
            kill(pid, Signal::SIGKILL).unwrap();
        }
        child.wait().unwrap()
    }

    /// Waits for the runner to end on its own.
    fn wait_runner(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.runner_exited() {
                self.runner = None;
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
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut child) = self.runner.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = sweep(RUNNER_TAG, &self.tag);
        self.agents.clear();
        let _ = sweep(AGENT_TAG, &self.tag);
        self.daemon = None;
    }
}

// ---------------------------------------------------------------------------------------------
// Progress: distinct answers and finally hooks started, then runs of the root's finally.

/// Follows a log as it grows.
#[derive(Default)]
struct Follow {
    offset: u64,
}

impl Follow {
    /// The complete lines appended since the last call.
    fn new_lines(&mut self, path: &Path) -> Vec<String> {
        let mut bytes = Vec::new();
        if let Ok(mut file) = File::open(path) {
            file.seek(SeekFrom::Start(self.offset)).unwrap();
            file.read_to_end(&mut bytes).unwrap();
        }
        // Only complete lines; the rest is read again next time.
        let complete = bytes
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |end| end + 1);
        self.offset += complete as u64;
        String::from_utf8_lossy(&bytes[..complete])
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// Progress through the run: distinct (task, attempt) answers, distinct tasks whose finally
/// started, and every run of the root's finally after its first (it blocks until the release,
/// and each resumed runner runs it again). Re-runs of other finally hooks do not count: a
/// resumed runner starts them all at once, and counting them would make kills cluster there.
#[derive(Default)]
struct Progress {
    answers: Follow,
    finallies: Follow,
    answered: HashSet<(String, String)>,
    finally_started: HashSet<String>,
    root_reruns: usize,
}

impl Progress {
    fn update(&mut self, lab: &Lab) -> usize {
        for line in self.answers.new_lines(&lab.agents_log()) {
            let fields: Vec<&str> = line.split(' ').collect();
            if let [_, task, attempt, ..] = fields[..] {
                self.answered
                    .insert((task.to_string(), attempt.to_string()));
            }
        }
        for line in self.finallies.new_lines(&lab.finally_log()) {
            let fields: Vec<&str> = line.split(' ').collect();
            if let [_, task, step, ..] = fields[..]
                && !self.finally_started.insert(task.to_string())
                && step == "Root"
            {
                self.root_reruns += 1;
            }
        }
        self.answered.len() + self.finally_started.len() + self.root_reruns
    }
}

// ---------------------------------------------------------------------------------------------
// What the store says.

struct Recorded {
    run: RunV2,
    tasks: BTreeMap<u128, TaskV1>,
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
        for (&id, task) in &tasks {
            let indexed = reader.task_transitions(run_id, id).unwrap();
            assert_eq!(
                Some(&indexed),
                transitions.get(&id),
                "the per-task transition index disagrees with the run's transitions for {} ({})",
                Ulid(id),
                task.step
            );
        }
        for id in transitions.keys() {
            assert!(
                tasks.contains_key(id),
                "transitions of unknown task {}",
                Ulid(*id)
            );
        }
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
            run,
            tasks,
            transitions,
            children,
        }
    }

    fn describe(&self, id: u128) -> String {
        let task = &self.tasks[&id];
        format!("{} ({} {})", Ulid(id), task.step, task.value)
    }

    fn transitions(&self, id: u128) -> &[(u64, TransitionV2)] {
        self.transitions.get(&id).map_or(&[], Vec::as_slice)
    }

    /// Sequence numbers of the transitions of `id` into `stage`.
    fn seqs(&self, id: u128, stage: Stage) -> Vec<u64> {
        self.transitions(id)
            .iter()
            .filter(|(_, t)| t.to == stage)
            .map(|(seq, _)| *seq)
            .collect()
    }

    /// Retries recorded for `id`: transitions back to `queued` from a phase.
    fn retries(&self, id: u128) -> Vec<&TransitionV2> {
        self.transitions(id)
            .iter()
            .filter(|(_, t)| t.to == Stage::Phase(Phase::Queued) && t.from.is_some())
            .map(|(_, t)| t)
            .collect()
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

    /// Every task settled exactly once, the tree is exactly the deterministic one, every
    /// finally recorded done exactly once and after everything below it.
    fn check(&self, expected: &Expected) {
        let run = &self.run;
        let total = expected.tasks();
        assert_eq!(run.status, RunStatus::Completed, "run status: {run:?}");
        assert_eq!(run.tasks_total, total, "tasks_total: {run:?}");
        assert_eq!(run.tasks_completed, total, "tasks_completed: {run:?}");
        assert_eq!(run.tasks_failed, 0, "tasks_failed: {run:?}");
        assert_eq!(run.tasks_open, 0, "tasks_open: {run:?}");
        assert_eq!(self.tasks.len() as u64, total, "tasks stored");

        let mut per_step: BTreeMap<&str, u64> = BTreeMap::new();
        for task in self.tasks.values() {
            *per_step.entry(task.step.as_str()).or_default() += 1;
        }
        let want: BTreeMap<&str, u64> = [
            ("Root", 1),
            ("Analyze", expected.items),
            ("Fix", expected.fixes()),
        ]
        .into_iter()
        .collect();
        assert_eq!(per_step, want, "tasks per step");

        let roots: Vec<u128> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.parent.is_none())
            .map(|(&id, _)| id)
            .collect();
        assert_eq!(roots.len(), 1, "exactly one root task");
        let root = roots[0];
        assert_eq!(self.tasks[&root].step, "Root");

        for (&id, task) in &self.tasks {
            let what = self.describe(id);
            assert_eq!(task.phase, Phase::Completed, "{what}: phase");
            assert_eq!(
                self.seqs(id, Stage::Phase(Phase::Completed)).len(),
                1,
                "{what} must have exactly one transition into `completed`: {:#?}",
                self.transitions(id)
            );
            assert!(
                self.seqs(id, Stage::Phase(Phase::Failed)).is_empty(),
                "{what} was recorded failed: {:#?}",
                self.transitions(id)
            );

            // No duplicated (or missing) children: grouped by parent, exactly the values the
            // deterministic answer names, each once.
            let value: Value = serde_json::from_str(&task.value).unwrap();
            let mut got: Vec<(String, String)> = self
                .children
                .get(&id)
                .into_iter()
                .flatten()
                .map(|c| (self.tasks[c].step.clone(), self.tasks[c].value.clone()))
                .collect();
            got.sort();
            let duplicated: Vec<&(String, String)> = got
                .windows(2)
                .filter(|w| w[0] == w[1])
                .map(|w| &w[0])
                .collect();
            assert!(
                duplicated.is_empty(),
                "{what} has duplicated children: {duplicated:?}"
            );
            assert_eq!(
                got,
                expected.children(&task.step, &value),
                "children of {what}"
            );

            let done = self.seqs(id, Stage::FinallyDone);
            let failed = self.seqs(id, Stage::FinallyFailed);
            if has_finally(&task.step) {
                assert_eq!(task.finally, FinallyState::Done, "{what}: finally state");
                assert_eq!(
                    done.len(),
                    1,
                    "the finally of {what} must be recorded done exactly once: {:#?}",
                    self.transitions(id)
                );
                assert!(failed.is_empty(), "the finally of {what} failed");
                // After everything below it was settled and finished.
                for d in self.descendants(id) {
                    let last = self
                        .transitions(d)
                        .iter()
                        .map(|(seq, _)| *seq)
                        .max()
                        .unwrap();
                    assert!(
                        last < done[0],
                        "the finally of {what} was recorded done (#{}) before descendant {} \
                         had finished (#{last})",
                        done[0],
                        self.describe(d)
                    );
                }
                let completed = self.seqs(id, Stage::Phase(Phase::Completed))[0];
                assert!(
                    completed < done[0],
                    "the finally of {what} before it completed"
                );
            } else {
                assert_eq!(task.finally, FinallyState::None, "{what}: finally state");
                assert!(
                    done.is_empty() && failed.is_empty(),
                    "{what} has no finally"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What the logs say.

#[derive(Debug, Default)]
struct LogStats {
    answers: usize,
    /// Tasks answered in more than one attempt.
    reanswered: usize,
    finally_runs: usize,
    /// Finally hooks that ran more than once (cut short by a kill, or done but not yet recorded).
    finally_reruns: usize,
}

/// `answered <task id> <attempt> <agent>` lines in `agents.log`, `finally <task id> <step>`
/// lines in `finally.log`.
///
/// Answers: each (task, attempt) at most once, every Pool
/// task answered, nothing answered twice without a recorded retry; every finally hook ran.
fn check_logs(lab: &Lab, recorded: &Recorded) -> LogStats {
    let text = fs::read_to_string(lab.agents_log()).unwrap_or_default();
    let mut by_task: HashMap<u128, BTreeMap<u32, Vec<usize>>> = HashMap::new();
    for (line, text) in text.lines().enumerate() {
        let fields: Vec<&str> = text.split(' ').collect();
        assert!(
            fields.len() == 4 && fields[0] == "answered",
            "agents.log line {} is malformed: {text:?}",
            line + 1
        );
        let task = Ulid::from_string(fields[1])
            .unwrap_or_else(|e| panic!("agents.log line {}: {text:?}: {e}", line + 1))
            .0;
        let attempt: u32 = fields[2].parse().unwrap();
        assert!(
            recorded.tasks.contains_key(&task),
            "agents.log line {}: {text:?} names a task the store lacks",
            line + 1
        );
        by_task
            .entry(task)
            .or_default()
            .entry(attempt)
            .or_default()
            .push(line + 1);
    }

    let mut stats = LogStats::default();
    for (&id, task) in &recorded.tasks {
        let what = recorded.describe(id);
        let pool = task.step != "Root";
        let answered = by_task.get(&id);
        assert_eq!(
            answered.is_some(),
            pool,
            "{what}: answered by an agent: {answered:?}"
        );
        let Some(answered) = answered else { continue };
        for (attempt, lines) in answered {
            stats.answers += lines.len();
            assert_eq!(
                lines.len(),
                1,
                "{what}: attempt {attempt} was dispatched to agents again after it had been \
                 answered (agents.log lines {lines:?})"
            );
            assert!(
                *attempt <= task.attempt,
                "{what}: answered in attempt {attempt}, but the store's last is {}",
                task.attempt
            );
        }
        if answered.len() > 1 {
            stats.reanswered += 1;
            let retries = recorded.retries(id);
            assert!(
                retries.len() >= answered.len() - 1,
                "{what} was answered in attempts {:?} without a retry recorded for each: {:#?}",
                answered.keys().collect::<Vec<_>>(),
                recorded.transitions(id)
            );
        }
    }

    let text = fs::read_to_string(lab.finally_log()).unwrap_or_default();
    let mut runs: HashMap<u128, usize> = HashMap::new();
    for (line, text) in text.lines().enumerate() {
        let fields: Vec<&str> = text.split(' ').collect();
        assert!(
            fields.len() == 3 && fields[0] == "finally",
            "finally.log line {} is malformed: {text:?}",
            line + 1
        );
        let task = Ulid::from_string(fields[1]).unwrap().0;
        let stored = recorded.tasks.get(&task).unwrap_or_else(|| {
            panic!(
                "finally.log line {}: {text:?}: a task the store lacks",
                line + 1
            )
        });
        assert!(
            has_finally(&stored.step) && fields[2] == stored.step,
            "finally.log line {}: {text:?}: the store has a {} task, whose finally {}",
            line + 1,
            stored.step,
            if has_finally(&stored.step) {
                "is another step's"
            } else {
                "does not exist"
            }
        );
        *runs.entry(task).or_default() += 1;
    }
    for (&id, task) in &recorded.tasks {
        if has_finally(&task.step) {
            assert!(
                runs.contains_key(&id),
                "the finally of {} never ran, yet it was recorded done",
                recorded.describe(id)
            );
        }
    }
    stats.finally_runs = runs.values().sum();
    stats.finally_reruns = runs.values().filter(|&&n| n > 1).count();

    // Nothing in this workflow can fail: no timeouts, agents always answer validly. A retry
    // means the runner lost track of a task it had dispatched.
    let retried: Vec<String> = recorded
        .tasks
        .keys()
        .filter(|&&id| !recorded.retries(id).is_empty())
        .map(|&id| {
            let details: Vec<&str> = recorded
                .retries(id)
                .iter()
                .map(|t| t.detail.as_str())
                .collect();
            format!("{}: {details:?}", recorded.describe(id))
        })
        .collect();
    assert!(
        retried.is_empty(),
        "retries were recorded, though nothing in this workflow can fail:\n{}",
        retried.join("\n")
    );
    stats
}

// ---------------------------------------------------------------------------------------------
// The soak.

struct Soak {
    items: u64,
    kills: usize,
    /// A quarter of the kills come after a random delay since the runner started of up to
    /// this long (unless their progress point comes first): kills during startup and
    /// re-attachment.
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
        "soak: seed {seed} (replay the kill schedule with SOAK_SEED={seed}), {} items, {} kills",
        params.items, params.kills
    );
    let mut rng = Rng(seed);
    let expected = Expected {
        items: params.items,
    };

    // Kill points spread over the whole run as progress through it (answers, then finally
    // hooks towards the end). The root's finally waits for the release file, so the run cannot
    // end before the last kill; every resumed runner runs it again, so there is progress to
    // wait for after it started too.
    let total = expected.answers() + expected.finallies();
    let mut points: Vec<usize> = (0..params.kills)
        .map(|_| usize::try_from(rng.range(1, total)).unwrap())
        .collect();
    points.sort_unstable();

    let began = Instant::now();
    let mut lab = Lab::new(params.items);
    let mut progress = Progress::default();
    lab.start();
    let mut kills = 0usize;
    let mut after_delay = 0;
    let mut dead_wait_due = false;
    let mut dead_waits = 0;
    let mut held_for_dead_runner = 0;
    // Kills that left Pool actions out at the agents / finally hooks running.
    let mut kills_in_action = 0;
    let mut kills_in_finally = 0;
    for &point in &points {
        let started = Instant::now();
        // Progress since this runner started is required (points can lag behind, when agents
        // answered while the runner was dead), unless this kill is one of the delayed ones.
        let target = point.max(progress.update(&lab) + 1);
        let delay = rng
            .next()
            .is_multiple_of(4)
            .then(|| Duration::from_millis(rng.range(0, params.max_delay_ms)));
        after_delay += usize::from(delay.is_some());
        let deadline = Instant::now() + PROGRESS_DEADLINE;
        loop {
            if lab.runner_exited().is_some()
                || progress.update(&lab) >= target
                || delay.is_some_and(|d| started.elapsed() >= d)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "seed {seed}: no progress to {target} in {PROGRESS_DEADLINE:?} (at {}); \
                 runner output:\n{}",
                progress.update(&lab),
                lab.runner_tail()
            );
            std::thread::sleep(POLL);
        }
        let tail = lab.runner_tail();
        let status = lab.kill_runner();
        assert!(
            status.code().is_none(),
            "seed {seed}: runner {} exited on its own ({status}) before the root's finally was \
             released; its output:\n{tail}",
            lab.epoch
        );
        kills += 1;
        let (actions, finallies) = lab.in_flight();
        kills_in_action += usize::from(actions > 0);
        kills_in_finally += usize::from(finallies > 0);
        lab.assert_pool_alive();
        // Every third kill (or the first after it with tasks out at the agents), the runner
        // stays dead until the agents have answered everything the pool held: those answers
        // wait in the pool, and the resumed runner must use them.
        dead_wait_due |= kills % 3 == 1;
        if dead_wait_due && let Some(undelivered) = lab.wait_pool_drained(seed) {
            dead_wait_due = false;
            dead_waits += 1;
            held_for_dead_runner += undelivered;
        }
        lab.resume();
    }
    fs::write(lab.release(), "").unwrap();
    let status = lab.wait_runner(params.finish_within);
    assert_eq!(
        status.code(),
        Some(0),
        "seed {seed}: the last runner failed ({status}); its output:\n{}",
        lab.runner_tail()
    );
    lab.assert_pool_alive();
    eprintln!(
        "soak: pool status at the end: {}",
        lab.pool_status().unwrap()
    );
    // Hooks orphaned by a killed runner may still be about to write to the finally log.
    sweep(RUNNER_TAG, &lab.tag).unwrap();

    let recorded = Recorded::load(&lab.state);
    recorded.check(&expected);
    let stats = check_logs(&lab, &recorded);
    assert!(
        dead_waits > 0,
        "seed {seed}: no kill left tasks out at the agents, so no answer was given while the \
         runner was dead"
    );
    eprintln!(
        "soak: seed {seed}: {kills} kills ({after_delay} after a delay; {kills_in_action} with Pool actions \
         out, {kills_in_finally} with finally hooks running; after {dead_waits} the \
         agents drained the pool, which then held {held_for_dead_runner} answers in all), {} runners, {} tasks, \
         {} answers ({} tasks answered in two attempts), {} finally runs for {} hooks \
         ({} re-run), {:.1}s",
        lab.epoch,
        recorded.tasks.len(),
        stats.answers,
        stats.reanswered,
        stats.finally_runs,
        expected.finallies(),
        stats.finally_reruns,
        began.elapsed().as_secs_f64()
    );
}

#[test]
fn soak_pool_20_kills() {
    soak(Soak {
        items: 80,
        kills: 20,
        max_delay_ms: 300,
        finish_within: Duration::from_secs(180),
    });
}

#[test]
#[ignore = "long soak (200 kills, minutes); run with --release --ignored --nocapture"]
fn soak_pool_200_kills() {
    soak(Soak {
        items: 400,
        kills: 200,
        max_delay_ms: 300,
        finish_within: Duration::from_secs(900),
    });
}
