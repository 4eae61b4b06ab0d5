//! Where state lives (CONTRACT.md §1): flags, then environment, then XDG defaults.

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct StateDirArg {
    /// Directory of the runner's state file [default: $XDG_STATE_HOME/drover or ~/.local/state/drover]
    #[arg(long, env = "DROVER_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

impl StateDirArg {
    /// Always absolute: hooks get it as `DROVER_STATE_DIR` and run in the config's directory.
    pub fn resolve(&self) -> PathBuf {
        let dir = self.resolve_as_given();
        if dir.is_absolute() {
            return dir;
        }
        std::env::current_dir().map_or(dir.clone(), |cwd| cwd.join(&dir))
    }

    fn resolve_as_given(&self) -> PathBuf {
        if let Some(dir) = &self.state_dir {
            return dir.clone();
        }
        if let Some(xdg) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
            return PathBuf::from(xdg).join("drover");
        }
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
        home.join(".local/state/drover")
    }
}
