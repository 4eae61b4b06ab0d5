//! The pool: a daemon that hands tasks to long-lived agents, the protocol both sides speak,
//! and the clients used by the runner and by agents.

pub mod agent;
pub mod conn;
pub mod daemon;
pub mod paths;
pub mod protocol;
pub mod protocol_text;
pub mod runner_client;
pub mod store;
