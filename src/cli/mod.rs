//! Command-line front ends of both binaries: argument definitions and output formatting.
//! The work itself lives in `engine`, `store` and `pool`.

mod config_cmd;
mod demo;
pub mod entry_value;
pub mod exit;
mod inspect_cmd;
pub mod locations;
pub mod logging;
pub mod pool_cli;
mod progress;
mod run_cmd;
mod runner;

pub use pool_cli::main as pool_main;
pub use runner::main as runner_main;

/// Restores the default SIGPIPE action so `drover … | head` ends quietly instead of panicking
/// in `println!` (Rust ignores SIGPIPE by default). Only for commands that just print: a
/// command that writes to hooks or sockets must keep SIGPIPE ignored and handle EPIPE.
pub fn restore_sigpipe() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: called first thing in main, before any thread exists; SIG_DFL installs no handler
    // code, so no async-signal-safety rules are involved.
    unsafe {
        let _ = signal(Signal::SIGPIPE, SigHandler::SigDfl);
    }
}

/// Writes the completion script of a clap command line for `shell` to stdout.
pub fn print_completions<C: clap::CommandFactory>(shell: clap_complete::Shell, name: &str) {
    let mut command = C::command();
    clap_complete::generate(shell, &mut command, name, &mut std::io::stdout());
}
