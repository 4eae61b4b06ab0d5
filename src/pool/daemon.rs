//! The pool daemon: hands queued tasks to waiting agents, watches response files, and delivers
//! answers to the runner of each run.
//!
//! One actor owns all state. Connection handlers and the response-file watcher send it
//! commands; it applies a batch of them, commits what changed to the pool's redb file in one
//! transaction, and only then replies — so a task is never handed to an agent, nor an answer
//! to a runner, before the pool would remember it after SIGKILL.
//!
//! Response files are read when inotify reports them closed after writing (or renamed into
//! place), never while an agent may still be writing them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};
use ulid::Ulid;

use super::conn::{LineReader, LineWriter, split};
use super::paths::PoolPaths;
use super::protocol::{
    AgentMessage, AgentStatus, AnswerOutcome, PoolTask, Reply, Request, StatusReport, TaskKey,
};
use super::store::{Entry, EntryState, Key, PoolStore};

const MAX_BATCH: usize = 4096;
const ABANDONED: &str = "agent requested a new task without answering";
const KICKED: &str = "kicked by drover-pool kick";
const KICKED_ABANDON: &str =
    "kicked by drover-pool kick --abandon: the task you held was given up; do not answer it";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Runs the daemon in the foreground until SIGINT/SIGTERM or `drover-pool stop`.
pub fn run_blocking(paths: PoolPaths) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(run(paths))
}

pub async fn run(paths: PoolPaths) -> Result<(), String> {
    crate::store::create_private_dir(&paths.dir)?;
    crate::store::create_private_dir(&paths.responses())?;
    let lock_file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(paths.daemon_lock())
        .map_err(|e| format!("cannot open {}: {e}", paths.daemon_lock().display()))?;
    let _lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|_| {
        format!(
            "a daemon is already running for pool `{}` ({})",
            paths.name,
            paths.dir.display()
        )
    })?;
    // Holding the lock means any socket file left is a stale one from a killed daemon.
    let socket = paths.socket();
    if socket.exists() {
        std::fs::remove_file(&socket)
            .map_err(|e| format!("cannot remove stale socket {}: {e}", socket.display()))?;
    }
    let listener = UnixListener::bind(&socket)
        .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot restrict {}: {e}", socket.display()))?;
    let _ = std::fs::remove_file(paths.stopped_marker());

    let store = PoolStore::open(&paths.database())?;
    let epoch = store.epoch()?;
    let (tx, rx) = mpsc::unbounded_channel();
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let mut state = State::new(paths.clone(), epoch, stop_tx);
    state.load(store.load()?);
    watch_responses(&paths.responses(), tx.clone())?;
    // Answers written while no daemon was running are picked up now.
    for (key, entry) in &state.entries {
        if matches!(
            entry.state,
            EntryState::Assigned { .. } | EntryState::Recalled { .. }
        ) {
            let path = state.response_path(*key);
            if std::fs::read_to_string(&path)
                .is_ok_and(|text| serde_json::from_str::<serde_json::Value>(&text).is_ok())
                && let Some(name) = path.file_name()
            {
                let _ = tx.send(Cmd::ResponseClosed {
                    file_name: name.to_string_lossy().into_owned(),
                });
            }
        }
    }
    // Answers written while no daemon was running to tasks already settled go, as they would
    // have on arrival (see `settled_response`).
    if let Ok(dir) = std::fs::read_dir(paths.responses()) {
        for file in dir.flatten() {
            let name = file.file_name();
            if response_key(&name.to_string_lossy()).is_some_and(|key| state.settled_response(key))
            {
                let _ = std::fs::remove_file(file.path());
            }
        }
    }
    let actor = tokio::spawn(actor(state, store, rx));
    tracing::info!(pool = %paths.name, socket = %socket.display(), "pool daemon started");
    crate::say!(
        "drover-pool: pool `{}` listening on {}",
        paths.name,
        socket.display()
    );

    let mut next_conn = 0u64;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    next_conn += 1;
                    tokio::spawn(handle_connection(stream, tx.clone(), next_conn));
                }
                Err(e) => tracing::warn!("accept failed: {e}"),
            },
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = stop_rx.changed() => break,
        }
    }
    let _ = std::fs::remove_file(&socket);
    // Let connection handlers write what the actor already answered (the `stop` reply, the
    // Kicked messages) before the runtime goes away.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    drop(tx);
    actor.abort();
    crate::say!("drover-pool: pool `{}` stopped", paths.name);
    Ok(())
}

/// Reports response files closed after writing or renamed into place. A plain thread doing
/// blocking reads keeps this free of `unsafe` fd registration; it ends with the process.
fn watch_responses(dir: &Path, tx: mpsc::UnboundedSender<Cmd>) -> Result<(), String> {
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC)
        .map_err(|e| format!("cannot watch response files: {e}"))?;
    inotify
        .add_watch(
            dir,
            AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO,
        )
        .map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
    std::thread::Builder::new()
        .name("response-watcher".into())
        .spawn(move || {
            loop {
                match inotify.read_events() {
                    Ok(events) => {
                        for event in events {
                            if let Some(name) = event.name
                                && tx
                                    .send(Cmd::ResponseClosed {
                                        file_name: name.to_string_lossy().into_owned(),
                                    })
                                    .is_err()
                            {
                                return;
                            }
                        }
                    }
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => {
                        tracing::error!("reading inotify events failed: {e}");
                        return;
                    }
                }
            }
        })
        .map_err(|e| format!("cannot start the response watcher: {e}"))?;
    Ok(())
}

enum Cmd {
    GetTask {
        name: String,
        conn: u64,
        reply: oneshot::Sender<Result<AgentMessage, String>>,
    },
    AgentGone {
        conn: u64,
    },
    TaskUndelivered {
        name: String,
        key: Key,
    },
    Runner {
        run_id: String,
        conn: u64,
        tx: mpsc::UnboundedSender<Reply>,
    },
    RunnerGone {
        conn: u64,
    },
    Request {
        request: Request,
        reply: Option<oneshot::Sender<Reply>>,
        runner: Option<mpsc::UnboundedSender<Reply>>,
    },
    ResponseClosed {
        file_name: String,
    },
}

struct Waiter {
    name: String,
    conn: u64,
    reply: oneshot::Sender<Result<AgentMessage, String>>,
}

#[derive(Default)]
struct Agent {
    task: Option<Key>,
    since_ms: u64,
    /// Kicked while not waiting: the reason it is told at its next get-task.
    kicked: Option<&'static str>,
}

/// Replies held back until the batch's commit.
enum Outgoing {
    Agent(
        oneshot::Sender<Result<AgentMessage, String>>,
        Result<AgentMessage, String>,
    ),
    Reply(oneshot::Sender<Reply>, Reply),
    Runner(mpsc::UnboundedSender<Reply>, Reply),
    RemoveFile(std::path::PathBuf),
}

struct State {
    paths: PoolPaths,
    epoch: u64,
    entries: HashMap<Key, Entry>,
    /// (priority, seq) → key; priority 0 puts an undelivered task back at the front.
    queue: BTreeMap<(u8, u64), Key>,
    next_seq: u64,
    waiting: VecDeque<Waiter>,
    agents: HashMap<String, Agent>,
    runners: HashMap<u128, (u64, mpsc::UnboundedSender<Reply>)>,
    dirty: Vec<Key>,
    deleted: Vec<Key>,
    out: Vec<Outgoing>,
    stop: Arc<watch::Sender<bool>>,
    stopping: bool,
}

async fn actor(mut state: State, store: PoolStore, mut rx: mpsc::UnboundedReceiver<Cmd>) {
    while let Some(first) = rx.recv().await {
        state.apply(first);
        let mut n = 1;
        while n < MAX_BATCH {
            match rx.try_recv() {
                Ok(cmd) => {
                    state.apply(cmd);
                    n += 1;
                }
                Err(_) => break,
            }
        }
        state.assign_waiting();
        let puts: Vec<(Key, Entry)> = std::mem::take(&mut state.dirty)
            .into_iter()
            .filter_map(|key| state.entries.get(&key).map(|e| (key, e.clone())))
            .collect();
        let deletes = std::mem::take(&mut state.deleted);
        let put_refs: Vec<(Key, &Entry)> = puts.iter().map(|(k, e)| (*k, e)).collect();
        let committed = tokio::task::block_in_place(|| store.commit(&put_refs, &deletes));
        if let Err(e) = committed {
            // Without a durable record nothing may be handed out; stop rather than lie.
            tracing::error!("{e}");
            crate::say!("drover-pool: {e}; stopping");
            let _ = state.stop.send(true);
            return;
        }
        for outgoing in std::mem::take(&mut state.out) {
            match outgoing {
                Outgoing::Agent(tx, message) => {
                    if let Err(Ok(AgentMessage::Task {
                        task_id, attempt, ..
                    })) = tx.send(message)
                    {
                        tracing::debug!(task_id, attempt, "agent left before its task was sent");
                    }
                }
                Outgoing::Reply(tx, reply) => {
                    let _ = tx.send(reply);
                }
                Outgoing::Runner(tx, reply) => {
                    let _ = tx.send(reply);
                }
                Outgoing::RemoveFile(path) => {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        if state.stopping && state.waiting.is_empty() {
            let _ = state.stop.send(true);
        }
    }
}

fn parse_key(key: &TaskKey) -> Result<Key, String> {
    let run =
        Ulid::from_string(&key.run_id).map_err(|e| format!("bad run id `{}`: {e}", key.run_id))?;
    let task = Ulid::from_string(&key.task_id)
        .map_err(|e| format!("bad task id `{}`: {e}", key.task_id))?;
    Ok((run.0, task.0, key.attempt))
}

/// The answer an entry holds, as its runner is sent it.
fn delivery(entry: &Entry) -> Option<Reply> {
    let EntryState::Answered {
        outcome,
        late,
        agent,
    } = &entry.state
    else {
        return None;
    };
    Some(Reply::Answer {
        key: task_key(&entry.task),
        outcome: outcome.clone(),
        late: *late,
        agent: agent.clone(),
    })
}

/// What `kick --abandon` did to the tasks the agent held, for its reply.
fn describe_given_up(given_up: &[(TaskKey, bool)]) -> String {
    if given_up.is_empty() {
        return "; it held no task".into();
    }
    given_up
        .iter()
        .map(|(key, answered)| {
            let task = format!(
                "task {} (attempt {}) of run {}",
                key.task_id, key.attempt, key.run_id
            );
            if *answered {
                format!("; its {task} had a complete answer on file, which is delivered")
            } else {
                format!(
                    "; gave up its {task}: the runner records an error and retries it if the step allows"
                )
            }
        })
        .collect()
}

/// The task a response file belongs to, from its name `RUN-TASK-ATTEMPT.json`.
fn response_key(file_name: &str) -> Option<Key> {
    let stem = file_name.strip_suffix(".json")?;
    let mut parts = stem.splitn(3, '-');
    let (run, task, attempt) = (parts.next()?, parts.next()?, parts.next()?);
    parse_key(&TaskKey {
        run_id: run.to_string(),
        task_id: task.to_string(),
        attempt: attempt.parse().ok()?,
    })
    .ok()
}

fn task_key(task: &PoolTask) -> TaskKey {
    TaskKey {
        run_id: task.run_id.clone(),
        task_id: task.task_id.clone(),
        attempt: task.attempt,
    }
}

impl State {
    fn new(paths: PoolPaths, epoch: u64, stop: watch::Sender<bool>) -> Self {
        Self {
            paths,
            epoch,
            entries: HashMap::new(),
            queue: BTreeMap::new(),
            next_seq: 0,
            waiting: VecDeque::new(),
            agents: HashMap::new(),
            runners: HashMap::new(),
            dirty: Vec::new(),
            deleted: Vec::new(),
            out: Vec::new(),
            stop: Arc::new(stop),
            stopping: false,
        }
    }

    fn load(&mut self, entries: Vec<(Key, Entry)>) {
        // A recalled task is still its agent's until answered or abandoned, like an assigned
        // one: forgotten here, the agent asking again would not settle it, and it would stay
        // in the pool for good.
        let mut held: HashMap<String, (u64, Key)> = HashMap::new();
        let mut dropped = Vec::new();
        for (key, entry) in entries {
            match &entry.state {
                EntryState::Queued { seq } => {
                    self.queue.insert((1, *seq), key);
                    self.next_seq = self.next_seq.max(seq + 1);
                }
                EntryState::Assigned {
                    agent, since_ms, ..
                }
                | EntryState::Recalled {
                    agent, since_ms, ..
                } => {
                    // An agent works on one task at a time. Two in the file (left by a daemon
                    // that lost track of one) mean it asked again after the older one.
                    let mine = (*since_ms, key);
                    match held.get(agent).copied() {
                        Some(other) if other > mine => dropped.push(key),
                        Some(other) => {
                            dropped.push(other.1);
                            held.insert(agent.clone(), mine);
                        }
                        None => {
                            held.insert(agent.clone(), mine);
                        }
                    }
                }
                EntryState::Answered { .. } => {}
            }
            self.entries.insert(key, entry);
        }
        for (agent, (since_ms, key)) in held {
            let record = self.agents.entry(agent).or_default();
            record.task = Some(key);
            record.since_ms = since_ms;
        }
        for key in dropped {
            let late = matches!(
                self.entries.get(&key),
                Some(Entry {
                    state: EntryState::Recalled { .. },
                    ..
                })
            );
            self.settle_from_file(key, late);
        }
    }

    fn response_path(&self, key: Key) -> std::path::PathBuf {
        self.paths
            .response_file(&Ulid(key.0).to_string(), &Ulid(key.1).to_string(), key.2)
    }

    fn apply(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::GetTask { name, conn, reply } => self.get_task(name, conn, reply),
            Cmd::AgentGone { conn } => self.waiting.retain(|w| w.conn != conn),
            Cmd::TaskUndelivered { name, key } => {
                if self.entries.get(&key).is_some_and(
                    |entry| matches!(&entry.state, EntryState::Assigned { agent, .. } if *agent == name),
                ) {
                    self.requeue(key);
                    if let Some(agent) = self.agents.get_mut(&name) {
                        agent.task = None;
                    }
                }
            }
            Cmd::Runner { run_id, conn, tx } => {
                let Ok(run) = Ulid::from_string(&run_id) else {
                    let _ = tx.send(Reply::Error {
                        message: format!("bad run id `{run_id}`"),
                    });
                    return;
                };
                for (key, entry) in &self.entries {
                    if key.0 == run.0
                        && let Some(reply) = delivery(entry)
                    {
                        self.out.push(Outgoing::Runner(tx.clone(), reply));
                    }
                }
                self.runners.insert(run.0, (conn, tx));
            }
            Cmd::RunnerGone { conn } => self.runners.retain(|_, (c, _)| *c != conn),
            Cmd::ResponseClosed { file_name } => self.response_closed(&file_name),
            Cmd::Request {
                request,
                reply,
                runner,
            } => {
                let to_runner = runner.clone();
                let answer = self.request(request, runner);
                match (reply, to_runner) {
                    (Some(tx), _) => self.out.push(Outgoing::Reply(tx, answer)),
                    // Every request on a runner connection is answered, in order and only once
                    // committed: the runner counts the replies to know which recalls and acks
                    // are safe in the pool's file and which to send again after a reconnect.
                    (None, Some(tx)) => self.out.push(Outgoing::Runner(tx, answer)),
                    (None, None) => {}
                }
            }
        }
    }

    fn request(&mut self, request: Request, runner: Option<mpsc::UnboundedSender<Reply>>) -> Reply {
        match request {
            Request::Submit { tasks } => {
                for task in tasks {
                    let key = match parse_key(&task_key(&task)) {
                        Ok(key) => key,
                        Err(message) => return Reply::Error { message },
                    };
                    if let Some(existing) = self.entries.get(&key) {
                        // Idempotent: an answered task is delivered again, anything else is
                        // already on its way.
                        if let (Some(reply), Some(tx)) = (delivery(existing), &runner) {
                            self.out.push(Outgoing::Runner(tx.clone(), reply));
                        }
                        continue;
                    }
                    let seq = self.next_seq;
                    self.next_seq += 1;
                    self.entries.insert(
                        key,
                        Entry {
                            task,
                            state: EntryState::Queued { seq },
                            submitted_ms: now_ms(),
                        },
                    );
                    self.queue.insert((1, seq), key);
                    self.dirty.push(key);
                }
                Reply::Ok
            }
            Request::Recall {
                run_id,
                task_id,
                attempt,
            } => {
                let key = match parse_key(&TaskKey {
                    run_id,
                    task_id,
                    attempt,
                }) {
                    Ok(key) => key,
                    Err(message) => return Reply::Error { message },
                };
                let Some(entry) = self.entries.get_mut(&key) else {
                    return Reply::Ok;
                };
                match entry.state.clone() {
                    EntryState::Queued { seq } => {
                        self.queue.remove(&(1, seq));
                        self.queue.remove(&(0, seq));
                        self.entries.remove(&key);
                        self.deleted.push(key);
                    }
                    EntryState::Assigned {
                        agent, since_ms, ..
                    } => {
                        entry.state = EntryState::Recalled {
                            agent,
                            since_ms,
                            run_ended: false,
                        };
                        self.dirty.push(key);
                    }
                    EntryState::Recalled { .. } | EntryState::Answered { .. } => {}
                }
                Reply::Ok
            }
            Request::Ack { keys } => {
                for key in keys {
                    let Ok(key) = parse_key(&key) else { continue };
                    if matches!(
                        self.entries.get(&key),
                        Some(Entry {
                            state: EntryState::Answered { .. },
                            ..
                        })
                    ) {
                        self.forget(key);
                    }
                }
                Reply::Ok
            }
            Request::RunEnded { run_id } => match Ulid::from_string(&run_id) {
                Ok(run) => {
                    self.run_ended(run.0);
                    Reply::Ok
                }
                Err(e) => Reply::Error {
                    message: format!("bad run id `{run_id}`: {e}"),
                },
            },
            Request::Status => Reply::Status(self.status()),
            Request::Kick { name, abandon } => self.kick(&name, abandon),
            Request::Stop => {
                self.stopping = true;
                let _ = std::fs::write(
                    self.paths.stopped_marker(),
                    b"stopped by drover-pool stop\n",
                );
                for waiter in std::mem::take(&mut self.waiting) {
                    self.out.push(Outgoing::Agent(
                        waiter.reply,
                        Ok(AgentMessage::Kicked {
                            reason: "the pool was stopped".into(),
                        }),
                    ));
                }
                Reply::Ok
            }
            Request::GetTask { .. } | Request::Runner { .. } => Reply::Error {
                message: "unexpected request on this connection".into(),
            },
        }
    }

    /// Forgets what the pool holds of an ended run: its queued tasks and its answers (with
    /// their response files) now; the tasks agents still hold are marked, and forgotten when
    /// their agent answers or asks again (see `answer`). Repeating it changes nothing.
    ///
    /// No set of ended runs is kept: it would grow by one with every run that ever ended.
    /// After this, all the pool holds of the run is the tasks agents still hold, one per agent
    /// at most; the mark rides on them, so that the run ended is forgotten with its last one.
    fn run_ended(&mut self, run: u128) {
        let keys: Vec<Key> = self
            .entries
            .keys()
            .filter(|k| k.0 == run)
            .copied()
            .collect();
        for key in keys {
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            match entry.state.clone() {
                EntryState::Queued { seq } => {
                    self.queue.remove(&(1, seq));
                    self.queue.remove(&(0, seq));
                    self.forget(key);
                }
                EntryState::Answered { .. } => self.forget(key),
                EntryState::Assigned {
                    agent, since_ms, ..
                }
                | EntryState::Recalled {
                    agent, since_ms, ..
                } => {
                    entry.state = EntryState::Recalled {
                        agent,
                        since_ms,
                        run_ended: true,
                    };
                    self.dirty.push(key);
                }
            }
        }
    }

    /// Drops an entry and, once that is committed, its response file.
    fn forget(&mut self, key: Key) {
        if self.entries.remove(&key).is_some() {
            self.deleted.push(key);
            self.out.push(Outgoing::RemoveFile(self.response_path(key)));
        }
    }

    /// Puts an assigned task back at the front of the queue, for the next waiting agent.
    fn requeue(&mut self, key: Key) {
        let Some(entry) = self.entries.get_mut(&key) else {
            return;
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        entry.state = EntryState::Queued { seq };
        self.queue.insert((0, seq), key);
        self.dirty.push(key);
    }

    /// Agent `name` leaves (kicked, or the pool stops) while it may still hold a task: the task
    /// gets the answer on file or the abandon error, as when the agent asks again without
    /// answering, so the runner waiting for it is not left waiting forever.
    fn release_held_task(&mut self, name: &str) {
        let Some(key) = self
            .agents
            .get_mut(name)
            .and_then(|agent| agent.task.take())
        else {
            return;
        };
        if self.settle_held_task(name, key).is_some() {
            // Assigned by an earlier daemon, maybe never delivered, and this agent is going
            // away: the task is not lost work, so another agent may have it.
            self.requeue(key);
        }
    }

    /// Kicks agent `name`: now if it is waiting, else at its next get-task. With `abandon`,
    /// the task it holds is given up now too (see `abandon_held`), and the reply says what
    /// happened; without it, the reply stays the plain `Ok` older clients expect.
    fn kick(&mut self, name: &str, abandon: bool) -> Reply {
        let reason = if abandon { KICKED_ABANDON } else { KICKED };
        let given_up = if abandon {
            self.abandon_held(name)
        } else {
            Vec::new()
        };
        let pool = self.paths.name.clone();
        if let Some(position) = self.waiting.iter().position(|w| w.name == name)
            && let Some(waiter) = self.waiting.remove(position)
        {
            self.release_held_task(name);
            self.agents.remove(name);
            self.out.push(Outgoing::Agent(
                waiter.reply,
                Ok(AgentMessage::Kicked {
                    reason: reason.into(),
                }),
            ));
            if !abandon {
                return Reply::Ok;
            }
            return Reply::Kicked {
                message: format!(
                    "agent `{name}` of pool `{pool}` was waiting for a task: kicked{}",
                    describe_given_up(&given_up)
                ),
            };
        }
        match self.agents.get_mut(name) {
            Some(agent) => {
                agent.kicked = Some(reason);
                if !abandon {
                    return Reply::Ok;
                }
                Reply::Kicked {
                    message: format!(
                        "agent `{name}` of pool `{pool}` kicked: it receives `Kicked` at its next get-task{}",
                        describe_given_up(&given_up)
                    ),
                }
            }
            // Not an error with --abandon: run again after the agent has gone (or by a script
            // that does not know whether it went), it has nothing left to do.
            None if abandon => Reply::Kicked {
                message: format!(
                    "no agent named `{name}` is known to pool `{pool}`: nobody to kick{}",
                    describe_given_up(&given_up)
                ),
            },
            None => Reply::Error {
                message: format!("no agent named `{name}` is known to pool `{pool}`"),
            },
        }
    }

    /// Gives up, now, the task(s) the pool has as held by agent `name` (its record names one,
    /// but the entries are what the runner waits on, so they are searched): each runner gets
    /// an `Error` naming the kick, as for an abandoned task, and retries it if its step allows.
    /// An answer already complete on file is delivered instead: the agent finished that work
    /// before it went. Committed with the batch, before the kick is answered.
    ///
    /// The agent may still be alive and write its response file later: the entry is settled
    /// by then, so `response_closed` deletes that file unread. That is also why a task an
    /// earlier daemon assigned (maybe never delivered) is given up here rather than queued
    /// again as a plain kick does: its retry is a new attempt with its own response file,
    /// which an answer from this agent can never land in.
    fn abandon_held(&mut self, name: &str) -> Vec<(TaskKey, bool)> {
        if let Some(agent) = self.agents.get_mut(name) {
            agent.task = None;
            agent.since_ms = now_ms();
        }
        let mut held: Vec<(Key, bool)> = self
            .entries
            .iter()
            .filter_map(|(key, entry)| match &entry.state {
                EntryState::Assigned { agent, .. } if agent == name => Some((*key, false)),
                EntryState::Recalled { agent, .. } if agent == name => Some((*key, true)),
                _ => None,
            })
            .collect();
        held.sort_unstable();
        let mut given_up = Vec::new();
        for (key, late) in held {
            let Some(task) = self.entries.get(&key).map(|e| task_key(&e.task)) else {
                continue;
            };
            // Half an answer (the agent died writing it) is not used: the kick gives it up.
            let complete = std::fs::read_to_string(self.response_path(key))
                .ok()
                .filter(|text| serde_json::from_str::<serde_json::Value>(text).is_ok());
            let answered = complete.is_some();
            let outcome = match complete {
                Some(text) => AnswerOutcome::Answered { text },
                None => AnswerOutcome::Failed {
                    reason: format!(
                        "agent `{name}` was kicked with --abandon while holding the task"
                    ),
                },
            };
            self.answer(key, outcome, late);
            given_up.push((task, answered));
        }
        given_up
    }

    fn get_task(
        &mut self,
        name: String,
        conn: u64,
        reply: oneshot::Sender<Result<AgentMessage, String>>,
    ) {
        if self.stopping {
            self.release_held_task(&name);
            self.out.push(Outgoing::Agent(
                reply,
                Ok(AgentMessage::Kicked {
                    reason: "the pool was stopped".into(),
                }),
            ));
            return;
        }
        self.waiting.retain(|w| !w.reply.is_closed());
        if self.waiting.iter().any(|w| w.name == name) {
            self.out.push(Outgoing::Agent(
                reply,
                Err(format!(
                    "an agent named `{name}` is already waiting for a task in pool `{}`",
                    self.paths.name
                )),
            ));
            return;
        }
        let agent = self.agents.entry(name.clone()).or_default();
        if let Some(reason) = agent.kicked {
            // Asking again means the agent is done with what it held (§4): settle that before
            // the record that names it goes.
            self.release_held_task(&name);
            self.agents.remove(&name);
            self.out.push(Outgoing::Agent(
                reply,
                Ok(AgentMessage::Kicked {
                    reason: reason.into(),
                }),
            ));
            return;
        }
        if let Some(key) = agent.task.take()
            && let Some(resend) = self.settle_held_task(&name, key)
        {
            // Assigned by an earlier daemon that may have died before the agent got it: hand
            // the same task over again rather than calling it abandoned.
            if let Some(agent) = self.agents.get_mut(&name) {
                agent.task = Some(key);
                agent.since_ms = now_ms();
            }
            self.out.push(Outgoing::Agent(reply, Ok(resend)));
            return;
        }
        if let Some(agent) = self.agents.get_mut(&name) {
            agent.since_ms = now_ms();
        }
        self.waiting.push_back(Waiter { name, conn, reply });
    }

    /// The agent asks for new work while holding `key`: take its answer if the file is there,
    /// otherwise it abandoned the task. Returns a task to resend instead (see `get_task`).
    fn settle_held_task(&mut self, name: &str, key: Key) -> Option<AgentMessage> {
        let path = self.response_path(key);
        let entry = self.entries.get(&key)?;
        let (late, assigned_epoch) = match &entry.state {
            EntryState::Assigned { agent, epoch, .. } if agent == name => (false, *epoch),
            EntryState::Recalled { agent, .. } if agent == name => (true, self.epoch),
            _ => return None,
        };
        if !late && assigned_epoch != self.epoch && !path.exists() {
            return Some(self.task_message(key));
        }
        self.settle_from_file(key, late);
        None
    }

    /// Settles a task its agent has left: with the answer on file, else as abandoned.
    fn settle_from_file(&mut self, key: Key, late: bool) {
        let outcome = match std::fs::read_to_string(self.response_path(key)) {
            Ok(text) => AnswerOutcome::Answered { text },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => AnswerOutcome::Failed {
                reason: ABANDONED.to_string(),
            },
            Err(e) => AnswerOutcome::Failed {
                reason: format!("cannot read the response file: {e}"),
            },
        };
        self.answer(key, outcome, late);
    }

    fn task_message(&self, key: Key) -> AgentMessage {
        let task = self.entries.get(&key).map(|e| e.task.clone());
        match task {
            Some(task) => AgentMessage::Task {
                task_id: task.task_id.clone(),
                attempt: task.attempt,
                response_file: self.response_path(key).display().to_string(),
                instructions: task.instructions,
                task: task.task,
                next_steps: task.next_steps,
            },
            None => AgentMessage::Kicked {
                reason: "internal error: the task vanished".into(),
            },
        }
    }

    fn answer(&mut self, key: Key, outcome: AnswerOutcome, late: bool) {
        let Some(entry) = self.entries.get_mut(&key) else {
            return;
        };
        if matches!(
            entry.state,
            EntryState::Recalled {
                run_ended: true,
                ..
            }
        ) {
            // Nobody will ever take it: kept, it would stay in the pool for good.
            self.forget(key);
            return;
        }
        let agent = match &entry.state {
            EntryState::Assigned { agent, .. } | EntryState::Recalled { agent, .. } => {
                Some(agent.clone())
            }
            EntryState::Queued { .. } | EntryState::Answered { .. } => None,
        };
        entry.state = EntryState::Answered {
            outcome,
            late,
            agent,
        };
        self.dirty.push(key);
        if let Some((_, tx)) = self.runners.get(&key.0)
            && let Some(reply) = delivery(entry)
        {
            self.out.push(Outgoing::Runner(tx.clone(), reply));
        }
    }

    fn response_closed(&mut self, file_name: &str) {
        let Some(key) = response_key(file_name) else {
            return;
        };
        let (agent, late) = match self.entries.get(&key).map(|entry| &entry.state) {
            Some(EntryState::Assigned { agent, .. }) => (agent.clone(), false),
            Some(EntryState::Recalled { agent, .. }) => (agent.clone(), true),
            Some(EntryState::Queued { .. }) => return,
            // Written after the task was settled: deleted unread (see `settled_response`).
            Some(EntryState::Answered { .. }) | None => {
                self.out.push(Outgoing::RemoveFile(self.response_path(key)));
                return;
            }
        };
        let outcome = match std::fs::read_to_string(self.response_path(key)) {
            Ok(text) => AnswerOutcome::Answered { text },
            Err(e) => AnswerOutcome::Failed {
                reason: format!("cannot read the response file: {e}"),
            },
        };
        if let Some(record) = self.agents.get_mut(&agent)
            && record.task == Some(key)
        {
            record.task = None;
            record.since_ms = now_ms();
        }
        self.answer(key, outcome, late);
    }

    /// Whether a response file for `key` can only be one written after its task was settled
    /// (answered, given up by `kick --abandon`, or forgotten with its run): such a file is
    /// deleted unread, never applied, as nothing would ever read it and, kept, it would stay in
    /// the pool's directory for good.
    fn settled_response(&self, key: Key) -> bool {
        match self.entries.get(&key) {
            None => true,
            Some(entry) => matches!(entry.state, EntryState::Answered { .. }),
        }
    }

    /// Hands queued tasks to waiting agents, first come first served.
    fn assign_waiting(&mut self) {
        while !self.queue.is_empty() {
            let Some(waiter) = self.waiting.pop_front() else {
                return;
            };
            if waiter.reply.is_closed() {
                continue;
            }
            let Some((_, key)) = self.queue.pop_first() else {
                self.waiting.push_front(waiter);
                return;
            };
            let now = now_ms();
            if let Some(entry) = self.entries.get_mut(&key) {
                entry.state = EntryState::Assigned {
                    agent: waiter.name.clone(),
                    since_ms: now,
                    epoch: self.epoch,
                };
                self.dirty.push(key);
            }
            let agent = self.agents.entry(waiter.name.clone()).or_default();
            agent.task = Some(key);
            agent.since_ms = now;
            let message = self.task_message(key);
            self.out.push(Outgoing::Agent(waiter.reply, Ok(message)));
        }
    }

    fn status(&self) -> StatusReport {
        let mut agents: Vec<AgentStatus> = self
            .agents
            .iter()
            .map(|(name, agent)| {
                let waiting = self.waiting.iter().any(|w| w.name == *name);
                let task = agent
                    .task
                    .and_then(|key| self.entries.get(&key))
                    .map(|e| task_key(&e.task));
                AgentStatus {
                    name: name.clone(),
                    state: if task.is_some() {
                        "busy".into()
                    } else if waiting {
                        "idle".into()
                    } else {
                        "away".into()
                    },
                    task,
                    since_ms: agent.since_ms,
                }
            })
            .collect();
        agents.sort_by(|a, b| a.name.cmp(&b.name));
        let count = |f: fn(&EntryState) -> bool| {
            self.entries.values().filter(|e| f(&e.state)).count() as u64
        };
        StatusReport {
            pool: self.paths.name.clone(),
            agents,
            queued: self.queue.len() as u64,
            assigned: count(|s| {
                matches!(s, EntryState::Assigned { .. } | EntryState::Recalled { .. })
            }),
            undelivered: count(|s| matches!(s, EntryState::Answered { .. })),
        }
    }
}

async fn handle_connection(stream: UnixStream, tx: mpsc::UnboundedSender<Cmd>, conn: u64) {
    let (mut reader, mut writer) = split(stream);
    let first: Request = match reader.recv().await {
        Ok(Some(request)) => request,
        Ok(None) => return,
        Err(e) => {
            let _ = writer
                .send(&Reply::Error {
                    message: e.to_string(),
                })
                .await;
            return;
        }
    };
    match first {
        Request::GetTask { name } => serve_agent(name, reader, writer, tx, conn).await,
        Request::Runner { run_id } => {
            let (runner_tx, mut runner_rx) = mpsc::unbounded_channel();
            if tx
                .send(Cmd::Runner {
                    run_id,
                    conn,
                    tx: runner_tx.clone(),
                })
                .is_err()
            {
                return;
            }
            loop {
                tokio::select! {
                    outgoing = runner_rx.recv() => match outgoing {
                        Some(reply) => if writer.send(&reply).await.is_err() { break },
                        None => break,
                    },
                    incoming = reader.recv::<Request>() => match incoming {
                        Ok(Some(request)) => {
                            let cmd = Cmd::Request { request, reply: None, runner: Some(runner_tx.clone()) };
                            if tx.send(cmd).is_err() { break }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            let _ = writer.send(&Reply::Error { message: e.to_string() }).await;
                            break;
                        }
                    },
                }
            }
            let _ = tx.send(Cmd::RunnerGone { conn });
        }
        request => {
            let (reply_tx, reply_rx) = oneshot::channel();
            let cmd = Cmd::Request {
                request,
                reply: Some(reply_tx),
                runner: None,
            };
            if tx.send(cmd).is_err() {
                return;
            }
            if let Ok(reply) = reply_rx.await {
                let _ = writer.send(&reply).await;
            }
        }
    }
}

/// An agent's connection: one task per `GetTask`, asked again on the same connection by
/// `drover-pool agent` (a `get-task` process asks once and exits). Anything the agent sends
/// while waiting, or the connection closing, means it is gone.
async fn serve_agent(
    mut name: String,
    mut reader: LineReader,
    mut writer: LineWriter,
    tx: mpsc::UnboundedSender<Cmd>,
    conn: u64,
) {
    loop {
        let (reply_tx, reply_rx) = oneshot::channel();
        let asked = Cmd::GetTask {
            name: name.clone(),
            conn,
            reply: reply_tx,
        };
        if tx.send(asked).is_err() {
            return;
        }
        tokio::select! {
            reply = reply_rx => match reply {
                Ok(Ok(message)) => {
                    if writer.send(&message).await.is_err() {
                        if let AgentMessage::Task { task_id, attempt, .. } = &message
                            && let Some(key) = find_key(&message, task_id, *attempt)
                        {
                            let _ = tx.send(Cmd::TaskUndelivered { name, key });
                        }
                        return;
                    }
                    if matches!(message, AgentMessage::Kicked { .. }) {
                        return;
                    }
                }
                Ok(Err(message)) => {
                    let _ = writer.send(&Reply::Error { message }).await;
                    return;
                }
                Err(_) => return,
            },
            _ = reader.recv::<serde_json::Value>() => {
                let _ = tx.send(Cmd::AgentGone { conn });
                return;
            }
        }
        match reader.recv::<Request>().await {
            Ok(Some(Request::GetTask { name: next })) => name = next,
            Ok(Some(_)) => {
                let message = "only GetTask may follow a task on an agent connection".to_string();
                let _ = writer.send(&Reply::Error { message }).await;
                return;
            }
            Ok(None) | Err(_) => return,
        }
    }
}

fn find_key(message: &AgentMessage, task_id: &str, attempt: u32) -> Option<Key> {
    let AgentMessage::Task { response_file, .. } = message else {
        return None;
    };
    // The run id is the first part of the response file name.
    let name = Path::new(response_file)
        .file_name()?
        .to_string_lossy()
        .into_owned();
    let run = name.split('-').next()?.to_string();
    parse_key(&TaskKey {
        run_id: run,
        task_id: task_id.to_string(),
        attempt,
    })
    .ok()
}
