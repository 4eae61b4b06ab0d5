//! Helpers shared by the integration tests that start real processes.
#![allow(dead_code)] // each test crate uses a different part

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;

pub mod soak;

/// How often conditions are polled.
pub const POLL: Duration = Duration::from_millis(20);

static NEXT_LOG: AtomicUsize = AtomicUsize::new(0);

/// A process in its own process group, stdout and stderr going to files (no pipe to fill
/// up). Dropping it SIGKILLs the whole group, so whatever it started in the background goes
/// too.
pub struct Proc {
    child: Child,
    label: String,
    out: PathBuf,
    err: PathBuf,
    status: Option<ExitStatus>,
}

impl Proc {
    pub fn spawn(logs: &Path, mut command: Command, label: &str) -> Proc {
        let n = NEXT_LOG.fetch_add(1, Ordering::SeqCst);
        let out = logs.join(format!("{n}-{label}.out"));
        let err = logs.join(format!("{n}-{label}.err"));
        let child = command
            .stdin(Stdio::null())
            .stdout(File::create(&out).expect("stdout file"))
            .stderr(File::create(&err).expect("stderr file"))
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("`{label}` starts: {e}"));
        Proc {
            child,
            label: label.to_string(),
            out,
            err,
            status: None,
        }
    }

    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status
    }

    /// Waits for the exit; fails the test after `deadline`.
    #[track_caller]
    pub fn wait_within(&mut self, deadline: Duration) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(
                started.elapsed() < deadline,
                "`{}` did not exit within {deadline:?}; stderr:\n{}",
                self.label,
                self.stderr()
            );
            std::thread::sleep(POLL);
        }
    }

    /// Fails the test if the process has exited.
    #[track_caller]
    pub fn assert_alive(&mut self) {
        if let Some(status) = self.exited() {
            panic!(
                "`{}` exited ({status}); stderr:\n{}",
                self.label,
                self.stderr()
            );
        }
    }

    /// SIGKILLs the process and its group, and reaps it.
    pub fn kill(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if self.status.is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
    }

    pub fn stdout(&self) -> String {
        fs::read_to_string(&self.out).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.err).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A finished process: its exit status and what it printed.
pub struct Done {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Done {
    #[track_caller]
    pub fn of(mut proc: Proc, deadline: Duration) -> Done {
        let status = proc.wait_within(deadline);
        Done {
            status,
            stdout: proc.stdout(),
            stderr: proc.stderr(),
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "exit status {}\n--- stdout:\n{}\n--- stderr:\n{}",
            self.status, self.stdout, self.stderr
        )
    }

    #[track_caller]
    pub fn assert_code(&self, code: i32) {
        assert_eq!(self.status.code(), Some(code), "{}", self.describe());
    }
}

/// Polls `condition` until it holds, failing the test after `deadline`.
#[track_caller]
pub fn wait_until(what: &str, deadline: Duration, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < deadline,
            "timed out after {deadline:?} waiting until {what}"
        );
        std::thread::sleep(POLL);
    }
}
