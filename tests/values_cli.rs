//! Task values pass through drover as they were written: an integer beyond 64 bits or a decimal
//! with more digits than a float holds reaches every hook, action and stored record unrounded,
//! whether it came from `--entrypoint-value`, an answer, a pre hook or a post hook's `next`. (Ids from other systems
//! are often such numbers; rounding one silently points the next step at another object.)

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use assert_cmd::Command;
use drover::store::Store;
use serde_json::json;

const BIG: &str = "1234567890123456789012345";
const LONG: &str = "0.1000000000000000055511151231257827";

fn script(dir: &Path, name: &str, body: &str) {
    let path = dir.join(name);
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn numbers_beyond_a_float_reach_hooks_actions_children_and_the_store_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let flow = dir.path();
    // The answer is pretty-printed, with the numbers and a string holding spaces and quotes.
    script(
        flow,
        "split.sh",
        &format!(
            "cat > split.in\ncat <<'EOF'\n[\n  {{\"kind\": \"Item\",\n   \"value\": {{ \"id\": {BIG}, \"x\": {LONG}, \"s\": \"a \\\"q\\\"  b\" }} }}\n]\nEOF"
        ),
    );
    // The pre hook passes the value on with a field added, keeping the numbers' text.
    script(flow, "pre.sh", "tee pre.in | sed 's/}$/, \"pre\": 1 }/'");
    script(flow, "item.sh", "cat > action.in; echo []");
    // The post hook records its stdin and answers Success with a recovery-style extra child.
    script(
        flow,
        "post.sh",
        &format!(
            "cat > post.in\nprintf '{{\"kind\": \"Success\", \"input\": {{\"id\": {BIG}}}, \"output\": [], \"next\": [{{\"kind\": \"Leaf\", \"value\": {{\"n\": {BIG}}}}}]}}'"
        ),
    );
    script(flow, "leaf.sh", "cat > leaf.in; echo []");
    let config = flow.join("workflow.json");
    fs::write(
        &config,
        json!({
            "entrypoint": "Split",
            "steps": [
                {"name": "Split", "action": {"kind": "Command", "script": "./split.sh"}, "next": ["Item"]},
                {"name": "Item", "pre": "./pre.sh", "post": "./post.sh",
                 "value_schema": {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}},
                 "action": {"kind": "Command", "script": "./item.sh"}, "next": ["Leaf"]},
                {"name": "Leaf", "action": {"kind": "Command", "script": "./leaf.sh"}, "next": []},
            ],
        })
        .to_string(),
    )
    .unwrap();
    let state = flow.join("state");
    Command::cargo_bin("drover")
        .unwrap()
        .env_remove("DROVER_STATE_DIR")
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .arg("--entrypoint-value")
        .arg(format!("{{ \"seed\" : {BIG} }}"))
        .assert()
        .code(0);

    let item = format!(r#"{{"id":{BIG},"x":{LONG},"s":"a \"q\"  b"}}"#);
    let read = |name: &str| fs::read_to_string(flow.join(name)).unwrap();
    assert_eq!(
        read("split.in").trim(),
        format!(r#"{{"kind":"Split","value":{{"seed":{BIG}}}}}"#)
    );
    // Compacted between tokens, never inside the string.
    assert_eq!(read("pre.in").trim(), item);
    assert_eq!(
        read("action.in").trim(),
        format!(r#"{{"kind":"Item","value":{{"id":{BIG},"x":{LONG},"s":"a \"q\"  b","pre":1}}}}"#)
    );
    let post_in = read("post.in");
    assert!(
        post_in.contains(&format!(r#""input":{{"id":{BIG},"x":{LONG}"#)),
        "{post_in}"
    );
    assert_eq!(
        read("leaf.in").trim(),
        format!(r#"{{"kind":"Leaf","value":{{"n":{BIG}}}}}"#)
    );

    let store = Store::open(&state).unwrap();
    let reader = store.read().unwrap();
    let (run_id, run) = reader.runs().unwrap().remove(0);
    assert_eq!(run.entrypoint_value, format!(r#"{{"seed":{BIG}}}"#));
    let mut values = Vec::new();
    reader
        .for_each_task(run_id, |_, task| values.push((task.step, task.value)))
        .unwrap();
    values.sort();
    assert_eq!(
        values,
        [
            ("Item".to_string(), item.clone()),
            ("Leaf".to_string(), format!(r#"{{"n":{BIG}}}"#)),
            ("Split".to_string(), format!(r#"{{"seed":{BIG}}}"#)),
        ]
    );
}
