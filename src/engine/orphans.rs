//! Stopping what a killed runner left running.
//!
//! Hooks and Command actions lead their own process groups, so a SIGKILLed runner leaves them
//! running, reparented to init. `resume` starts every phase that was in flight again; without
//! this the old copy and the new one would run at once (two `git commit`s, two deploys racing).
//! Every process a runner starts carries `DROVER_RUN_ID`, `DROVER_TASK_ID` and `DROVER_PHASE`
//! in its environment, and its children inherit them, so /proc names the leftovers of exactly
//! the phases about to run again. The caller holds the run's lock, so no live runner owns them.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, getpgrp};
use ulid::Ulid;

use super::procfs;

/// A leftover may fork while it is being killed; scan again until a scan finds none, but give
/// up after this (a process stuck in uninterruptible sleep cannot be helped by waiting).
const SWEEP_LIMIT: Duration = Duration::from_secs(5);
const SWEEP_PAUSE: Duration = Duration::from_millis(5);

/// SIGKILLs every process (and its process group) that runs `(task id, phase)` of `run_id` for
/// a pair in `phases` (`phase` as in `DROVER_PHASE`: pre, action, post, finally). Returns how
/// many processes were found.
pub fn stop_leftovers(run_id: Ulid, phases: &HashSet<(String, &'static str)>) -> usize {
    if phases.is_empty() {
        return 0;
    }
    let run = run_id.to_string();
    let own_pid = std::process::id() as i32;
    let own_group = getpgrp().as_raw();
    let deadline = Instant::now() + SWEEP_LIMIT;
    let mut found = HashSet::new();
    loop {
        let Some(processes) = procfs::processes() else {
            return found.len();
        };
        let leftovers: Vec<_> = processes
            .iter()
            .filter(|p| p.pid != own_pid && p.pgrp != own_group && !p.is_zombie())
            .filter(|p| p.env_var("DROVER_RUN_ID").as_deref() == Some(run.as_str()))
            .filter(|p| {
                let (Some(task), Some(phase)) =
                    (p.env_var("DROVER_TASK_ID"), p.env_var("DROVER_PHASE"))
                else {
                    return false;
                };
                phases.iter().any(|(t, ph)| *t == task && *ph == phase)
            })
            .collect();
        if leftovers.is_empty() || Instant::now() > deadline {
            return found.len();
        }
        for process in leftovers {
            found.insert(process.pid);
            tracing::info!(
                pid = process.pid,
                pgrp = process.pgrp,
                "stopping a process left running by the previous runner"
            );
            let _ = killpg(Pid::from_raw(process.pgrp), Signal::SIGKILL);
            let _ = kill(Pid::from_raw(process.pid), Signal::SIGKILL);
        }
        std::thread::sleep(SWEEP_PAUSE);
    }
}
