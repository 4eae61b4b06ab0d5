//! The workflow: config model and validation, the task lifecycle, scheduling.

pub mod config;
