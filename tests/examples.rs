//! The examples in `examples/`, run the way a user runs them.
//!
//! - Every `examples/*/workflow.jsonc` passes `drover config validate`.
//! - Every example has a `run.sh`; every `*.sh` is executable and passes `sh -n`, and every
//!   `./NAME.sh` a workflow names exists.
//! - The Command-only examples (linear, hooks, retries) run to their documented exit code, and
//!   the store holds the documented task counts and attempts.
//! - `linear/run.sh` and `fan-out/run.sh` (which starts a private pool daemon) run with `DROVER`
//!   pointing at the built binaries, from another directory; the Pool examples' `run.sh`
//!   explain what to start and exit non-zero when no daemon is up.
//! - `refactor` runs end to end: a real `drover-pool start`, a scripted agent (`sh` + `jq`)
//!   that answers every kind the way the instructions ask, against a throwaway repository.
//!
//! Every spawned process is in its own process group, SIGKILLed (group and all) on drop. Waits
//! poll with a deadline; nothing sleeps as an assertion.

use std::collections::BTreeMap;
use std::fs::{self};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use drover::store::{FinallyState, Phase, RunStatus, RunV2, Store, TaskV1};
use serde_json::{Value, json};

mod common;
use common::{Done, Proc, wait_until};

/// Generous bound for a whole example run (the retries example takes about 3 s).
const DEADLINE: Duration = Duration::from_secs(120);

/// Every example, with an entrypoint value its schema accepts.
const EXAMPLES: [(&str, &str); 5] = [
    ("fan-out", r#"{"count": 3, "review": true}"#),
    ("hooks", r#"{"name": "drover", "fail": true}"#),
    ("linear", r#"{"name": "drover"}"#),
    (
        "refactor",
        r#"{"root": "/tmp", "glob": "*.rs", "check": "cargo check"}"#,
    ),
    ("retries", r#"{"slow": true}"#),
];

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

fn drover_bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("drover")
}

fn pool_bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("drover-pool")
}

#[track_caller]
fn assert_has(haystack: &str, needle: &str) {
    assert!(
        haystack.contains(needle),
        "expected {needle:?} in:\n{haystack}"
    );
}

/// A scratch directory: state dir, pool root, logs, and whatever a test puts there.
struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        // Short: a pool socket path must fit in a sockaddr_un.
        let dir = tempfile::Builder::new()
            .prefix("dx")
            .tempdir()
            .expect("tempdir");
        fs::create_dir(dir.path().join("logs")).expect("logs dir");
        Env { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn state(&self) -> PathBuf {
        self.path("state")
    }

    fn root(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// `program ARGS` in the scratch directory, with no drover setting inherited from the
    /// environment of the test.
    fn command(&self, program: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(program);
        command.args(args).current_dir(self.dir.path());
        for var in [
            "DROVER",
            "DROVER_POOL_BIN",
            "DROVER_POOL",
            "DROVER_ROOT",
            "DROVER_STATE_DIR",
            "DROVER_CONFIG",
            "DROVER_LOG_FORMAT",
            "RUST_LOG",
        ] {
            command.env_remove(var);
        }
        command
    }

    fn spawn(&self, command: Command, label: &str) -> Proc {
        Proc::spawn(&self.path("logs"), command, label)
    }

    #[track_caller]
    fn finish(&self, command: Command, label: &str) -> Done {
        Done::of(self.spawn(command, label), DEADLINE)
    }

    /// `drover run --config examples/NAME/workflow.jsonc --state-dir STATE --entrypoint-value V`.
    #[track_caller]
    fn run_example(&self, name: &str, value: &str) -> Done {
        let config = examples_dir().join(name).join("workflow.jsonc");
        let state = self.state();
        let command = self.command(
            &drover_bin(),
            &[
                "run",
                "--config",
                config.to_str().expect("utf-8 path"),
                "--state-dir",
                state.to_str().expect("utf-8 path"),
                "--entrypoint-value",
                value,
            ],
        );
        self.finish(command, "run")
    }

    /// The newest run of the state directory, and its tasks in creation order.
    fn newest_run(&self) -> (RunV2, Vec<TaskV1>) {
        let store = Store::open(&self.state()).expect("the state store opens");
        let reader = store.read().expect("a read snapshot");
        let (id, run) = reader
            .runs()
            .expect("runs")
            .into_iter()
            .next()
            .expect("a run was recorded");
        let mut tasks = Vec::new();
        reader
            .for_each_task(id, |_, task| tasks.push(task))
            .expect("tasks");
        (run, tasks)
    }
}

/// `(total, completed, failed)` of a run.
fn counts(run: &RunV2) -> (u64, u64, u64) {
    (run.tasks_total, run.tasks_completed, run.tasks_failed)
}

/// Per step: how many tasks completed and how many failed.
fn per_step(tasks: &[TaskV1]) -> BTreeMap<String, (usize, usize)> {
    let mut steps = BTreeMap::new();
    for task in tasks {
        let entry = steps.entry(task.step.clone()).or_insert((0, 0));
        match task.phase {
            Phase::Completed => entry.0 += 1,
            Phase::Failed => entry.1 += 1,
            other => panic!("task of {} left in phase {other:?}", task.step),
        }
    }
    steps
}

#[track_caller]
fn only<'t>(tasks: &'t [TaskV1], step: &str) -> &'t TaskV1 {
    let found: Vec<&TaskV1> = tasks.iter().filter(|t| t.step == step).collect();
    assert_eq!(found.len(), 1, "one {step} task expected: {found:?}");
    found[0]
}

fn value(task: &TaskV1) -> Value {
    serde_json::from_str(&task.value).expect("a task value is JSON")
}

/// `examples/*/`, sorted.
fn example_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(examples_dir())
        .expect("examples/ exists")
        .map(|entry| entry.expect("readable entry").path())
        .filter(|path| path.is_dir())
        .collect();
    dirs.sort();
    dirs
}

// ---------------------------------------------------------------------------------------------
// Every example

#[test]
fn every_example_is_listed_here_and_in_the_readme() {
    let names: Vec<String> = example_dirs()
        .iter()
        .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let listed: Vec<&str> = EXAMPLES.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, listed, "examples/ and EXAMPLES in this file differ");
    let readme = fs::read_to_string(examples_dir().join("README.md")).expect("examples/README.md");
    for name in listed {
        assert_has(&readme, &format!("[`{name}`]({name}/)"));
    }
}

#[test]
fn every_example_workflow_passes_validate() {
    for (name, entry_value) in EXAMPLES {
        let config = examples_dir().join(name).join("workflow.jsonc");
        for extra in [&[][..], &["--entrypoint-value", entry_value][..]] {
            let output = Command::new(drover_bin())
                .args(["config", "validate", "--config"])
                .arg(&config)
                .args(extra)
                .output()
                .expect("drover runs");
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "{name} {extra:?}: {}\n{stdout}",
                String::from_utf8_lossy(&output.stderr)
            );
            assert_has(&stdout, ": valid, ");
        }
    }
}

#[test]
fn every_run_sh_and_script_is_executable_and_posix_sh() {
    let mut checked = 0;
    for dir in example_dirs() {
        assert!(
            dir.join("run.sh").is_file(),
            "{} has no run.sh",
            dir.display()
        );
        for entry in fs::read_dir(&dir).expect("readable dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "sh") {
                continue;
            }
            let mode = fs::metadata(&path).expect("metadata").permissions().mode();
            assert!(
                mode & 0o111 == 0o111,
                "{} is not executable (mode {mode:o})",
                path.display()
            );
            let first = fs::read_to_string(&path).expect("readable script");
            assert!(
                first.starts_with("#!/bin/sh\n"),
                "{} does not start with #!/bin/sh",
                path.display()
            );
            let output = Command::new("sh")
                .arg("-n")
                .arg(&path)
                .output()
                .expect("sh runs");
            assert!(
                output.status.success(),
                "sh -n {}: {}",
                path.display(),
                String::from_utf8_lossy(&output.stderr)
            );
            checked += 1;
        }
        // Every `./NAME.sh` the workflow runs is one of the scripts just checked.
        let config = fs::read_to_string(dir.join("workflow.jsonc")).expect("workflow.jsonc");
        for (i, _) in config.match_indices("./") {
            let name: String = config[i + 2..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-' || *c == '.')
                .collect();
            if name.ends_with(".sh") {
                assert!(
                    dir.join(&name).is_file(),
                    "{} runs ./{name}, which does not exist",
                    dir.display()
                );
            }
        }
    }
    assert!(
        checked >= 20,
        "expected the scripts of all five examples, checked {checked}"
    );
}

// ---------------------------------------------------------------------------------------------
// Command-only examples

#[test]
fn linear_runs_greet_shout_print() {
    let env = Env::new();
    let done = env.run_example("linear", r#"{"name": "drover"}"#);
    done.assert_code(0);
    let (run, tasks) = env.newest_run();
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(counts(&run), (3, 3, 0));
    let steps: Vec<&str> = tasks.iter().map(|t| t.step.as_str()).collect();
    assert_eq!(steps, ["Greet", "Shout", "Print"]);
    assert_eq!(value(&tasks[2]), json!({"text": "HELLO, DROVER!"}));
}

#[test]
fn hooks_succeeds_with_a_stamped_value() {
    let env = Env::new();
    let done = env.run_example("hooks", r#"{"name": "drover"}"#);
    done.assert_code(0);
    let (run, tasks) = env.newest_run();
    assert_eq!(counts(&run), (2, 2, 0));
    let done_value = value(only(&tasks, "Done"));
    assert_eq!(done_value["greeting"], "hello, drover");
    assert!(
        done_value["received_at"]
            .as_str()
            .is_some_and(|s| s.ends_with('Z')),
        "the pre hook's timestamp reached Done: {done_value}"
    );
}

#[test]
fn hooks_fail_spawns_recover_after_the_last_attempt() {
    let env = Env::new();
    let done = env.run_example("hooks", r#"{"name": "drover", "fail": true}"#);
    done.assert_code(1);
    let (run, tasks) = env.newest_run();
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(counts(&run), (2, 1, 1));
    let greet = only(&tasks, "Greet");
    assert_eq!((greet.phase, greet.attempt), (Phase::Failed, 3));
    assert_eq!(only(&tasks, "Recover").phase, Phase::Completed);
}

#[test]
fn retries_recovers_from_everything() {
    let env = Env::new();
    let done = env.run_example("retries", "{}");
    done.assert_code(0);
    let (run, tasks) = env.newest_run();
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(counts(&run), (6, 6, 0));
    // Attempts: Flaky succeeds on its third, Garbled's invalid first answer is retried, Slow
    // needs one, Fragile gives up after its second and its post hook spawns Recover.
    for (step, attempts) in [
        ("Start", 1),
        ("Flaky", 3),
        ("Garbled", 2),
        ("Slow", 1),
        ("Fragile", 2),
        ("Recover", 1),
    ] {
        let task = only(&tasks, step);
        assert_eq!(
            (task.phase, task.attempt),
            (Phase::Completed, attempts),
            "{step}: {task:?}"
        );
    }
    let recover = value(only(&tasks, "Recover"));
    assert_eq!(recover["attempts"], 2);
    assert_has(
        recover["error"].as_str().expect("error text"),
        "fragile.sh: attempt 2: the disk is full",
    );
}

#[test]
fn retries_slow_times_out_once_and_is_not_retried() {
    let env = Env::new();
    let done = env.run_example("retries", r#"{"slow": true}"#);
    done.assert_code(1);
    let (run, tasks) = env.newest_run();
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(counts(&run), (6, 5, 1));
    let slow = only(&tasks, "Slow");
    assert_eq!((slow.phase, slow.attempt), (Phase::Failed, 1), "{slow:?}");
    assert_has(slow.error.as_deref().unwrap_or_default(), "Timeout");
}

// ---------------------------------------------------------------------------------------------
// run.sh

#[test]
fn linear_run_sh_runs_with_the_built_drover_from_anywhere() {
    let env = Env::new();
    let mut command = env.command(&examples_dir().join("linear/run.sh"), &["robot"]);
    command
        .env("DROVER", drover_bin())
        .env("DROVER_STATE_DIR", env.state());
    let done = env.finish(command, "run.sh");
    done.assert_code(0);
    assert_has(&done.stdout, "run.sh: examples/linear");
    let (run, tasks) = env.newest_run();
    assert_eq!(counts(&run), (3, 3, 0));
    assert_eq!(
        value(only(&tasks, "Print")),
        json!({"text": "HELLO, ROBOT!"})
    );
}

#[test]
fn fan_out_run_sh_starts_and_stops_a_private_pool() {
    let env = Env::new();
    let mut command = env.command(&examples_dir().join("fan-out/run.sh"), &["4"]);
    command
        .env("DROVER", drover_bin())
        .env("DROVER_POOL_BIN", pool_bin())
        .env("DROVER_STATE_DIR", env.state());
    let done = env.finish(command, "run.sh");
    done.assert_code(0);
    assert_has(&done.stdout, "starting a private pool daemon");
    let (run, tasks) = env.newest_run();
    assert_eq!(counts(&run), (5, 5, 0));
    assert_eq!(tasks.iter().filter(|t| t.step == "Work").count(), 4);
    // The daemon's directory is gone, so run.sh stopped it.
    let root = done
        .stdout
        .lines()
        .find_map(|l| l.split("--root ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("run.sh names the private pool root")
        .to_string();
    wait_until("the private pool directory is removed", DEADLINE, || {
        !Path::new(&root).exists()
    });
}

#[test]
fn pool_run_sh_without_a_daemon_explains_what_to_start() {
    let env = Env::new();
    let repo = env.path("repo");
    fs::create_dir(&repo).expect("repo dir");
    for (example, args) in [
        ("fan-out", vec!["--review"]),
        ("refactor", vec![repo.to_str().expect("utf-8 path")]),
    ] {
        let mut command = env.command(&examples_dir().join(example).join("run.sh"), &args);
        command
            .env("DROVER", drover_bin())
            .env("DROVER_POOL_BIN", pool_bin())
            .env("DROVER_ROOT", env.root())
            .env("DROVER_STATE_DIR", env.state());
        let done = env.finish(command, "run.sh");
        assert_eq!(
            done.status.code(),
            Some(1),
            "{example}: {}",
            done.describe()
        );
        assert_has(&done.stderr, "no pool daemon is running");
        assert_has(&done.stderr, "drover-pool start");
        assert_has(&done.stderr, "drover-pool protocol --name agent-1");
        assert!(
            !env.state().join(drover::store::STATE_FILE).exists(),
            "{example}: nothing was run"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// refactor, end to end

/// A scripted agent for the refactor workflow (`sh` and `jq`), answering each kind the way its
/// instructions ask. Findings are `TODO` lines. Its fixes replace TODO with DONE, except on
/// lines mentioning "two" or "stubborn", where they write BROKEN, which the check rejects.
/// Repair fixes "two" and cannot fix "stubborn". Every task is logged to `$AGENT_LOG`.
const AGENT: &str = r#"#!/bin/sh
set -eu
msg=$(cat)
kind=$(printf '%s\n' "$msg" | jq -r '.task.kind')
v=$(printf '%s\n' "$msg" | jq -c '.task.value')
get() { printf '%s\n' "$v" | jq -r "$1"; }
path="$(get .root)/$(get .file)"
echo "$DROVER_AGENT_NAME $kind $(get .file) $DROVER_ATTEMPT" >>"$AGENT_LOG"
case $kind in
  Analyze)
    { grep -n TODO "$path" || true; } | jq -R -s -c --argjson v "$v" '
      split("\n") | map(select(length > 0) | index(":") as $i | (.[:$i] | tonumber) as $n
        | {kind: "ProposeFix", value: {root: $v.root, file: $v.file, goal: $v.goal,
           check: $v.check, line: $n, title: "Resolve the TODO on line \($n)",
           problem: "Line \($n) still reads \(.[$i + 1:] | tojson); resolve the marker."}})' ;;
  ProposeFix)
    old=$(sed -n "$(get .line)p" "$path")
    case $old in *two* | *stubborn*) fix=BROKEN ;; *) fix=DONE ;; esac
    printf '%s\n' "$v" | jq -c --arg old "$old" --arg fix "$fix" '[{kind: "Apply", value: {
      root, file, check, title, rationale: "Replaces the marker and nothing else.",
      edits: [{old: $old, new: ($old | sub("TODO"; $fix))}]}}]' ;;
  Apply)
    jq -R -s -j --argjson v "$v" 'reduce $v.edits[] as $e (.;
      if (split($e.old) | length) == 2 then split($e.old) | join($e.new)
      else error("not exactly once: \($e.old)") end)' "$path" >"$path.new"
    mv "$path.new" "$path"
    printf '%s\n' "$v" | jq -c '[{kind: "Verify", value: {root, file, check, title, round: 1}}]' ;;
  Repair)
    if grep -q two "$path"; then sed 's/BROKEN/DONE/' "$path" >"$path.new"; mv "$path.new" "$path"; fi
    printf '%s\n' "$v" | jq -c '[{kind: "Verify", value: {root, file, check, title, round: (.round + 1)}}]' ;;
  *) echo '[]' ;;
esac
"#;

#[test]
fn refactor_runs_end_to_end_with_scripted_agents() {
    for tool in ["jq", "sed", "grep"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .expect("sh runs")
            .status
            .success();
        assert!(
            found,
            "the refactor example and this test need `{tool}` on PATH"
        );
    }
    let env = Env::new();

    // The throwaway repository: a.txt gets a good fix; sub/b.txt a bad one that Repair fixes;
    // c.txt has nothing to fix; d.txt a bad one that Repair cannot fix. Hidden directories and
    // other extensions are not listed.
    let repo = env.path("repo");
    for (file, text) in [
        ("a.txt", "one\nTODO one\n"),
        ("sub/b.txt", "TODO two\n"),
        ("c.txt", "clean\n"),
        ("d.txt", "TODO stubborn\n"),
        (".hidden/e.txt", "TODO hidden\n"),
        ("notes.md", "TODO markdown\n"),
    ] {
        let path = repo.join(file);
        fs::create_dir_all(path.parent().expect("parent")).expect("repo dirs");
        fs::write(path, text).expect("repo file");
    }
    let agent_script = env.path("agent.sh");
    fs::write(&agent_script, AGENT).expect("agent script");
    let agent_log = env.path("agents.log");
    let report = env.path("report.md");

    let root = env.root();
    let root_arg = root.to_str().expect("utf-8 path");
    let daemon = env.spawn(
        env.command(&pool_bin(), &["start", "--root", root_arg]),
        "daemon",
    );
    let status_ok = || {
        env.command(&pool_bin(), &["status", "--root", root_arg])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("drover-pool status runs")
            .success()
    };
    wait_until("the pool daemon answers", DEADLINE, status_ok);
    let mut agent_command = env.command(
        &pool_bin(),
        &[
            "agent",
            "--name",
            "a",
            "--root",
            root_arg,
            "--",
            "sh",
            agent_script.to_str().expect("utf-8 path"),
        ],
    );
    agent_command.env("AGENT_LOG", &agent_log);
    let mut agent = env.spawn(agent_command, "agent");

    let entry = json!({
        "root": repo,
        "glob": "*.txt",
        "check": "! grep -rq BROKEN ${FILE:-.}",
        "goal": "Resolve the TODO markers.",
        "report": report,
    })
    .to_string();
    let config = examples_dir().join("refactor/workflow.jsonc");
    let state = env.state();
    let mut run_command = env.command(
        &drover_bin(),
        &[
            "run",
            "--config",
            config.to_str().expect("utf-8 path"),
            "--state-dir",
            state.to_str().expect("utf-8 path"),
            "--root",
            root_arg,
            "--entrypoint-value",
            &entry,
        ],
    );
    // The finally hook reads the run back with this drover.
    run_command.env("DROVER", drover_bin());
    let mut run = env.spawn(run_command, "run");
    let status = run.wait_within(DEADLINE);
    let agent_alive = agent.exited().is_none();
    let describe = || {
        format!(
            "run: {status}\n{}\nagent log:\n{}\nagent stderr:\n{}\ndaemon stderr:\n{}",
            run.stderr(),
            fs::read_to_string(&agent_log).unwrap_or_default(),
            agent.stderr(),
            daemon.stderr()
        )
    };
    // d.txt's change fails its check twice: that Verify task fails, so the run does.
    assert_eq!(status.code(), Some(1), "{}", describe());
    assert!(agent_alive, "the agent is still waiting: {}", describe());

    let (run_record, tasks) = env.newest_run();
    assert_eq!(run_record.status, RunStatus::Failed, "{}", describe());
    assert_eq!(counts(&run_record), (18, 17, 1), "{}", describe());
    let expected: BTreeMap<String, (usize, usize)> = [
        ("ListFiles", (1, 0)),
        ("Analyze", (4, 0)),
        ("ProposeFix", (3, 0)),
        ("Apply", (3, 0)),
        ("Verify", (4, 1)),
        ("Repair", (2, 0)),
    ]
    .into_iter()
    .map(|(step, n)| (step.to_string(), n))
    .collect();
    assert_eq!(per_step(&tasks), expected, "{}", describe());

    // ListFiles listed the .txt files outside hidden directories, relative to the root.
    let mut analyzed: Vec<String> = tasks
        .iter()
        .filter(|t| t.step == "Analyze")
        .map(|t| value(t)["file"].as_str().expect("file").to_string())
        .collect();
    analyzed.sort();
    assert_eq!(analyzed, ["a.txt", "c.txt", "d.txt", "sub/b.txt"]);

    // The failing Verify is round 2 of d.txt; the repaired b.txt passed its round 2.
    let failed: Vec<Value> = tasks
        .iter()
        .filter(|t| t.phase == Phase::Failed)
        .map(value)
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(
        (&failed[0]["file"], &failed[0]["round"]),
        (&json!("d.txt"), &json!(2))
    );

    // The repository as the agents left it.
    let read = |file: &str| fs::read_to_string(repo.join(file)).expect("repo file");
    assert_eq!(read("a.txt"), "one\nDONE one\n");
    assert_eq!(read("sub/b.txt"), "DONE two\n");
    assert_eq!(read("c.txt"), "clean\n");
    assert_eq!(read("d.txt"), "BROKEN stubborn\n");
    assert_eq!(read(".hidden/e.txt"), "TODO hidden\n");

    // The finally hook ran once everything had settled, and wrote the report.
    assert_eq!(only(&tasks, "ListFiles").finally, FinallyState::Done);
    let text = fs::read_to_string(&report).expect("report written");
    assert_has(&text, "| Verify | 4 | 1 |");
    assert_has(
        &text,
        "- `a.txt`: Resolve the TODO on line 2 (round 1): check passed",
    );
    assert_has(
        &text,
        "- `sub/b.txt`: Resolve the TODO on line 1 (round 1): check failed, sent to Repair",
    );
    assert_has(
        &text,
        "- `sub/b.txt`: Resolve the TODO on line 1 (round 2): check passed",
    );
    assert_has(
        &text,
        "- `d.txt`: Resolve the TODO on line 1 (round 2): check FAILED",
    );

    // Every agent task was one of the Pool steps, each handed over once.
    let log = fs::read_to_string(&agent_log).expect("agent log");
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for line in log.lines() {
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("a"), "{line}");
        *kinds.entry(words.next().expect("kind")).or_default() += 1;
        assert_eq!(words.last(), Some("1"), "first attempts only: {line}");
    }
    let kinds: Vec<(&str, usize)> = kinds.into_iter().collect();
    assert_eq!(
        kinds,
        [
            ("Analyze", 4),
            ("Apply", 3),
            ("ProposeFix", 3),
            ("Repair", 2)
        ]
    );
}
