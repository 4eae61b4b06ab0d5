//! Typed access to the tables inside one transaction.

use redb::{ReadOnlyTable, ReadTransaction, ReadableTable, Table, WriteTransaction};

use super::StoreError;
use super::records::{
    HookLogRecord, HookLogV2, RunRecord, RunV2, TaskRecord, TaskV1, TransitionRecord, TransitionV2,
    decode, encode,
};
use super::tables::*;

/// All tables of one write transaction, opened once.
pub struct Writer<'t> {
    runs: Table<'t, u128, &'static [u8]>,
    tasks: Table<'t, (u128, u128), &'static [u8]>,
    open_children: Table<'t, (u128, u128), u64>,
    queue: Table<'t, (u128, u32, u64, u128), ()>,
    in_flight: Table<'t, (u128, u8, u128), ()>,
    transitions: Table<'t, (u128, u64), &'static [u8]>,
    task_transitions: Table<'t, (u128, u128, u64), ()>,
    hook_logs: Table<'t, (u128, u128, u64), &'static [u8]>,
}

impl<'t> Writer<'t> {
    pub(super) fn new(txn: &'t WriteTransaction) -> Result<Self, StoreError> {
        Ok(Self {
            runs: txn.open_table(RUNS)?,
            tasks: txn.open_table(TASKS)?,
            open_children: txn.open_table(OPEN_CHILDREN)?,
            queue: txn.open_table(QUEUE)?,
            in_flight: txn.open_table(IN_FLIGHT)?,
            transitions: txn.open_table(TRANSITIONS)?,
            task_transitions: txn.open_table(TASK_TRANSITIONS)?,
            hook_logs: txn.open_table(HOOK_LOGS)?,
        })
    }

    pub fn run(&self, run: u128) -> Result<Option<RunV2>, StoreError> {
        match self.runs.get(run)? {
            Some(bytes) => Ok(Some(decode::<RunRecord>(bytes.value())?)),
            None => Ok(None),
        }
    }

    pub fn put_run(&mut self, run: u128, record: &RunV2) -> Result<(), StoreError> {
        let bytes = encode::<RunRecord>(record.clone())?;
        self.runs.insert(run, bytes.as_slice())?;
        Ok(())
    }

    pub fn task(&self, run: u128, task: u128) -> Result<Option<TaskV1>, StoreError> {
        match self.tasks.get((run, task))? {
            Some(bytes) => Ok(Some(decode::<TaskRecord>(bytes.value())?)),
            None => Ok(None),
        }
    }

    pub fn put_task(&mut self, run: u128, task: u128, record: &TaskV1) -> Result<(), StoreError> {
        let bytes = encode::<TaskRecord>(record.clone())?;
        self.tasks.insert((run, task), bytes.as_slice())?;
        Ok(())
    }

    pub fn open_children(&self, run: u128, task: u128) -> Result<u64, StoreError> {
        Ok(self
            .open_children
            .get((run, task))?
            .map_or(0, |v| v.value()))
    }

    pub fn add_open_children(
        &mut self,
        run: u128,
        task: u128,
        count: u64,
    ) -> Result<(), StoreError> {
        if count > 0 {
            let now = self.open_children(run, task)?;
            self.open_children.insert((run, task), now + count)?;
        }
        Ok(())
    }

    /// One child finished; returns how many are still open.
    pub fn child_finished(&mut self, run: u128, task: u128) -> Result<u64, StoreError> {
        let left = self.open_children(run, task)?.saturating_sub(1);
        if left == 0 {
            self.open_children.remove((run, task))?;
        } else {
            self.open_children.insert((run, task), left)?;
        }
        Ok(left)
    }

    pub fn enqueue(
        &mut self,
        run: u128,
        step: u32,
        ready_at: u64,
        task: u128,
    ) -> Result<(), StoreError> {
        self.queue.insert((run, step, ready_at, task), ())?;
        Ok(())
    }

    pub fn dequeue(
        &mut self,
        run: u128,
        step: u32,
        ready_at: u64,
        task: u128,
    ) -> Result<(), StoreError> {
        self.queue.remove((run, step, ready_at, task))?;
        Ok(())
    }

    /// The earliest queued task of `step`: (ready at, task).
    pub fn queue_head(&self, run: u128, step: u32) -> Result<Option<(u64, u128)>, StoreError> {
        let mut range = self
            .queue
            .range((run, step, 0, 0)..=(run, step, u64::MAX, u128::MAX))?;
        match range.next() {
            Some(entry) => {
                let (key, _) = entry?;
                let (_, _, ready_at, task) = key.value();
                Ok(Some((ready_at, task)))
            }
            None => Ok(None),
        }
    }

    pub fn mark_in_flight(&mut self, run: u128, code: u8, task: u128) -> Result<(), StoreError> {
        self.in_flight.insert((run, code, task), ())?;
        Ok(())
    }

    pub fn clear_in_flight(&mut self, run: u128, code: u8, task: u128) -> Result<(), StoreError> {
        self.in_flight.remove((run, code, task))?;
        Ok(())
    }

    /// Appends a transition; the caller writes `run` back (its sequence counter moved).
    pub fn transition(
        &mut self,
        run_id: u128,
        run: &mut RunV2,
        record: TransitionV2,
    ) -> Result<u64, StoreError> {
        let seq = run.next_transition;
        run.next_transition += 1;
        let task = record.task;
        let bytes = encode::<TransitionRecord>(record)?;
        self.transitions.insert((run_id, seq), bytes.as_slice())?;
        self.task_transitions.insert((run_id, task, seq), ())?;
        Ok(seq)
    }

    pub fn hook_log(
        &mut self,
        run: u128,
        task: u128,
        seq: u64,
        record: HookLogV2,
    ) -> Result<(), StoreError> {
        let bytes = encode::<HookLogRecord>(record)?;
        self.hook_logs.insert((run, task, seq), bytes.as_slice())?;
        Ok(())
    }

    /// In-flight entries of a run: (phase code, task).
    pub fn in_flight(&self, run: u128) -> Result<Vec<(u8, u128)>, StoreError> {
        let mut out = Vec::new();
        for entry in self
            .in_flight
            .range((run, 0, 0)..=(run, u8::MAX, u128::MAX))?
        {
            let (key, _) = entry?;
            let (_, code, task) = key.value();
            out.push((code, task));
        }
        Ok(out)
    }
}

/// A read snapshot.
pub struct Reader {
    txn: ReadTransaction,
}

impl Reader {
    pub(super) fn new(txn: ReadTransaction) -> Result<Self, StoreError> {
        Ok(Self { txn })
    }

    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        def: redb::TableDefinition<K, V>,
    ) -> Result<ReadOnlyTable<K, V>, StoreError> {
        Ok(self.txn.open_table(def)?)
    }

    /// Every run, newest first, without touching task records.
    pub fn runs(&self) -> Result<Vec<(u128, RunV2)>, StoreError> {
        let table = self.table(RUNS)?;
        let mut out = Vec::new();
        for entry in table.iter()?.rev() {
            let (key, value) = entry?;
            out.push((key.value(), decode::<RunRecord>(value.value())?));
        }
        Ok(out)
    }

    pub fn run(&self, run: u128) -> Result<Option<RunV2>, StoreError> {
        let table = self.table(RUNS)?;
        match table.get(run)? {
            Some(bytes) => Ok(Some(decode::<RunRecord>(bytes.value())?)),
            None => Ok(None),
        }
    }

    pub fn task(&self, run: u128, task: u128) -> Result<Option<TaskV1>, StoreError> {
        let table = self.table(TASKS)?;
        match table.get((run, task))? {
            Some(bytes) => Ok(Some(decode::<TaskRecord>(bytes.value())?)),
            None => Ok(None),
        }
    }

    pub fn open_children(&self, run: u128, task: u128) -> Result<u64, StoreError> {
        let table = self.table(OPEN_CHILDREN)?;
        Ok(table.get((run, task))?.map_or(0, |v| v.value()))
    }

    /// Visits every task of a run in creation order.
    pub fn for_each_task(
        &self,
        run: u128,
        mut visit: impl FnMut(u128, TaskV1),
    ) -> Result<(), StoreError> {
        let table = self.table(TASKS)?;
        for entry in table.range((run, 0)..=(run, u128::MAX))? {
            let (key, value) = entry?;
            visit(key.value().1, decode::<TaskRecord>(value.value())?);
        }
        Ok(())
    }

    /// Visits every transition of a run in order.
    pub fn for_each_transition(
        &self,
        run: u128,
        mut visit: impl FnMut(u64, TransitionV2),
    ) -> Result<(), StoreError> {
        let table = self.table(TRANSITIONS)?;
        for entry in table.range((run, 0)..=(run, u64::MAX))? {
            let (key, value) = entry?;
            visit(key.value().1, decode::<TransitionRecord>(value.value())?);
        }
        Ok(())
    }

    /// A task's transitions in order, with their sequence numbers.
    pub fn task_transitions(
        &self,
        run: u128,
        task: u128,
    ) -> Result<Vec<(u64, TransitionV2)>, StoreError> {
        let index = self.table(TASK_TRANSITIONS)?;
        let transitions = self.table(TRANSITIONS)?;
        let mut out = Vec::new();
        for entry in index.range((run, task, 0)..=(run, task, u64::MAX))? {
            let (key, _) = entry?;
            let seq = key.value().2;
            if let Some(bytes) = transitions.get((run, seq))? {
                out.push((seq, decode::<TransitionRecord>(bytes.value())?));
            }
        }
        Ok(out)
    }

    pub fn hook_logs(&self, run: u128, task: u128) -> Result<Vec<(u64, HookLogV2)>, StoreError> {
        let table = self.table(HOOK_LOGS)?;
        let mut out = Vec::new();
        for entry in table.range((run, task, 0)..=(run, task, u64::MAX))? {
            let (key, value) = entry?;
            out.push((key.value().2, decode::<HookLogRecord>(value.value())?));
        }
        Ok(out)
    }
}
