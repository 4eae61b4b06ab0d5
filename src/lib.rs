pub mod cli;
pub mod engine;
pub mod pool;
pub mod store;
