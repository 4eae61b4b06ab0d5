//! Table tests of the lifecycle core: one per row of CONTRACT.md §3 and per retry flag.
//!
//! The step under test is always `Analyze` (schema: object with a string `file`, next
//! `Implement` and `Report`); `Implement` has a schema with a string `file` and an integer
//! `lines`, `Report` and `Orphan` accept anything, and `Orphan` is no step's `next`. Hooks are
//! only declared: the core never runs them, the tests feed their outcomes in.

use std::path::Path;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::answer::NewTask;
use super::config::{Step, Workflow, load_text};
use super::lifecycle::{
    ActionOutcome, Decision, Effect, HookOutcome, action_done, finally_done, post_done, pre_done,
    start,
};
use crate::store::{FinallyState, Phase, TaskV1};

const NOW: u64 = 1_000_000;
/// The task's original value.
const VALUE: &str = r#"{"file":"a.rs"}"#;

const NO_HOOKS: &str = "";
const PRE: &str = r#""pre": "./pre.sh","#;
const POST: &str = r#""post": {"kind": "Command", "script": "./post.sh"},"#;
const PRE_POST: &str = r#""pre": "./pre.sh", "post": "./post.sh","#;

/// `hooks` are extra fields of the `Analyze` step, `options` its options object.
fn workflow(hooks: &str, options: &str) -> Workflow {
    let text = format!(
        r#"{{
  // the step under test is Analyze
  "entrypoint": "Analyze",
  "steps": [
    {{
      "name": "Analyze",
      "value_schema": {{"type": "object", "required": ["file"], "properties": {{"file": {{"type": "string"}}}}}},
      "action": {{"kind": "Command", "script": "./analyze.sh"}},
      "next": ["Implement", "Report"],
      {hooks}
      "options": {options},
    }},
    {{
      "name": "Implement",
      "value_schema": {{
        "type": "object",
        "required": ["file"],
        "properties": {{"file": {{"type": "string"}}, "lines": {{"type": "integer"}}}},
      }},
      "action": {{"kind": "Pool", "instructions": "implement it"}},
      "next": [],
    }},
    {{"name": "Report", "action": {{"kind": "Command", "script": "cat"}}, "next": []}},
    {{"name": "Orphan", "action": {{"kind": "Command", "script": "cat"}}, "next": []}},
  ],
}}"#
    );
    load_text(&text, Path::new("/tmp/x/workflow.jsonc"))
        .unwrap_or_else(|e| panic!("the test workflow is invalid: {e}"))
}

fn analyze(workflow: &Workflow) -> &Step {
    workflow.step("Analyze").expect("Analyze step")
}

fn task() -> TaskV1 {
    task_on("Analyze", VALUE)
}

fn task_on(step: &str, value: &str) -> TaskV1 {
    TaskV1 {
        parent: Some(7),
        step: step.into(),
        value: value.into(),
        attempt: 1,
        phase: Phase::Queued,
        ready_at_ms: 0,
        action_value: None,
        result: None,
        invalid_response: false,
        error: None,
        finally: FinallyState::None,
        created_ms: 0,
        updated_ms: 0,
    }
}

fn new_task(kind: &str, value: Value) -> NewTask {
    NewTask::new(kind, &value)
}

/// The task's stored result, parsed.
fn result_of(task: &TaskV1) -> Value {
    let text = task.result.as_deref().expect("the task has a result");
    serde_json::from_str(text).expect("the stored result is JSON")
}

/// The stdin a decision hands to the post hook, parsed.
fn post_stdin(decision: &Decision) -> Value {
    match &decision.effect {
        Some(Effect::Post { stdin }) => serde_json::from_str(stdin).expect("post stdin is JSON"),
        other => panic!("expected a post hook effect, got {other:?} ({decision:?})"),
    }
}

fn error_text(result: &Value) -> &str {
    result["error"]
        .as_str()
        .unwrap_or_else(|| panic!("result has no string `error`: {result}"))
}

fn assert_contains(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "expected {needle:?} in {text:?}");
    }
}

fn output(text: &str) -> HookOutcome {
    HookOutcome::Output(text.to_string())
}

fn answered(text: &str) -> ActionOutcome {
    ActionOutcome::Answered(text.to_string())
}

/// Starts the task, passes the value through the pre hook if the step has one, and ends the
/// action with `outcome`.
fn through_action(
    task: &mut TaskV1,
    workflow: &Workflow,
    step: &Step,
    outcome: ActionOutcome,
) -> Decision {
    let decision = start(task, step, NOW);
    if step.pre.is_some() {
        assert_eq!(decision.to, Phase::Pre);
        let value = task.value.clone();
        let decision = pre_done(task, workflow, step, HookOutcome::Output(value), NOW);
        assert_eq!(decision.to, Phase::Action);
    } else {
        assert_eq!(decision.to, Phase::Action);
    }
    action_done(task, workflow, step, outcome, NOW)
}

/// Runs the action with a `Success` answer and hands `post` to the post hook.
fn through_post(
    task: &mut TaskV1,
    workflow: &Workflow,
    step: &Step,
    action: ActionOutcome,
    post: HookOutcome,
) -> Decision {
    let decision = through_action(task, workflow, step, action);
    assert_eq!(decision.to, Phase::Post, "{decision:?}");
    post_done(task, workflow, step, post, NOW)
}

/// The error an invalid answer gives the post hook; checks it is an `Error` result flagged as
/// an invalid response.
fn answer_error(answer: &str) -> String {
    let workflow = workflow(POST, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    let decision = through_action(&mut task, &workflow, step, answered(answer));
    assert_eq!((decision.from, decision.to), (Phase::Action, Phase::Post));
    assert!(decision.spawn.is_empty());
    let stdin = post_stdin(&decision);
    assert_eq!(stdin["kind"], "Error", "{stdin}");
    assert_eq!(stdin["input"], json!({"file": "a.rs"}));
    assert!(stdin.get("output").is_none() && stdin.get("next").is_none());
    assert!(task.invalid_response, "an invalid answer must be flagged");
    error_text(&stdin).to_string()
}

const VALID_ANSWER: &str =
    r#"[{"kind": "Implement", "value": {"file": "b.rs", "lines": 3}}, {"kind": "Report"}]"#;

fn valid_answer_next() -> Vec<NewTask> {
    vec![
        new_task("Implement", json!({"file": "b.rs", "lines": 3})),
        new_task("Report", json!({})),
    ]
}

// ---------------------------------------------------------------------------------------------
// start

#[test]
fn start_without_pre_runs_the_action_on_the_original_value() {
    let workflow = workflow(NO_HOOKS, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    let decision = start(&mut task, step, NOW);
    assert_eq!(
        decision,
        Decision {
            from: Phase::Queued,
            to: Phase::Action,
            detail: "attempt 1: action".into(),
            effect: Some(Effect::Action {
                value: VALUE.into()
            }),
            spawn: Vec::new(),
        }
    );
    assert_eq!(task.phase, Phase::Action);
    assert_eq!(task.action_value.as_deref(), Some(VALUE));
    assert_eq!(task.updated_ms, NOW);
}

#[test]
fn start_with_pre_runs_the_pre_hook_on_the_original_value() {
    let workflow = workflow(PRE, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    let decision = start(&mut task, step, NOW);
    assert_eq!((decision.from, decision.to), (Phase::Queued, Phase::Pre));
    assert_eq!(
        decision.effect,
        Some(Effect::Pre {
            stdin: VALUE.into()
        })
    );
    assert!(decision.spawn.is_empty());
    assert_eq!(task.phase, Phase::Pre);
    assert_eq!(task.action_value, None);
}

// ---------------------------------------------------------------------------------------------
// pre rows

#[test]
fn pre_exit_zero_replaces_the_value_the_action_gets_without_revalidation() {
    let workflow = workflow(PRE, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    start(&mut task, step, NOW);
    // Violates Analyze's schema (no `file`): the action still gets it.
    let decision = pre_done(
        &mut task,
        &workflow,
        step,
        output("  {\"path\": 7}\n"),
        NOW + 5,
    );
    assert_eq!(
        decision,
        Decision {
            from: Phase::Pre,
            to: Phase::Action,
            detail: "pre hook done".into(),
            effect: Some(Effect::Action {
                value: r#"{"path":7}"#.into()
            }),
            spawn: Vec::new(),
        }
    );
    assert_eq!(task.phase, Phase::Action);
    assert_eq!(task.action_value.as_deref(), Some(r#"{"path":7}"#));
    assert_eq!(task.value, VALUE, "the task's original value is kept");
    assert_eq!(task.updated_ms, NOW + 5);
    assert_eq!(task.result, None);

    // The action's result reports the value the action got.
    action_done(&mut task, &workflow, step, ActionOutcome::TimedOut, NOW + 6);
    assert_eq!(result_of(&task)["input"], json!({"path": 7}));

    // Any JSON is accepted, scalars included.
    for scalar in ["42", "\"text\"", "null", "[1,2]"] {
        let mut task = self::task();
        start(&mut task, step, NOW);
        let decision = pre_done(&mut task, &workflow, step, output(scalar), NOW);
        assert_eq!(decision.to, Phase::Action, "pre output {scalar}");
        assert_eq!(
            decision.effect,
            Some(Effect::Action {
                value: scalar.into()
            })
        );
    }
}

#[test]
fn pre_failure_skips_action_and_post_gets_pre_hook_error() {
    let workflow = workflow(PRE_POST, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    start(&mut task, step, NOW);
    let decision = pre_done(
        &mut task,
        &workflow,
        step,
        HookOutcome::Failed("exit code 3".into()),
        NOW,
    );
    assert_eq!((decision.from, decision.to), (Phase::Pre, Phase::Post));
    assert!(decision.spawn.is_empty());
    let stdin = post_stdin(&decision);
    assert_eq!(stdin["kind"], "PreHookError");
    assert_eq!(stdin["input"], json!({"file": "a.rs"}));
    assert_contains(error_text(&stdin), &["exit code 3"]);
    assert!(stdin.get("output").is_none() && stdin.get("next").is_none());
    assert_eq!(task.phase, Phase::Post);
    assert_eq!(task.action_value, None, "the action never ran");
    assert_eq!(result_of(&task), stdin);
}

#[test]
fn pre_failure_without_post_settles_as_pre_hook_error() {
    let workflow = workflow(PRE, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    start(&mut task, step, NOW);
    let decision = pre_done(
        &mut task,
        &workflow,
        step,
        HookOutcome::Failed("exit code 3".into()),
        NOW,
    );
    assert_eq!((decision.from, decision.to), (Phase::Pre, Phase::Failed));
    assert_eq!(decision.effect, None);
    assert!(decision.spawn.is_empty());
    assert_eq!(task.phase, Phase::Failed);
    let result = result_of(&task);
    assert_eq!(result["kind"], "PreHookError");
    assert_contains(error_text(&result), &["exit code 3"]);
    assert_contains(
        task.error.as_deref().unwrap(),
        &["PreHookError", "exit code 3"],
    );
}

#[test]
fn pre_timeout_is_a_pre_hook_error() {
    let workflow = workflow(PRE_POST, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    start(&mut task, step, NOW);
    let decision = pre_done(&mut task, &workflow, step, HookOutcome::TimedOut, NOW);
    assert_eq!((decision.from, decision.to), (Phase::Pre, Phase::Post));
    let stdin = post_stdin(&decision);
    assert_eq!(stdin["kind"], "PreHookError");
    assert_eq!(stdin["input"], json!({"file": "a.rs"}));
    assert_contains(error_text(&stdin), &["timed out"]);
}

#[test]
fn pre_output_not_json_is_a_pre_hook_error() {
    let workflow = workflow(PRE_POST, "{}");
    let step = analyze(&workflow);
    for stdout in ["", "   \n", "not json", "{\"a\": 1} trailing", "{\"a\":"] {
        let mut task = task();
        start(&mut task, step, NOW);
        let decision = pre_done(&mut task, &workflow, step, output(stdout), NOW);
        assert_eq!(
            (decision.from, decision.to),
            (Phase::Pre, Phase::Post),
            "pre stdout {stdout:?}"
        );
        let stdin = post_stdin(&decision);
        assert_eq!(stdin["kind"], "PreHookError", "pre stdout {stdout:?}");
        assert_eq!(stdin["input"], json!({"file": "a.rs"}));
        assert_contains(error_text(&stdin), &["not JSON"]);
        assert_eq!(task.action_value, None);
    }
}

// ---------------------------------------------------------------------------------------------
// action rows

#[test]
fn action_valid_answer_gives_post_success_with_output_and_next() {
    let workflow = workflow(POST, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    let decision = through_action(&mut task, &workflow, step, answered(VALID_ANSWER));
    assert_eq!((decision.from, decision.to), (Phase::Action, Phase::Post));
    assert!(
        decision.spawn.is_empty(),
        "nothing is spawned before the post hook has run"
    );
    let answer: Value = serde_json::from_str(VALID_ANSWER).unwrap();
    assert_eq!(
        post_stdin(&decision),
        json!({
            "kind": "Success",
            "input": {"file": "a.rs"},
            "output": answer,
            "next": [
                {"kind": "Implement", "value": {"file": "b.rs", "lines": 3}},
                {"kind": "Report", "value": {}},
            ],
        })
    );
    assert_eq!(task.phase, Phase::Post);
    assert!(!task.invalid_response);
}

#[test]
fn action_success_input_is_the_value_the_pre_hook_gave_the_action() {
    let workflow = workflow(PRE_POST, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    start(&mut task, step, NOW);
    pre_done(
        &mut task,
        &workflow,
        step,
        output(r#"{"file":"pre.rs"}"#),
        NOW,
    );
    let decision = action_done(&mut task, &workflow, step, answered("[]"), NOW);
    let stdin = post_stdin(&decision);
    assert_eq!(stdin["kind"], "Success");
    assert_eq!(stdin["input"], json!({"file": "pre.rs"}));
    assert_eq!(stdin["output"], json!([]));
    assert_eq!(stdin["next"], json!([]));
}

#[test]
fn action_timeout_gives_post_timeout() {
    let workflow = workflow(POST, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    let decision = through_action(&mut task, &workflow, step, ActionOutcome::TimedOut);
    assert_eq!((decision.from, decision.to), (Phase::Action, Phase::Post));
    assert!(decision.spawn.is_empty());
    assert_eq!(
        post_stdin(&decision),
        json!({"kind": "Timeout", "input": {"file": "a.rs"}})
    );
    assert!(!task.invalid_response);
}

#[test]
fn action_failure_gives_post_error_with_the_reason() {
    let workflow = workflow(POST, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    let decision = through_action(
        &mut task,
        &workflow,
        step,
        ActionOutcome::Failed("exit code 2: boom".into()),
    );
    assert_eq!((decision.from, decision.to), (Phase::Action, Phase::Post));
    assert_eq!(
        post_stdin(&decision),
        json!({"kind": "Error", "input": {"file": "a.rs"}, "error": "exit code 2: boom"})
    );
    assert!(!task.invalid_response, "a failure is not an invalid answer");
}

#[test]
fn answer_not_json_is_an_error() {
    for answer in ["", "Done!", "[{\"kind\": \"Report\"}"] {
        let error = answer_error(answer);
        assert_contains(&error, &["not JSON"]);
    }
}

#[test]
fn answer_not_an_array_is_an_error() {
    let error = answer_error(r#"{"kind": "Implement", "value": {"file": "b.rs"}}"#);
    assert_contains(&error, &["must be a JSON array", "got an object"]);
    let error = answer_error("null");
    assert_contains(&error, &["must be a JSON array", "got null"]);
    for (answer, named) in [
        (r#""[]""#, "got a string"),
        ("-3", "got a number"),
        ("true", "got a boolean"),
    ] {
        assert_contains(&answer_error(answer), &["must be a JSON array", named]);
    }
}

/// The answer is kept as the agent wrote it (a 20-digit number is not rounded through a
/// float), while each child's value is stored as compact JSON.
#[test]
fn success_keeps_the_answer_text_and_compacts_child_values() {
    let workflow = workflow(POST, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    let answer = "\n [ {\"kind\": \"Report\", \"value\": { \"n\": 1 },\n  \"x\": 1} ]";
    let refused = through_action(&mut task, &workflow, step, answered(answer));
    assert_contains(
        error_text(&post_stdin(&refused)),
        &["task [0]", "unknown field `x`"],
    );

    let mut task = self::task();
    let answer = "\n [ {\"kind\": \"Report\", \"value\": { \"id\": 12345678901234567890123, \"n\": [ 1 ] }} ]\n";
    let decision = through_action(&mut task, &workflow, step, answered(answer));
    let stdin = decision_stdin_text(&decision);
    assert!(
        stdin.contains(
            r#""output":[ {"kind": "Report", "value": { "id": 12345678901234567890123, "n": [ 1 ] }} ]"#
        ),
        "{stdin}"
    );
    let done = post_done(&mut task, &workflow, step, output(&stdin), NOW);
    assert_eq!(done.to, Phase::Completed, "{done:?}");
    assert_eq!(done.spawn.len(), 1);
    let child = done.spawn[0].value.as_str();
    assert!(
        child.ends_with(r#","n":[1]}"#) && !child.contains(' '),
        "{child}"
    );
}

#[test]
fn answer_malformed_task_is_an_error_naming_the_index() {
    let error = answer_error(r#"[{"kind": "Report"}, 5]"#);
    assert_contains(&error, &["task [1]", "must be an object", "got a number"]);
    assert!(!error.contains("task [0]"), "{error}");

    let error = answer_error(r#"[{"kind": "Report", "valu": {}}]"#);
    assert_contains(&error, &["task [0]", "unknown field `valu`"]);

    let error = answer_error(r#"[{"value": {}}]"#);
    assert_contains(&error, &["task [0]", "missing `kind`"]);
}

#[test]
fn answer_unknown_kind_is_an_error_naming_the_index() {
    let error =
        answer_error(r#"[{"kind": "Report"}, {"kind": "Implemnt", "value": {"file": "b.rs"}}]"#);
    assert_contains(
        &error,
        &[
            "task [1]",
            "unknown step `Implemnt`",
            "did you mean `Implement`",
        ],
    );
    assert!(!error.contains("task [0]"), "{error}");
}

#[test]
fn answer_kind_not_in_next_is_an_error() {
    let error = answer_error(r#"[{"kind": "Report"}, {"kind": "Orphan"}]"#);
    assert_contains(
        &error,
        &[
            "task [1]",
            "step `Analyze` may not emit `Orphan`",
            "allowed: Implement, Report",
        ],
    );
    assert!(!error.contains("task [0]"), "{error}");

    // Not even itself.
    let error = answer_error(r#"[{"kind": "Analyze", "value": {"file": "x"}}]"#);
    assert_contains(&error, &["task [0]", "may not emit `Analyze`"]);

    // A terminal step may only answer [].
    let workflow = workflow(NO_HOOKS, "{}");
    let step = workflow.step("Report").unwrap();
    let mut task = task_on("Report", "{}");
    let decision = through_action(
        &mut task,
        &workflow,
        step,
        answered(r#"[{"kind": "Orphan"}]"#),
    );
    assert_eq!(decision.to, Phase::Failed);
    let result = result_of(&task);
    assert_eq!(result["kind"], "Error");
    assert_contains(
        error_text(&result),
        &["task [0]", "terminal step, answer []"],
    );
}

#[test]
fn answer_value_failing_target_schema_is_an_error_naming_the_field() {
    let error = answer_error(
        r#"[{"kind": "Implement", "value": {"file": "b.rs"}},
            {"kind": "Implement", "value": {"file": "c.rs", "lines": "many"}}]"#,
    );
    assert_contains(&error, &["task [1]", "value for `Implement`", "/lines"]);
    assert!(!error.contains("task [0]"), "{error}");

    let error = answer_error(r#"[{"kind": "Implement", "value": {"lines": 1}}]"#);
    assert_contains(&error, &["task [0]", "/file"]);

    // A missing value is `{}`, which lacks the required `file`.
    let error = answer_error(r#"[{"kind": "Implement"}]"#);
    assert_contains(&error, &["task [0]", "/file"]);
}

#[test]
fn answer_with_several_invalid_tasks_names_each() {
    let error = answer_error(
        r#"[{"kind": "Nope"}, {"kind": "Report"}, {"kind": "Orphan"}, {"kind": "Implement", "value": {"file": 1}}]"#,
    );
    assert_contains(&error, &["task [0]", "task [2]", "task [3]"]);
    assert!(!error.contains("task [1]"), "{error}");
}

// ---------------------------------------------------------------------------------------------
// post rows

#[test]
fn post_result_replaces_the_original_and_its_next_is_validated() {
    let workflow = workflow(POST, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    let replacement = json!({
        "kind": "Success",
        "input": {"file": "z.rs"},
        "output": ["replaced"],
        "next": [{"kind": "Report", "value": {"from": "post"}}],
    });
    let decision = through_post(
        &mut task,
        &workflow,
        step,
        answered(VALID_ANSWER),
        output(&replacement.to_string()),
    );
    assert_eq!(
        (decision.from, decision.to),
        (Phase::Post, Phase::Completed)
    );
    assert_eq!(decision.effect, None);
    assert_eq!(
        decision.spawn,
        vec![new_task("Report", json!({"from": "post"}))],
        "the post hook's next replaces the answer's"
    );
    assert_eq!(result_of(&task), replacement);
    assert_eq!(task.phase, Phase::Completed);
    assert_eq!(task.error, None);

    // A Success without `next` spawns nothing (not the answer's next).
    let mut task = self::task();
    let decision = through_post(
        &mut task,
        &workflow,
        step,
        answered(VALID_ANSWER),
        output(r#"{"kind": "Success"}"#),
    );
    assert_eq!(decision.to, Phase::Completed);
    assert!(decision.spawn.is_empty(), "{decision:?}");
    assert_eq!(result_of(&task)["next"], json!([]));
}

#[test]
fn post_invalid_next_restarts_the_task_when_retries_allow() {
    let workflow = workflow(POST, r#"{"max_retries": 1}"#);
    let step = analyze(&workflow);
    let mut task = task();
    let decision = through_post(
        &mut task,
        &workflow,
        step,
        answered(VALID_ANSWER),
        output(
            r#"{"kind": "Success", "output": [], "next": [{"kind": "Report"}, {"kind": "Implement", "value": {"file": "b.rs", "lines": 1.5}}]}"#,
        ),
    );
    assert_eq!((decision.from, decision.to), (Phase::Post, Phase::Queued));
    assert_eq!(decision.effect, None);
    assert!(decision.spawn.is_empty());
    assert_eq!(task.phase, Phase::Queued);
    assert_eq!(task.attempt, 2);
    assert_eq!(task.result, None);
    assert_contains(
        task.error.as_deref().unwrap(),
        &["`next` is invalid", "task [1]", "/lines"],
    );
    assert_contains(&decision.detail, &["task [1]", "retry as attempt 2"]);

    // A recovery `next` on a failure result is validated too.
    let mut task = self::task();
    let decision = through_post(
        &mut task,
        &workflow,
        step,
        ActionOutcome::Failed("exit code 1".into()),
        output(r#"{"kind": "Error", "error": "x", "next": [{"kind": "Orphan"}]}"#),
    );
    assert_eq!(decision.to, Phase::Queued);
    assert_contains(
        task.error.as_deref().unwrap(),
        &["`next` is invalid", "task [0]", "may not emit `Orphan`"],
    );
}

#[test]
fn post_invalid_next_without_retries_fails_the_task() {
    let workflow = workflow(POST, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    let decision = through_post(
        &mut task,
        &workflow,
        step,
        answered(VALID_ANSWER),
        output(r#"{"kind": "Success", "next": [{"kind": "Orphan"}]}"#),
    );
    assert_eq!((decision.from, decision.to), (Phase::Post, Phase::Failed));
    assert!(decision.spawn.is_empty(), "neither list is spawned");
    assert_eq!(task.phase, Phase::Failed);
    assert_eq!(task.attempt, 1);
    assert_contains(
        task.error.as_deref().unwrap(),
        &["task [0]", "may not emit `Orphan`"],
    );
}

#[test]
fn post_result_without_a_known_kind_is_a_post_hook_failure() {
    let workflow = workflow(POST, r#"{"max_retries": 1}"#);
    let step = analyze(&workflow);
    for (stdout, expected) in [
        (r#"{"input": 1}"#, "no `kind`"),
        (r#"{"kind": "Sucess"}"#, "unknown kind `Sucess`"),
        (r#"[{"kind": "Report"}]"#, "must be a result object"),
        (r#"{"kind": "Error", "error": 5}"#, "malformed"),
    ] {
        let mut task = task();
        let decision = through_post(
            &mut task,
            &workflow,
            step,
            answered(VALID_ANSWER),
            output(stdout),
        );
        assert_eq!(decision.to, Phase::Queued, "post stdout {stdout}");
        assert!(decision.spawn.is_empty());
        assert_contains(task.error.as_deref().unwrap(), &[expected]);
    }
}

#[test]
fn post_failure_restarts_whole_task_from_pre() {
    let workflow = workflow(PRE_POST, r#"{"max_retries": 3}"#);
    let step = analyze(&workflow);
    for (outcome, expected) in [
        (
            HookOutcome::Failed("exit code 1".into()),
            "post hook failed: exit code 1",
        ),
        (HookOutcome::TimedOut, "post hook timed out"),
        (output("garbage"), "not JSON"),
        (output(""), "not JSON"),
    ] {
        let mut task = task();
        start(&mut task, step, NOW);
        pre_done(
            &mut task,
            &workflow,
            step,
            output(r#"{"file":"pre.rs"}"#),
            NOW,
        );
        let decision = action_done(&mut task, &workflow, step, answered(VALID_ANSWER), NOW);
        assert_eq!(decision.to, Phase::Post);
        let decision = post_done(&mut task, &workflow, step, outcome.clone(), NOW + 1);
        assert_eq!(
            (decision.from, decision.to),
            (Phase::Post, Phase::Queued),
            "{outcome:?}"
        );
        assert_eq!(decision.effect, None);
        assert!(
            decision.spawn.is_empty(),
            "the answer's next is not spawned"
        );
        assert_eq!(task.attempt, 2);
        assert_eq!(task.phase, Phase::Queued);
        assert_eq!(task.ready_at_ms, NOW + 1);
        assert_eq!(task.action_value, None);
        assert_eq!(task.result, None);
        assert_contains(task.error.as_deref().unwrap(), &[expected]);

        // The new attempt begins with the pre hook, on the original value.
        let decision = start(&mut task, step, NOW + 2);
        assert_eq!((decision.from, decision.to), (Phase::Queued, Phase::Pre));
        assert_eq!(
            decision.effect,
            Some(Effect::Pre {
                stdin: VALUE.into()
            })
        );
        assert_contains(&decision.detail, &["attempt 2"]);
    }
}

#[test]
fn post_failure_without_retries_fails_the_task() {
    let workflow = workflow(POST, "{}");
    let step = analyze(&workflow);
    for outcome in [
        HookOutcome::Failed("exit code 1".into()),
        HookOutcome::TimedOut,
        output("{"),
    ] {
        let mut task = task();
        let decision = through_post(
            &mut task,
            &workflow,
            step,
            answered(VALID_ANSWER),
            outcome.clone(),
        );
        assert_eq!(
            (decision.from, decision.to),
            (Phase::Post, Phase::Failed),
            "{outcome:?}"
        );
        assert_eq!(decision.effect, None);
        assert!(
            decision.spawn.is_empty(),
            "a failed post hook spawns nothing, not even the answer's next"
        );
        assert_eq!(task.phase, Phase::Failed);
        assert_eq!(task.attempt, 1);
        assert!(task.error.is_some());
        assert_eq!(decision.detail, task.error.clone().unwrap());
    }
}

#[test]
fn no_post_uses_result_as_is() {
    let workflow = workflow(NO_HOOKS, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    let decision = through_action(&mut task, &workflow, step, answered(VALID_ANSWER));
    assert_eq!(
        (decision.from, decision.to),
        (Phase::Action, Phase::Completed)
    );
    assert_eq!(decision.effect, None);
    assert_eq!(decision.spawn, valid_answer_next());
    let answer: Value = serde_json::from_str(VALID_ANSWER).unwrap();
    assert_eq!(
        result_of(&task),
        json!({
            "kind": "Success",
            "input": {"file": "a.rs"},
            "output": answer,
            "next": [
                {"kind": "Implement", "value": {"file": "b.rs", "lines": 3}},
                {"kind": "Report", "value": {}},
            ],
        })
    );

    let mut task = self::task();
    let decision = through_action(
        &mut task,
        &workflow,
        step,
        ActionOutcome::Failed("exit code 4".into()),
    );
    assert_eq!((decision.from, decision.to), (Phase::Action, Phase::Failed));
    assert_eq!(
        result_of(&task),
        json!({"kind": "Error", "input": {"file": "a.rs"}, "error": "exit code 4"})
    );
    assert_eq!(task.error.as_deref(), Some("Error: exit code 4"));
}

// ---------------------------------------------------------------------------------------------
// after the final result

#[test]
fn success_spawns_next_as_children_and_completes() {
    let workflow = workflow(POST, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    task.error = Some("left from an earlier attempt".into());
    task.attempt = 2;
    let decision = through_action(&mut task, &workflow, step, answered(VALID_ANSWER));
    let stdin = decision_stdin_text(&decision);
    // The post hook passes the result through unchanged.
    let decision = post_done(&mut task, &workflow, step, output(&stdin), NOW);
    assert_eq!(
        decision,
        Decision {
            from: Phase::Post,
            to: Phase::Completed,
            detail: "Success, 2 next task(s)".into(),
            effect: None,
            spawn: valid_answer_next(),
        }
    );
    assert_eq!(task.phase, Phase::Completed);
    assert_eq!(task.error, None);
    assert_eq!(task.attempt, 2);

    // An empty answer completes with nothing to spawn.
    let workflow = self::workflow(NO_HOOKS, "{}");
    let step = analyze(&workflow);
    let mut task = self::task();
    let decision = through_action(&mut task, &workflow, step, answered(" [] \n"));
    assert_eq!(decision.to, Phase::Completed);
    assert!(decision.spawn.is_empty());
}

fn decision_stdin_text(decision: &Decision) -> String {
    match &decision.effect {
        Some(Effect::Post { stdin }) => stdin.clone(),
        other => panic!("expected a post hook effect, got {other:?}"),
    }
}

#[test]
fn timeout_is_retried_unless_retry_on_timeout_is_false() {
    for hooks in [NO_HOOKS, POST] {
        for (flag, retried) in [("true", true), ("false", false)] {
            let workflow = workflow(
                hooks,
                &format!(r#"{{"max_retries": 2, "retry_on_timeout": {flag}}}"#),
            );
            let step = analyze(&workflow);
            let mut task = task();
            let mut decision = through_action(&mut task, &workflow, step, ActionOutcome::TimedOut);
            if step.post.is_some() {
                let stdin = decision_stdin_text(&decision);
                decision = post_done(&mut task, &workflow, step, output(&stdin), NOW);
            }
            let expected = if retried {
                (Phase::Queued, 2)
            } else {
                (Phase::Failed, 1)
            };
            assert_eq!(
                (decision.to, task.attempt),
                expected,
                "hooks {hooks:?}, retry_on_timeout {flag}"
            );
            assert_eq!(task.phase, expected.0);
            assert_contains(task.error.as_deref().unwrap(), &["Timeout"]);
            if !retried {
                assert_eq!(result_of(&task)["kind"], "Timeout");
            }
        }
    }
}

#[test]
fn invalid_response_is_retried_unless_retry_on_invalid_response_is_false() {
    for hooks in [NO_HOOKS, POST] {
        for answer in ["not json", "{}", r#"[{"kind": "Orphan"}]"#] {
            for (flag, retried) in [("true", true), ("false", false)] {
                let workflow = workflow(
                    hooks,
                    &format!(r#"{{"max_retries": 2, "retry_on_invalid_response": {flag}}}"#),
                );
                let step = analyze(&workflow);
                let mut task = task();
                let mut decision = through_action(&mut task, &workflow, step, answered(answer));
                if step.post.is_some() {
                    let stdin = decision_stdin_text(&decision);
                    decision = post_done(&mut task, &workflow, step, output(&stdin), NOW);
                }
                let expected = if retried {
                    (Phase::Queued, 2)
                } else {
                    (Phase::Failed, 1)
                };
                assert_eq!(
                    (decision.to, task.attempt),
                    expected,
                    "hooks {hooks:?}, answer {answer}, retry_on_invalid_response {flag}"
                );
                assert_contains(task.error.as_deref().unwrap(), &["Error", "answer"]);
            }
        }
    }
}

#[test]
fn command_failure_is_retried_even_when_retry_on_invalid_response_is_false() {
    let workflow = workflow(
        NO_HOOKS,
        r#"{"max_retries": 1, "retry_on_invalid_response": false, "retry_on_timeout": false}"#,
    );
    let step = analyze(&workflow);
    let mut task = task();
    let decision = through_action(
        &mut task,
        &workflow,
        step,
        ActionOutcome::Failed("exit code 1".into()),
    );
    assert_eq!((decision.from, decision.to), (Phase::Action, Phase::Queued));
    assert_eq!(task.attempt, 2);
    assert!(!task.invalid_response);
}

#[test]
fn retry_flags_are_independent() {
    // retry_on_invalid_response: false does not stop a timeout from being retried …
    let workflow = self::workflow(
        NO_HOOKS,
        r#"{"max_retries": 1, "retry_on_invalid_response": false}"#,
    );
    let step = analyze(&workflow);
    let mut task = task();
    let decision = through_action(&mut task, &workflow, step, ActionOutcome::TimedOut);
    assert_eq!(decision.to, Phase::Queued);

    // … and retry_on_timeout: false does not stop an invalid answer from being retried.
    let workflow = self::workflow(NO_HOOKS, r#"{"max_retries": 1, "retry_on_timeout": false}"#);
    let step = analyze(&workflow);
    let mut task = self::task();
    let decision = through_action(&mut task, &workflow, step, answered("{}"));
    assert_eq!(decision.to, Phase::Queued);
}

#[test]
fn pre_hook_error_is_retried_regardless_of_retry_flags() {
    let workflow = workflow(
        PRE,
        r#"{"max_retries": 1, "retry_on_invalid_response": false, "retry_on_timeout": false}"#,
    );
    let step = analyze(&workflow);
    for outcome in [
        HookOutcome::TimedOut,
        HookOutcome::Failed("exit code 1".into()),
        output("nope"),
    ] {
        let mut task = task();
        start(&mut task, step, NOW);
        let decision = pre_done(&mut task, &workflow, step, outcome.clone(), NOW);
        assert_eq!(
            (decision.from, decision.to),
            (Phase::Pre, Phase::Queued),
            "{outcome:?}"
        );
        assert_eq!(task.attempt, 2);
        assert_contains(task.error.as_deref().unwrap(), &["PreHookError"]);
    }
}

#[test]
fn post_converting_invalid_answer_error_keeps_retry_on_invalid_response() {
    let workflow = workflow(
        POST,
        r#"{"max_retries": 3, "retry_on_invalid_response": false}"#,
    );
    let step = analyze(&workflow);
    let mut task = task();
    let decision = through_post(
        &mut task,
        &workflow,
        step,
        answered("{}"),
        output(r#"{"kind": "Error", "error": "rewritten by post"}"#),
    );
    assert_eq!(decision.to, Phase::Failed);
    assert_contains(task.error.as_deref().unwrap(), &["rewritten by post"]);

    // Turned into a Timeout, it is governed by retry_on_timeout instead.
    let mut task = self::task();
    let decision = through_post(
        &mut task,
        &workflow,
        step,
        answered("{}"),
        output(r#"{"kind": "Timeout"}"#),
    );
    assert_eq!(decision.to, Phase::Queued);
    assert!(!task.invalid_response);
}

#[test]
fn retries_stop_after_max_retries() {
    let workflow = workflow(NO_HOOKS, r#"{"max_retries": 2}"#);
    let step = analyze(&workflow);
    let mut task = task();
    let mut starts = 0;
    loop {
        starts += 1;
        let before = task.attempt;
        let decision = through_action(
            &mut task,
            &workflow,
            step,
            ActionOutcome::Failed("exit code 1".into()),
        );
        match decision.to {
            Phase::Queued => {
                assert_eq!(task.attempt, before + 1);
                assert_contains(
                    &decision.detail,
                    &[&format!("retry as attempt {}", before + 1)],
                );
            }
            Phase::Failed => {
                assert_eq!(task.attempt, before, "a final failure starts no attempt");
                break;
            }
            other => panic!("unexpected phase {other:?}"),
        }
        assert!(starts < 10, "retries never stopped");
    }
    assert_eq!(starts, 3, "max_retries 2 is three attempts in all");
    assert_eq!(task.attempt, 3);
    assert_eq!(task.phase, Phase::Failed);
    assert_eq!(result_of(&task)["kind"], "Error");
}

#[test]
fn max_retries_zero_means_a_single_attempt() {
    let workflow = workflow(NO_HOOKS, "{}");
    let step = analyze(&workflow);
    let mut task = task();
    let decision = through_action(&mut task, &workflow, step, ActionOutcome::TimedOut);
    assert_eq!(decision.to, Phase::Failed);
    assert_eq!(task.attempt, 1);
}

#[test]
fn retry_delay_sets_ready_at_with_backoff() {
    let workflow = workflow(
        NO_HOOKS,
        r#"{"max_retries": 5, "retry_delay": {"initial": 1, "multiplier": 2, "max": 5}}"#,
    );
    let step = analyze(&workflow);
    let mut task = task();
    let mut delays = Vec::new();
    for i in 0..5u64 {
        let now = NOW + i * 100_000;
        start(&mut task, step, now);
        let decision = action_done(
            &mut task,
            &workflow,
            step,
            ActionOutcome::Failed("boom".into()),
            now,
        );
        assert_eq!(decision.to, Phase::Queued);
        delays.push(task.ready_at_ms - now);
        if i == 0 {
            assert_contains(&decision.detail, &["retry as attempt 2 in 1.0s"]);
        }
    }
    assert_eq!(delays, vec![1000, 2000, 4000, 5000, 5000]);
    assert_eq!(task.attempt, 6);
}

#[test]
fn fixed_retry_delay_is_the_same_before_every_retry() {
    let workflow = workflow(NO_HOOKS, r#"{"max_retries": 3, "retry_delay": 0.25}"#);
    let step = analyze(&workflow);
    let mut task = task();
    for _ in 0..3 {
        let decision = through_action(&mut task, &workflow, step, ActionOutcome::TimedOut);
        assert_eq!(decision.to, Phase::Queued);
        assert_eq!(task.ready_at_ms, NOW + 250);
    }
}

#[test]
fn no_retry_delay_makes_the_retry_ready_at_once() {
    let workflow = workflow(NO_HOOKS, r#"{"max_retries": 1}"#);
    let step = analyze(&workflow);
    let mut task = task();
    let decision = through_action(&mut task, &workflow, step, ActionOutcome::TimedOut);
    assert_eq!(decision.to, Phase::Queued);
    assert_eq!(task.ready_at_ms, NOW);
    assert!(!decision.detail.contains(" in "), "{}", decision.detail);
}

#[test]
fn post_failure_restart_waits_the_retry_delay() {
    let workflow = workflow(POST, r#"{"max_retries": 1, "retry_delay": 2}"#);
    let step = analyze(&workflow);
    let mut task = task();
    let decision = through_post(
        &mut task,
        &workflow,
        step,
        answered("[]"),
        HookOutcome::TimedOut,
    );
    assert_eq!(decision.to, Phase::Queued);
    assert_eq!(task.ready_at_ms, NOW + 2000);
}

#[test]
fn failed_task_still_spawns_recovery_next_from_post_hook() {
    let workflow = workflow(POST, "{}");
    let step = analyze(&workflow);
    for kind in ["Error", "Timeout", "PreHookError"] {
        let mut task = task();
        let post = json!({
            "kind": kind,
            "input": {"file": "a.rs"},
            "error": "gave up",
            "next": [{"kind": "Report", "value": {"why": "gave up"}}],
        });
        let decision = through_post(
            &mut task,
            &workflow,
            step,
            ActionOutcome::Failed("exit code 1".into()),
            output(&post.to_string()),
        );
        assert_eq!(
            (decision.from, decision.to),
            (Phase::Post, Phase::Failed),
            "{kind}"
        );
        assert_eq!(
            decision.spawn,
            vec![new_task("Report", json!({"why": "gave up"}))],
            "{kind}"
        );
        assert_contains(&decision.detail, &[kind, "1 recovery task(s)"]);
        assert_eq!(task.phase, Phase::Failed);
        let result = result_of(&task);
        assert_eq!(result["kind"], kind);
        assert_eq!(
            result["next"],
            json!([{"kind": "Report", "value": {"why": "gave up"}}])
        );
    }
}

#[test]
fn recovery_next_is_not_spawned_while_the_task_is_retried() {
    let workflow = workflow(POST, r#"{"max_retries": 1}"#);
    let step = analyze(&workflow);
    let mut task = task();
    let decision = through_post(
        &mut task,
        &workflow,
        step,
        ActionOutcome::Failed("exit code 1".into()),
        output(r#"{"kind": "Error", "error": "gave up", "next": [{"kind": "Report"}]}"#),
    );
    assert_eq!(decision.to, Phase::Queued);
    assert!(decision.spawn.is_empty());
}

#[test]
fn post_converting_error_to_success_completes_the_task() {
    let workflow = workflow(POST, r#"{"max_retries": 3}"#);
    let step = analyze(&workflow);
    for action in [
        ActionOutcome::Failed("exit code 1".into()),
        ActionOutcome::TimedOut,
        answered("not an answer"),
    ] {
        let mut task = task();
        let decision = through_post(
            &mut task,
            &workflow,
            step,
            action.clone(),
            output(
                r#"{"kind": "Success", "output": "fixed", "next": [{"kind": "Implement", "value": {"file": "b.rs"}}]}"#,
            ),
        );
        assert_eq!(
            (decision.from, decision.to),
            (Phase::Post, Phase::Completed),
            "{action:?}"
        );
        assert_eq!(
            decision.spawn,
            vec![new_task("Implement", json!({"file": "b.rs"}))]
        );
        assert_eq!(task.phase, Phase::Completed);
        assert_eq!(task.attempt, 1);
        assert_eq!(task.error, None);
        assert!(!task.invalid_response);
        let result = result_of(&task);
        assert_eq!(result["kind"], "Success");
        assert_eq!(result["output"], "fixed");
    }
}

#[test]
fn post_converting_success_to_error_retries_or_fails_without_spawning() {
    for (options, to) in [
        (r#"{"max_retries": 1}"#, Phase::Queued),
        ("{}", Phase::Failed),
    ] {
        let workflow = workflow(POST, options);
        let step = analyze(&workflow);
        let mut task = task();
        let decision = through_post(
            &mut task,
            &workflow,
            step,
            answered(VALID_ANSWER),
            output(r#"{"kind": "Error", "error": "rejected by review"}"#),
        );
        assert_eq!((decision.from, decision.to), (Phase::Post, to), "{options}");
        assert!(decision.spawn.is_empty(), "the answer's next is dropped");
        assert_contains(
            task.error.as_deref().unwrap(),
            &["Error: rejected by review"],
        );
    }
}

// ---------------------------------------------------------------------------------------------
// finally

#[test]
fn finally_output_array_spawns_tasks() {
    let workflow = workflow(r#""finally": "./finally.sh","#, "{}");
    // Any step may be targeted, not only the step's `next`.
    let spawned = finally_done(
        &workflow,
        output(
            " [{\"kind\": \"Report\", \"value\": {\"n\": 1}}, {\"kind\": \"Orphan\"}, \
             {\"kind\": \"Analyze\", \"value\": {\"file\": \"again.rs\"}}]\n",
        ),
    );
    assert_eq!(
        spawned,
        Ok(vec![
            new_task("Report", json!({"n": 1})),
            new_task("Orphan", json!({})),
            new_task("Analyze", json!({"file": "again.rs"})),
        ])
    );
    assert_eq!(finally_done(&workflow, output("[]")), Ok(Vec::new()));
}

#[test]
fn finally_garbage_or_unknown_step_or_bad_value_is_an_error_never_empty() {
    let workflow = workflow(r#""finally": "./finally.sh","#, "{}");
    let cases: Vec<(HookOutcome, Vec<&str>)> = vec![
        (output(""), vec!["not JSON"]),
        (output("done"), vec!["not JSON"]),
        (output("[{\"kind\": \"Report\"}] extra"), vec!["not JSON"]),
        (output("{}"), vec!["invalid", "array", "got an object"]),
        (output("null"), vec!["invalid", "array", "got null"]),
        (
            output(r#"[{"kind": "Report"}, {"kind": "Nope"}]"#),
            vec!["invalid", "task [1]", "unknown step `Nope`"],
        ),
        (
            output(r#"[{"kind": "Report"}, {"kind": "Implement", "value": {"file": 3}}]"#),
            vec!["invalid", "task [1]", "/file"],
        ),
        (
            output(r#"[{"kind": "Report"}, 7]"#),
            vec!["invalid", "task [1]", "must be an object"],
        ),
        (
            HookOutcome::Failed("exit code 9".into()),
            vec!["finally hook failed", "exit code 9"],
        ),
        (HookOutcome::TimedOut, vec!["finally hook timed out"]),
    ];
    for (outcome, expected) in cases {
        match finally_done(&workflow, outcome.clone()) {
            Ok(tasks) => panic!("{outcome:?} must be an error, got Ok({tasks:?})"),
            Err(reason) => assert_contains(&reason, &expected),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// attempts

#[test]
fn attempt_number_increments_and_state_is_reset_on_retry() {
    let workflow = workflow(PRE, r#"{"max_retries": 1}"#);
    let step = analyze(&workflow);
    let mut task = task();
    let decision = start(&mut task, step, NOW);
    assert_eq!(decision.detail, "attempt 1: pre hook");
    pre_done(
        &mut task,
        &workflow,
        step,
        output(r#"{"file":"pre.rs"}"#),
        NOW,
    );
    assert_eq!(task.action_value.as_deref(), Some(r#"{"file":"pre.rs"}"#));
    let decision = action_done(
        &mut task,
        &workflow,
        step,
        answered(r#"[{"kind": "Orphan"}]"#),
        NOW + 1,
    );
    assert_eq!((decision.from, decision.to), (Phase::Action, Phase::Queued));
    assert_eq!(task.attempt, 2);
    assert_eq!(task.phase, Phase::Queued);
    assert_eq!(task.ready_at_ms, NOW + 1);
    assert_eq!(task.action_value, None);
    assert_eq!(task.result, None);
    assert_contains(task.error.as_deref().unwrap(), &["Orphan"]);
    assert_eq!(task.value, VALUE);

    let decision = start(&mut task, step, NOW + 2);
    assert_eq!(
        decision,
        Decision {
            from: Phase::Queued,
            to: Phase::Pre,
            detail: "attempt 2: pre hook".into(),
            effect: Some(Effect::Pre {
                stdin: VALUE.into()
            }),
            spawn: Vec::new(),
        }
    );
    assert_eq!(task.attempt, 2);
    assert!(!task.invalid_response, "start resets the invalid flag");
    assert_eq!(task.result, None);
    assert_eq!(task.action_value, None);
    assert_eq!(task.updated_ms, NOW + 2);

    // Without a pre hook the new attempt's action gets the original value again.
    let workflow = self::workflow(NO_HOOKS, r#"{"max_retries": 1}"#);
    let step = analyze(&workflow);
    let mut task = self::task();
    through_action(&mut task, &workflow, step, ActionOutcome::TimedOut);
    assert_eq!(task.attempt, 2);
    let decision = start(&mut task, step, NOW);
    assert_eq!(
        decision.effect,
        Some(Effect::Action {
            value: VALUE.into()
        })
    );
    assert_eq!(decision.detail, "attempt 2: action");
}

// ---------------------------------------------------------------------------------------------
// properties

/// One way an attempt can go wrong.
#[derive(Debug, Clone, Copy)]
enum Failure {
    PreFailed,
    PreTimedOut,
    PreGarbage,
    ActionFailed,
    ActionTimedOut,
    ActionInvalid,
    PostFailed,
    PostTimedOut,
    PostGarbage,
}

fn failure() -> impl Strategy<Value = Failure> {
    prop_oneof![
        Just(Failure::PreFailed),
        Just(Failure::PreTimedOut),
        Just(Failure::PreGarbage),
        Just(Failure::ActionFailed),
        Just(Failure::ActionTimedOut),
        Just(Failure::ActionInvalid),
        Just(Failure::PostFailed),
        Just(Failure::PostTimedOut),
        Just(Failure::PostGarbage),
    ]
}

/// Runs one attempt (pre, action, post; the post hook passes failures through) that fails
/// with `failure`, and returns the concluding decision.
fn failing_attempt(
    task: &mut TaskV1,
    workflow: &Workflow,
    step: &Step,
    failure: Failure,
    now: u64,
) -> Decision {
    let decision = start(task, step, now);
    assert_eq!(decision.to, Phase::Pre);
    let pre = match failure {
        Failure::PreFailed => HookOutcome::Failed("exit code 1".into()),
        Failure::PreTimedOut => HookOutcome::TimedOut,
        Failure::PreGarbage => output("garbage"),
        _ => output(&task.value.clone()),
    };
    let mut decision = pre_done(task, workflow, step, pre, now);
    if decision.to == Phase::Action {
        let action = match failure {
            Failure::ActionFailed => ActionOutcome::Failed("exit code 1".into()),
            Failure::ActionTimedOut => ActionOutcome::TimedOut,
            Failure::ActionInvalid => answered(r#"[{"kind": "Orphan"}]"#),
            _ => answered(VALID_ANSWER),
        };
        decision = action_done(task, workflow, step, action, now);
    }
    assert_eq!(decision.to, Phase::Post);
    let post = match failure {
        Failure::PostFailed => HookOutcome::Failed("exit code 1".into()),
        Failure::PostTimedOut => HookOutcome::TimedOut,
        Failure::PostGarbage => output("garbage"),
        _ => output(&decision_stdin_text(&decision)),
    };
    post_done(task, workflow, step, post, now)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn any_failure_sequence_respects_max_retries_and_the_flags(
        max_retries in 0u32..5,
        retry_on_timeout in any::<bool>(),
        retry_on_invalid_response in any::<bool>(),
        failures in prop::collection::vec(failure(), 1..8),
    ) {
        let workflow = workflow(
            PRE_POST,
            &format!(
                r#"{{"max_retries": {max_retries}, "retry_on_timeout": {retry_on_timeout},
                    "retry_on_invalid_response": {retry_on_invalid_response}}}"#
            ),
        );
        let step = analyze(&workflow);
        let mut task = task();
        let mut starts = 0u32;
        for (i, &failure) in failures.iter().cycle().enumerate() {
            prop_assert!(i < 20, "retries never stopped");
            starts += 1;
            let attempt = task.attempt;
            prop_assert_eq!(attempt, starts);
            prop_assert!(attempt <= max_retries + 1);
            let now = NOW + i as u64;
            let decision = failing_attempt(&mut task, &workflow, step, failure, now);
            prop_assert!(decision.spawn.is_empty(), "a failure without recovery spawns nothing");
            prop_assert_eq!(decision.effect, None);
            let allowed = match failure {
                Failure::ActionTimedOut => retry_on_timeout,
                Failure::ActionInvalid => retry_on_invalid_response,
                _ => true,
            };
            if allowed && attempt <= max_retries {
                prop_assert_eq!(decision.to, Phase::Queued, "{:?} at attempt {}", failure, attempt);
                prop_assert_eq!(task.phase, Phase::Queued);
                prop_assert_eq!(task.attempt, attempt + 1);
                prop_assert_eq!(task.ready_at_ms, now);
                prop_assert!(task.result.is_none() && task.action_value.is_none());
            } else {
                prop_assert_eq!(decision.to, Phase::Failed, "{:?} at attempt {}", failure, attempt);
                prop_assert_eq!(task.phase, Phase::Failed);
                prop_assert_eq!(task.attempt, attempt);
                prop_assert!(task.error.is_some());
                break;
            }
        }
        prop_assert!(starts <= max_retries + 1);
        prop_assert_eq!(task.phase, Phase::Failed);
    }

    #[test]
    fn success_after_retried_failures_completes_with_the_answers_children(
        max_retries in 0u32..5,
        failures in prop::collection::vec(
            prop_oneof![
                Just(Failure::PreFailed),
                Just(Failure::ActionFailed),
                Just(Failure::PostGarbage),
            ],
            0..5,
        ),
    ) {
        prop_assume!(failures.len() as u32 <= max_retries);
        let workflow = workflow(PRE_POST, &format!(r#"{{"max_retries": {max_retries}}}"#));
        let step = analyze(&workflow);
        let mut task = task();
        for &failure in &failures {
            let decision = failing_attempt(&mut task, &workflow, step, failure, NOW);
            prop_assert_eq!(decision.to, Phase::Queued);
        }
        let decision = through_action(&mut task, &workflow, step, answered(VALID_ANSWER));
        let stdin = decision_stdin_text(&decision);
        let decision = post_done(&mut task, &workflow, step, output(&stdin), NOW);
        prop_assert_eq!(decision.to, Phase::Completed);
        prop_assert_eq!(decision.spawn, valid_answer_next());
        prop_assert_eq!(task.attempt, failures.len() as u32 + 1);
        prop_assert_eq!(task.error, None);
    }
}
