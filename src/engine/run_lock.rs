//! One runner per run: `run` and `resume` hold an exclusive flock on a per-run lock file, so a
//! second `resume` of a live run is refused instead of doubling every effect. The kernel drops
//! the lock when the holder dies, SIGKILL included, so a crashed run is resumable at once.

use std::fs::{File, OpenOptions};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};
use ulid::Ulid;

pub struct RunLock {
    _lock: Flock<File>,
}

impl RunLock {
    pub fn acquire(state_dir: &Path, run_id: Ulid) -> Result<Self, String> {
        let dir = state_dir.join("locks");
        crate::store::create_private_dir(&dir)?;
        let path = dir.join(format!("{run_id}.lock"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| format!("cannot open lock file {}: {e}", path.display()))?;
        Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map(|lock| Self { _lock: lock })
            .map_err(|_| format!("run {run_id} is being run by another drover process"))
    }
}
