//! Run progress on stderr: a live bar on a terminal, a plain line every few seconds otherwise
//! (logs and CI output stay readable).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::engine::driver::ProgressSink;
use crate::store::RunV2;

pub struct Progress {
    bar: Option<ProgressBar>,
    last_line: Option<Instant>,
    last_counts: (u64, u64, u64),
}

const PLAIN_INTERVAL: Duration = Duration::from_secs(2);

impl Progress {
    pub fn new() -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(0);
            let style = ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} tasks settled {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Self {
            bar,
            last_line: None,
            last_counts: (0, 0, 0),
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

impl ProgressSink for Progress {
    fn update(&mut self, run: &RunV2, in_flight: usize) {
        let settled = run.tasks_completed + run.tasks_failed;
        if let Some(bar) = &self.bar {
            bar.set_length(run.tasks_total);
            bar.set_position(settled);
            bar.set_message(format!(
                "({} failed, {in_flight} running)",
                run.tasks_failed
            ));
            return;
        }
        let counts = (run.tasks_total, run.tasks_completed, run.tasks_failed);
        let due = self
            .last_line
            .is_none_or(|at| at.elapsed() >= PLAIN_INTERVAL);
        if due && counts != self.last_counts {
            crate::say!(
                "progress: {settled}/{} tasks settled ({} completed, {} failed, {in_flight} running)",
                run.tasks_total,
                run.tasks_completed,
                run.tasks_failed
            );
            self.last_line = Some(Instant::now());
            self.last_counts = counts;
        }
    }
}
