//! The workflow config: file format, strict parsing, validation and the resolved model.

pub mod jsonc;
mod load;
pub mod model;
mod problem;
mod workflow;

pub use load::{load, load_text};
pub use model::config_json_schema;
pub use problem::{ConfigErrors, Problem, hint as hint_for};
pub use workflow::{Action, Hook, RetryDelay, Step, StepOptions, Workflow};
