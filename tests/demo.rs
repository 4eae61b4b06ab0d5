//! `drover demo` runs the whole product in one process: an embedded pool, scripted agents, a
//! workflow with fan-out, hooks, a retry and a finally hook.

use assert_cmd::Command;

#[test]
fn demo_completes_every_task_prints_the_summary_and_tree_and_cleans_up() {
    let before = demo_dirs();
    let output = Command::cargo_bin("drover")
        .unwrap()
        .arg("demo")
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("17 total: 17 completed, 0 failed, 0 pending"),
        "{stdout}"
    );
    // Per step: 1 Plan, 6 Analyze, 5 Fix, 5 Verify, all completed.
    for (step, count) in [("Plan", 1), ("Analyze", 6), ("Fix", 5), ("Verify", 5)] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("│ {step} ")))
            .unwrap_or_else(|| panic!("no row for {step}:\n{stdout}"));
        let cells: Vec<&str> = row
            .split(['│', '┆'])
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            cells,
            vec![step, "0", "0", &count.to_string(), "0", &count.to_string()],
            "{row}"
        );
    }
    // The garbage first answer was retried, the finally hook ran after everything settled.
    assert!(stdout.contains("completed (attempt 2)"), "{stdout}");
    assert!(
        stdout.contains("Plan ") && stdout.contains("[finally done]"),
        "{stdout}"
    );
    assert!(
        stdout.contains("finally hook summary: 5 fixes verified"),
        "{stdout}"
    );
    let left: Vec<_> = demo_dirs()
        .into_iter()
        .filter(|d| !before.contains(d))
        .collect();
    assert!(left.is_empty(), "demo left {left:?} behind");
}

fn demo_dirs() -> Vec<std::path::PathBuf> {
    std::fs::read_dir(std::env::temp_dir())
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("drover-demo-"))
                })
                .collect()
        })
        .unwrap_or_default()
}
