//! Pieces of the SIGKILL soaks (`soak_command`, `soak_pool`): a replayable kill schedule and
//! the sweep that kills whatever a killed runner left running.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use drover::engine::procfs;
use drover::store::Store;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long processes may survive SIGKILL before the sweep gives up.
const SWEEP_DEADLINE: Duration = Duration::from_secs(120);
const SWEEP_POLL: Duration = Duration::from_millis(2);

/// A tiny seeded generator (SplitMix64): the kill schedule is replayable from the seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `low..=high`.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }
}

/// Live processes whose environment sets `var` to `tag` (zombies have an empty environ).
pub fn tagged_processes(var: &str, tag: &str) -> Vec<Pid> {
    procfs::processes()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.env_var(var).as_deref() == Some(tag))
        .map(|p| Pid::from_raw(p.pid))
        .collect()
}

/// SIGKILLs every process whose environment holds `VAR=TAG` until two scans in a row find
/// none: after this, nothing a killed runner started can write any more. Returns how many
/// were killed.
pub fn sweep(var: &str, tag: &str) -> Result<usize, String> {
    let deadline = Instant::now() + SWEEP_DEADLINE;
    let mut killed = 0;
    let mut quiet_scans = 0;
    while quiet_scans < 2 {
        let pids = tagged_processes(var, tag);
        if pids.is_empty() {
            quiet_scans += 1;
        } else {
            quiet_scans = 0;
            for pid in pids {
                if kill(pid, Signal::SIGKILL).is_ok() {
                    killed += 1;
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "processes tagged {var}={tag} survive SIGKILL: {:?}",
                tagged_processes(var, tag)
            ));
        }
        std::thread::sleep(SWEEP_POLL);
    }
    Ok(killed)
}

/// Whether a run is recorded in the state dir, for telling `resume` from a fresh `run` after
/// a kill: the runner's log said so, or the store holds one.
pub fn run_recorded(runner_log: &Path, state: &Path) -> bool {
    let started = fs::read_to_string(runner_log)
        .unwrap_or_default()
        .contains(" started");
    started || {
        let store = Store::open(state).expect("the state store opens");
        !store
            .read()
            .expect("the store reads")
            .runs()
            .expect("the runs list reads")
            .is_empty()
    }
}
