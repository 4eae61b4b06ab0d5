//! The driver: performs the effects the lifecycle core asks for and records every outcome.
//!
//! One synchronous loop owns all writes. It takes the events that have arrived (a hook exited,
//! an action answered), applies them all in ONE write transaction (group commit: a fan-out of
//! a thousand answers costs one fsync, not a thousand), fills free concurrency slots from the
//! stored queue in that same transaction, commits, and only then starts the effects. So a
//! crash at any instant leaves the store describing work that is either done or re-doable;
//! `resume` re-issues the effects of whatever the in-flight index lists.
//!
//! Memory holds only work in flight: queued tasks stay in the store's queue table and are read
//! one by one as slots free.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use ulid::Ulid;

use super::answer::{JsonText, NewTask};
use super::config::{Action, Step, Workflow};
use super::lifecycle::{self, ActionOutcome, Decision, Effect, HookOutcome};
use super::process::{ProcessOutcome, ProcessSpec, ProcessTracker};
use crate::pool::protocol::{AnswerOutcome, PoolTask, TaskKey, TaskRef};
use crate::pool::runner_client::{LateAnswerSink, PoolAnswer, PoolClient};
use crate::store::tables::FINALLY_CODE;
use crate::store::{
    FinallyState, HookLogV2, LATE_ANSWER, Phase, PoolRef, RunStatus, RunV2, Stage, Store,
    StoreError, TaskV1, TransitionV2, Writer,
};

/// Largest stdout kept from a hook or command (a large fan-out answer fits comfortably).
const STDOUT_LIMIT: usize = 256 * 1024 * 1024;
/// Stderr tail kept per hook run for `inspect`.
const STDERR_TAIL: usize = 8 * 1024;
/// Events applied per transaction at most, so one commit never grows without bound.
const MAX_BATCH: usize = 4096;

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Invalid(String),
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSummary {
    pub run_id: Ulid,
    pub status: RunStatus,
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
    /// The run completed or failed, but its pool did not confirm `RunEnded` before the runner
    /// gave up waiting (the daemon was away): the pool keeps the run's leftovers until
    /// `drover resume RUN_ID` tells it.
    pub pool_not_told: bool,
}

/// Progress after each commit, for the CLI to display.
pub trait ProgressSink {
    fn update(&mut self, run: &RunV2, in_flight: usize);
}

enum Event {
    Phase {
        task: u128,
        attempt: u32,
        phase: Phase,
        outcome: PhaseResult,
        log: Option<HookLogV2>,
        /// The pool answer this event carries, acknowledged once committed.
        pool_key: Option<TaskKey>,
        /// The agent that did the pool work, named in the action's transition.
        agent: Option<String>,
    },
    LateAnswer {
        key: TaskKey,
        answer: PoolAnswer,
    },
    Finally {
        task: u128,
        outcome: HookOutcome,
        log: Option<HookLogV2>,
    },
    Interrupt,
}

enum PhaseResult {
    Hook(HookOutcome),
    Action(ActionOutcome),
    /// The process was killed because the runner is stopping; the task stays resumable.
    Cancelled,
}

struct Job {
    task: u128,
    attempt: u32,
    step: String,
    kind: JobKind,
}

enum JobKind {
    Phase(Effect),
    Finally { value: String },
}

impl JobKind {
    /// The phase as hooks see it in `DROVER_PHASE`.
    fn phase_name(&self) -> &'static str {
        match self {
            JobKind::Finally { .. } => "finally",
            JobKind::Phase(Effect::Pre { .. }) => "pre",
            JobKind::Phase(Effect::Action { .. }) => "action",
            JobKind::Phase(Effect::Post { .. }) => "post",
        }
    }
}

/// The finally hook of `task`, fed the task's original value.
fn finally_job(task_id: u128, task: &TaskV1) -> Job {
    Job {
        task: task_id,
        attempt: task.attempt,
        step: task.step.clone(),
        kind: JobKind::Finally {
            value: task.value.clone(),
        },
    }
}

/// Creates a run record with its first tasks.
pub fn create_run(
    store: &Store,
    run_id: Ulid,
    workflow: &Workflow,
    config_snapshot: String,
    entrypoint_value: &str,
    first_tasks: Vec<NewTask>,
    pool: Option<PoolRef>,
) -> Result<(), DriverError> {
    let now = now_ms();
    let mut ids = ulid::Generator::new();
    // Absolute, so that `resume` and `inspect` from any directory name the same file.
    let config_path = match workflow.path.file_name() {
        Some(name) => workflow.base_dir.join(name),
        None => workflow.path.clone(),
    };
    store.write(|w| {
        let mut run = RunV2 {
            config_path: config_path.display().to_string(),
            base_dir: workflow.base_dir.display().to_string(),
            config_snapshot,
            entrypoint_value: entrypoint_value.to_string(),
            status: RunStatus::Running,
            started_ms: now,
            updated_ms: now,
            ended_ms: None,
            tasks_total: 0,
            tasks_completed: 0,
            tasks_failed: 0,
            tasks_open: 0,
            next_transition: 0,
            pool: pool.clone(),
        };
        spawn_tasks(
            w,
            workflow,
            &mut ids,
            run_id.0,
            &mut run,
            None,
            first_tasks,
            now,
        )?;
        w.put_run(run_id.0, &run)
    })?;
    Ok(())
}

/// Inserts queued tasks; returns how many (the caller adds them to the parent's counter).
#[allow(clippy::too_many_arguments)]
fn spawn_tasks(
    w: &mut Writer<'_>,
    workflow: &Workflow,
    ids: &mut ulid::Generator,
    run_id: u128,
    run: &mut RunV2,
    parent: Option<u128>,
    tasks: Vec<NewTask>,
    now: u64,
) -> Result<u64, StoreError> {
    let mut count = 0u64;
    for new in tasks {
        let Some(index) = workflow.steps.iter().position(|s| s.name == new.kind) else {
            // Validated before; a stale snapshot cannot name a step that does not exist.
            continue;
        };
        let step = &workflow.steps[index];
        let id = next_id(ids);
        let task = TaskV1 {
            parent,
            step: new.kind.clone(),
            value: new.value.into_string(),
            attempt: 1,
            phase: Phase::Queued,
            ready_at_ms: now,
            action_value: None,
            result: None,
            invalid_response: false,
            error: None,
            finally: if step.finally_hook.is_some() {
                FinallyState::Waiting
            } else {
                FinallyState::None
            },
            created_ms: now,
            updated_ms: now,
        };
        w.put_task(run_id, id, &task)?;
        w.enqueue(run_id, step_code(index), now, id)?;
        w.transition(
            run_id,
            run,
            TransitionV2 {
                task: id,
                attempt: 1,
                from: None,
                to: Stage::Phase(Phase::Queued),
                at_ms: now,
                detail: match parent {
                    Some(p) => format!("created by {}", Ulid(p)),
                    None => "created".to_string(),
                },
                agent: None,
            },
        )?;
        count += 1;
    }
    run.tasks_total += count;
    run.tasks_open += count;
    Ok(count)
}

fn next_id(ids: &mut ulid::Generator) -> u128 {
    // The generator only fails when 2^80 ids were made in one millisecond.
    ids.generate()
        .map_or_else(|_| Ulid::generate().0, |id| id.0)
}

fn step_code(index: usize) -> u32 {
    u32::try_from(index).unwrap_or(u32::MAX)
}

pub struct Driver {
    store: Arc<Store>,
    run_id: u128,
    workflow: Arc<Workflow>,
    state_dir: PathBuf,
    runtime: tokio::runtime::Handle,
    tracker: ProcessTracker,
    events_tx: Sender<Event>,
    events_rx: Receiver<Event>,
    ids: ulid::Generator,
    in_flight: usize,
    in_flight_by_step: Vec<usize>,
    finally_running: usize,
    interrupted: bool,
    pool: Option<PoolClient>,
    acks: Vec<TaskKey>,
}

impl Driver {
    pub fn new(
        store: Arc<Store>,
        run_id: Ulid,
        workflow: Arc<Workflow>,
        state_dir: PathBuf,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        let (events_tx, events_rx) = channel();
        let steps = workflow.steps.len();
        Self {
            store,
            run_id: run_id.0,
            workflow,
            state_dir,
            runtime,
            tracker: ProcessTracker::default(),
            events_tx,
            events_rx,
            ids: ulid::Generator::new(),
            in_flight: 0,
            in_flight_by_step: vec![0; steps],
            finally_running: 0,
            interrupted: false,
            pool: None,
            acks: Vec::new(),
        }
    }

    /// Where the pool client reports answers that came after their task was recalled.
    pub fn late_answer_sink(&self) -> LateAnswerSink {
        let tx = std::sync::Mutex::new(self.events_tx.clone());
        Box::new(move |key, answer| {
            if let Ok(tx) = tx.lock() {
                let _ = tx.send(Event::LateAnswer { key, answer });
            }
        })
    }

    pub fn attach_pool(&mut self, client: PoolClient) {
        self.pool = Some(client);
    }

    /// A handle that stops the run gracefully (SIGINT/SIGTERM): no new dispatches, running
    /// processes killed, everything left resumable.
    pub fn interrupter(&self) -> impl Fn() + Send + Sync + 'static {
        let tx = std::sync::Mutex::new(self.events_tx.clone());
        move || {
            if let Ok(tx) = tx.lock() {
                let _ = tx.send(Event::Interrupt);
            }
        }
    }

    /// Runs until no task is open (or interrupted). Work that was in flight when a previous
    /// runner died is started again first.
    pub fn run(mut self, progress: &mut dyn ProgressSink) -> Result<RunSummary, DriverError> {
        let store = self.store.clone();
        let mut jobs = store.write(|w| self.reattach(w))?;
        self.stop_leftovers(&jobs);
        let mut pending: Vec<Event> = Vec::new();
        loop {
            let now = now_ms();
            let (new_jobs, run, wake) = store.write(|w| {
                let mut run = self.load_run(w)?;
                for event in pending.drain(..) {
                    self.apply(w, &mut run, event, now, &mut jobs)?;
                }
                let wake = self.dispatch(w, &mut run, now, &mut jobs)?;
                if run.tasks_open == 0 && run.status == RunStatus::Running {
                    run.status = if run.tasks_failed > 0 {
                        RunStatus::Failed
                    } else {
                        RunStatus::Completed
                    };
                    run.ended_ms = Some(now);
                }
                if self.interrupted && run.status == RunStatus::Running {
                    run.status = RunStatus::Interrupted;
                }
                run.updated_ms = now;
                w.put_run(self.run_id, &run)?;
                Ok((std::mem::take(&mut jobs), run, wake))
            })?;
            if let Some(pool) = &self.pool {
                pool.ack(std::mem::take(&mut self.acks));
            }
            progress.update(&run, self.in_flight + self.finally_running);
            if run.status != RunStatus::Running {
                if self.interrupted {
                    self.tracker.kill_all();
                }
                let mut pool_not_told = false;
                if let Some(pool) = &self.pool {
                    let ended = matches!(run.status, RunStatus::Completed | RunStatus::Failed);
                    if ended {
                        pool.run_ended();
                    }
                    let flushed = self.runtime.block_on(pool.flush(Duration::from_secs(2)));
                    pool_not_told = ended && !flushed;
                }
                return Ok(RunSummary {
                    run_id: Ulid(self.run_id),
                    status: run.status,
                    total: run.tasks_total,
                    completed: run.tasks_completed,
                    failed: run.tasks_failed,
                    pool_not_told,
                });
            }
            for job in new_jobs {
                self.launch(job);
            }
            if self.in_flight + self.finally_running == 0 && wake.is_none() {
                return Err(DriverError::Invalid(format!(
                    "run {} has {} open task(s) but nothing to run; the stored state is inconsistent",
                    Ulid(self.run_id),
                    run.tasks_open
                )));
            }
            let timeout = wake.map_or(Duration::from_secs(3600), |at| {
                Duration::from_millis(at.saturating_sub(now_ms()))
            });
            match self.events_rx.recv_timeout(timeout) {
                Ok(event) => pending.push(event),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(DriverError::Invalid("the event channel closed".into()));
                }
            }
            while pending.len() < MAX_BATCH {
                match self.events_rx.try_recv() {
                    Ok(event) => pending.push(event),
                    Err(_) => break,
                }
            }
        }
    }

    fn load_run(&self, w: &Writer<'_>) -> Result<RunV2, StoreError> {
        w.run(self.run_id)?.ok_or_else(|| {
            StoreError::Missing(format!("run {} is not in the store", Ulid(self.run_id)))
        })
    }

    /// Re-issues the effects of everything the in-flight index lists (nothing, for a new run).
    fn reattach(&mut self, w: &mut Writer<'_>) -> Result<Vec<Job>, StoreError> {
        // An interrupted run is running again from here on.
        let mut run = self.load_run(w)?;
        if run.status == RunStatus::Interrupted {
            run.status = RunStatus::Running;
            w.put_run(self.run_id, &run)?;
        }
        let mut jobs = Vec::new();
        for (code, task_id) in w.in_flight(self.run_id)? {
            let Some(task) = w.task(self.run_id, task_id)? else {
                continue;
            };
            let step_index = self.step_index(&task.step);
            if code == FINALLY_CODE {
                self.finally_running += 1;
                jobs.push(finally_job(task_id, &task));
                continue;
            }
            let effect = match task.phase {
                Phase::Pre => Effect::Pre {
                    stdin: task.value.clone(),
                },
                Phase::Action => Effect::Action {
                    value: task
                        .action_value
                        .clone()
                        .unwrap_or_else(|| task.value.clone()),
                },
                Phase::Post => Effect::Post {
                    stdin: task.result.clone().unwrap_or_default(),
                },
                _ => continue,
            };
            self.in_flight += 1;
            if let Some(i) = step_index {
                self.in_flight_by_step[i] += 1;
            }
            jobs.push(Job {
                task: task_id,
                attempt: task.attempt,
                step: task.step.clone(),
                kind: JobKind::Phase(effect),
            });
        }
        Ok(jobs)
    }

    /// Kills what a dead runner left running of the phases about to run again, so that no
    /// hook or command runs twice at once.
    fn stop_leftovers(&self, jobs: &[Job]) {
        let phases: HashSet<(String, &'static str)> = jobs
            .iter()
            .map(|job| (Ulid(job.task).to_string(), job.kind.phase_name()))
            .collect();
        let stopped = super::orphans::stop_leftovers(Ulid(self.run_id), &phases);
        if stopped > 0 {
            tracing::warn!(
                stopped,
                "stopped processes the previous runner of this run left running"
            );
        }
    }

    fn step_index(&self, name: &str) -> Option<usize> {
        self.workflow.steps.iter().position(|s| s.name == name)
    }

    fn step(&self, name: &str) -> Result<&Step, StoreError> {
        self.workflow.step(name).ok_or_else(|| {
            StoreError::Missing(format!(
                "a stored task names step `{name}`, which the run's config lacks"
            ))
        })
    }

    fn apply(
        &mut self,
        w: &mut Writer<'_>,
        run: &mut RunV2,
        event: Event,
        now: u64,
        jobs: &mut Vec<Job>,
    ) -> Result<(), StoreError> {
        match event {
            Event::Interrupt => {
                self.interrupted = true;
                self.tracker.kill_all();
                Ok(())
            }
            Event::LateAnswer { key, answer } => {
                self.acks.push(key.clone());
                let Ok(task_id) = Ulid::from_string(&key.task_id) else {
                    return Ok(());
                };
                let summary = match &answer.outcome {
                    AnswerOutcome::Answered { .. } => {
                        "the agent answered after the action timed out; recorded, not applied"
                    }
                    AnswerOutcome::Failed { .. } => {
                        "the agent ended without an answer after the action timed out"
                    }
                };
                let text = match answer.outcome {
                    AnswerOutcome::Answered { text } => text,
                    AnswerOutcome::Failed { reason } => reason,
                };
                let truncated = text.len() > STDERR_TAIL;
                let mut cut = text.len().min(STDERR_TAIL);
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                // A sequence number of its own, so it cannot overwrite another log entry.
                let seq = run.next_transition;
                run.next_transition += 1;
                w.hook_log(
                    self.run_id,
                    task_id.0,
                    seq,
                    HookLogV2 {
                        attempt: key.attempt,
                        phase: LATE_ANSWER.into(),
                        outcome: summary.into(),
                        stderr: text[..cut].to_string(),
                        stderr_truncated: truncated,
                        at_ms: now,
                        agent: answer.agent,
                    },
                )?;
                Ok(())
            }
            Event::Phase {
                task: task_id,
                attempt,
                phase,
                outcome,
                log,
                pool_key,
                agent,
            } => {
                if let Some(key) = pool_key {
                    self.acks.push(key);
                }
                let Some(mut task) = w.task(self.run_id, task_id)? else {
                    return Ok(());
                };
                // A late event for an attempt or phase already left behind changes nothing.
                if task.attempt != attempt || task.phase != phase {
                    return Ok(());
                }
                let workflow = self.workflow.clone();
                let step = self.step(&task.step)?.clone();
                let decision = match outcome {
                    PhaseResult::Cancelled => return Ok(()),
                    PhaseResult::Hook(outcome) if phase == Phase::Pre => {
                        lifecycle::pre_done(&mut task, &workflow, &step, outcome, now)
                    }
                    PhaseResult::Hook(outcome) => {
                        lifecycle::post_done(&mut task, &workflow, &step, outcome, now)
                    }
                    PhaseResult::Action(outcome) => {
                        lifecycle::action_done(&mut task, &workflow, &step, outcome, now)
                    }
                };
                self.record(w, run, task_id, task, decision, log, agent, now, jobs)
            }
            Event::Finally {
                task: task_id,
                outcome,
                log,
            } => {
                let Some(mut task) = w.task(self.run_id, task_id)? else {
                    return Ok(());
                };
                if task.finally != FinallyState::Running {
                    return Ok(());
                }
                self.finally_running = self.finally_running.saturating_sub(1);
                w.clear_in_flight(self.run_id, FINALLY_CODE, task_id)?;
                let (stage, detail) = match lifecycle::finally_done(&self.workflow, outcome) {
                    Ok(siblings) => {
                        let count = siblings.len();
                        // Siblings are children of the parent, counted there before this task
                        // finishes, so the parent's own finally waits for them too.
                        let workflow = self.workflow.clone();
                        let added = spawn_tasks(
                            w,
                            &workflow,
                            &mut self.ids,
                            self.run_id,
                            run,
                            task.parent,
                            siblings,
                            now,
                        )?;
                        if let Some(parent_id) = task.parent {
                            w.add_open_children(self.run_id, parent_id, added)?;
                        }
                        task.finally = FinallyState::Done;
                        (
                            Stage::FinallyDone,
                            format!("finally hook done, {count} sibling task(s)"),
                        )
                    }
                    Err(reason) => {
                        tracing::warn!(task = %Ulid(task_id), "{reason}");
                        task.finally = FinallyState::Failed(reason.clone());
                        (Stage::FinallyFailed, reason)
                    }
                };
                let seq = w.transition(
                    self.run_id,
                    run,
                    TransitionV2 {
                        task: task_id,
                        attempt: task.attempt,
                        from: Some(Stage::FinallyRunning),
                        to: stage,
                        at_ms: now,
                        detail,
                        agent: None,
                    },
                )?;
                if let Some(log) = log {
                    w.hook_log(self.run_id, task_id, seq, log)?;
                }
                self.finish_upwards(w, run, task_id, task, now, jobs)
            }
        }
    }

    /// Writes a decision: the transition, slot bookkeeping, spawned children, and settlement.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        w: &mut Writer<'_>,
        run: &mut RunV2,
        task_id: u128,
        task: TaskV1,
        decision: Decision,
        log: Option<HookLogV2>,
        // The pool agent whose work ended an action.
        agent: Option<String>,
        now: u64,
        jobs: &mut Vec<Job>,
    ) -> Result<(), StoreError> {
        // A retry has already moved the task to its next attempt; the transition belongs to
        // the attempt that failed.
        let attempt = if decision.to == Phase::Queued && decision.from.holds_slot() {
            task.attempt.saturating_sub(1).max(1)
        } else {
            task.attempt
        };
        let seq = w.transition(
            self.run_id,
            run,
            TransitionV2 {
                task: task_id,
                attempt,
                from: Some(Stage::Phase(decision.from)),
                to: Stage::Phase(decision.to),
                at_ms: now,
                detail: decision.detail.clone(),
                agent,
            },
        )?;
        if let Some(log) = log {
            w.hook_log(self.run_id, task_id, seq, log)?;
        }
        if decision.from.holds_slot() {
            w.clear_in_flight(self.run_id, decision.from.code(), task_id)?;
        }
        if decision.to.holds_slot() {
            w.mark_in_flight(self.run_id, decision.to.code(), task_id)?;
        }
        if decision.from.holds_slot() && !decision.to.holds_slot() {
            self.in_flight = self.in_flight.saturating_sub(1);
            if let Some(i) = self.step_index(&task.step) {
                self.in_flight_by_step[i] = self.in_flight_by_step[i].saturating_sub(1);
            }
        }
        if decision.to == Phase::Queued
            && let Some(i) = self.step_index(&task.step)
        {
            w.enqueue(self.run_id, step_code(i), task.ready_at_ms, task_id)?;
        }
        if !decision.spawn.is_empty() {
            let workflow = self.workflow.clone();
            let added = spawn_tasks(
                w,
                &workflow,
                &mut self.ids,
                self.run_id,
                run,
                Some(task_id),
                decision.spawn,
                now,
            )?;
            w.add_open_children(self.run_id, task_id, added)?;
        }
        match decision.to {
            Phase::Completed => run.tasks_completed += 1,
            Phase::Failed => run.tasks_failed += 1,
            _ => {}
        }
        if let Some(effect) = decision.effect {
            jobs.push(Job {
                task: task_id,
                attempt: task.attempt,
                step: task.step.clone(),
                kind: JobKind::Phase(effect),
            });
        }
        if decision.to.is_settled() {
            self.finish_upwards(w, run, task_id, task, now, jobs)
        } else {
            w.put_task(self.run_id, task_id, &task)
        }
    }

    /// After a task settles (or a child or its finally hook finishes): starts its finally hook
    /// when everything below it is done, or counts it as finished in its parent, walking up as
    /// far as finishing goes — all in the caller's transaction.
    fn finish_upwards(
        &mut self,
        w: &mut Writer<'_>,
        run: &mut RunV2,
        mut task_id: u128,
        mut task: TaskV1,
        now: u64,
        jobs: &mut Vec<Job>,
    ) -> Result<(), StoreError> {
        // The caller changed `task`; ancestors are rewritten only when their finally starts.
        let mut changed = true;
        loop {
            let open_children = w.open_children(self.run_id, task_id)?;
            if task.phase.is_settled()
                && open_children == 0
                && task.finally == FinallyState::Waiting
            {
                task.finally = FinallyState::Running;
                changed = true;
                w.mark_in_flight(self.run_id, FINALLY_CODE, task_id)?;
                w.transition(
                    self.run_id,
                    run,
                    TransitionV2 {
                        task: task_id,
                        attempt: task.attempt,
                        from: Some(Stage::Phase(task.phase)),
                        to: Stage::FinallyRunning,
                        at_ms: now,
                        detail: "task and all descendants settled".into(),
                        agent: None,
                    },
                )?;
                self.finally_running += 1;
                jobs.push(finally_job(task_id, &task));
            }
            if changed {
                w.put_task(self.run_id, task_id, &task)?;
            }
            if !task.is_finished(open_children) {
                return Ok(());
            }
            run.tasks_open = run.tasks_open.saturating_sub(1);
            let Some(parent_id) = task.parent else {
                return Ok(());
            };
            // Only the counter is touched while siblings are still open: the parent's record
            // (which may hold a huge answer) is read once, when its last child finishes.
            if w.child_finished(self.run_id, parent_id)? > 0 {
                return Ok(());
            }
            let Some(parent) = w.task(self.run_id, parent_id)? else {
                return Ok(());
            };
            task_id = parent_id;
            task = parent;
            changed = false;
        }
    }

    /// Starts queued tasks while slots are free; returns when the next delayed one is due.
    fn dispatch(
        &mut self,
        w: &mut Writer<'_>,
        run: &mut RunV2,
        now: u64,
        jobs: &mut Vec<Job>,
    ) -> Result<Option<u64>, StoreError> {
        if self.interrupted {
            return Ok(None);
        }
        let steps = self.workflow.steps.len();
        let mut heads: Vec<Option<(u64, u128)>> = Vec::with_capacity(steps);
        for i in 0..steps {
            heads.push(w.queue_head(self.run_id, step_code(i))?);
        }
        loop {
            if self
                .workflow
                .max_concurrency
                .is_some_and(|max| self.in_flight >= max)
            {
                break;
            }
            let mut best: Option<(u64, u128, usize)> = None;
            for (i, head) in heads.iter().enumerate() {
                let Some((ready_at, task_id)) = *head else {
                    continue;
                };
                let step_cap = self.workflow.steps[i].options.max_concurrency;
                if ready_at > now || step_cap.is_some_and(|cap| self.in_flight_by_step[i] >= cap) {
                    continue;
                }
                if best.is_none_or(|(r, t, _)| (ready_at, task_id) < (r, t)) {
                    best = Some((ready_at, task_id, i));
                }
            }
            let Some((ready_at, task_id, i)) = best else {
                break;
            };
            w.dequeue(self.run_id, step_code(i), ready_at, task_id)?;
            heads[i] = w.queue_head(self.run_id, step_code(i))?;
            let Some(mut task) = w.task(self.run_id, task_id)? else {
                continue;
            };
            let step = self.workflow.steps[i].clone();
            let decision = lifecycle::start(&mut task, &step, now);
            self.in_flight += 1;
            self.in_flight_by_step[i] += 1;
            self.record(w, run, task_id, task, decision, None, None, now, jobs)?;
        }
        // The earliest delayed task decides when to look again.
        Ok(heads
            .iter()
            .enumerate()
            .filter_map(|(i, head)| {
                let (ready_at, _) = (*head)?;
                let step_cap = self.workflow.steps[i].options.max_concurrency;
                let blocked = step_cap.is_some_and(|cap| self.in_flight_by_step[i] >= cap);
                (ready_at > now && !blocked).then_some(ready_at)
            })
            .min())
    }

    fn launch(&self, job: Job) {
        let Some(step) = self.workflow.step(&job.step).cloned() else {
            return;
        };
        let tx = self.events_tx.clone();
        if let (JobKind::Phase(Effect::Action { value }), Action::Pool { instructions }) =
            (&job.kind, &step.action)
        {
            let next_steps = super::instructions::next_steps(&self.workflow, &step);
            let task = PoolTask {
                run_id: Ulid(self.run_id).to_string(),
                task_id: Ulid(job.task).to_string(),
                attempt: job.attempt,
                instructions: super::instructions::render(instructions, &step, &next_steps),
                task: TaskRef {
                    kind: step.name.clone(),
                    value: JsonText::stored(value),
                },
                next_steps,
            };
            let key = TaskKey {
                run_id: task.run_id.clone(),
                task_id: task.task_id.clone(),
                attempt: task.attempt,
            };
            let Some(pool) = self.pool.clone() else {
                let _ = tx.send(Event::Phase {
                    task: job.task,
                    attempt: job.attempt,
                    phase: Phase::Action,
                    outcome: PhaseResult::Action(ActionOutcome::Failed(
                        "no pool is connected".into(),
                    )),
                    log: None,
                    pool_key: None,
                    agent: None,
                });
                return;
            };
            // Registered now, in dispatch order, so an answer the pool kept is claimed.
            let mut answer = pool.dispatch(task);
            let timeout = step.options.timeout;
            self.runtime.spawn(async move {
                let outcome = match timeout {
                    Some(limit) => match tokio::time::timeout(limit, &mut answer).await {
                        Ok(outcome) => Some(outcome),
                        // An answer sent between the timer firing and now is in the channel:
                        // closing it first makes any later one fail to send, and the client
                        // then hands it to the late-answer sink, so none is lost.
                        Err(_) => {
                            answer.close();
                            answer.try_recv().ok().map(Ok)
                        }
                    },
                    None => Some(answer.await),
                };
                let (outcome, pool_key, agent) = match outcome {
                    None => {
                        pool.recall(key);
                        (ActionOutcome::TimedOut, None, None)
                    }
                    Some(Err(_)) => (
                        ActionOutcome::Failed("the pool connection closed".into()),
                        None,
                        None,
                    ),
                    Some(Ok(PoolAnswer { outcome, agent })) => {
                        let outcome = match outcome {
                            AnswerOutcome::Answered { text } => ActionOutcome::Answered(text),
                            AnswerOutcome::Failed { reason } => ActionOutcome::Failed(reason),
                        };
                        (outcome, Some(key), agent)
                    }
                };
                let _ = tx.send(Event::Phase {
                    task: job.task,
                    attempt: job.attempt,
                    phase: Phase::Action,
                    outcome: PhaseResult::Action(outcome),
                    log: None,
                    pool_key,
                    agent,
                });
            });
            return;
        }
        let tracker = self.tracker.clone();
        let base_dir = self.workflow.base_dir.clone();
        let env = vec![
            ("DROVER_RUN_ID".to_string(), Ulid(self.run_id).to_string()),
            ("DROVER_TASK_ID".to_string(), Ulid(job.task).to_string()),
            ("DROVER_STEP".to_string(), step.name.clone()),
            ("DROVER_ATTEMPT".to_string(), job.attempt.to_string()),
            (
                "DROVER_STATE_DIR".to_string(),
                self.state_dir.display().to_string(),
            ),
        ];
        self.runtime.spawn(async move {
            let event = perform(job, step, base_dir, env, tracker).await;
            let _ = tx.send(event);
        });
    }
}

async fn perform(
    job: Job,
    step: Step,
    base_dir: PathBuf,
    mut env: Vec<(String, String)>,
    tracker: ProcessTracker,
) -> Event {
    let timeout = step.options.timeout;
    let phase_name = job.kind.phase_name();
    let (script, stdin) = match &job.kind {
        JobKind::Finally { value } => match &step.finally_hook {
            Some(hook) => (hook.script.clone(), value.clone()),
            None => {
                return Event::Finally {
                    task: job.task,
                    outcome: HookOutcome::Output("[]".into()),
                    log: None,
                };
            }
        },
        JobKind::Phase(Effect::Pre { stdin }) => match &step.pre {
            Some(hook) => (hook.script.clone(), stdin.clone()),
            None => ("cat".to_string(), stdin.clone()),
        },
        JobKind::Phase(Effect::Post { stdin }) => match &step.post {
            Some(hook) => (hook.script.clone(), stdin.clone()),
            None => ("cat".to_string(), stdin.clone()),
        },
        JobKind::Phase(Effect::Action { value }) => match &step.action {
            // The stored value is compact JSON text already: spliced in, not re-parsed, so a
            // number too large for a float reaches the command as it was written.
            Action::Command { script } => (
                script.clone(),
                format!(r#"{{"kind":{},"value":{value}}}"#, json!(step.name)),
            ),
            Action::Pool { .. } => {
                // Pool actions are launched by `Driver::launch`, never here.
                return Event::Phase {
                    task: job.task,
                    attempt: job.attempt,
                    phase: Phase::Action,
                    outcome: PhaseResult::Action(ActionOutcome::Failed(
                        "internal: pool action run as a process".into(),
                    )),
                    log: None,
                    pool_key: None,
                    agent: None,
                };
            }
        },
    };
    env.push(("DROVER_PHASE".to_string(), phase_name.to_string()));
    let spec = ProcessSpec {
        script,
        cwd: base_dir,
        env,
        stdin: stdin.into_bytes(),
        timeout,
        stdout_limit: STDOUT_LIMIT,
        stderr_limit: STDERR_TAIL,
    };
    let outcome = super::process::run(spec, &tracker).await;
    let (hook_outcome, log) = interpret(outcome, job.attempt, phase_name);
    match job.kind {
        JobKind::Finally { .. } => Event::Finally {
            task: job.task,
            outcome: hook_outcome.unwrap_or(HookOutcome::Failed("cancelled".into())),
            log,
        },
        JobKind::Phase(effect) => {
            let phase = match effect {
                Effect::Pre { .. } => Phase::Pre,
                Effect::Action { .. } => Phase::Action,
                Effect::Post { .. } => Phase::Post,
            };
            let outcome = match hook_outcome {
                None => PhaseResult::Cancelled,
                Some(outcome) if phase == Phase::Action => PhaseResult::Action(match outcome {
                    HookOutcome::Output(stdout) => ActionOutcome::Answered(stdout),
                    HookOutcome::Failed(reason) => {
                        ActionOutcome::Failed(format!("command failed: {reason}"))
                    }
                    HookOutcome::TimedOut => ActionOutcome::TimedOut,
                }),
                Some(outcome) => PhaseResult::Hook(outcome),
            };
            Event::Phase {
                task: job.task,
                attempt: job.attempt,
                phase,
                outcome,
                log,
                pool_key: None,
                agent: None,
            }
        }
    }
}

/// Turns a process outcome into a hook outcome (None: cancelled) and a log record worth
/// keeping (failures, and anything written to stderr).
fn interpret(
    outcome: ProcessOutcome,
    attempt: u32,
    phase: &str,
) -> (Option<HookOutcome>, Option<HookLogV2>) {
    let log = |outcome: String, stderr: &[u8], truncated: bool| HookLogV2 {
        attempt,
        phase: phase.to_string(),
        outcome,
        stderr: String::from_utf8_lossy(stderr).into_owned(),
        stderr_truncated: truncated,
        at_ms: now_ms(),
        agent: None,
    };
    match outcome {
        ProcessOutcome::Exited {
            status,
            stdout,
            stdout_overflow,
            stderr,
            stderr_truncated,
        } => {
            let keep_log = !status.success() || !stderr.is_empty();
            let record = keep_log.then(|| log(status.to_string(), &stderr, stderr_truncated));
            if stdout_overflow {
                let reason = format!("stdout exceeded {STDOUT_LIMIT} bytes");
                return (Some(HookOutcome::Failed(reason)), record);
            }
            if status.success() {
                let text = String::from_utf8_lossy(&stdout).into_owned();
                (Some(HookOutcome::Output(text)), record)
            } else {
                let last_line = String::from_utf8_lossy(&stderr)
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .map(|l| format!(": {}", l.trim()))
                    .unwrap_or_default();
                (
                    Some(HookOutcome::Failed(format!("{status}{last_line}"))),
                    record,
                )
            }
        }
        ProcessOutcome::TimedOut {
            stderr,
            stderr_truncated,
            ..
        } => (
            Some(HookOutcome::TimedOut),
            Some(log("timed out".into(), &stderr, stderr_truncated)),
        ),
        ProcessOutcome::Cancelled => (None, None),
        ProcessOutcome::SpawnFailed { error } => {
            let reason = format!("could not start: {error}");
            (
                Some(HookOutcome::Failed(reason.clone())),
                Some(log(reason, &[], false)),
            )
        }
    }
}
