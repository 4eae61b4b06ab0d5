//! Table layout. Keys are chosen so the hot queries are range scans: a run's tasks, a run's
//! queue in ready order per step, a run's in-flight tasks, a run's transitions in order.

use redb::TableDefinition;

/// `schema_version` → the layout version of this file (see migrations.md).
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// run → RunRecord.
pub const RUNS: TableDefinition<u128, &[u8]> = TableDefinition::new("runs");
/// (run, task) → TaskRecord.
pub const TASKS: TableDefinition<(u128, u128), &[u8]> = TableDefinition::new("tasks");
/// (run, step index, ready at ms, task): queued tasks, earliest first within each step.
pub const QUEUE: TableDefinition<(u128, u32, u64, u128), ()> = TableDefinition::new("queue");
/// (run, phase code, task): unsettled tasks that were doing something (a phase or a finally
/// hook) — what a resumed runner must pick up again.
pub const IN_FLIGHT: TableDefinition<(u128, u8, u128), ()> = TableDefinition::new("in_flight");
/// (run, task) → children not yet finished. Kept apart from the task record because it changes
/// once per finishing child: rewriting a parent whose record holds a 10,000-task answer on
/// every child would copy gigabytes. 64 bits: a fan-out may be very large.
pub const OPEN_CHILDREN: TableDefinition<(u128, u128), u64> = TableDefinition::new("open_children");
/// (run, sequence) → TransitionRecord.
pub const TRANSITIONS: TableDefinition<(u128, u64), &[u8]> = TableDefinition::new("transitions");
/// (run, task, sequence): a task's transitions without scanning the run's.
pub const TASK_TRANSITIONS: TableDefinition<(u128, u128, u64), ()> =
    TableDefinition::new("task_transitions");
/// (run, task, sequence) → HookLogRecord: exit status and stderr tail of each hook/command.
pub const HOOK_LOGS: TableDefinition<(u128, u128, u64), &[u8]> = TableDefinition::new("hook_logs");

/// The in-flight index code for a running finally hook (phase codes are 0–5).
pub const FINALLY_CODE: u8 = 9;

pub const SCHEMA_VERSION: u64 = 2;
