//! One runner per run: `run` and `resume` hold an exclusive flock on a per-run lock file, so a
//! second `resume` of a live run is refused instead of doubling every effect. The kernel drops
//! the lock when the holder dies, SIGKILL included, so a crashed run is resumable at once, and
//! whether the lock is held tells a live run from one whose runner is gone.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use ulid::Ulid;

/// How long `acquire` keeps trying: `is_held` probes take the lock for an instant, and a resume
/// that happens to start during an `inspect` must not be refused for it.
const ACQUIRE_PATIENCE: Duration = Duration::from_millis(300);
const ACQUIRE_RETRY: Duration = Duration::from_millis(10);

pub struct RunLock {
    _lock: Flock<File>,
}

fn lock_path(state_dir: &Path, run_id: Ulid) -> PathBuf {
    state_dir.join("locks").join(format!("{run_id}.lock"))
}

impl RunLock {
    pub fn acquire(state_dir: &Path, run_id: Ulid) -> Result<Self, String> {
        crate::store::create_private_dir(&state_dir.join("locks"))?;
        let path = lock_path(state_dir, run_id);
        let deadline = Instant::now() + ACQUIRE_PATIENCE;
        loop {
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|e| format!("cannot open lock file {}: {e}", path.display()))?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(Self { _lock: lock }),
                Err(_) if Instant::now() < deadline => std::thread::sleep(ACQUIRE_RETRY),
                Err(_) => {
                    return Err(format!(
                        "run {run_id} is being run by another drover process"
                    ));
                }
            }
        }
    }

    /// Whether a live drover process is running `run_id` now. Creates nothing, so read-only
    /// commands may ask.
    pub fn is_held(state_dir: &Path, run_id: Ulid) -> bool {
        let Ok(file) = File::open(lock_path(state_dir, run_id)) else {
            return false;
        };
        // A shared probe: it cannot be mistaken for a second runner by another probe.
        Flock::lock(file, FlockArg::LockSharedNonblock).is_err()
    }
}
