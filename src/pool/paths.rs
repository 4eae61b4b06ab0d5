//! Where a pool lives (CONTRACT.md §1): `<root>/pools/<name>/` holding the socket, the pool's
//! redb file, the daemon lock and the response files.

use std::path::{Path, PathBuf};

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct PoolArgs {
    /// Pool name [default: default]
    #[arg(long, env = "DROVER_POOL", value_name = "NAME")]
    pub pool: Option<String>,
    /// Pool root directory [default: $XDG_RUNTIME_DIR/drover, else /tmp/drover-$UID]
    #[arg(long, env = "DROVER_ROOT", value_name = "DIR")]
    pub root: Option<PathBuf>,
}

impl PoolArgs {
    pub fn paths(&self) -> PoolPaths {
        PoolPaths::new(&self.root(), self.name())
    }

    pub fn name(&self) -> &str {
        self.pool.as_deref().unwrap_or("default")
    }

    /// The root as an absolute path (a relative one is taken from the current directory).
    /// `drover-pool protocol` repeats `--root` as given from the raw field instead.
    pub fn root(&self) -> PathBuf {
        if let Some(root) = &self.root {
            return absolute(root);
        }
        if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
            return absolute(&PathBuf::from(runtime).join("drover"));
        }
        PathBuf::from(format!("/tmp/drover-{}", nix::unistd::getuid()))
    }
}

#[derive(Debug, Clone)]
pub struct PoolPaths {
    pub name: String,
    pub dir: PathBuf,
}

/// `path` joined to the current directory when relative. Response file paths are handed to
/// agents, which may run anywhere: relative, they would name a different file for each.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

impl PoolPaths {
    pub fn new(root: &Path, name: &str) -> Self {
        Self {
            name: name.to_string(),
            dir: absolute(&root.join("pools").join(name)),
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("pool.sock")
    }

    pub fn database(&self) -> PathBuf {
        self.dir.join("pool.redb")
    }

    pub fn daemon_lock(&self) -> PathBuf {
        self.dir.join("daemon.lock")
    }

    /// Present while the pool is stopped on purpose: agents waiting for a daemon exit instead.
    pub fn stopped_marker(&self) -> PathBuf {
        self.dir.join("stopped")
    }

    pub fn responses(&self) -> PathBuf {
        self.dir.join("responses")
    }

    pub fn response_file(&self, run_id: &str, task_id: &str, attempt: u32) -> PathBuf {
        self.responses()
            .join(format!("{run_id}-{task_id}-{attempt}.json"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_root_is_taken_from_the_current_directory() {
        let args = PoolArgs {
            pool: Some("p".into()),
            root: Some(PathBuf::from("some/root")),
        };
        let cwd = std::env::current_dir().expect("a current directory");
        assert_eq!(args.root(), cwd.join("some/root"));
        let paths = args.paths();
        assert_eq!(paths.dir, cwd.join("some/root/pools/p"));
        assert!(paths.response_file("r", "t", 1).is_absolute());
        assert_eq!(
            PoolPaths::new(Path::new("rel"), "q").dir,
            cwd.join("rel/pools/q")
        );
        let given = PoolArgs {
            pool: None,
            root: Some(PathBuf::from("/abs/root")),
        };
        assert_eq!(given.root(), PathBuf::from("/abs/root"));
    }
}
