//! The pool's own redb file: every task it holds and where it is (queued, with an agent,
//! answered), so a SIGKILLed daemon restarts with its queue, its assignments and the answers
//! its runners have not acknowledged yet.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::protocol::{AnswerOutcome, PoolTask};

/// (run, task, attempt) → PoolEntryRecord.
const ENTRIES: TableDefinition<(u128, u128, u32), &[u8]> = TableDefinition::new("entries");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const SCHEMA_VERSION: u64 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum EntryState {
    /// Waiting for an agent; `seq` orders the queue.
    Queued { seq: u64 },
    /// An agent is working on it. `epoch` is the daemon start that assigned it.
    Assigned {
        agent: String,
        since_ms: u64,
        epoch: u64,
    },
    /// The runner gave up on it (action timeout) while an agent held it.
    Recalled {
        agent: String,
        since_ms: u64,
        /// Its run has ended (`RunEnded`): no runner will ever take the answer, so it is
        /// discarded when it comes, or forgotten when the agent asks again. Kept on the entry
        /// rather than in a set of ended runs, which would only grow (see the daemon's
        /// `run_ended`). Absent in entries written before it existed (and ignored by daemons that predate
        /// it, which then keep the answer as before).
        #[serde(default)]
        run_ended: bool,
    },
    /// Answered; kept until the runner acknowledges it.
    Answered {
        outcome: AnswerOutcome,
        late: bool,
        /// Who answered, for the runner to record; kept here so that a daemon restarted
        /// between the answer and its delivery still names the agent. Absent in entries
        /// written before it existed.
        #[serde(default)]
        agent: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolEntryV1 {
    /// The submitted task as JSON text (values are arbitrary JSON).
    pub task: String,
    /// The `EntryState` as JSON text: it holds an internally tagged `AnswerOutcome`, which
    /// postcard can write but never read back.
    pub state: String,
    pub submitted_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum PoolEntryRecord {
    V1(PoolEntryV1),
}

pub type Key = (u128, u128, u32);

pub struct PoolStore {
    db: Database,
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub task: PoolTask,
    pub state: EntryState,
    pub submitted_ms: u64,
}

fn err(e: impl std::fmt::Display) -> String {
    format!("pool store: {e}")
}

impl PoolStore {
    pub fn open(path: &Path) -> Result<Self, String> {
        let db = Database::builder()
            .create(path)
            .map_err(|e| format!("cannot open the pool store {}: {e}", path.display()))?;
        let store = Self { db };
        let mut txn = store.db.begin_write().map_err(err)?;
        txn.set_quick_repair(true);
        {
            let mut meta = txn.open_table(META).map_err(err)?;
            let found = meta.get("schema_version").map_err(err)?.map(|v| v.value());
            match found {
                None => {
                    meta.insert("schema_version", SCHEMA_VERSION).map_err(err)?;
                }
                Some(v) if v > SCHEMA_VERSION => {
                    return Err(format!(
                        "the pool store {} was written by a newer drover (schema version {v}); this drover reads up to {SCHEMA_VERSION}",
                        path.display()
                    ));
                }
                Some(_) => {}
            }
            let epoch = meta.get("epoch").map_err(err)?.map_or(0, |v| v.value());
            meta.insert("epoch", epoch + 1).map_err(err)?;
            txn.open_table(ENTRIES).map_err(err)?;
        }
        txn.commit().map_err(err)?;
        Ok(store)
    }

    /// This daemon start's number (incremented by each open).
    pub fn epoch(&self) -> Result<u64, String> {
        let txn = self.db.begin_read().map_err(err)?;
        let meta = txn.open_table(META).map_err(err)?;
        Ok(meta.get("epoch").map_err(err)?.map_or(0, |v| v.value()))
    }

    pub fn load(&self) -> Result<Vec<(Key, Entry)>, String> {
        let txn = self.db.begin_read().map_err(err)?;
        let table = txn.open_table(ENTRIES).map_err(err)?;
        let mut out = Vec::new();
        for item in table.iter().map_err(err)? {
            let (key, value) = item.map_err(err)?;
            let PoolEntryRecord::V1(record) = postcard::from_bytes(value.value()).map_err(err)?;
            let task: PoolTask = serde_json::from_str(&record.task).map_err(err)?;
            let state: EntryState = serde_json::from_str(&record.state).map_err(err)?;
            out.push((
                key.value(),
                Entry {
                    task,
                    state,
                    submitted_ms: record.submitted_ms,
                },
            ));
        }
        Ok(out)
    }

    /// Applies puts and deletes in one durable transaction.
    pub fn commit(&self, puts: &[(Key, &Entry)], deletes: &[Key]) -> Result<(), String> {
        if puts.is_empty() && deletes.is_empty() {
            return Ok(());
        }
        let mut txn = self.db.begin_write().map_err(err)?;
        txn.set_quick_repair(true);
        {
            let mut table = txn.open_table(ENTRIES).map_err(err)?;
            for (key, entry) in puts {
                let record = PoolEntryRecord::V1(PoolEntryV1 {
                    task: serde_json::to_string(&entry.task).map_err(err)?,
                    state: serde_json::to_string(&entry.state).map_err(err)?,
                    submitted_ms: entry.submitted_ms,
                });
                let bytes = postcard::to_stdvec(&record).map_err(err)?;
                table.insert(*key, bytes.as_slice()).map_err(err)?;
            }
            for key in deletes {
                table.remove(*key).map_err(err)?;
            }
        }
        txn.commit().map_err(err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::protocol::TaskRef;

    #[test]
    fn every_entry_state_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool.redb");
        let task = PoolTask {
            run_id: "01J00000000000000000000000".into(),
            task_id: "01J00000000000000000000001".into(),
            attempt: 1,
            instructions: "do it".into(),
            task: TaskRef {
                kind: "A".into(),
                value: crate::engine::answer::JsonText::stored(r#"{"n":1}"#),
            },
            next_steps: Vec::new(),
        };
        let states = [
            EntryState::Queued { seq: 3 },
            EntryState::Assigned {
                agent: "a".into(),
                since_ms: 5,
                epoch: 2,
            },
            EntryState::Recalled {
                agent: "a".into(),
                since_ms: 5,
                run_ended: false,
            },
            EntryState::Recalled {
                agent: "b".into(),
                since_ms: 6,
                run_ended: true,
            },
            EntryState::Answered {
                outcome: AnswerOutcome::Answered { text: "[]".into() },
                late: false,
                agent: Some("a".into()),
            },
            EntryState::Answered {
                outcome: AnswerOutcome::Failed {
                    reason: "gone".into(),
                },
                late: true,
                agent: None,
            },
        ];
        {
            let store = PoolStore::open(&path).unwrap();
            let entries: Vec<(Key, Entry)> = states
                .iter()
                .enumerate()
                .map(|(i, state)| {
                    let entry = Entry {
                        task: task.clone(),
                        state: state.clone(),
                        submitted_ms: 9,
                    };
                    ((1, i as u128, 1), entry)
                })
                .collect();
            let refs: Vec<(Key, &Entry)> = entries.iter().map(|(k, e)| (*k, e)).collect();
            store.commit(&refs, &[]).unwrap();
        }
        let reopened = PoolStore::open(&path).unwrap();
        let loaded: Vec<EntryState> = reopened
            .load()
            .unwrap()
            .into_iter()
            .map(|(_, e)| e.state)
            .collect();
        assert_eq!(loaded, states);
    }

    #[test]
    fn an_answered_state_written_before_the_agent_was_kept_reads_without_one() {
        let old = r#"{"Answered":{"outcome":{"outcome":"Answered","text":"[]"},"late":false}}"#;
        let state: EntryState = serde_json::from_str(old).unwrap();
        assert_eq!(
            state,
            EntryState::Answered {
                outcome: AnswerOutcome::Answered { text: "[]".into() },
                late: false,
                agent: None,
            }
        );
    }
}
