//! `drover-pool` as users and agents run it: real processes, a real daemon in a temporary
//! root. Every spawned process is owned by a guard that kills it on drop; waits poll for a
//! condition with a generous deadline instead of sleeping.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use drover::engine::answer::JsonText;
use drover::pool::protocol::{
    AgentMessage, AnswerOutcome, PoolTask, Reply, Request, TaskKey, TaskRef,
};
use drover::pool::store::{Entry, EntryState, PoolStore};
use serde_json::{Value, json};

mod common;
use common::Proc;

const DEADLINE: Duration = Duration::from_secs(60);

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_drover-pool")
}

/// `drover-pool ARGS` with no pool location inherited from the environment.
fn command(args: &[&str]) -> Command {
    let mut command = Command::new(bin());
    command
        .args(args)
        .env_remove("DROVER_POOL")
        .env_remove("DROVER_ROOT")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    command
}

/// A finished command: exit status, stdout, stderr.
struct Done {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

#[track_caller]
fn run(logs: &Path, args: &[&str]) -> Done {
    let mut proc = Proc::spawn(logs, command(args), args[0]);
    let status = proc.wait_within(DEADLINE);
    Done {
        status,
        stdout: proc.stdout(),
        stderr: proc.stderr(),
    }
}

/// Polls `condition` until it holds, failing the test after the deadline.
#[track_caller]
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < DEADLINE,
            "timed out waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A temporary pool root and a place for process logs.
struct Pool {
    dir: tempfile::TempDir,
}

impl Pool {
    fn new() -> Pool {
        let dir = tempfile::Builder::new()
            .prefix("dp")
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir(dir.path().join("logs")).expect("logs dir");
        Pool { dir }
    }

    fn root(&self) -> &str {
        self.dir.path().to_str().expect("utf-8 temp path")
    }

    fn logs(&self) -> PathBuf {
        self.dir.path().join("logs")
    }

    fn pool_dir(&self) -> PathBuf {
        self.dir.path().join("pools").join("default")
    }

    /// `drover-pool SUB --root ROOT ARGS…`, run to completion.
    #[track_caller]
    fn run(&self, sub: &str, args: &[&str]) -> Done {
        let mut all = vec![sub, "--root", self.root()];
        all.extend_from_slice(args);
        run(&self.logs(), &all)
    }

    fn spawn(&self, sub: &str, args: &[&str]) -> Proc {
        let mut all = vec![sub, "--root", self.root()];
        all.extend_from_slice(args);
        Proc::spawn(&self.logs(), command(&all), sub)
    }

    /// Starts a daemon and waits until it answers `status`.
    #[track_caller]
    fn start(&self) -> Proc {
        let mut daemon = self.spawn("start", &[]);
        wait_until("the daemon answers status", || {
            if let Some(status) = daemon.exited() {
                panic!(
                    "the daemon exited early ({status}); stderr:\n{}",
                    daemon.stderr()
                );
            }
            self.run("status", &[]).status.success()
        });
        daemon
    }

    fn status_json(&self) -> Option<Value> {
        let done = self.run("status", &["--json"]);
        if !done.status.success() {
            return None;
        }
        Some(serde_json::from_str(&done.stdout).expect("status --json prints JSON"))
    }

    /// (queued, assigned, undelivered) as `status --json` reports them.
    #[track_caller]
    fn counts(&self) -> (u64, u64, u64) {
        let status = self.status_json().expect("status");
        let count = |field: &str| status[field].as_u64().expect(field);
        (count("queued"), count("assigned"), count("undelivered"))
    }

    /// Waits until agent `name` is waiting in get-task.
    #[track_caller]
    fn wait_idle(&self, name: &str) {
        wait_until(&format!("agent `{name}` is waiting"), || {
            self.status_json().is_some_and(|status| {
                status["agents"]
                    .as_array()
                    .expect("agents array")
                    .iter()
                    .any(|a| a["name"] == name && a["state"] == "idle")
            })
        });
    }
}

#[track_caller]
fn assert_has(haystack: &str, needle: &str) {
    assert!(
        haystack.contains(needle),
        "expected {needle:?} in:\n{haystack}"
    );
}

#[track_caller]
fn one_message(done_stdout: &str) -> AgentMessage {
    let lines: Vec<&str> = done_stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "one JSON line expected, got:\n{done_stdout}"
    );
    serde_json::from_str(lines[0]).expect("an agent message")
}

impl Pool {
    /// The task id and response file of what one `get-task --name NAME` is handed.
    #[track_caller]
    fn take_task(&self, name: &str) -> (String, String) {
        let done = self.run("get-task", &["--name", name]);
        match one_message(&done.stdout) {
            AgentMessage::Task {
                task_id,
                response_file,
                ..
            } => (task_id, response_file),
            other => panic!("expected a task, got {other:?}"),
        }
    }
}

// --- without a daemon ---

#[test]
fn protocol_without_flags_prints_commands_without_them() {
    let output = command(&["protocol", "--name", "alice"])
        .output()
        .expect("runs");
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).expect("utf-8");
    assert_has(&text, "\n   drover-pool get-task --name alice\n");
    assert!(!text.contains("--pool"), "{text}");
    assert!(!text.contains("--root"), "{text}");
    assert_has(&text, "\"kind\": \"Kicked\"");
    assert_has(&text, "response_file");
    assert_has(&text, "next_steps");
}

#[test]
fn protocol_repeats_given_flags_exactly() {
    let output = command(&[
        "protocol",
        "--name",
        "bob",
        "--pool=reviews",
        "--root",
        "/tmp/a root",
    ])
    .output()
    .expect("runs");
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).expect("utf-8");
    assert_has(
        &text,
        "\n   drover-pool get-task --name bob --pool reviews --root '/tmp/a root'\n",
    );

    let output = command(&["protocol", "--root", "/srv/drover", "--name", "bob"])
        .output()
        .expect("runs");
    let text = String::from_utf8(output.stdout).expect("utf-8");
    assert_has(
        &text,
        "\n   drover-pool get-task --name bob --root /srv/drover\n",
    );
    assert!(!text.contains("--pool"), "{text}");
}

#[test]
fn protocol_does_not_turn_environment_values_into_flags() {
    let output = command(&["protocol", "--name", "carol"])
        .env("DROVER_POOL", "from-env")
        .env("DROVER_ROOT", "/tmp/from-env")
        .output()
        .expect("runs");
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).expect("utf-8");
    assert_has(&text, "\n   drover-pool get-task --name carol\n");
    assert!(!text.contains("--pool"), "{text}");
    assert!(!text.contains("--root"), "{text}");
    assert!(!text.contains("from-env"), "{text}");
}

#[test]
fn status_stop_and_kick_without_a_daemon_exit_3() {
    let pool = Pool::new();
    for (sub, args) in [
        ("status", vec![]),
        ("status", vec!["--json"]),
        ("stop", vec![]),
        ("kick", vec!["--name", "a"]),
    ] {
        let done = pool.run(sub, &args);
        assert_eq!(done.status.code(), Some(3), "{sub}: {}", done.stderr);
        assert_has(&done.stderr, "no pool daemon is running for pool `default`");
        assert_has(&done.stderr, "drover-pool start");
        assert!(done.stdout.is_empty(), "{sub} printed {}", done.stdout);
    }
}

#[test]
fn get_task_on_a_stopped_pool_is_kicked() {
    let pool = Pool::new();
    std::fs::create_dir_all(pool.pool_dir()).expect("pool dir");
    std::fs::write(pool.pool_dir().join("stopped"), "stopped\n").expect("marker");
    for sub in ["get-task", "get_task"] {
        let done = pool.run(sub, &["--name", "a"]);
        assert!(done.status.success(), "{}", done.stderr);
        assert_eq!(
            one_message(&done.stdout),
            AgentMessage::Kicked {
                reason: "the pool was stopped".into()
            }
        );
    }
    let done = pool.run("agent", &["--name", "a", "--", "cat"]);
    assert!(done.status.success(), "{}", done.stderr);
    assert_has(&done.stderr, "the pool was stopped");
}

// --- with a daemon ---

#[test]
fn kick_reaches_a_waiting_agent() {
    let pool = Pool::new();
    let _daemon = pool.start();

    let mut get_task = pool.spawn("get-task", &["--name", "a"]);
    pool.wait_idle("a");
    assert!(get_task.exited().is_none(), "get-task blocks while idle");
    let done = pool.run("kick", &["--name", "a"]);
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        get_task.wait_within(DEADLINE).success(),
        "{}",
        get_task.stderr()
    );
    assert!(matches!(
        one_message(&get_task.stdout()),
        AgentMessage::Kicked { .. }
    ));

    // `agent` exits 0 when kicked.
    let mut agent = pool.spawn("agent", &["--name", "b", "--", "cat"]);
    pool.wait_idle("b");
    assert!(pool.run("kick", &["--name", "b"]).status.success());
    assert!(agent.wait_within(DEADLINE).success(), "{}", agent.stderr());
    assert_has(&agent.stderr(), "kicked");

    let done = pool.run("kick", &["--name", "nobody"]);
    assert_eq!(done.status.code(), Some(1));
    assert_has(&done.stderr, "no agent named `nobody`");
}

#[test]
fn a_second_daemon_on_the_same_pool_is_refused() {
    let pool = Pool::new();
    let mut first = pool.start();
    let done = pool.run("start", &[]);
    assert!(!done.status.success());
    assert_has(&done.stderr, "already running");
    assert!(first.exited().is_none(), "the first daemon keeps running");
    assert!(pool.run("status", &[]).status.success());
}

#[test]
fn a_second_live_get_task_under_one_name_is_refused() {
    let pool = Pool::new();
    let _daemon = pool.start();
    let mut first = pool.spawn("get-task", &["--name", "a"]);
    pool.wait_idle("a");
    let done = pool.run("get-task", &["--name", "a"]);
    assert_eq!(done.status.code(), Some(2), "{}", done.stderr);
    assert_has(&done.stderr, "already waiting");
    assert!(done.stdout.is_empty());
    assert!(first.exited().is_none(), "the first get-task keeps waiting");
    // Another name is fine.
    let mut other = pool.spawn("get-task", &["--name", "b"]);
    pool.wait_idle("b");
    assert!(other.exited().is_none());
}

#[test]
fn stop_kicks_waiting_agents_and_the_daemon_exits_0() {
    let pool = Pool::new();
    let mut daemon = pool.start();
    let mut get_task = pool.spawn("get-task", &["--name", "a"]);
    pool.wait_idle("a");

    let table = pool.run("status", &[]);
    assert!(table.status.success());
    assert_has(&table.stdout, "idle");
    assert_has(&table.stdout, "queued: 0");

    let done = pool.run("stop", &[]);
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        get_task.wait_within(DEADLINE).success(),
        "{}",
        get_task.stderr()
    );
    assert_eq!(
        one_message(&get_task.stdout()),
        AgentMessage::Kicked {
            reason: "the pool was stopped".into()
        }
    );
    let status = daemon.wait_within(DEADLINE);
    assert!(status.success(), "{status}: {}", daemon.stderr());
    // Agents that come later are told too, and status says the daemon is gone.
    let late = pool.run("get-task", &["--name", "b"]);
    assert!(matches!(
        one_message(&late.stdout),
        AgentMessage::Kicked { .. }
    ));
    let done = pool.run("status", &[]);
    assert_eq!(done.status.code(), Some(3));
    assert_has(&done.stderr, "stopped with `drover-pool stop`");
}

/// The runner's side of the socket, enough to submit tasks and read answers.
struct TestRunner {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    run_id: String,
    /// Answers read while waiting for a request's confirmation.
    answers: VecDeque<(TaskKey, AnswerOutcome, bool)>,
}

impl TestRunner {
    fn connect(pool: &Pool) -> TestRunner {
        TestRunner::connect_to(&pool.pool_dir().join("pool.sock"))
    }

    fn connect_to(socket: &Path) -> TestRunner {
        TestRunner::connect_as(socket, ulid::Ulid::generate().to_string())
    }

    /// The runner of `run_id` (again, after a daemon restart).
    fn connect_as(socket: &Path, run_id: String) -> TestRunner {
        let stream = UnixStream::connect(socket).expect("the daemon listens");
        stream
            .set_read_timeout(Some(DEADLINE))
            .expect("read timeout");
        let mut runner = TestRunner {
            reader: BufReader::new(stream.try_clone().expect("clone")),
            writer: stream,
            run_id: run_id.clone(),
            answers: VecDeque::new(),
        };
        runner.send(&Request::Runner { run_id });
        runner
    }

    fn send(&mut self, request: &Request) {
        let mut line = serde_json::to_vec(request).expect("encodes");
        line.push(b'\n');
        self.writer.write_all(&line).expect("sent");
    }

    /// Submits a task and waits until the pool has committed it.
    fn submit(&mut self, value: Value) -> String {
        let task_id = ulid::Ulid::generate().to_string();
        self.send_confirmed(&Request::Submit {
            tasks: vec![PoolTask {
                run_id: self.run_id.clone(),
                task_id: task_id.clone(),
                attempt: 1,
                instructions: "Do it.".into(),
                task: TaskRef {
                    kind: "Work".into(),
                    value: JsonText::stored(&value.to_string()),
                },
                next_steps: vec![],
            }],
        });
        task_id
    }

    fn key(&self, task_id: &str) -> TaskKey {
        TaskKey {
            run_id: self.run_id.clone(),
            task_id: task_id.to_string(),
            attempt: 1,
        }
    }

    fn reply(&mut self) -> Reply {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("a reply arrives");
        serde_json::from_str(&line).expect("a reply")
    }

    /// Sends `request` and waits for the daemon's confirmation that it is committed (`Ok`:
    /// each request on a runner connection gets one, in order).
    fn send_confirmed(&mut self, request: &Request) {
        self.send(request);
        loop {
            match self.reply() {
                Reply::Ok => return,
                Reply::Answer {
                    key, outcome, late, ..
                } => {
                    self.answers.push_back((key, outcome, late));
                }
                other => panic!("expected Ok, got {other:?}"),
            }
        }
    }

    /// The next answer (confirmations skipped): its key, outcome and `late` flag.
    fn answer_full(&mut self) -> (TaskKey, AnswerOutcome, bool) {
        if let Some(answer) = self.answers.pop_front() {
            return answer;
        }
        loop {
            match self.reply() {
                Reply::Ok => {}
                Reply::Answer {
                    key, outcome, late, ..
                } => return (key, outcome, late),
                other => panic!("expected an answer, got {other:?}"),
            }
        }
    }

    fn answer(&mut self) -> (String, AnswerOutcome) {
        let (key, outcome, _) = self.answer_full();
        (key.task_id, outcome)
    }
}

#[test]
fn get_task_survives_a_daemon_restart_and_agent_answers_tasks() {
    let pool = Pool::new();
    let mut daemon = pool.start();
    let mut get_task = pool.spawn("get-task", &["--name", "a"]);
    pool.wait_idle("a");

    // SIGKILL: the socket file stays behind; the next daemon takes it over.
    daemon.kill();
    let _daemon = pool.start();
    pool.wait_idle("a");
    assert!(
        get_task.exited().is_none(),
        "get-task waited through the restart"
    );

    let mut runner = TestRunner::connect(&pool);
    let first = runner.submit(json!({"n": 1}));
    assert!(
        get_task.wait_within(DEADLINE).success(),
        "{}",
        get_task.stderr()
    );
    let AgentMessage::Task {
        task_id,
        response_file,
        task,
        ..
    } = one_message(&get_task.stdout())
    else {
        panic!("expected a task: {}", get_task.stdout())
    };
    assert_eq!(task_id, first);
    assert_eq!(task.value.to_value(), json!({"n": 1}));
    std::fs::write(&response_file, "[]").expect("answer written");
    let (answered, outcome) = runner.answer();
    assert_eq!(answered, first);
    assert_eq!(outcome, AnswerOutcome::Answered { text: "[]".into() });

    // `agent`: the task message on stdin, stdout as the answer, even on a non-zero exit.
    let seen = pool.dir.path().join("seen.json");
    let script = r#"cat > "$0"; printf '[{"kind":"Next","value":"%s"}]' "$DROVER_TASK_ID"; exit 3"#;
    let mut agent = pool.spawn(
        "agent",
        &[
            "--name",
            "b",
            "--max-tasks",
            "1",
            "--",
            "sh",
            "-c",
            script,
            seen.to_str().expect("utf-8"),
        ],
    );
    let second = runner.submit(json!({"n": 2}));
    let (answered, outcome) = runner.answer();
    assert_eq!(answered, second);
    assert_eq!(
        outcome,
        AnswerOutcome::Answered {
            text: format!(r#"[{{"kind":"Next","value":"{second}"}}]"#)
        }
    );
    assert!(agent.wait_within(DEADLINE).success(), "{}", agent.stderr());
    assert_has(&agent.stderr(), "exit status: 3");
    let input: AgentMessage =
        serde_json::from_str(&std::fs::read_to_string(&seen).expect("input saved"))
            .expect("the task message on stdin");
    assert!(matches!(input, AgentMessage::Task { task_id, .. } if task_id == second));
    let leftovers: Vec<String> = std::fs::read_dir(pool.pool_dir().join("responses"))
        .expect("responses dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
}

/// `drover-pool agent` keeps one connection: after a task, the next `GetTask` goes over the
/// same socket, the answer written in between is delivered, and nothing else is accepted there.
#[test]
fn an_agent_connection_serves_task_after_task() {
    let pool = Pool::new();
    let _daemon = pool.start();
    let mut runner = TestRunner::connect(&pool);
    let first = runner.submit(json!({"n": 1}));
    let second = runner.submit(json!({"n": 2}));

    let stream =
        UnixStream::connect(pool.pool_dir().join("pool.sock")).expect("the daemon listens");
    stream
        .set_read_timeout(Some(DEADLINE))
        .expect("read timeout");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    let mut ask = |writer: &mut UnixStream, request: &Request| {
        let mut line = serde_json::to_vec(request).expect("encodes");
        line.push(b'\n');
        writer.write_all(&line).expect("sent");
        let mut reply = String::new();
        reader.read_line(&mut reply).expect("a reply arrives");
        reply
    };
    let get_task = Request::GetTask {
        name: "steady".into(),
    };
    let AgentMessage::Task {
        task_id,
        response_file,
        ..
    } = one_message(&ask(&mut writer, &get_task))
    else {
        panic!("expected the first task")
    };
    assert_eq!(task_id, first);
    std::fs::write(&response_file, "[]").expect("answer written");

    let AgentMessage::Task { task_id, .. } = one_message(&ask(&mut writer, &get_task)) else {
        panic!("expected the second task on the same connection")
    };
    assert_eq!(task_id, second);
    let (answered, outcome) = runner.answer();
    assert_eq!(answered, first);
    assert_eq!(outcome, AnswerOutcome::Answered { text: "[]".into() });

    let refused: Value =
        serde_json::from_str(&ask(&mut writer, &Request::Status)).expect("a JSON reply");
    assert_eq!(refused["type"], "Error", "{refused}");
    assert_has(
        refused["message"].as_str().unwrap_or_default(),
        "only GetTask",
    );
}

/// Each request on a runner connection is confirmed with `Ok` once the pool has committed it,
/// and a recall or an ack sent again (as a runner does after losing its connection before the
/// confirmation) is confirmed again and changes nothing.
#[test]
fn runner_requests_are_confirmed_and_repeated_recalls_and_acks_change_nothing() {
    let pool = Pool::new();
    let _daemon = pool.start();
    let mut runner = TestRunner::connect(&pool);

    let recalled = runner.submit(json!({"n": 1}));
    assert_eq!(pool.counts(), (1, 0, 0), "the confirmed submit is queued");
    let key = runner.key(&recalled);
    for _ in 0..2 {
        runner.send_confirmed(&Request::Recall {
            run_id: key.run_id.clone(),
            task_id: key.task_id.clone(),
            attempt: key.attempt,
        });
        assert_eq!(pool.counts(), (0, 0, 0), "the recalled task left the queue");
    }

    let answered = runner.submit(json!({"n": 2}));
    let (task_id, response_file) = pool.take_task("a");
    assert_eq!(task_id, answered, "the recalled task is not handed out");
    std::fs::write(&response_file, "[]").expect("answer written");
    let (key, outcome, late) = runner.answer_full();
    assert_eq!(key, runner.key(&answered));
    assert_eq!(outcome, AnswerOutcome::Answered { text: "[]".into() });
    assert!(!late);
    assert_eq!(pool.counts(), (0, 0, 1), "kept until acknowledged");
    for _ in 0..2 {
        runner.send_confirmed(&Request::Ack {
            keys: vec![key.clone()],
        });
        assert_eq!(
            pool.counts(),
            (0, 0, 0),
            "the acknowledged answer is forgotten"
        );
        assert!(!Path::new(&response_file).exists(), "its file is removed");
    }
    // A recall that comes after the answer was acknowledged changes nothing either.
    runner.send_confirmed(&Request::Recall {
        run_id: key.run_id.clone(),
        task_id: key.task_id.clone(),
        attempt: key.attempt,
    });
    assert_eq!(pool.counts(), (0, 0, 0));
}

/// A relative `--root`/`DROVER_ROOT` is taken from each command's current directory, and the
/// response file a task names is absolute, so an agent working elsewhere writes the right file.
/// Here the daemon runs in DIR with `--root rel`, the agent in DIR/elsewhere with
/// `DROVER_ROOT=../rel`: a relative response file would send its answer to
/// DIR/elsewhere/rel/…, which does not exist. `protocol` still repeats `--root` as given.
#[test]
fn a_relative_root_gives_agents_absolute_response_files() {
    let pool = Pool::new();
    let dir = pool.dir.path();
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("agent dir");
    let in_dir = |cwd: &Path, args: &[&str]| {
        let mut command = command(args);
        command.current_dir(cwd);
        command
    };
    let mut daemon = Proc::spawn(
        &pool.logs(),
        in_dir(dir, &["start", "--root", "rel"]),
        "start",
    );
    let socket = dir.join("rel/pools/default/pool.sock");
    wait_until("the daemon listens under DIR/rel", || {
        if let Some(status) = daemon.exited() {
            panic!("the daemon exited ({status}): {}", daemon.stderr());
        }
        UnixStream::connect(&socket).is_ok()
    });

    let mut agent_command = in_dir(
        &elsewhere,
        &[
            "agent",
            "--name",
            "a",
            "--max-tasks",
            "1",
            "--",
            "sh",
            "-c",
            r#"cat >/dev/null; printf '%s' "$DROVER_RESPONSE_FILE" > ../seen; echo '[]'"#,
        ],
    );
    agent_command.env("DROVER_ROOT", "../rel");
    let mut agent = Proc::spawn(&pool.logs(), agent_command, "agent");
    let mut runner = TestRunner::connect_to(&socket);
    let task = runner.submit(json!({"n": 1}));
    let (answered, outcome) = runner.answer();
    assert_eq!(answered, task);
    assert_eq!(
        outcome,
        AnswerOutcome::Answered {
            text: "[]\n".into()
        }
    );
    assert!(agent.wait_within(DEADLINE).success(), "{}", agent.stderr());
    let seen = PathBuf::from(std::fs::read_to_string(dir.join("seen")).expect("seen"));
    assert!(seen.is_absolute(), "{}", seen.display());
    assert_eq!(
        seen.parent(),
        Some(dir.join("rel/pools/default/responses").as_path()),
        "{}",
        seen.display()
    );

    let output = in_dir(dir, &["protocol", "--name", "a", "--root", "rel"])
        .output()
        .expect("runs");
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).expect("utf-8");
    assert_has(&text, "\n   drover-pool get-task --name a --root rel\n");
}

const ABANDONED: &str = "agent requested a new task without answering";

/// The agents `status --json` lists, with the task id each holds.
fn held_tasks(pool: &Pool) -> Vec<(String, Option<String>)> {
    let status = pool.status_json().expect("status");
    status["agents"]
        .as_array()
        .expect("agents array")
        .iter()
        .map(|a| {
            (
                a["name"].as_str().expect("a name").to_string(),
                a["task"]["task_id"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// A task the runner recalled (its action timed out) while an agent held it is still that
/// agent's after a daemon restart: status shows it busy with the task, and when it asks again
/// without answering, the task is settled (a late abandon error), not kept forever.
#[test]
fn a_recalled_task_stays_with_its_agent_across_a_daemon_restart() {
    let pool = Pool::new();
    let mut daemon = pool.start();
    let socket = pool.pool_dir().join("pool.sock");
    let mut runner = TestRunner::connect(&pool);
    let task_id = runner.submit(json!({"n": 1}));
    let done = pool.run("get-task", &["--name", "x"]);
    assert!(
        matches!(one_message(&done.stdout), AgentMessage::Task { task_id: t, .. } if t == task_id)
    );
    let key = runner.key(&task_id);
    runner.send_confirmed(&Request::Recall {
        run_id: key.run_id.clone(),
        task_id: key.task_id.clone(),
        attempt: key.attempt,
    });

    daemon.kill();
    let _daemon = pool.start();
    assert_eq!(
        held_tasks(&pool),
        vec![("x".to_string(), Some(task_id.clone()))],
        "the agent still holds the recalled task"
    );
    let mut runner = TestRunner::connect_as(&socket, runner.run_id.clone());
    let mut again = pool.spawn("get-task", &["--name", "x"]);
    pool.wait_idle("x");
    let (answered, outcome, late) = runner.answer_full();
    assert_eq!(answered, key);
    assert_eq!(
        outcome,
        AnswerOutcome::Failed {
            reason: ABANDONED.into()
        }
    );
    assert!(late, "the runner had recalled it");
    runner.send_confirmed(&Request::Ack { keys: vec![key] });
    let status = pool.status_json().expect("status");
    assert_eq!(
        (&status["assigned"], &status["undelivered"]),
        (&json!(0), &json!(0)),
        "{status}"
    );
    assert!(again.exited().is_none(), "x waits for a new task");
}

/// A pool file in which one agent holds two tasks (left by a daemon that lost track of the
/// older one when a kicked or restarted agent asked again): on start the newer stays the
/// agent's, the older is settled (abandoned, or its answer if the file is there) and reaches
/// its runner, instead of being kept as assigned forever.
#[test]
fn an_agent_holding_two_tasks_in_the_pool_file_keeps_the_newer_one() {
    let pool = Pool::new();
    std::fs::create_dir_all(pool.pool_dir()).expect("pool dir");
    let run_id = ulid::Ulid::generate();
    let older = ulid::Ulid::generate();
    let newer = ulid::Ulid::generate();
    let entry = |task: ulid::Ulid, state: EntryState| Entry {
        task: PoolTask {
            run_id: run_id.to_string(),
            task_id: task.to_string(),
            attempt: 1,
            instructions: "Do it.".into(),
            task: TaskRef {
                kind: "Work".into(),
                value: JsonText::stored("{}"),
            },
            next_steps: vec![],
        },
        state,
        submitted_ms: 1,
    };
    {
        let store = PoolStore::open(&pool.pool_dir().join("pool.redb")).expect("pool store");
        let older_entry = entry(
            older,
            EntryState::Assigned {
                agent: "x".into(),
                since_ms: 10,
                epoch: 1,
            },
        );
        let newer_entry = entry(
            newer,
            EntryState::Assigned {
                agent: "x".into(),
                since_ms: 20,
                epoch: 1,
            },
        );
        store
            .commit(
                &[
                    ((run_id.0, older.0, 1), &older_entry),
                    ((run_id.0, newer.0, 1), &newer_entry),
                ],
                &[],
            )
            .expect("entries written");
    }
    let _daemon = pool.start();
    assert_eq!(
        held_tasks(&pool),
        vec![("x".to_string(), Some(newer.to_string()))]
    );
    let mut runner = TestRunner::connect_as(&pool.pool_dir().join("pool.sock"), run_id.to_string());
    let (key, outcome, late) = runner.answer_full();
    assert_eq!(key.task_id, older.to_string());
    assert_eq!(
        outcome,
        AnswerOutcome::Failed {
            reason: ABANDONED.into()
        }
    );
    assert!(!late);
    let status = pool.status_json().expect("status");
    assert_eq!(status["assigned"], 1, "{status}");
}

/// `RunEnded`: the pool forgets the run's queued tasks and its answers nobody acknowledged
/// (deleting their response files) at once, touches no other run's tasks, and repeated (as a
/// runner does after losing its connection before the confirmation) changes nothing.
#[test]
fn run_ended_forgets_the_runs_queued_and_answered_tasks_and_nothing_else() {
    let pool = Pool::new();
    let _daemon = pool.start();
    let socket = pool.pool_dir().join("pool.sock");
    let mut ended = TestRunner::connect(&pool);
    let mut other = TestRunner::connect_to(&socket);

    let answered = ended.submit(json!({"n": 1}));
    let (task_id, response_file) = pool.take_task("a");
    assert_eq!(task_id, answered);
    std::fs::write(&response_file, "[]").expect("answer written");
    assert_eq!(ended.answer().0, answered, "delivered, never acknowledged");
    ended.submit(json!({"n": 2}));
    let kept = other.submit(json!({"n": 3}));
    assert_eq!(pool.counts(), (2, 0, 1));

    for _ in 0..2 {
        ended.send_confirmed(&Request::RunEnded {
            run_id: ended.run_id.clone(),
        });
        assert_eq!(
            pool.counts(),
            (1, 0, 0),
            "only the other run's task is left"
        );
        assert!(
            !Path::new(&response_file).exists(),
            "the answer's file is removed"
        );
    }
    let done = pool.run("get-task", &["--name", "b"]);
    assert!(
        matches!(one_message(&done.stdout), AgentMessage::Task { task_id, .. } if task_id == kept),
        "the other run's task is handed out: {}",
        done.stdout
    );
}
