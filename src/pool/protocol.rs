//! Every message that crosses the pool's Unix socket, shared by the daemon, the runner and the
//! agent side. One JSON object per line. The agent-facing messages (`AgentMessage`) are also
//! exactly what `drover-pool get-task` prints, so agents see the same format the daemon sends.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::engine::answer::JsonText;

/// `{"kind": …, "value": …}` as in the workflow config. The value is kept as its JSON text, so
/// that a number no float holds reaches the agent as the runner stored it.
///
/// serde reads internally tagged enums (`Request`, `AgentMessage`) through a buffer that has
/// already turned every number into a float or a 64-bit integer, and that cannot hold raw JSON
/// at all; so those two enums are read by hand (`Deserialize` below): the variants that carry
/// a `TaskRef` are parsed straight from the message's text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRef {
    pub kind: String,
    pub value: JsonText,
}

/// A step the agent may answer with, and the schema its value must satisfy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NextStep {
    pub kind: String,
    pub value_schema: Value,
}

/// What a runner hands the pool. Identified by (run_id, task_id, attempt); submitting the same
/// one again changes nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolTask {
    pub run_id: String,
    pub task_id: String,
    pub attempt: u32,
    pub instructions: String,
    pub task: TaskRef,
    pub next_steps: Vec<NextStep>,
}

/// What `get-task` prints: a task to do, or an order to exit.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind")]
pub enum AgentMessage {
    Task {
        task_id: String,
        attempt: u32,
        response_file: String,
        instructions: String,
        task: TaskRef,
        next_steps: Vec<NextStep>,
    },
    Kicked {
        reason: String,
    },
}

/// How an agent's work on a task ended, as the pool saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome")]
pub enum AnswerOutcome {
    /// The complete response file's text (validated by the runner).
    Answered { text: String },
    /// No usable answer (the agent abandoned the task, the file was unreadable, …).
    Failed { reason: String },
}

/// On a runner connection (after `Runner`), every request gets exactly one `Ok` or `Error`,
/// in order, once the daemon has committed it: the runner counts them to know which recalls
/// and acknowledgements to send again after a reconnect. `Answer`s are pushed in between.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", remote = "Request")]
pub enum Request {
    /// An agent asks for work; answered by one `AgentMessage` line.
    GetTask {
        name: String,
    },
    /// This connection is the runner of `run_id`: answers for it are delivered here,
    /// including those that arrived while no runner was connected.
    Runner {
        run_id: String,
    },
    /// Queue tasks (from the runner connection).
    Submit {
        tasks: Vec<PoolTask>,
    },
    /// The runner gave up on a task (action timeout): a later answer is kept, never delivered
    /// as live.
    Recall {
        run_id: String,
        task_id: String,
        attempt: u32,
    },
    /// The runner recorded these answers; the pool may forget them.
    Ack {
        keys: Vec<TaskKey>,
    },
    /// The run is over (completed or failed; never sent for an interrupted run, which will be
    /// resumed): no runner will take any more of its answers. The pool forgets the run's
    /// queued and answered tasks at once, and those an agent still holds once the agent
    /// answers (the answer is discarded) or asks again.
    RunEnded {
        run_id: String,
    },
    Status,
    /// Kick agent `name`. Answered `Ok`, or `Kicked` when `abandon` is set.
    Kick {
        name: String,
        /// Also give up the task the agent holds, now: its runner gets an `Error` as for an
        /// abandoned task, rather than waiting for an agent that may be dead. Absent from the
        /// requests of clients that predate it (and left out when false, so that a plain kick
        /// reads the same to a daemon that predates it).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        abandon: bool,
    },
    Stop,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskKey {
    pub run_id: String,
    pub task_id: String,
    pub attempt: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Reply {
    Ok,
    Error {
        message: String,
    },
    /// Pushed to the runner connection.
    Answer {
        key: TaskKey,
        outcome: AnswerOutcome,
        /// The runner had recalled the task: record it, do not apply it.
        late: bool,
        /// The agent that held the task. Absent from the answers of a daemon that predates it,
        /// and of a task no agent held.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<String>,
    },
    Status(StatusReport),
    /// The answer to a `Kick` with `abandon`: what happened, for the operator. A daemon that
    /// predates `abandon` answers a plain `Ok` instead, which tells the client the task was
    /// not given up.
    Kicked {
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub pool: String,
    pub agents: Vec<AgentStatus>,
    /// Tasks waiting for an agent.
    pub queued: u64,
    /// Tasks an agent is working on.
    pub assigned: u64,
    /// Answers not yet acknowledged by their runner.
    pub undelivered: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentStatus {
    pub name: String,
    /// "idle" (waiting in get-task) or "busy".
    pub state: String,
    pub task: Option<TaskKey>,
    /// Milliseconds since the epoch when it entered that state.
    pub since_ms: u64,
}

/// A message's text, then its tag: what the hand-written readers below dispatch on. The tag
/// is read without building the rest (serde skips unknown fields without allocating).
fn raw_and_tag<'de, D: Deserializer<'de>>(
    deserializer: D,
    tag: &'static str,
) -> Result<(Box<RawValue>, String), D::Error> {
    #[derive(Deserialize)]
    struct Kind {
        kind: String,
    }
    #[derive(Deserialize)]
    struct Type {
        #[serde(rename = "type")]
        kind: String,
    }
    let raw = Box::<RawValue>::deserialize(deserializer)?;
    let kind = match tag {
        "type" => serde_json::from_str::<Type>(raw.get()).map(|t| t.kind),
        _ => serde_json::from_str::<Kind>(raw.get()).map(|k| k.kind),
    }
    .map_err(D::Error::custom)?;
    Ok((raw, kind))
}

impl<'de> Deserialize<'de> for AgentMessage {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Task {
            task_id: String,
            attempt: u32,
            response_file: String,
            instructions: String,
            task: TaskRef,
            next_steps: Vec<NextStep>,
        }
        #[derive(Deserialize)]
        struct Kicked {
            reason: String,
        }
        let (raw, kind) = raw_and_tag(deserializer, "kind")?;
        match kind.as_str() {
            "Task" => {
                let t: Task = serde_json::from_str(raw.get()).map_err(D::Error::custom)?;
                Ok(AgentMessage::Task {
                    task_id: t.task_id,
                    attempt: t.attempt,
                    response_file: t.response_file,
                    instructions: t.instructions,
                    task: t.task,
                    next_steps: t.next_steps,
                })
            }
            "Kicked" => {
                let k: Kicked = serde_json::from_str(raw.get()).map_err(D::Error::custom)?;
                Ok(AgentMessage::Kicked { reason: k.reason })
            }
            other => Err(D::Error::unknown_variant(other, &["Task", "Kicked"])),
        }
    }
}

impl Serialize for Request {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Request::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for Request {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Submit {
            tasks: Vec<PoolTask>,
        }
        let (raw, kind) = raw_and_tag(deserializer, "type")?;
        if kind == "Submit" {
            let submit: Submit = serde_json::from_str(raw.get()).map_err(D::Error::custom)?;
            return Ok(Request::Submit {
                tasks: submit.tasks,
            });
        }
        // No other variant holds raw JSON: the derived reader is right for them.
        let mut reader = serde_json::Deserializer::from_str(raw.get());
        Request::deserialize(&mut reader).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_from_a_daemon_that_does_not_name_agents_still_parses() {
        let old = r#"{"type":"Answer","key":{"run_id":"r","task_id":"t","attempt":1},"outcome":{"outcome":"Failed","reason":"gone"},"late":true}"#;
        let Ok(Reply::Answer { agent, late, .. }) = serde_json::from_str::<Reply>(old) else {
            panic!("an old answer parses");
        };
        assert_eq!((agent, late), (None, true));
    }

    #[test]
    fn a_kick_from_a_client_that_predates_abandon_still_parses_and_a_plain_kick_reads_the_same() {
        let old = r#"{"type":"Kick","name":"a"}"#;
        let parsed: Request = serde_json::from_str(old).expect("an old kick parses");
        assert_eq!(
            parsed,
            Request::Kick {
                name: "a".into(),
                abandon: false
            }
        );
        assert_eq!(serde_json::to_string(&parsed).expect("encodes"), old);
    }

    #[test]
    fn submitted_and_handed_out_values_keep_every_digit() {
        let value = r#"{"id":1234567890123456789012345,"x":0.1000000000000000055511151231257827}"#;
        let task = format!(
            r#"{{"run_id":"r","task_id":"t","attempt":1,"instructions":"i","task":{{"kind":"K","value":{value}}},"next_steps":[]}}"#
        );
        let submit = format!(r#"{{"type":"Submit","tasks":[{task}]}}"#);
        let parsed: Request = serde_json::from_str(&submit).expect("a submit parses");
        assert_eq!(serde_json::to_string(&parsed).expect("encodes"), submit);

        let message = format!(
            r#"{{"kind":"Task","task_id":"t","attempt":1,"response_file":"/f","instructions":"i","task":{{"kind":"K","value":{value}}},"next_steps":[]}}"#
        );
        let parsed: AgentMessage = serde_json::from_str(&message).expect("a task parses");
        assert_eq!(serde_json::to_string(&parsed).expect("encodes"), message);
        assert!(serde_json::from_str::<AgentMessage>(r#"{"kind":"Nope"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"name":"a"}"#).is_err());
    }
}
