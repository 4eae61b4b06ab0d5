//! `drover resume` after a runner was SIGKILLed: it continues the run where it was started (the
//! config's directory, the same pool) whatever directory or environment it is run from; what
//! the dead runner left running is stopped before it runs again; `inspect` says the run
//! crashed; the default run is one no live runner holds; a finished run keeps its exit code.
//!
//! Every process is real: the `drover` binary, `drover-pool start`, `sh` scripts in temporary
//! directories. The runner is SIGKILLed together with its process group; the hooks it started
//! lead groups of their own and survive it, as they would in a real crash.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Done, Proc, wait_until};
use drover::pool::protocol::AgentMessage;
use drover::store::{PoolRef, RunStatus, RunV2, Store};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

/// Generous: a loaded 2-core CI machine; only a hang reaches it.
const DEADLINE: Duration = Duration::from_secs(120);

/// An action that blocks on its first run (publishing its pid and a grandchild's), and on a
/// later run reports whether those are still alive and answers `[]`. Every run appends its
/// working directory to `runs`.
const BLOCK_ONCE: &str = r#"cat >/dev/null
n=$(cat runs 2>/dev/null | wc -l)
pwd -P >> runs
if [ "$n" -eq 0 ]; then
  sleep 600 &
  echo $! > child.pid
  echo $$ > block.pid.tmp; mv block.pid.tmp block.pid
  wait
  exit 1
fi
for f in block.pid child.pid; do
  state=$(sed 's/.*) //' "/proc/$(cat $f)/stat" 2>/dev/null | cut -c1)
  case "$state" in ""|Z|X) echo "$f gone" >> report ;; *) echo "$f alive" >> report ;; esac
done
echo []"#;

/// A temporary directory: `flow*/` hold configs and scripts, `state/` the runner's store,
/// `pool/` a pool root, `logs/` the processes' output. Short, for the socket path.
struct Lab {
    dir: tempfile::TempDir,
    /// Pids the scripts published, SIGKILLed at the end if a failed test left them.
    published: Vec<PathBuf>,
}

impl Lab {
    fn new() -> Lab {
        let dir = tempfile::Builder::new()
            .prefix("dr")
            .tempdir()
            .expect("tempdir");
        for sub in ["logs", "elsewhere", "runtime"] {
            fs::create_dir(dir.path().join(sub)).expect("dir");
        }
        Lab {
            dir,
            published: Vec::new(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn state(&self) -> String {
        self.path("state").display().to_string()
    }

    /// `flow/workflow.json` with one Command step running `script` (saved as `flow/act.sh`).
    fn flow(&mut self, flow: &str, script: &str) {
        let dir = self.path(flow);
        fs::create_dir_all(&dir).expect("flow dir");
        let act = dir.join("act.sh");
        fs::write(&act, format!("#!/bin/sh\n{script}\n")).expect("script");
        fs::set_permissions(&act, fs::Permissions::from_mode(0o755)).expect("chmod");
        self.config(
            flow,
            &json!({
                "entrypoint": "Act",
                "steps": [{"name": "Act", "action": {"kind": "Command", "script": "./act.sh"}, "next": []}],
            }),
        );
        self.published.push(dir.join("block.pid"));
        self.published.push(dir.join("child.pid"));
    }

    fn config(&self, flow: &str, config: &Value) {
        fs::write(
            self.path(flow).join("workflow.json"),
            serde_json::to_string_pretty(config).expect("config"),
        )
        .expect("config written");
    }

    /// A program run in `cwd` (relative to the lab) with no drover location inherited: the
    /// pool's default root is the lab's `runtime/`, never the machine's.
    fn command(&self, bin: &str, cwd: &str, args: &[&str]) -> Command {
        let mut command = Command::new(bin);
        command
            .args(args)
            .current_dir(self.path(cwd))
            .env_remove("DROVER_POOL")
            .env_remove("DROVER_ROOT")
            .env_remove("DROVER_STATE_DIR")
            .env_remove("DROVER_CONFIG")
            .env_remove("RUST_LOG")
            .env("XDG_RUNTIME_DIR", self.path("runtime"))
            .stdin(Stdio::null());
        command
    }

    fn drover(&self, cwd: &str, args: &[&str]) -> Proc {
        let command = self.command(env!("CARGO_BIN_EXE_drover"), cwd, args);
        Proc::spawn(&self.path("logs"), command, args[0])
    }

    fn pool(&self, args: &[&str]) -> Proc {
        let command = self.command(env!("CARGO_BIN_EXE_drover-pool"), ".", args);
        Proc::spawn(&self.path("logs"), command, args[0])
    }

    /// `drover run --config FLOW/workflow.json` from the lab's root: a relative config path.
    fn run(&self, flow: &str, extra: &[&str]) -> Proc {
        let config = format!("{flow}/workflow.json");
        let state = self.state();
        let mut args = vec!["run", "--config", &config, "--state-dir", &state];
        args.extend_from_slice(extra);
        self.drover(".", &args)
    }

    fn resume_from(&self, cwd: &str, extra: &[&str]) -> Done {
        let state = self.state();
        let mut args = vec!["resume", "--state-dir", &state];
        args.extend_from_slice(extra);
        Done::of(self.drover(cwd, &args), DEADLINE)
    }

    fn lines(&self, file: &str) -> Vec<String> {
        fs::read_to_string(self.path(file))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Waits until `flow`'s action published its pid, i.e. it is blocked in its first run.
    fn wait_blocked(&self, flow: &str, runner: &mut Proc) {
        let pid_file = self.path(flow).join("block.pid");
        wait_until(&format!("{flow}'s action blocks"), DEADLINE, || {
            runner.assert_alive();
            pid_file.exists()
        });
    }

    fn runs(&self) -> Vec<(u128, RunV2)> {
        let store = Store::open(Path::new(&self.state())).expect("the store opens");
        store.read().expect("reads").runs().expect("runs list")
    }

    fn inspect_statuses(&self) -> Vec<(String, String)> {
        let state = self.state();
        let done = Done::of(
            self.drover(".", &["inspect", "--json", "--state-dir", &state]),
            DEADLINE,
        );
        done.assert_code(0);
        let runs: Value = serde_json::from_str(&done.stdout).expect("inspect --json is JSON");
        runs.as_array()
            .expect("an array of runs")
            .iter()
            .map(|run| {
                (
                    run["id"].as_str().unwrap_or_default().to_string(),
                    run["status"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for file in &self.published {
            let Some(pid) = fs::read_to_string(file)
                .ok()
                .and_then(|text| text.trim().parse::<i32>().ok())
            else {
                continue;
            };
            // Only if it is still one of ours: its command line names the lab's script.
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let ours = String::from_utf8_lossy(&cmdline).contains("act.sh")
                || String::from_utf8_lossy(&cmdline).contains("sleep");
            let environ = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let in_lab = String::from_utf8_lossy(&environ).contains("DROVER_RUN_ID=");
            if ours && in_lab {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

fn canonical(path: &Path) -> String {
    fs::canonicalize(path)
        .expect("canonical path")
        .display()
        .to_string()
}

#[test]
fn resume_stops_the_dead_runners_action_and_runs_it_again_in_the_configs_directory() {
    let mut lab = Lab::new();
    lab.flow("flow", BLOCK_ONCE);
    let mut runner = lab.run("flow", &[]);
    lab.wait_blocked("flow", &mut runner);
    runner.kill();

    // Seen from another terminal, the run is not "running": nothing is running it.
    let statuses = lab.inspect_statuses();
    assert_eq!(statuses.len(), 1, "{statuses:?}");
    assert_eq!(statuses[0].1, "crashed");
    let state = lab.state();
    let report = Done::of(
        lab.drover(".", &["inspect", &statuses[0].0, "--state-dir", &state]),
        DEADLINE,
    );
    report.assert_code(0);
    assert!(
        report.stdout.contains("crashed") && report.stdout.contains("drover resume"),
        "{}",
        report.stdout
    );

    // From a directory where `./act.sh` does not exist, and where `flow/` does not either.
    let resumed = lab.resume_from("elsewhere", &[]);
    resumed.assert_code(0);

    let flow = canonical(&lab.path("flow"));
    assert_eq!(lab.lines("flow/runs"), [flow.clone(), flow]);
    // The re-run found the first run's action and its grandchild already stopped.
    assert_eq!(
        lab.lines("flow/report"),
        ["block.pid gone", "child.pid gone"]
    );
    let runs = lab.runs();
    assert_eq!(runs[0].1.status, RunStatus::Completed);
    assert_eq!(
        runs[0].1.config_path,
        canonical(&lab.path("flow/workflow.json"))
    );
    assert_eq!(lab.inspect_statuses()[0].1, "completed");
}

#[test]
fn resume_without_a_run_id_takes_the_newest_run_no_live_runner_holds() {
    let mut lab = Lab::new();
    lab.flow("old", BLOCK_ONCE);
    lab.flow("live", BLOCK_ONCE);
    let mut crashed = lab.run("old", &[]);
    lab.wait_blocked("old", &mut crashed);
    crashed.kill();
    let mut live = lab.run("live", &[]);
    lab.wait_blocked("live", &mut live);

    let mut statuses: Vec<String> = lab.inspect_statuses().into_iter().map(|r| r.1).collect();
    statuses.sort();
    assert_eq!(statuses, ["crashed", "running"]);

    // The newest unfinished run is live; the crashed one is resumed, not refused.
    let resumed = lab.resume_from(".", &[]);
    resumed.assert_code(0);
    assert_eq!(
        lab.lines("old/report"),
        ["block.pid gone", "child.pid gone"]
    );
    live.assert_alive();
    // The live run's action was not touched.
    assert_eq!(lab.lines("live/runs").len(), 1);
    assert!(!lab.path("live/report").exists());

    // With nothing resumable left, it says why.
    let nothing = lab.resume_from(".", &[]);
    nothing.assert_code(2);
    assert!(
        nothing
            .stderr
            .contains("being run by live drover processes"),
        "{}",
        nothing.stderr
    );
    live.kill();
}

#[test]
fn resume_of_a_run_that_finished_with_failures_exits_1_and_runs_nothing() {
    let mut lab = Lab::new();
    lab.flow("flow", "cat >/dev/null; pwd -P >> runs; exit 3");
    let first = Done::of(lab.run("flow", &[]), DEADLINE);
    first.assert_code(1);
    let id = lab.runs()[0].0;
    let resumed = lab.resume_from(".", &[&ulid::Ulid(id).to_string()]);
    resumed.assert_code(1);
    assert!(
        resumed.stderr.contains("already finished: failed"),
        "{}",
        resumed.stderr
    );
    assert_eq!(lab.lines("flow/runs").len(), 1);
}

#[test]
fn resume_goes_back_to_the_pool_the_run_started_with() {
    let lab = Lab::new();
    fs::create_dir(lab.path("flow")).expect("flow dir");
    lab.config(
        "flow",
        &json!({
            "entrypoint": "Ask",
            "steps": [{"name": "Ask", "action": {"kind": "Pool", "instructions": "answer []"}, "next": []}],
        }),
    );
    let root = lab.path("pool").display().to_string();
    let _daemon = lab.pool(&["start", "--pool", "review", "--root", &root]);
    let mut runner = lab.run("flow", &["--pool", "review", "--root", &root]);

    // An agent takes the task; the runner dies while the agent works on it.
    let taken = Done::of(
        lab.pool(&[
            "get-task", "--name", "a1", "--pool", "review", "--root", &root,
        ]),
        DEADLINE,
    );
    taken.assert_code(0);
    let (task_id, response_file) =
        match serde_json::from_str(taken.stdout.trim()).expect("a message") {
            AgentMessage::Task {
                task_id,
                response_file,
                ..
            } => (task_id, PathBuf::from(response_file)),
            other => panic!("expected a task, got {other:?}"),
        };
    runner.kill();
    let runs = lab.runs();
    assert_eq!(
        runs[0].1.pool,
        Some(PoolRef {
            name: "review".into(),
            root: root.clone(),
        })
    );

    // The agent answers while no runner is there; resume, given no pool, finds it anyway.
    fs::write(&response_file, "[]").expect("answer written");
    let resumed = lab.resume_from("elsewhere", &["--pool-wait", "2"]);
    resumed.assert_code(0);
    let runs = lab.runs();
    assert_eq!(runs[0].1.status, RunStatus::Completed);

    // The answer was taken and acknowledged, and nothing was handed out again: the pool
    // ends with nothing queued, assigned or waiting for a runner.
    let mut last = Value::Null;
    let settled = || {
        let done = Done::of(
            lab.pool(&["status", "--json", "--pool", "review", "--root", &root]),
            DEADLINE,
        );
        done.assert_code(0);
        serde_json::from_str::<Value>(&done.stdout).expect("status JSON")
    };
    wait_until("the pool forgets the answered task", DEADLINE, || {
        last = settled();
        (&last["queued"], &last["assigned"], &last["undelivered"])
            == (&json!(0), &json!(0), &json!(0))
    });
    assert!(!last.to_string().contains(&task_id), "{last}");
}
