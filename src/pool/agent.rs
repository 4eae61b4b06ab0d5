//! The agent side of the pool (CONTRACT.md §4): asking for a task, and running a program as
//! an agent.
//!
//! `get_task` outlives the daemon: when the connection ends before a message arrives (the
//! daemon was killed or is restarting), it reconnects and asks again. It gives up only when
//! the pool was stopped on purpose (`drover-pool stop` leaves a marker), which it reports as
//! `Kicked`, like a stop that reaches a waiting agent.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;
use serde_json::value::RawValue;
use tokio::io::AsyncWriteExt;

use super::conn::{LineReader, LineWriter, Unreachable, connect_waiting};
use super::paths::PoolPaths;
use super::protocol::{AgentMessage, Request};

const WHO: &str = "drover-pool get-task";
pub const STOPPED_REASON: &str = "the pool was stopped";

/// Registers as agent `name`, waits for a task and returns it (or the order to exit).
/// `Err` is a refusal by the daemon (e.g. another live `get-task` under the same name) or a
/// message that cannot be understood.
pub async fn get_task(paths: &PoolPaths, name: &str) -> Result<AgentMessage, String> {
    AgentConnection::default().get_task(paths, name).await
}

/// An agent's connection to the daemon, kept open from one task to the next so a busy agent
/// does not pay a connect and a registration per task. Reopened when the daemon goes away.
#[derive(Default)]
pub struct AgentConnection {
    open: Option<(LineReader, LineWriter)>,
}

impl AgentConnection {
    /// `get_task` over this connection.
    pub async fn get_task(
        &mut self,
        paths: &PoolPaths,
        name: &str,
    ) -> Result<AgentMessage, String> {
        let mut announced_loss = false;
        loop {
            let (mut reader, mut writer) = match self.open.take() {
                Some(open) => open,
                None => match connect_waiting(paths, None, true, WHO).await {
                    Ok(conn) => conn,
                    Err(Unreachable::Stopped) => {
                        return Ok(AgentMessage::Kicked {
                            reason: STOPPED_REASON.into(),
                        });
                    }
                    Err(Unreachable::TimedOut) => {
                        return Err(format!("timed out waiting for pool `{}`", paths.name));
                    }
                },
            };
            let request = Request::GetTask {
                name: name.to_string(),
            };
            let lost = match writer.send(&request).await {
                Err(e) => e.to_string(),
                // Kept as text until parsed as a message: a `Value` would round the task's
                // numbers that no float holds.
                Ok(()) => match reader.recv::<Box<RawValue>>().await {
                    Ok(Some(line)) => {
                        let message = parse_message(line.get())?;
                        if matches!(message, AgentMessage::Task { .. }) {
                            self.open = Some((reader, writer));
                        }
                        return Ok(message);
                    }
                    Ok(None) => "connection closed".to_string(),
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                        return Err(format!("the pool daemon sent an unreadable message: {e}"));
                    }
                    Err(e) => e.to_string(),
                },
            };
            if !announced_loss {
                crate::say!(
                    "{WHO}: lost the connection to the daemon of pool `{}` ({lost}); reconnecting",
                    paths.name
                );
                announced_loss = true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One line from the daemon: a `{"type": "Error"}` reply, or an `AgentMessage`.
fn parse_message(line: &str) -> Result<AgentMessage, String> {
    let value: Value = serde_json::from_str(line)
        .map_err(|e| format!("the pool daemon sent a message that is not JSON: {e}"))?;
    if value.get("type").and_then(Value::as_str) == Some("Error") {
        let message = value
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("the pool daemon refused the request without saying why");
        return Err(message.to_string());
    }
    serde_json::from_str(line)
        .map_err(|e| format!("the pool daemon sent a message that is not a task: {e}"))
}

/// Why `run_agent` failed.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentError {
    /// `get-task` was refused or answered with something unreadable.
    Refused(String),
    /// The command could not be run or its answer not written.
    Failed(String),
}

/// Why `run_agent` returned.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEnd {
    Kicked {
        reason: String,
    },
    /// `--max-tasks` answers were written.
    Done {
        answered: u64,
    },
}

/// Runs `command` (argv, no shell) as agent `name`: for each task, the task message (the JSON
/// that `get-task` prints) goes to its stdin and its stdout is written, whatever its exit
/// status, as the response. Returns on `Kicked` or after `max_tasks` answers.
pub async fn run_agent(
    paths: &PoolPaths,
    name: &str,
    command: &[OsString],
    max_tasks: Option<u64>,
) -> Result<AgentEnd, AgentError> {
    let Some((program, args)) = command.split_first() else {
        return Err(AgentError::Failed("no command given".into()));
    };
    let mut answered = 0u64;
    let mut connection = AgentConnection::default();
    loop {
        if max_tasks.is_some_and(|max| answered >= max) {
            return Ok(AgentEnd::Done { answered });
        }
        let message = connection
            .get_task(paths, name)
            .await
            .map_err(AgentError::Refused)?;
        let (task_id, attempt, response_file) = match &message {
            AgentMessage::Task {
                task_id,
                attempt,
                response_file,
                ..
            } => (task_id.clone(), *attempt, response_file.clone()),
            AgentMessage::Kicked { reason } => {
                return Ok(AgentEnd::Kicked {
                    reason: reason.clone(),
                });
            }
        };
        let input = serde_json::to_vec(&message)
            .map_err(|e| AgentError::Failed(format!("cannot encode the task message: {e}")))?;
        let (status, output) = run_command(program, args, name, &message, input)
            .await
            .map_err(|e| {
                AgentError::Failed(format!("cannot run {}: {e}", program.to_string_lossy()))
            })?;
        if !status.success() {
            crate::say!(
                "drover-pool agent: {} ended with {status} on task {task_id} (attempt {attempt}); its output is sent as the answer anyway",
                program.to_string_lossy()
            );
        }
        write_atomically(Path::new(&response_file), &output).map_err(|e| {
            AgentError::Failed(format!(
                "cannot write the response file {response_file}: {e}"
            ))
        })?;
        answered += 1;
    }
}

async fn run_command(
    program: &OsString,
    args: &[OsString],
    name: &str,
    message: &AgentMessage,
    input: Vec<u8>,
) -> std::io::Result<(ExitStatus, Vec<u8>)> {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .env("DROVER_AGENT_NAME", name);
    if let AgentMessage::Task {
        task_id,
        attempt,
        response_file,
        ..
    } = message
    {
        command
            .env("DROVER_TASK_ID", task_id)
            .env("DROVER_ATTEMPT", attempt.to_string())
            .env("DROVER_RESPONSE_FILE", response_file);
    }
    let mut child = command.spawn()?;
    let stdin = child.stdin.take();
    let feed = async move {
        if let Some(mut stdin) = stdin {
            // A program that does not read its input closes the pipe early: not an error.
            let _ = stdin.write_all(&input).await;
            let _ = stdin.shutdown().await;
        }
    };
    let ((), output) = tokio::join!(feed, child.wait_with_output());
    let output = output?;
    Ok((output.status, output.stdout))
}

/// Writes `path.tmp-<pid>` beside `path`, then renames it into place, so the daemon never
/// reads a partial answer.
pub fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let mut tmp: OsString = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = std::fs::write(&tmp, contents).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn error_replies_become_errors() {
        let refused =
            parse_message(&json!({"type": "Error", "message": "already waiting"}).to_string());
        assert_eq!(refused, Err("already waiting".to_string()));
    }

    #[test]
    fn agent_messages_parse() {
        let kicked = parse_message(&json!({"kind": "Kicked", "reason": "bye"}).to_string());
        assert_eq!(
            kicked,
            Ok(AgentMessage::Kicked {
                reason: "bye".into()
            })
        );
        assert!(parse_message(&json!({"kind": "Nonsense"}).to_string()).is_err());
    }

    #[test]
    fn atomic_write_leaves_only_the_target() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("answer.json");
        write_atomically(&target, b"[]").expect("written");
        assert_eq!(std::fs::read(&target).expect("readable"), b"[]");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("listable")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![OsString::from("answer.json")]);
    }
}
