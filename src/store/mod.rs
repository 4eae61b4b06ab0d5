//! Durable state: one redb file per state directory (all runs) and one per pool.
//!
//! Files are opened in `ConcurrencyMode::MultiWriter` so that two runs can execute at once from
//! one state directory and `inspect` can follow them read-only, with quick repair on so that a
//! reopen after SIGKILL takes milliseconds. Everything the lifecycle needs is written here in
//! one transaction per batch of events; nothing about a task lives only in memory.

pub mod records;
pub mod tables;
mod txn;

use std::path::{Path, PathBuf};

use redb::{ConcurrencyMode, Database, ReadableDatabase, ReadableTable};

pub use records::*;
pub use txn::{Reader, Writer};

use tables::{META, SCHEMA_VERSION};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the state store {path}: {reason}")]
    Open { path: PathBuf, reason: String },
    #[error(
        "the state store {path} was written by a newer drover (schema version {found}); this drover reads versions up to {supported}"
    )]
    NewerVersion {
        path: PathBuf,
        found: u64,
        supported: u64,
    },
    #[error("state store error: {0}")]
    Db(String),
    #[error("cannot encode a {what} record: {reason}")]
    Encode { what: &'static str, reason: String },
    #[error("a stored {what} record is unreadable: {reason}")]
    Decode { what: &'static str, reason: String },
    #[error("{0}")]
    Missing(String),
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Db(e.to_string())
            }
        }
    )*};
}
from_redb!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

pub const STATE_FILE: &str = "drover.redb";

/// redb's page cache. Its default (1 GiB) would let a large run's memory grow with the file;
/// the hot pages (queue heads, in-flight tasks, the run record) fit easily in this.
const CACHE_BYTES: usize = 16 * 1024 * 1024;

/// The runner's state file.
pub struct Store {
    db: Database,
    path: PathBuf,
}

impl Store {
    /// Opens (creating if needed) the state file in `state_dir`.
    pub fn open(state_dir: &Path) -> Result<Self, StoreError> {
        create_private_dir(state_dir).map_err(|reason| StoreError::Open {
            path: state_dir.to_path_buf(),
            reason,
        })?;
        Self::open_file(&state_dir.join(STATE_FILE))
    }

    pub fn open_file(path: &Path) -> Result<Self, StoreError> {
        let open_error = |e: redb::DatabaseError| StoreError::Open {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let db = Database::builder()
            .set_concurrency_mode(ConcurrencyMode::MultiWriter)
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(open_error)?;
        let store = Self {
            db,
            path: path.to_path_buf(),
        };
        store.check_version()?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn check_version(&self) -> Result<(), StoreError> {
        let txn = self.begin_write()?;
        {
            let mut meta = txn.open_table(META)?;
            let found = meta.get("schema_version")?.map(|v| v.value());
            match found {
                None => {
                    meta.insert("schema_version", SCHEMA_VERSION)?;
                }
                Some(found) if found > SCHEMA_VERSION => {
                    return Err(StoreError::NewerVersion {
                        path: self.path.clone(),
                        found,
                        supported: SCHEMA_VERSION,
                    });
                }
                // Version 1 → 2 appended `RunRecord::V2`; version-1 records are upgraded as
                // they are read, so only the number changes (and an older drover, which cannot
                // decode V2 records, now refuses the file instead of misreading it).
                Some(found) if found < SCHEMA_VERSION => {
                    meta.insert("schema_version", SCHEMA_VERSION)?;
                }
                Some(_) => {}
            }
            // Create every table so read-only openers never see a missing one.
            txn.open_table(tables::RUNS)?;
            txn.open_table(tables::TASKS)?;
            txn.open_table(tables::OPEN_CHILDREN)?;
            txn.open_table(tables::QUEUE)?;
            txn.open_table(tables::IN_FLIGHT)?;
            txn.open_table(tables::TRANSITIONS)?;
            txn.open_table(tables::TASK_TRANSITIONS)?;
            txn.open_table(tables::HOOK_LOGS)?;
        }
        txn.commit()?;
        Ok(())
    }

    fn begin_write(&self) -> Result<redb::WriteTransaction, StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_quick_repair(true);
        Ok(txn)
    }

    /// Runs `body` in one durable write transaction; nothing is written if it fails.
    pub fn write<T>(
        &self,
        body: impl FnOnce(&mut Writer<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let txn = self.begin_write()?;
        let result = {
            let mut writer = Writer::new(&txn)?;
            body(&mut writer)?
        };
        txn.commit()?;
        Ok(result)
    }

    /// A consistent snapshot for queries.
    pub fn read(&self) -> Result<Reader, StoreError> {
        Reader::new(self.db.begin_read()?)
    }
}

/// Opens a state file for reading alongside live writers (used by `inspect`). A file left
/// unrepaired by a killed writer is repaired first when no writer holds it.
pub fn open_for_reading(state_dir: &Path) -> Result<Store, StoreError> {
    let path = state_dir.join(STATE_FILE);
    if !path.exists() {
        return Err(StoreError::Open {
            path,
            reason: "no runs have been recorded in this state directory".into(),
        });
    }
    // In MultiWriter mode a writer handle shares the file with live runs; opening one repairs a
    // file a SIGKILLed writer left behind, which a read-only handle refuses to do.
    Store::open_file(&path)
}

/// Creates `dir` (and parents) with mode 0700.
pub fn create_private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create directory {}: {e}", dir.display()))
}
