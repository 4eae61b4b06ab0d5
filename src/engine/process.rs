//! Running hooks and Command actions as child processes.
//!
//! A hook is arbitrary shell text, so it may start background jobs, ignore SIGTERM, never read
//! its stdin, or print megabytes. Spawning it naively leaks processes and deadlocks on full
//! pipes, and tokio's `kill_on_drop` only reaches the direct child: a grandchild survives (see
//! DESIGN.md, "Measured facts"). So every child leads its own process group, every kill is aimed
//! at the whole group, and all three pipes are serviced concurrently. Live groups are recorded
//! in a [`ProcessTracker`] so that shutdown can reach processes whose futures it does not own,
//! and a drop guard covers the case where the future running a process is abandoned.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use nix::errno::Errno;
use nix::libc;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::watch;
use tokio::time::Instant;

/// How long a timed-out group gets between SIGTERM and SIGKILL (CONTRACT.md §3).
pub const TERM_GRACE: Duration = Duration::from_secs(5);

/// Default cap on kept stdout: large enough for any sane JSON answer, small enough that a
/// runaway hook cannot exhaust the runner's memory.
pub const DEFAULT_STDOUT_LIMIT: usize = 16 * 1024 * 1024;

/// Default stderr tail: the end of stderr is where the reason for a failure usually is.
pub const DEFAULT_STDERR_LIMIT: usize = 64 * 1024;

/// After the leader exits, output already in the pipes is read at once; this only bounds how
/// long we wait for stragglers (background jobs still holding the pipes) before killing them.
const EXIT_DRAIN: Duration = Duration::from_millis(250);

/// After a group kill the pipes reach EOF as soon as the kernel tears the processes down; the
/// bound matters only when a process outside the group inherited a pipe, which would otherwise
/// keep us reading forever.
const KILLED_DRAIN: Duration = Duration::from_millis(250);

/// How often to check whether a SIGTERMed group has emptied once its leader is gone. The kernel
/// offers no notification for "last member of a process group exited", and each check scans
/// /proc, so not too often.
const GROUP_POLL: Duration = Duration::from_millis(50);

/// Reaping after SIGKILL is normally instant; the bound keeps a process stuck in uninterruptible
/// sleep from wedging the caller (tokio reaps it later as an orphan).
const REAP_LIMIT: Duration = Duration::from_secs(5);

const READ_CHUNK: usize = 64 * 1024;

/// What to run and how to feed and bound it.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// Run as `sh -c SCRIPT`.
    pub script: String,
    pub cwd: PathBuf,
    /// Added to the inherited environment.
    pub env: Vec<(String, String)>,
    /// Written to the child's stdin, which is then closed.
    pub stdin: Vec<u8>,
    pub timeout: Option<Duration>,
    /// Keep at most this many bytes of stdout (the head); more sets `stdout_overflow`.
    pub stdout_limit: usize,
    /// Keep the last this many bytes of stderr (the tail); more sets `stderr_truncated`.
    pub stderr_limit: usize,
}

impl ProcessSpec {
    /// A spec with no extra environment, empty stdin, no timeout and the default limits.
    pub fn new(script: impl Into<String>, cwd: impl Into<PathBuf>) -> Self {
        Self {
            script: script.into(),
            cwd: cwd.into(),
            env: Vec::new(),
            stdin: Vec::new(),
            timeout: None,
            stdout_limit: DEFAULT_STDOUT_LIMIT,
            stderr_limit: DEFAULT_STDERR_LIMIT,
        }
    }
}

/// How the process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessOutcome {
    /// The leader exited on its own (or was killed by something other than us).
    Exited {
        status: ExitInfo,
        stdout: Vec<u8>,
        stdout_overflow: bool,
        stderr: Vec<u8>,
        stderr_truncated: bool,
    },
    /// The timeout elapsed and the group was killed; output is whatever arrived before that.
    TimedOut {
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        stderr_truncated: bool,
    },
    /// Killed because [`ProcessTracker::kill_all`] was invoked.
    Cancelled,
    /// The process could not be started at all.
    SpawnFailed { error: String },
}

/// Exit status of the group leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl ExitInfo {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// Neither code nor signal: used when waiting for the process itself failed.
    fn unknown() -> Self {
        Self {
            code: None,
            signal: None,
        }
    }
}

impl From<ExitStatus> for ExitInfo {
    fn from(status: ExitStatus) -> Self {
        Self {
            code: status.code(),
            signal: status.signal(),
        }
    }
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "exit code {code}"),
            (None, Some(signal)) => write!(f, "killed by signal {signal}"),
            (None, None) => f.write_str("unknown exit status"),
        }
    }
}

/// Shared registry of live process groups, so that shutdown can kill processes whose futures
/// are owned by other tasks. Clones share the registry.
///
/// Cancellation is sticky: after [`kill_all`](Self::kill_all), every later [`run`] with this
/// tracker returns [`ProcessOutcome::Cancelled`] without spawning, which closes the race with a
/// spawn that is in flight while shutdown begins.
#[derive(Debug, Clone, Default)]
pub struct ProcessTracker {
    inner: Arc<TrackerInner>,
}

#[derive(Debug, Default)]
struct TrackerInner {
    state: Mutex<TrackerState>,
    cancelled: watch::Sender<bool>,
}

#[derive(Debug, Default)]
struct TrackerState {
    next_id: u64,
    /// Keyed by a registration id rather than the pgid, so that a recycled pid can never make
    /// one run's deregistration remove another's entry.
    groups: HashMap<u64, Pid>,
    cancelled: bool,
}

impl ProcessTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// SIGKILL every live group and make the runs that own them return `Cancelled`.
    pub fn kill_all(&self) {
        let mut state = self.lock();
        state.cancelled = true;
        // Signal while holding the lock: a run deregisters only under the lock, after reaping,
        // so no group is killed after its run has let go of it.
        for &pgid in state.groups.values() {
            signal_group(pgid, Signal::SIGKILL);
        }
        drop(state);
        self.inner.cancelled.send_replace(true);
    }

    /// Number of process groups currently registered (spawned and not yet reaped).
    pub fn live(&self) -> usize {
        self.lock().groups.len()
    }

    /// Whether [`kill_all`](Self::kill_all) has been invoked.
    pub fn is_cancelled(&self) -> bool {
        self.lock().cancelled
    }

    fn lock(&self) -> MutexGuard<'_, TrackerState> {
        // The state stays consistent even if a holder panicked: every update is one statement.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn register(&self, pgid: Pid) -> Registration {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.groups.insert(id, pgid);
        if state.cancelled {
            // kill_all ran between our pre-spawn check and now; it could not see this group.
            signal_group(pgid, Signal::SIGKILL);
        }
        Registration {
            tracker: self.clone(),
            id,
            pgid,
            armed: true,
        }
    }
}

/// Keeps a group registered while its run is alive. If the run's future is dropped before it
/// finishes, the group is SIGKILLed here: nothing else would ever kill it.
struct Registration {
    tracker: ProcessTracker,
    id: u64,
    pgid: Pid,
    armed: bool,
}

impl Registration {
    /// The run has killed and reaped the group itself; killing again could hit a recycled pgid.
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.tracker.lock();
        if self.armed {
            signal_group(self.pgid, Signal::SIGKILL);
        }
        state.groups.remove(&self.id);
    }
}

/// Run `spec` to completion, with the contract's 5 s grace between SIGTERM and SIGKILL.
pub async fn run(spec: ProcessSpec, tracker: &ProcessTracker) -> ProcessOutcome {
    run_with_grace(spec, tracker, TERM_GRACE).await
}

/// [`run`] with a chosen grace between SIGTERM and SIGKILL on timeout (tests use a short one).
pub async fn run_with_grace(
    spec: ProcessSpec,
    tracker: &ProcessTracker,
    grace: Duration,
) -> ProcessOutcome {
    let ProcessSpec {
        script,
        cwd,
        env,
        stdin,
        timeout,
        stdout_limit,
        stderr_limit,
    } = spec;

    let mut cancel = tracker.inner.cancelled.subscribe();
    if tracker.is_cancelled() {
        return ProcessOutcome::Cancelled;
    }

    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(&script)
        .current_dir(&cwd)
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        // Backstop for the leader if everything else fails; the group is handled below.
        .kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            return ProcessOutcome::SpawnFailed {
                error: format!("cannot start `sh -c` in {}: {error}", cwd.display()),
            };
        }
    };
    let Some(pgid) = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
    else {
        return ProcessOutcome::SpawnFailed {
            error: "the spawned shell has no usable pid".to_owned(),
        };
    };
    // Declared after `child` so it drops first: the group is killed while the leader is still
    // unreaped, which guarantees the pgid has not been recycled.
    let mut registration = tracker.register(pgid);

    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    let mut stdin_error = None;
    let mut stdout = Captured::new(stdout_limit, Keep::Head);
    let mut stderr = Captured::new(stderr_limit, Keep::Tail);
    let stdin_pipe = child.stdin.take();
    let stdout_pipe = child.stdout.take();
    let stderr_pipe = child.stderr.take();

    let ended = {
        let io = async {
            tokio::join!(
                feed(stdin_pipe, stdin, &mut stdin_error),
                pump(stdout_pipe, &mut stdout),
                pump(stderr_pipe, &mut stderr),
            );
        };
        tokio::pin!(io);
        supervise(&mut child, pgid, io, deadline, grace, &mut cancel).await
    };
    registration.disarm();
    drop(registration);

    let notes = [
        ("writing stdin", stdin_error),
        ("reading stdout", stdout.error.take()),
        ("reading stderr", stderr.error.take()),
    ];
    for (what, error) in notes {
        if let Some(error) = error {
            tracing::warn!(%error, script = %script, "{what} of a child process failed");
            stderr.push(format!("\ndrover: {what} failed: {error}\n").as_bytes());
        }
    }

    match ended {
        Ended::Exited(status) => {
            let status = match status {
                Ok(status) => ExitInfo::from(status),
                Err(error) => {
                    tracing::warn!(%error, script = %script, "waiting for a child process failed");
                    stderr.push(
                        format!("\ndrover: waiting for the process failed: {error}\n").as_bytes(),
                    );
                    ExitInfo::unknown()
                }
            };
            let (stdout, stdout_overflow) = stdout.finish();
            let (stderr, stderr_truncated) = stderr.finish();
            ProcessOutcome::Exited {
                status,
                stdout,
                stdout_overflow,
                stderr,
                stderr_truncated,
            }
        }
        Ended::TimedOut => {
            let (stdout, _) = stdout.finish();
            let (stderr, stderr_truncated) = stderr.finish();
            ProcessOutcome::TimedOut {
                stdout,
                stderr,
                stderr_truncated,
            }
        }
        Ended::Cancelled => ProcessOutcome::Cancelled,
    }
}

enum Ended {
    Exited(io::Result<ExitStatus>),
    TimedOut,
    Cancelled,
}

/// Wait for the leader, the deadline or cancellation while `io` services the pipes, then make
/// sure the whole group is dead before returning.
async fn supervise<F: Future<Output = ()>>(
    child: &mut Child,
    pgid: Pid,
    mut io: Pin<&mut F>,
    deadline: Option<Instant>,
    grace: Duration,
    cancel: &mut watch::Receiver<bool>,
) -> Ended {
    let mut io_done = false;
    let first = loop {
        tokio::select! {
            // Cancellation first: kill_all sets the flag before it kills, so a leader that died
            // of that kill is reported as cancelled, not as "killed by signal 9".
            biased;
            () = cancelled(cancel) => break Ended::Cancelled,
            status = child.wait() => break Ended::Exited(status),
            () = until(deadline) => break Ended::TimedOut,
            () = io.as_mut(), if !io_done => io_done = true,
        }
    };

    match first {
        Ended::Exited(status) => {
            // A background job may still hold the pipes; don't let it keep the hook alive.
            drain(io.as_mut(), &mut io_done, EXIT_DRAIN).await;
            signal_group(pgid, Signal::SIGKILL);
            drain(io.as_mut(), &mut io_done, KILLED_DRAIN).await;
            Ended::Exited(status)
        }
        Ended::Cancelled => {
            signal_group(pgid, Signal::SIGKILL);
            reap(child).await;
            Ended::Cancelled
        }
        Ended::TimedOut => {
            signal_group(pgid, Signal::SIGTERM);
            let grace_end = Instant::now().checked_add(grace);
            let mut reaped = false;
            // The grace is for the whole group, not just the leader: a grandchild doing its own
            // cleanup on SIGTERM gets the same time.
            while !reaped || group_alive(pgid) {
                tokio::select! {
                    biased;
                    () = cancelled(cancel) => {
                        signal_group(pgid, Signal::SIGKILL);
                        if !reaped {
                            reap(child).await;
                        }
                        return Ended::Cancelled;
                    }
                    _ = child.wait(), if !reaped => reaped = true,
                    () = until(grace_end) => break,
                    () = io.as_mut(), if !io_done => io_done = true,
                    () = tokio::time::sleep(GROUP_POLL), if reaped => {}
                }
            }
            signal_group(pgid, Signal::SIGKILL);
            if !reaped {
                reap(child).await;
            }
            drain(io.as_mut(), &mut io_done, KILLED_DRAIN).await;
            Ended::TimedOut
        }
    }
}

async fn cancelled(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|cancelled| *cancelled).await.is_err() {
        // The sender lives in the tracker we borrow, so this cannot happen; never fire.
        std::future::pending::<()>().await;
    }
}

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

async fn drain<F: Future<Output = ()>>(io: Pin<&mut F>, io_done: &mut bool, limit: Duration) {
    if !*io_done && tokio::time::timeout(limit, io).await.is_ok() {
        *io_done = true;
    }
}

async fn reap(child: &mut Child) {
    let _ = tokio::time::timeout(REAP_LIMIT, child.wait()).await;
}

fn signal_group(pgid: Pid, signal: Signal) {
    match killpg(pgid, signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(error) => {
            tracing::warn!(%error, pgid = pgid.as_raw(), ?signal, "cannot signal process group")
        }
    }
}

fn group_alive(pgid: Pid) -> bool {
    // EPERM means a member exists that we may not signal (it changed uid): still alive.
    if matches!(killpg(pgid, None), Err(Errno::ESRCH)) {
        return false;
    }
    // Zombies still count for killpg, and orphans are reparented to PID 1, which in a container
    // often never reaps them: without this, every timed-out group with a background job would
    // sit out the whole grace.
    #[cfg(target_os = "linux")]
    if let Some(live) = has_live_member(pgid) {
        return live;
    }
    true
}

/// Whether any non-zombie process is in group `pgid`, or `None` if /proc can't tell us.
#[cfg(target_os = "linux")]
fn has_live_member(pgid: Pid) -> Option<bool> {
    let processes = super::procfs::processes()?;
    Some(
        processes
            .iter()
            .any(|p| p.pgrp == pgid.as_raw() && !p.is_zombie()),
    )
}

async fn feed(pipe: Option<ChildStdin>, data: Vec<u8>, error: &mut Option<io::Error>) {
    let Some(pipe) = pipe else { return };
    let mut pipe = NoSigpipe(pipe);
    if let Err(e) = pipe.write_all(&data).await {
        // A child may legitimately ignore its stdin and exit (or close it) before reading it all.
        if e.kind() != io::ErrorKind::BrokenPipe {
            *error = Some(e);
        }
    }
    // Dropping `pipe` closes it, so the child sees EOF.
}

/// Writes to a child's stdin without SIGPIPE. The binaries restore the default SIGPIPE action
/// (so `drover … | head` ends quietly), and under it a hook that exits or closes its stdin
/// before reading everything would kill the runner itself instead of yielding EPIPE. The write
/// syscall happens inside `poll_write` on the current thread, and a pipe's SIGPIPE is sent to
/// the writing thread, so blocking it in this thread around the call is enough.
struct NoSigpipe(ChildStdin);

impl AsyncWrite for NoSigpipe {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut blocked = SigpipeBlocked::new();
        let result = Pin::new(&mut self.0).poll_write(cx, buf);
        if let Poll::Ready(Err(e)) = &result
            && e.kind() == io::ErrorKind::BrokenPipe
        {
            blocked.discard_pending();
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// SIGPIPE blocked in the current thread until drop, which restores the previous mask.
struct SigpipeBlocked {
    /// The mask to restore, or `None` if SIGPIPE was already blocked (then someone else owns
    /// any pending SIGPIPE) or blocking failed.
    previous: Option<SigSet>,
}

impl SigpipeBlocked {
    fn new() -> Self {
        let previous = sigpipe_set()
            .thread_swap_mask(SigmaskHow::SIG_BLOCK)
            .ok()
            .filter(|previous| !previous.contains(Signal::SIGPIPE));
        Self { previous }
    }

    /// Swallows the SIGPIPE our failed write raised, so unblocking can't deliver it.
    fn discard_pending(&mut self) {
        // Checked first because sigwait would block if nothing is pending.
        if self.previous.is_some() && sigpipe_pending() {
            let _ = sigpipe_set().wait();
        }
    }
}

impl Drop for SigpipeBlocked {
    fn drop(&mut self) {
        if let Some(previous) = &self.previous {
            let _ = previous.thread_set_mask();
        }
    }
}

fn sigpipe_set() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGPIPE);
    set
}

fn sigpipe_pending() -> bool {
    let mut pending = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigpending initialises the set when it returns 0, and the set is read only then.
    unsafe {
        libc::sigpending(pending.as_mut_ptr()) == 0
            && libc::sigismember(pending.as_ptr(), libc::SIGPIPE) == 1
    }
}

async fn pump<R: AsyncRead + Unpin>(pipe: Option<R>, sink: &mut Captured) {
    let Some(mut pipe) = pipe else { return };
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => sink.push(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                sink.error = Some(e);
                return;
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Keep {
    Head,
    Tail,
}

/// Bounded capture of one output stream. Reading always continues to EOF even past the limit:
/// a child blocked on a full pipe would otherwise hang until its timeout.
struct Captured {
    data: Vec<u8>,
    limit: usize,
    keep: Keep,
    cut: bool,
    error: Option<io::Error>,
}

impl Captured {
    fn new(limit: usize, keep: Keep) -> Self {
        Self {
            data: Vec::new(),
            limit,
            keep,
            cut: false,
            error: None,
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        match self.keep {
            Keep::Head => {
                let room = self.limit.saturating_sub(self.data.len());
                if chunk.len() > room {
                    self.cut = true;
                }
                self.data.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Keep::Tail => {
                self.data.extend_from_slice(chunk);
                let excess = self.data.len().saturating_sub(self.limit);
                if excess > 0 {
                    self.cut = true;
                }
                // Compact only once the excess is large, so the copying stays amortised O(1).
                if excess >= self.limit.max(READ_CHUNK) {
                    self.data.drain(..excess);
                }
            }
        }
    }

    fn finish(mut self) -> (Vec<u8>, bool) {
        let excess = self.data.len().saturating_sub(self.limit);
        self.data.drain(..excess);
        (self.data, self.cut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Generous: CI machines are slow and shared, and these bounds only catch hangs.
    const PATIENCE: Duration = Duration::from_secs(20);
    const SHORT_GRACE: Duration = Duration::from_millis(600);

    fn spec(script: &str) -> ProcessSpec {
        ProcessSpec::new(script, std::env::temp_dir())
    }

    async fn run_short(spec: ProcessSpec, tracker: &ProcessTracker) -> ProcessOutcome {
        match tokio::time::timeout(PATIENCE, run_with_grace(spec, tracker, SHORT_GRACE)).await {
            Ok(outcome) => outcome,
            Err(_) => panic!("run did not return within {PATIENCE:?}"),
        }
    }

    fn exited(outcome: ProcessOutcome) -> (ExitInfo, Vec<u8>, bool, Vec<u8>, bool) {
        match outcome {
            ProcessOutcome::Exited {
                status,
                stdout,
                stdout_overflow,
                stderr,
                stderr_truncated,
            } => (status, stdout, stdout_overflow, stderr, stderr_truncated),
            other => panic!("expected Exited, got {}", describe(&other)),
        }
    }

    fn describe(outcome: &ProcessOutcome) -> String {
        match outcome {
            ProcessOutcome::Exited { status, stderr, .. } => {
                format!(
                    "Exited({status}), stderr {:?}",
                    String::from_utf8_lossy(stderr)
                )
            }
            ProcessOutcome::TimedOut { .. } => "TimedOut".to_owned(),
            ProcessOutcome::Cancelled => "Cancelled".to_owned(),
            ProcessOutcome::SpawnFailed { error } => format!("SpawnFailed({error})"),
        }
    }

    /// Deterministic bytes that are not a repeating short pattern, so misordering shows.
    fn noise(len: usize) -> Vec<u8> {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect()
    }

    /// A pid is gone once it no longer exists or is a zombie: orphans are reparented to PID 1,
    /// which in a container may never reap them.
    fn is_gone(pid: Pid) -> bool {
        match nix::sys::signal::kill(pid, None) {
            Err(Errno::ESRCH) => true,
            Err(_) => false,
            Ok(()) => std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
                    Some(state == 'Z' || state == 'X')
                })
                .unwrap_or(false),
        }
    }

    async fn assert_gone(pid: Pid, what: &str) {
        let deadline = Instant::now() + PATIENCE;
        while !is_gone(pid) {
            assert!(
                Instant::now() < deadline,
                "{what} (pid {pid}) is still alive"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the script has written a pid to `path`.
    async fn read_pid(path: &Path) -> Pid {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(text) = std::fs::read_to_string(path)
                && text.ends_with('\n')
                && let Ok(pid) = text.trim().parse::<i32>()
            {
                return Pid::from_raw(pid);
            }
            assert!(
                Instant::now() < deadline,
                "{} never got a pid",
                path.display()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn eight_mib_round_trip_through_cat() {
        let tracker = ProcessTracker::new();
        let input = noise(8 * 1024 * 1024);
        let mut spec = spec("cat");
        spec.stdin = input.clone();
        let (status, stdout, overflow, _, _) = exited(run_short(spec, &tracker).await);
        assert!(status.success(), "{status}");
        assert!(!overflow);
        assert_eq!(stdout.len(), input.len());
        assert!(stdout == input, "stdout differs from stdin");
        assert_eq!(tracker.live(), 0);
    }

    #[tokio::test]
    async fn eight_mib_to_stdout_and_stderr_at_once_does_not_deadlock() {
        let tracker = ProcessTracker::new();
        let input = noise(8 * 1024 * 1024);
        let mut spec = spec("tee /dev/stderr");
        spec.stdin = input.clone();
        spec.stderr_limit = 1000;
        let (status, stdout, overflow, stderr, truncated) = exited(run_short(spec, &tracker).await);
        assert!(status.success(), "{status}");
        assert!(!overflow);
        assert!(stdout == input, "stdout differs from stdin");
        assert!(truncated);
        assert!(
            stderr == input[input.len() - 1000..],
            "stderr is not the tail of stdin"
        );
    }

    #[tokio::test]
    async fn stdout_beyond_the_limit_is_cut_and_flagged() {
        let tracker = ProcessTracker::new();
        let input = noise(3 * 1024 * 1024);
        let mut spec = spec("cat");
        spec.stdin = input.clone();
        spec.stdout_limit = 100_000;
        let (status, stdout, overflow, _, _) = exited(run_short(spec, &tracker).await);
        assert!(status.success(), "{status}");
        assert!(overflow);
        assert!(
            stdout == input[..100_000],
            "stdout is not the head of stdin"
        );
    }

    #[tokio::test]
    async fn stdout_exactly_at_the_limit_is_not_flagged() {
        let tracker = ProcessTracker::new();
        let mut spec = spec("printf 12345");
        spec.stdout_limit = 5;
        let (_, stdout, overflow, _, _) = exited(run_short(spec, &tracker).await);
        assert_eq!(stdout, b"12345");
        assert!(!overflow);
    }

    #[tokio::test]
    async fn stderr_keeps_the_tail_and_flags_truncation() {
        let tracker = ProcessTracker::new();
        let script = "i=0; while [ $i -lt 2000 ]; do echo line$i >&2; i=$((i+1)); done";
        let mut spec = spec(script);
        spec.stderr_limit = 20;
        let (_, _, _, stderr, truncated) = exited(run_short(spec, &tracker).await);
        let full: String = (0..2000).map(|i| format!("line{i}\n")).collect();
        assert!(truncated);
        assert_eq!(String::from_utf8_lossy(&stderr), full[full.len() - 20..]);

        let mut spec = self::spec("echo short >&2");
        spec.stderr_limit = 20;
        let (_, _, _, stderr, truncated) = exited(run_short(spec, &tracker).await);
        assert!(!truncated);
        assert_eq!(stderr, b"short\n");
    }

    #[tokio::test]
    async fn a_child_that_ignores_its_stdin_is_not_an_error() {
        let tracker = ProcessTracker::new();
        let mut spec = spec("echo ok");
        spec.stdin = noise(4 * 1024 * 1024);
        let (status, stdout, _, stderr, _) = exited(run_short(spec, &tracker).await);
        assert!(status.success(), "{status}");
        assert_eq!(stdout, b"ok\n");
        assert_eq!(stderr, b"");
    }

    const SIGPIPE_PROBE_ENV: &str = "DROVER_PROCESS_SIGPIPE_PROBE";

    /// The binaries restore the default SIGPIPE action (so `drover … | head` ends quietly), and
    /// then a hook that closes its stdin early would kill the runner itself. The probe runs in a
    /// child test process because signal dispositions are process-wide.
    #[test]
    fn a_child_that_closes_stdin_early_does_not_kill_a_runner_with_default_sigpipe() {
        let exe = std::env::current_exe().expect("current_exe");
        let output = std::process::Command::new(exe)
            .args([
                "--exact",
                "engine::process::tests::sigpipe_probe",
                "--nocapture",
            ])
            .env(SIGPIPE_PROBE_ENV, "1")
            .output()
            .expect("run the probe");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "probe failed ({}):\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Only does something when started by the test above.
    #[tokio::test]
    async fn sigpipe_probe() {
        if std::env::var_os(SIGPIPE_PROBE_ENV).is_none() {
            return;
        }
        crate::cli::restore_sigpipe();
        let tracker = ProcessTracker::new();
        let mut spec = spec("exec 0<&-; echo ok");
        spec.stdin = noise(4 * 1024 * 1024);
        let (status, stdout, ..) = exited(run_short(spec, &tracker).await);
        assert!(status.success(), "{status}");
        assert_eq!(stdout, b"ok\n");
    }

    #[tokio::test]
    async fn exit_code_is_reported() {
        let tracker = ProcessTracker::new();
        let (status, ..) = exited(run_short(spec("exit 3"), &tracker).await);
        assert_eq!(
            status,
            ExitInfo {
                code: Some(3),
                signal: None
            }
        );
        assert!(!status.success());
        assert_eq!(status.to_string(), "exit code 3");

        let (status, ..) = exited(run_short(spec("true"), &tracker).await);
        assert!(status.success());
        assert_eq!(status.to_string(), "exit code 0");
    }

    #[tokio::test]
    async fn death_by_signal_is_reported() {
        let tracker = ProcessTracker::new();
        let (status, ..) = exited(run_short(spec("kill -9 $$"), &tracker).await);
        assert_eq!(
            status,
            ExitInfo {
                code: None,
                signal: Some(9)
            }
        );
        assert!(!status.success());
        assert_eq!(status.to_string(), "killed by signal 9");
    }

    #[tokio::test]
    async fn env_is_added_and_cwd_is_used() {
        let tracker = ProcessTracker::new();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut spec = ProcessSpec::new(
            r#"printf '%s|%s\n' "$DROVER_TEST_VAR" "$HOME"; pwd -P"#,
            dir.path(),
        );
        spec.env = vec![("DROVER_TEST_VAR".into(), "hello world".into())];
        let (status, stdout, ..) = exited(run_short(spec, &tracker).await);
        assert!(status.success(), "{status}");
        let home = std::env::var("HOME").unwrap_or_default();
        let cwd = std::fs::canonicalize(dir.path()).expect("canonicalize");
        assert_eq!(
            String::from_utf8_lossy(&stdout),
            format!("hello world|{home}\n{}\n", cwd.display())
        );
    }

    #[tokio::test]
    async fn a_missing_cwd_is_a_spawn_failure() {
        let tracker = ProcessTracker::new();
        let spec = ProcessSpec::new("true", "/nonexistent/drover/dir");
        match run_short(spec, &tracker).await {
            ProcessOutcome::SpawnFailed { error } => {
                assert!(error.contains("/nonexistent/drover/dir"), "{error}")
            }
            other => panic!("expected SpawnFailed, got {}", describe(&other)),
        }
        assert_eq!(tracker.live(), 0);
    }

    #[tokio::test]
    async fn timeout_kills_grandchildren_and_keeps_partial_output() {
        let tracker = ProcessTracker::new();
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("pid");
        let script = format!(
            "echo before; echo oops >&2; sleep 1000 & echo $! > '{}'; wait",
            pidfile.display()
        );
        let mut spec = spec(&script);
        spec.timeout = Some(Duration::from_millis(300));
        match run_short(spec, &tracker).await {
            ProcessOutcome::TimedOut {
                stdout,
                stderr,
                stderr_truncated,
            } => {
                assert_eq!(stdout, b"before\n");
                assert_eq!(stderr, b"oops\n");
                assert!(!stderr_truncated);
            }
            other => panic!("expected TimedOut, got {}", describe(&other)),
        }
        assert_gone(read_pid(&pidfile).await, "the background sleep").await;
        assert_eq!(tracker.live(), 0);
    }

    #[tokio::test]
    async fn a_term_ignoring_grandchild_is_killed_after_the_grace() {
        let tracker = ProcessTracker::new();
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("pid");
        let script = format!(
            r#"sh -c 'trap "" TERM; echo $$ > "{}"; exec sleep 1000'"#,
            pidfile.display()
        );
        let timeout = Duration::from_millis(300);
        let mut spec = spec(&script);
        spec.timeout = Some(timeout);
        let started = Instant::now();
        let outcome = run_short(spec, &tracker).await;
        let elapsed = started.elapsed();
        assert!(
            matches!(outcome, ProcessOutcome::TimedOut { .. }),
            "{}",
            describe(&outcome)
        );
        // Timer slack only ever makes things later, so the lower bound is exact.
        assert!(
            elapsed >= timeout + SHORT_GRACE,
            "returned after {elapsed:?}, before the grace was over"
        );
        assert_gone(read_pid(&pidfile).await, "the TERM-ignoring sleep").await;
    }

    #[tokio::test]
    async fn a_group_that_obeys_term_does_not_wait_out_the_grace() {
        let tracker = ProcessTracker::new();
        // The background sleep dies of SIGTERM too, but as an orphan it may stay a zombie
        // forever (PID 1 in a container need not reap): a zombie does not count as alive.
        let mut spec = spec("sleep 1000 & wait");
        spec.timeout = Some(Duration::from_millis(100));
        let endless_grace = Duration::from_secs(3600);
        let outcome = tokio::time::timeout(PATIENCE, run_with_grace(spec, &tracker, endless_grace))
            .await
            .expect("run should return once the group is dead, not after the grace");
        assert!(
            matches!(outcome, ProcessOutcome::TimedOut { .. }),
            "{}",
            describe(&outcome)
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_group_of_zombies_counts_as_dead() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("true")
            .process_group(0)
            .spawn()
            .expect("spawn true");
        let pgid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"));
        let deadline = std::time::Instant::now() + PATIENCE;
        while !is_gone(pgid) {
            assert!(std::time::Instant::now() < deadline, "`true` never exited");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Unreaped, so the kernel still counts it as a member of its group.
        assert_eq!(killpg(pgid, None), Ok(()));
        assert!(!group_alive(pgid));
        child.wait().expect("reap");
    }

    #[tokio::test]
    async fn a_normal_exit_still_kills_leftover_background_jobs() {
        let tracker = ProcessTracker::new();
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("pid");
        // The background sleep inherits stdout: without the group kill, reading would never end.
        let script = format!("sleep 1000 & echo $! > '{}'; echo done", pidfile.display());
        let (status, stdout, ..) = exited(run_short(spec(&script), &tracker).await);
        assert!(status.success(), "{status}");
        assert_eq!(stdout, b"done\n");
        assert_gone(read_pid(&pidfile).await, "the background sleep").await;
        assert_eq!(tracker.live(), 0);
    }

    #[tokio::test]
    async fn kill_all_cancels_a_running_process_and_kills_its_group() {
        let tracker = ProcessTracker::new();
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("pid");
        let script = format!("sleep 1000 & echo $! > '{}'; wait", pidfile.display());
        let task = tokio::spawn({
            let tracker = tracker.clone();
            let spec = spec(&script);
            async move { run_short(spec, &tracker).await }
        });
        let grandchild = read_pid(&pidfile).await;
        assert_eq!(tracker.live(), 1);
        tracker.kill_all();
        let outcome = task.await.expect("run task panicked");
        assert_eq!(outcome, ProcessOutcome::Cancelled);
        assert_gone(grandchild, "the background sleep").await;
        assert_eq!(tracker.live(), 0);

        // Sticky: nothing new starts once shutdown has begun.
        let outcome = run_short(
            spec(&format!("echo x > '{}'", dir.path().join("late").display())),
            &tracker,
        )
        .await;
        assert_eq!(outcome, ProcessOutcome::Cancelled);
        assert!(!dir.path().join("late").exists());
    }

    #[tokio::test]
    async fn dropping_the_future_kills_the_group() {
        let tracker = ProcessTracker::new();
        let dir = tempfile::tempdir().expect("tempdir");
        let leader_file = dir.path().join("leader");
        let grandchild_file = dir.path().join("grandchild");
        let script = format!(
            "echo $$ > '{}'; sleep 1000 & echo $! > '{}'; wait",
            leader_file.display(),
            grandchild_file.display()
        );
        let spec = spec(&script);
        let grandchild = tokio::select! {
            outcome = run(spec, &tracker) => panic!("run returned early: {}", describe(&outcome)),
            pid = read_pid(&grandchild_file) => pid,
        };
        // The run future is dropped here, at the end of the select.
        assert_eq!(tracker.live(), 0);
        assert_gone(grandchild, "the background sleep").await;
        assert_gone(read_pid(&leader_file).await, "the shell").await;
    }
}
