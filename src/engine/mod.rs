//! The workflow: config model and validation, the task lifecycle, scheduling.

pub mod answer;
pub mod config;
pub mod driver;
pub mod instructions;
pub mod lifecycle;
pub mod orphans;
pub mod process;
pub mod procfs;
pub mod report;
pub mod run_lock;

#[cfg(test)]
mod lifecycle_tests;
