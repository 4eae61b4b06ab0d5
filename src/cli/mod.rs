//! Command-line front ends of both binaries: argument definitions and output formatting.
//! The work itself lives in `engine`, `store` and `pool`.

mod config_cmd;
pub mod entry_value;
pub mod exit;
pub mod locations;
pub mod logging;
mod progress;
mod run_cmd;
mod runner;

pub use runner::main as runner_main;
