//! Reading the process table from /proc (Linux): which processes exist, their state, process
//! group and environment. The kernel has no call for "members of group G" or "processes with
//! variable V", and both are needed to clean up after hooks.

use std::path::PathBuf;

/// One process as /proc describes it.
pub struct ProcEntry {
    pub pid: i32,
    /// `R`, `S`, `Z` (zombie), …
    pub state: char,
    pub pgrp: i32,
    dir: PathBuf,
}

impl ProcEntry {
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }

    /// The value of `name` in the process's environment as it started; `None` when unset or
    /// unreadable (another user's process, or it has just exited).
    pub fn env_var(&self, name: &str) -> Option<String> {
        let environ = std::fs::read(self.dir.join("environ")).ok()?;
        environ.split(|&b| b == 0).find_map(|entry| {
            let value = entry.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
            Some(String::from_utf8_lossy(value).into_owned())
        })
    }
}

/// Every process visible now, or `None` when /proc cannot be trusted to describe this pid
/// namespace (not mounted, or mounted from another namespace).
pub fn processes() -> Option<Vec<ProcEntry>> {
    let own = std::fs::read_link("/proc/self").ok()?;
    if own.to_str()?.parse::<u32>().ok()? != std::process::id() {
        return None;
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // Fails if the process has just gone; it is then not worth reporting.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp ...`; comm may contain spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let Some(state) = fields.next().and_then(|s| s.chars().next()) else {
            continue;
        };
        let Some(pgrp) = fields.nth(1).and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        out.push(ProcEntry {
            pid,
            state,
            pgrp,
            dir: entry.path(),
        });
    }
    Some(out)
}
