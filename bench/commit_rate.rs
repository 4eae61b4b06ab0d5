//! The disk's raw durable commit rate through redb in drover's mode (MultiWriter, quick
//! repair), so the benchmark table can say what limits it. `bash bench/run.sh commit`.

use std::time::Instant;

use redb::{ConcurrencyMode, Database, TableDefinition};

const TABLE: TableDefinition<u64, &[u8]> = TableDefinition::new("bench");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: commit_rate FILE")?;
    let db = Database::builder()
        .set_concurrency_mode(ConcurrencyMode::MultiWriter)
        .create(&path)?;
    let record = vec![7u8; 500];
    let mut key = 0u64;
    for per_commit in [1u64, 100] {
        let commits = if per_commit == 1 { 500 } else { 50 };
        let start = Instant::now();
        for _ in 0..commits {
            let mut txn = db.begin_write()?;
            txn.set_quick_repair(true);
            {
                let mut table = txn.open_table(TABLE)?;
                for _ in 0..per_commit {
                    table.insert(key, record.as_slice())?;
                    key += 1;
                }
            }
            txn.commit()?;
        }
        let seconds = start.elapsed().as_secs_f64();
        println!(
            "| redb durable commits, {per_commit} x 500-byte record(s) each | {} | {seconds:.2} | {:.0} records/s | - | {:.0} commits/s",
            commits * per_commit,
            (commits * per_commit) as f64 / seconds,
            commits as f64 / seconds
        );
    }
    std::fs::remove_file(&path)?;
    Ok(())
}
