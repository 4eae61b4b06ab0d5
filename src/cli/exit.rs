//! Exit codes of CONTRACT.md §5 and the error type that carries one to `main`.

use std::fmt;
use std::process::ExitCode;

pub const FAILED_TASKS: u8 = 1;
pub const INVALID_INPUT: u8 = 2;
pub const UNAVAILABLE: u8 = 3;
pub const INTERRUPTED: u8 = 130;

/// An error the CLI prints (no backtrace) before exiting with `code`.
#[derive(Debug)]
pub struct CliError {
    pub code: u8,
    pub message: String,
}

impl CliError {
    pub fn invalid(message: impl fmt::Display) -> Self {
        Self {
            code: INVALID_INPUT,
            message: message.to_string(),
        }
    }

    pub fn unavailable(message: impl fmt::Display) -> Self {
        Self {
            code: UNAVAILABLE,
            message: message.to_string(),
        }
    }
}

impl From<crate::engine::config::ConfigErrors> for CliError {
    fn from(errors: crate::engine::config::ConfigErrors) -> Self {
        Self::invalid(errors)
    }
}

pub type CliResult = Result<ExitCode, CliError>;

/// Prints the error and turns the result into the process exit code.
pub fn finish(result: CliResult) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(error) => {
            crate::say!("error: {}", error.message);
            ExitCode::from(error.code)
        }
    }
}
