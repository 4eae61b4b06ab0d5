//! Stored records. Each is a versioned envelope encoded with postcard; variants are only ever
//! appended (see migrations.md). JSON payloads (task values, results) are kept as JSON text
//! because arbitrary JSON cannot round-trip through a non-self-describing format.

use serde::{Deserialize, Serialize};

use super::StoreError;

/// Where a task is in its lifecycle. Only `Completed` and `Failed` are settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Waiting for a concurrency slot (or for its retry delay to pass).
    Queued,
    Pre,
    Action,
    Post,
    Completed,
    Failed,
}

impl Phase {
    pub fn is_settled(self) -> bool {
        matches!(self, Phase::Completed | Phase::Failed)
    }

    pub fn holds_slot(self) -> bool {
        matches!(self, Phase::Pre | Phase::Action | Phase::Post)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Queued => "queued",
            Phase::Pre => "pre",
            Phase::Action => "action",
            Phase::Post => "post",
            Phase::Completed => "completed",
            Phase::Failed => "failed",
        }
    }

    /// A stable small number for index keys.
    pub fn code(self) -> u8 {
        match self {
            Phase::Queued => 0,
            Phase::Pre => 1,
            Phase::Action => 2,
            Phase::Post => 3,
            Phase::Completed => 4,
            Phase::Failed => 5,
        }
    }
}

/// The state of a task's `finally` hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FinallyState {
    /// The step has no finally hook.
    None,
    /// Waiting for the task and all its descendants to settle.
    Waiting,
    /// Due or running; a resumed runner runs it (again).
    Running,
    Done,
    Failed(String),
}

/// What a transition moved a task to; `inspect` shows these in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stage {
    Phase(Phase),
    FinallyRunning,
    FinallyDone,
    FinallyFailed,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Phase(phase) => phase.as_str(),
            Stage::FinallyRunning => "finally",
            Stage::FinallyDone => "finally-done",
            Stage::FinallyFailed => "finally-failed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunStatus {
    Running,
    Completed,
    Failed,
    /// Stopped by a signal; resumable.
    Interrupted,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Interrupted => "interrupted",
        }
    }
}

/// A run as version 1 stored it (before the pool was recorded); read and upgraded to [`RunV2`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunV1 {
    pub config_path: String,
    /// Where hooks run and links were resolved.
    pub base_dir: String,
    /// The config with links inlined, so a resume runs what the run started with.
    pub config_snapshot: String,
    pub entrypoint_value: String,
    pub status: RunStatus,
    pub started_ms: u64,
    pub updated_ms: u64,
    pub ended_ms: Option<u64>,
    pub tasks_total: u64,
    pub tasks_completed: u64,
    pub tasks_failed: u64,
    /// Tasks not yet finished (settled with all descendants and finally done). The run ends at 0.
    pub tasks_open: u64,
    pub next_transition: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunV2 {
    pub config_path: String,
    /// Where hooks run and links were resolved.
    pub base_dir: String,
    /// The config with links inlined, so a resume runs what the run started with.
    pub config_snapshot: String,
    pub entrypoint_value: String,
    pub status: RunStatus,
    pub started_ms: u64,
    pub updated_ms: u64,
    pub ended_ms: Option<u64>,
    pub tasks_total: u64,
    pub tasks_completed: u64,
    pub tasks_failed: u64,
    /// Tasks not yet finished (settled with all descendants and finally done). The run ends at 0.
    pub tasks_open: u64,
    pub next_transition: u64,
    /// The pool its Pool tasks went to (absent when the workflow has no Pool step): a resume
    /// must reach the same pool, or work the pool holds would be dispatched again elsewhere.
    pub pool: Option<PoolRef>,
}

/// A pool daemon's identity: its name and absolute root directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRef {
    pub name: String,
    pub root: String,
}

impl From<RunV1> for RunV2 {
    fn from(v1: RunV1) -> Self {
        RunV2 {
            config_path: v1.config_path,
            base_dir: v1.base_dir,
            config_snapshot: v1.config_snapshot,
            entrypoint_value: v1.entrypoint_value,
            status: v1.status,
            started_ms: v1.started_ms,
            updated_ms: v1.updated_ms,
            ended_ms: v1.ended_ms,
            tasks_total: v1.tasks_total,
            tasks_completed: v1.tasks_completed,
            tasks_failed: v1.tasks_failed,
            tasks_open: v1.tasks_open,
            next_transition: v1.next_transition,
            pool: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskV1 {
    pub parent: Option<u128>,
    pub step: String,
    /// The task's original value (JSON text).
    pub value: String,
    /// 1-based attempt number; survives waiting for a slot.
    pub attempt: u32,
    pub phase: Phase,
    /// When a queued task may start (ms since the epoch); also its queue position.
    pub ready_at_ms: u64,
    /// The value the action gets in this attempt (the pre hook's output), JSON text.
    pub action_value: Option<String>,
    /// The result of this attempt (JSON text): input to the post hook, then final.
    pub result: Option<String>,
    /// The action's error came from an invalid answer (governs `retry_on_invalid_response`).
    pub invalid_response: bool,
    /// Why the task failed, or why the last attempt did.
    pub error: Option<String>,
    pub finally: FinallyState,
    pub created_ms: u64,
    pub updated_ms: u64,
}

impl TaskV1 {
    /// Settled, every descendant finished (`open_children`, kept in its own table), and finally
    /// (if any) done: the parent may count it.
    pub fn is_finished(&self, open_children: u64) -> bool {
        self.phase.is_settled()
            && open_children == 0
            && matches!(
                self.finally,
                FinallyState::None | FinallyState::Done | FinallyState::Failed(_)
            )
    }
}

/// A transition as version 1 stored it; read as [`TransitionV2`] with no agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransitionV1 {
    pub task: u128,
    pub attempt: u32,
    pub from: Option<Stage>,
    pub to: Stage,
    pub at_ms: u64,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransitionV2 {
    pub task: u128,
    pub attempt: u32,
    pub from: Option<Stage>,
    pub to: Stage,
    pub at_ms: u64,
    pub detail: String,
    /// The pool agent whose work ended the action (answered, or held the task when it was
    /// abandoned or failed); `None` for every other transition.
    pub agent: Option<String>,
}

impl From<TransitionV1> for TransitionV2 {
    fn from(v1: TransitionV1) -> Self {
        TransitionV2 {
            task: v1.task,
            attempt: v1.attempt,
            from: v1.from,
            to: v1.to,
            at_ms: v1.at_ms,
            detail: v1.detail,
            agent: None,
        }
    }
}

/// The `phase` of a hook log that records an agent's answer that came after its action timed
/// out.
pub const LATE_ANSWER: &str = "late-answer";

/// A hook log as version 1 stored it; read as [`HookLogV2`] with no agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HookLogV1 {
    pub attempt: u32,
    /// pre, action, post or finally.
    pub phase: String,
    /// "exit code 0", "timed out", …
    pub outcome: String,
    /// The tail of stderr.
    pub stderr: String,
    pub stderr_truncated: bool,
    pub at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HookLogV2 {
    pub attempt: u32,
    /// pre, action, post, finally, or `late-answer` (an agent's answer after a timeout).
    pub phase: String,
    /// "exit code 0", "timed out", …
    pub outcome: String,
    /// The tail of stderr (of a late answer: its text).
    pub stderr: String,
    pub stderr_truncated: bool,
    pub at_ms: u64,
    /// The pool agent that sent a late answer; `None` for hooks.
    pub agent: Option<String>,
}

impl From<HookLogV1> for HookLogV2 {
    fn from(v1: HookLogV1) -> Self {
        HookLogV2 {
            attempt: v1.attempt,
            phase: v1.phase,
            outcome: v1.outcome,
            stderr: v1.stderr,
            stderr_truncated: v1.stderr_truncated,
            at_ms: v1.at_ms,
            agent: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RunRecord {
    V1(RunV1),
    V2(RunV2),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TaskRecord {
    V1(TaskV1),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TransitionRecord {
    V1(TransitionV1),
    V2(TransitionV2),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum HookLogRecord {
    V1(HookLogV1),
    V2(HookLogV2),
}

/// A record type with a current version it is read into and written as.
pub trait Versioned: Sized {
    type Current;
    const NAME: &'static str;
    fn wrap(current: Self::Current) -> Self;
    fn into_current(self) -> Self::Current;
}

/// `versioned!(Envelope, Current(Type), "name", from [Old, …])`: records are written as the
/// `Current` variant and read from any variant, older ones upgraded with `From`.
macro_rules! versioned {
    ($envelope:ident, $variant:ident($current:ident), $name:literal $(, from [$($old:ident),*])?) => {
        impl Versioned for $envelope {
            type Current = $current;
            const NAME: &'static str = $name;
            fn wrap(current: $current) -> Self {
                $envelope::$variant(current)
            }
            fn into_current(self) -> $current {
                match self {
                    $envelope::$variant(current) => current,
                    $($($envelope::$old(old) => old.into(),)*)?
                }
            }
        }
    };
}

versioned!(RunRecord, V2(RunV2), "run", from[V1]);
versioned!(TaskRecord, V1(TaskV1), "task");
versioned!(TransitionRecord, V2(TransitionV2), "transition", from[V1]);
versioned!(HookLogRecord, V2(HookLogV2), "hook log", from[V1]);

pub fn encode<E: Versioned + Serialize>(current: E::Current) -> Result<Vec<u8>, StoreError> {
    postcard::to_stdvec(&E::wrap(current)).map_err(|e| StoreError::Encode {
        what: E::NAME,
        reason: e.to_string(),
    })
}

pub fn decode<E: Versioned + for<'de> Deserialize<'de>>(
    bytes: &[u8],
) -> Result<E::Current, StoreError> {
    postcard::from_bytes::<E>(bytes)
        .map(E::into_current)
        .map_err(|e| StoreError::Decode {
            what: E::NAME,
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_round_trips_with_large_counters() {
        let task = TaskV1 {
            parent: Some(u128::MAX),
            step: "Analyze".into(),
            value: r#"{"file":"a.rs","n":1.5e300}"#.into(),
            attempt: 3,
            phase: Phase::Post,
            ready_at_ms: 17,
            action_value: Some("{}".into()),
            result: None,
            invalid_response: true,
            error: Some("boom".into()),
            finally: FinallyState::Failed("x".into()),
            created_ms: 1,
            updated_ms: 2,
        };
        let bytes = encode::<TaskRecord>(task.clone()).unwrap();
        assert_eq!(decode::<TaskRecord>(&bytes).unwrap(), task);
    }

    #[test]
    fn a_version_1_run_reads_as_version_2_without_a_pool() {
        let v1 = RunV1 {
            config_path: "flow/workflow.jsonc".into(),
            base_dir: "/work/flow".into(),
            config_snapshot: "{}".into(),
            entrypoint_value: "{}".into(),
            status: RunStatus::Interrupted,
            started_ms: 1,
            updated_ms: 2,
            ended_ms: None,
            tasks_total: 5,
            tasks_completed: 3,
            tasks_failed: 1,
            tasks_open: 1,
            next_transition: 9,
        };
        let bytes = postcard::to_stdvec(&RunRecord::V1(v1.clone())).unwrap();
        let read = decode::<RunRecord>(&bytes).unwrap();
        assert_eq!(read.pool, None);
        assert_eq!(
            (
                read.config_path.as_str(),
                read.base_dir.as_str(),
                read.status
            ),
            ("flow/workflow.jsonc", "/work/flow", RunStatus::Interrupted)
        );
        assert_eq!(
            (
                read.tasks_total,
                read.tasks_completed,
                read.tasks_failed,
                read.tasks_open,
                read.next_transition
            ),
            (5, 3, 1, 1, 9)
        );
        // Written back as the current version, and read the same.
        let rewritten = encode::<RunRecord>(read.clone()).unwrap();
        assert!(matches!(
            postcard::from_bytes::<RunRecord>(&rewritten).unwrap(),
            RunRecord::V2(_)
        ));
        assert_eq!(decode::<RunRecord>(&rewritten).unwrap(), read);
    }

    #[test]
    fn version_1_transitions_and_hook_logs_read_with_no_agent() {
        let t1 = TransitionV1 {
            task: 7,
            attempt: 2,
            from: Some(Stage::Phase(Phase::Action)),
            to: Stage::Phase(Phase::Completed),
            at_ms: 9,
            detail: "Success".into(),
        };
        let bytes = postcard::to_stdvec(&TransitionRecord::V1(t1)).unwrap();
        let t2 = decode::<TransitionRecord>(&bytes).unwrap();
        assert_eq!((t2.task, t2.attempt, t2.at_ms, t2.agent), (7, 2, 9, None));
        assert_eq!(t2.detail, "Success");
        let h1 = HookLogV1 {
            attempt: 1,
            phase: LATE_ANSWER.into(),
            outcome: "late".into(),
            stderr: "[]".into(),
            stderr_truncated: false,
            at_ms: 3,
        };
        let bytes = postcard::to_stdvec(&HookLogRecord::V1(h1)).unwrap();
        let h2 = decode::<HookLogRecord>(&bytes).unwrap();
        assert_eq!(
            (h2.phase.as_str(), h2.stderr.as_str(), h2.agent),
            (LATE_ANSWER, "[]", None)
        );
        let with_agent = HookLogV2 {
            agent: Some("a-1".into()),
            ..h2
        };
        let bytes = encode::<HookLogRecord>(with_agent.clone()).unwrap();
        assert_eq!(decode::<HookLogRecord>(&bytes).unwrap(), with_agent);
    }

    #[test]
    fn garbage_is_a_decode_error_not_a_panic() {
        assert!(decode::<RunRecord>(&[0xff, 0xff, 0xff]).is_err());
    }
}
