//! The runner's side of the pool: submits `Pool` actions, routes answers back to the task
//! waiting for them, acknowledges answers once the runner has recorded them, and rides out a
//! daemon restart by reconnecting and submitting again (the pool treats a repeat as a no-op).
//! Recalls, acks and the end of the run that the daemon has not confirmed yet are sent again on
//! the new connection too (all are no-ops when repeated).
//!
//! An answer for a task the runner has recalled (its action timed out) goes to the late-answer
//! sink, to be recorded and acknowledged, never applied: whether the daemon marks it late, or
//! it was answered before the recall reached the daemon, or it came just as the wait for it
//! ended.
//!
//! Answers can arrive before anyone waits for them (a resumed runner is sent every answer the
//! pool kept while it was away); they are parked until the task's dispatch claims them. A
//! resumed runner re-dispatches all its pool tasks at once, so an answer still unclaimed after
//! `UNCLAIMED_AFTER` belongs to a task that had moved on before the crash: it is acknowledged
//! so the pool can forget it.
//!
//! When the run completes or fails, `run_ended` tells the pool, which then forgets the run's
//! leftovers: answers still parked here, and late answers to recalled tasks that come after
//! the runner has gone.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::conn::{Unreachable, connect_waiting};
use super::paths::PoolPaths;
use super::protocol::{AnswerOutcome, PoolTask, Reply, Request, TaskKey};

const UNCLAIMED_AFTER: Duration = Duration::from_secs(30);

/// Called with answers that arrive after the runner recalled their task.
pub type LateAnswerSink = Box<dyn Fn(TaskKey, PoolAnswer) + Send + Sync>;

/// How a task's pool work ended, and which agent did it (when the daemon says).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolAnswer {
    pub outcome: AnswerOutcome,
    pub agent: Option<String>,
}

enum Command {
    Dispatch {
        task: PoolTask,
        reply: oneshot::Sender<PoolAnswer>,
    },
    Recall(TaskKey),
    Ack(Vec<TaskKey>),
    /// Answered once the daemon has confirmed everything sent before it.
    Flush(oneshot::Sender<()>),
    /// The run is over (completed or failed).
    RunEnded,
}

#[derive(Clone)]
pub struct PoolClient {
    commands: mpsc::UnboundedSender<Command>,
}

impl PoolClient {
    /// Connects to the pool, waiting up to `wait` for a daemon, then keeps the connection up
    /// in the background for as long as the client lives.
    pub async fn connect(
        paths: PoolPaths,
        run_id: String,
        wait: Duration,
        late: LateAnswerSink,
    ) -> Result<Self, String> {
        let first = connect_waiting(&paths, Some(wait), false, "drover").await.map_err(|e| match e {
            Unreachable::Stopped | Unreachable::TimedOut => format!(
                "no pool daemon answered at {} within {}s; start one with `drover-pool start{}`",
                paths.socket().display(),
                wait.as_secs(),
                if paths.name == "default" { String::new() } else { format!(" --pool {}", paths.name) }
            ),
        })?;
        let (commands, receiver) = mpsc::unbounded_channel();
        tokio::spawn(connection_loop(paths, run_id, first, receiver, late));
        Ok(Self { commands })
    }

    /// Submits a task; the receiver yields its answer. Registration happens synchronously, in
    /// call order, so it is in place before anything sent later.
    pub fn dispatch(&self, task: PoolTask) -> oneshot::Receiver<PoolAnswer> {
        let (reply, receiver) = oneshot::channel();
        let _ = self.commands.send(Command::Dispatch { task, reply });
        receiver
    }

    /// Gives up on a task: a later answer comes back as late.
    pub fn recall(&self, key: TaskKey) {
        let _ = self.commands.send(Command::Recall(key));
    }

    /// Waits (up to `limit`) until the daemon has committed everything sent so far, so the
    /// last acknowledgements are not lost when the runner exits. Returns whether it did.
    pub async fn flush(&self, limit: Duration) -> bool {
        let (done, wait) = oneshot::channel();
        if self.commands.send(Command::Flush(done)).is_err() {
            return false;
        }
        matches!(tokio::time::timeout(limit, wait).await, Ok(Ok(())))
    }

    /// The run has completed or failed (not interrupted: that run will be resumed and its
    /// answers are still wanted). The pool forgets everything it holds of the run, and
    /// discards answers that come for it later: late answers to tasks this runner recalled,
    /// which no runner would ever acknowledge. Follow with `flush` to make sure it is sent.
    pub fn run_ended(&self) {
        let _ = self.commands.send(Command::RunEnded);
    }

    /// The runner has durably recorded these answers.
    pub fn ack(&self, keys: Vec<TaskKey>) {
        if !keys.is_empty() {
            let _ = self.commands.send(Command::Ack(keys));
        }
    }
}

/// Tells the pool at `paths` that run `run_id` is over, for a run whose own runner could not
/// (the daemon was away during its final flush): the pool forgets what it still holds of the
/// run, as on `RunEnded` from the runner. Waits up to `connect_wait` for a daemon, then up to
/// `reply_wait` for its confirmation, which comes once the pool has committed it. Repeating it
/// changes nothing.
pub async fn tell_run_ended(
    paths: &PoolPaths,
    run_id: &str,
    connect_wait: Duration,
    reply_wait: Duration,
) -> Result<(), String> {
    let (mut reader, mut writer) = connect_waiting(paths, Some(connect_wait), true, "drover")
        .await
        .map_err(|e| match e {
            Unreachable::Stopped => "the pool was stopped with `drover-pool stop`".to_string(),
            Unreachable::TimedOut => format!(
                "no pool daemon answered at {} within {:.1}s",
                paths.socket().display(),
                connect_wait.as_secs_f64()
            ),
        })?;
    let request = Request::RunEnded {
        run_id: run_id.to_string(),
    };
    let confirmed = tokio::time::timeout(reply_wait, async {
        writer.send(&request).await?;
        reader.recv::<Reply>().await
    })
    .await;
    match confirmed {
        Ok(Ok(Some(Reply::Ok))) => Ok(()),
        Ok(Ok(Some(Reply::Error { message }))) => Err(format!("the pool refused: {message}")),
        Ok(Ok(Some(other))) => Err(format!("unexpected reply from the pool daemon: {other:?}")),
        Ok(Ok(None)) => Err("the pool daemon closed the connection without answering".into()),
        Ok(Err(e)) => Err(format!("lost the connection to the pool daemon: {e}")),
        Err(_) => Err(format!(
            "the pool daemon did not confirm within {:.1}s",
            reply_wait.as_secs_f64()
        )),
    }
}

type Conn = (super::conn::LineReader, super::conn::LineWriter);

/// A request written to the daemon and not yet confirmed.
struct Sent {
    seq: u64,
    /// What to send again after a reconnect (recalls, acks, the end of the run). Submits are
    /// not kept: the tasks still unanswered in `pending` are what gets submitted again.
    resend: Option<Request>,
}

/// Requests not yet confirmed. The daemon answers each request on a runner connection with
/// `Ok` or `Error`, in order, once it is committed to the pool's file; until then a write that
/// went through may still be lost with the daemon (killed before reading or committing it), so
/// recalls, acks and the end of the run are kept to be sent again on the next connection.
#[derive(Default)]
struct Outbox {
    unconfirmed: VecDeque<Sent>,
    next_seq: u64,
}

impl Outbox {
    /// Counts a request written (or about to be written) on the current connection.
    fn sent(&mut self, resend: Option<Request>) {
        self.unconfirmed.push_back(Sent {
            seq: self.next_seq,
            resend,
        });
        self.next_seq += 1;
    }

    /// The daemon answered the oldest request outstanding.
    fn confirmed(&mut self) {
        self.unconfirmed.pop_front();
    }

    /// The number the next request will get: a flush waits until everything below it is
    /// confirmed.
    fn mark(&self) -> u64 {
        self.next_seq
    }

    fn confirmed_below(&self, mark: u64) -> bool {
        self.unconfirmed.front().is_none_or(|sent| sent.seq >= mark)
    }

    /// A new connection: the requests to send on it first (all but submits). They stay counted, in
    /// their order, as the new connection's first requests; what the old connection lost
    /// with no resend (submits) is forgotten, so replies and requests pair up again.
    fn reconnected(&mut self) -> Vec<Request> {
        self.unconfirmed.retain(|sent| sent.resend.is_some());
        self.unconfirmed
            .iter()
            .filter_map(|sent| sent.resend.clone())
            .collect()
    }
}

/// Answers every flush whose requests have all been confirmed.
fn settle_flushes(flushes: &mut Vec<(u64, oneshot::Sender<()>)>, outbox: &Outbox) {
    let mut index = 0;
    while index < flushes.len() {
        if outbox.confirmed_below(flushes[index].0) {
            let (_, done) = flushes.swap_remove(index);
            let _ = done.send(());
        } else {
            index += 1;
        }
    }
}

async fn connection_loop(
    paths: PoolPaths,
    run_id: String,
    first: Conn,
    mut commands: mpsc::UnboundedReceiver<Command>,
    late: LateAnswerSink,
) {
    let mut pending: HashMap<TaskKey, (PoolTask, oneshot::Sender<PoolAnswer>)> = HashMap::new();
    let mut parked: HashMap<TaskKey, (PoolAnswer, Instant)> = HashMap::new();
    // Recalled while still unanswered: an answer for them can still come, and it is late even
    // when the daemon, which answered before the recall reached it, does not say so.
    let mut recalled: HashSet<TaskKey> = HashSet::new();
    let mut outbox = Outbox::default();
    let mut flushes: Vec<(u64, oneshot::Sender<()>)> = Vec::new();
    let mut sweep = tokio::time::interval(UNCLAIMED_AFTER);
    let mut next_conn = Some(first);
    loop {
        let (mut reader, mut writer) = match next_conn.take() {
            Some(conn) => conn,
            None => match connect_waiting(&paths, None, false, "drover").await {
                Ok(conn) => conn,
                Err(_) => return,
            },
        };
        if writer
            .send(&Request::Runner {
                run_id: run_id.clone(),
            })
            .await
            .is_err()
        {
            continue;
        }
        let mut broken = false;
        for request in outbox.reconnected() {
            if writer.send(&request).await.is_err() {
                broken = true;
                break;
            }
        }
        if broken {
            continue;
        }
        let resubmit: Vec<PoolTask> = pending.values().map(|(task, _)| task.clone()).collect();
        if !resubmit.is_empty() {
            outbox.sent(None);
            if writer
                .send(&Request::Submit { tasks: resubmit })
                .await
                .is_err()
            {
                continue;
            }
        }
        loop {
            tokio::select! {
                _ = sweep.tick() => {
                    let stale: Vec<TaskKey> = parked
                        .iter()
                        .filter(|(_, (_, at))| at.elapsed() >= UNCLAIMED_AFTER)
                        .map(|(key, _)| key.clone())
                        .collect();
                    if !stale.is_empty() {
                        for key in &stale {
                            parked.remove(key);
                        }
                        let request = Request::Ack { keys: stale };
                        let written = writer.send(&request).await;
                        outbox.sent(Some(request));
                        if written.is_err() {
                            break;
                        }
                    }
                }
                command = commands.recv() => {
                    let Some(first) = command else { return };
                    let mut batch = vec![first];
                    while let Ok(more) = commands.try_recv() {
                        batch.push(more);
                    }
                    let mut submit = Vec::new();
                    let mut requests = Vec::new();
                    let mut flushed = Vec::new();
                    for command in batch {
                        match command {
                            Command::Dispatch { task, reply } => {
                                let key = TaskKey { run_id: task.run_id.clone(), task_id: task.task_id.clone(), attempt: task.attempt };
                                if let Some((answer, _)) = parked.remove(&key) {
                                    if let Err(answer) = reply.send(answer) {
                                        late(key, answer);
                                    }
                                    continue;
                                }
                                submit.push(task.clone());
                                pending.insert(key, (task, reply));
                            }
                            Command::Recall(key) => {
                                if pending.remove(&key).is_some() {
                                    recalled.insert(key.clone());
                                }
                                requests.push(Request::Recall { run_id: key.run_id, task_id: key.task_id, attempt: key.attempt });
                            }
                            Command::Ack(keys) => {
                                for key in &keys {
                                    parked.remove(key);
                                }
                                requests.push(Request::Ack { keys });
                            }
                            Command::Flush(done) => flushed.push(done),
                            Command::RunEnded => {
                                // Answers nobody claimed belong to tasks that moved on long
                                // ago; the pool drops them with the rest of the run.
                                parked.clear();
                                requests.push(Request::RunEnded { run_id: run_id.clone() });
                            }
                        }
                    }
                    // Everything is counted even once the connection has failed, so that the
                    // requests among it other than submits are sent again after reconnecting.
                    let mut broken = false;
                    if !submit.is_empty() {
                        broken |= writer.send(&Request::Submit { tasks: submit }).await.is_err();
                        outbox.sent(None);
                    }
                    for request in requests {
                        if !broken {
                            broken |= writer.send(&request).await.is_err();
                        }
                        outbox.sent(Some(request));
                    }
                    let mark = outbox.mark();
                    flushes.extend(flushed.into_iter().map(|done| (mark, done)));
                    settle_flushes(&mut flushes, &outbox);
                    if broken {
                        break;
                    }
                }
                reply = reader.recv::<Reply>() => match reply {
                    Ok(Some(Reply::Answer { key, outcome, late: is_late, agent })) => {
                        let answer = PoolAnswer { outcome, agent };
                        let was_recalled = recalled.remove(&key);
                        if is_late || was_recalled {
                            late(key, answer);
                        } else if let Some((_, reply)) = pending.remove(&key) {
                            // The task timed out just as its answer came: it is late, and
                            // recorded as such rather than dropped with the receiver.
                            if let Err(answer) = reply.send(answer) {
                                late(key, answer);
                            }
                        } else {
                            parked.insert(key, (answer, Instant::now()));
                        }
                    }
                    Ok(Some(Reply::Ok)) => {
                        outbox.confirmed();
                        settle_flushes(&mut flushes, &outbox);
                    }
                    Ok(Some(Reply::Error { message })) => {
                        tracing::error!("pool: {message}");
                        outbox.confirmed();
                        settle_flushes(&mut flushes, &outbox);
                    }
                    Ok(Some(Reply::Status(_) | Reply::Kicked { .. })) => {}
                    Ok(None) | Err(_) => {
                        crate::say!("drover: lost the connection to pool `{}`; reconnecting", paths.name);
                        break;
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(task: &str) -> Request {
        Request::Ack {
            keys: vec![TaskKey {
                run_id: "r".into(),
                task_id: task.into(),
                attempt: 1,
            }],
        }
    }

    #[test]
    fn unconfirmed_recalls_and_acks_are_sent_again_in_order_and_submits_are_not() {
        let mut outbox = Outbox::default();
        outbox.sent(Some(ack("a")));
        outbox.sent(None);
        outbox.sent(Some(ack("b")));
        outbox.sent(Some(ack("c")));
        outbox.confirmed();
        assert_eq!(outbox.reconnected(), vec![ack("b"), ack("c")]);
        // Resent on the new connection: confirmed there in the same order.
        outbox.sent(None);
        outbox.confirmed();
        assert_eq!(outbox.reconnected(), vec![ack("c")]);
        outbox.confirmed();
        assert_eq!(outbox.reconnected(), Vec::<Request>::new());
    }

    #[test]
    fn a_flush_waits_for_what_was_sent_before_it_only() {
        let mut outbox = Outbox::default();
        outbox.sent(Some(ack("a")));
        outbox.sent(Some(ack("b")));
        let mark = outbox.mark();
        outbox.sent(Some(ack("c")));
        let (done, mut flushed) = oneshot::channel();
        let mut flushes = vec![(mark, done)];
        settle_flushes(&mut flushes, &outbox);
        assert!(flushed.try_recv().is_err(), "nothing confirmed yet");
        outbox.confirmed();
        settle_flushes(&mut flushes, &outbox);
        assert!(flushed.try_recv().is_err(), "`b` is not confirmed yet");
        // The connection is lost: `b` still counts, and is confirmed on the next one.
        assert_eq!(outbox.reconnected(), vec![ack("b"), ack("c")]);
        settle_flushes(&mut flushes, &outbox);
        assert!(flushed.try_recv().is_err(), "`b` is not confirmed yet");
        outbox.confirmed();
        settle_flushes(&mut flushes, &outbox);
        assert_eq!(
            flushed.try_recv(),
            Ok(()),
            "everything before the mark confirmed"
        );
        assert!(flushes.is_empty());
    }
}
