//! `drover config schema|validate|graph` as a user runs them: every validation rule of
//! CONTRACT.md §2 has a bad config here and a test that checks the exit code (2) and that the
//! message names the exact `file:line:column`, the step and the field.
//!
//! Fixture configs live in `tests/fixtures/config/`; the commands run from that directory so
//! that messages name the bare file name. Configs that need links are written to a tempdir.

use std::collections::VecDeque;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use assert_cmd::Command;
use predicates::prelude::*;
use serde_json::{Value, json};

fn drover() -> Command {
    Command::cargo_bin("drover").expect("the drover binary is built")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config")
}

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// Every `examples/*/workflow.jsonc`, sorted.
fn example_configs() -> Vec<PathBuf> {
    let mut configs: Vec<PathBuf> = fs::read_dir(examples_dir())
        .expect("examples/ exists")
        .map(|entry| entry.expect("readable entry").path().join("workflow.jsonc"))
        .filter(|path| path.is_file())
        .collect();
    configs.sort();
    assert!(
        configs.len() >= 3,
        "expected the linear, fan-out and hooks examples, found {configs:?}"
    );
    configs
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[track_caller]
fn assert_has(haystack: &str, needle: &str) {
    assert!(
        haystack.contains(needle),
        "expected to find\n  {needle}\nin\n{haystack}"
    );
}

/// Runs `drover config validate` in `dir` with `args` appended.
fn validate_in(dir: &Path, config: &str, args: &[&str]) -> Output {
    drover()
        .current_dir(dir)
        .args(["config", "validate", "--config", config])
        .args(args)
        .output()
        .expect("drover runs")
}

/// Checks that `output` is a rejection (exit 2, nothing on stdout) and returns its stderr.
#[track_caller]
fn rejection(output: Output) -> String {
    let stderr = text(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(2),
        "expected exit code 2; stdout:\n{}\nstderr:\n{stderr}",
        text(&output.stdout)
    );
    assert!(
        output.stdout.is_empty(),
        "a rejected config prints nothing on stdout, got:\n{}",
        text(&output.stdout)
    );
    assert!(
        stderr.starts_with("error: "),
        "errors start with `error: `:\n{stderr}"
    );
    stderr
}

/// Validates fixture `name` and returns its stderr, checking that it was rejected.
#[track_caller]
fn rejected(name: &str) -> String {
    rejection(validate_in(&fixtures(), name, &[]))
}

/// Writes `files` (name, content) into a new tempdir.
fn tempdir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, content) in files {
        fs::write(dir.path().join(name), content).expect("write file");
    }
    dir
}

// ---------------------------------------------------------------------------------------------
// Strict JSON with comments

#[test]
fn missing_comma_is_a_syntax_error_at_its_position() {
    let stderr = rejected("missing_comma.jsonc");
    assert_has(&stderr, "error: missing_comma.jsonc:6:22: Expected comma");
}

#[test]
fn nan_is_rejected_not_read_as_null() {
    let stderr = rejected("nan.jsonc");
    assert_has(
        &stderr,
        "error: nan.jsonc:5:16: `NaN` is not valid JSON: Infinity and NaN are not allowed",
    );
}

#[test]
fn single_quoted_strings_are_rejected() {
    let stderr = rejected("single_quotes.jsonc");
    assert_has(
        &stderr,
        "error: single_quotes.jsonc:6:15: Single-quoted strings are not allowed",
    );
}

#[test]
fn out_of_range_number_is_rejected_not_read_as_null() {
    let stderr = rejected("out_of_range_number.jsonc");
    assert_has(
        &stderr,
        "error: out_of_range_number.jsonc:5:16: number `1e400` is out of range",
    );
}

#[test]
fn comments_and_trailing_commas_are_accepted() {
    let dir = tempdir_with(&[(
        "workflow.jsonc",
        r#"/* block */ {
          // line
          "entrypoint": "Start",
          "steps": [
            {"name": "Start", "action": {"kind": "Command", "script": "echo '[]'"}, "next": [],},
          ],
        }"#,
    )]);
    drover()
        .current_dir(dir.path())
        .args(["config", "validate", "--config", "workflow.jsonc"])
        .assert()
        .success()
        .stdout(predicate::str::contains("workflow.jsonc: valid, 1 steps"));
}

// ---------------------------------------------------------------------------------------------
// Unknown fields and kinds, with "did you mean"

#[test]
fn unknown_top_level_field_is_reported_with_a_hint() {
    let stderr = rejected("unknown_top_level_field.jsonc");
    assert_has(
        &stderr,
        "error: unknown_top_level_field.jsonc:4:3: unknown field `max_concurency` \
         (did you mean `max_concurrency`?)",
    );
}

#[test]
fn unknown_step_field_is_reported_with_the_step_and_a_hint() {
    let stderr = rejected("unknown_step_field.jsonc");
    assert_has(
        &stderr,
        "error: unknown_step_field.jsonc:9:7: step `Start`: unknown field `finaly` \
         (did you mean `finally`?)",
    );
}

#[test]
fn unknown_options_field_is_reported_with_the_step_and_a_hint() {
    let stderr = rejected("unknown_options_field.jsonc");
    assert_has(
        &stderr,
        "error: unknown_options_field.jsonc:11:9: step `Start`: unknown field `max_retry` \
         (did you mean `max_retries`?)",
    );
}

#[test]
fn unknown_action_field_is_reported_with_the_step_and_a_hint() {
    let stderr = rejected("unknown_action_field.jsonc");
    assert_has(
        &stderr,
        "error: unknown_action_field.jsonc:9:9: step `Start`: unknown field `scrpt` \
         (did you mean `script`?)",
    );
}

#[test]
fn unknown_field_inside_instructions_is_located_at_the_field() {
    let config = r#"{
  "steps": [
    {
      "name": "Ask",
      "action": {
        "kind": "Pool",
        "instructions": {"inline": "hi", "lnk": "x.md"}
      },
      "next": []
    }
  ]
}
"#;
    let dir = tempdir_with(&[("workflow.jsonc", config)]);
    let stderr = rejection(validate_in(dir.path(), "workflow.jsonc", &[]));
    assert_has(
        &stderr,
        "error: workflow.jsonc:7:42: step `Ask`: unknown field `lnk`",
    );
}

#[test]
fn unknown_action_kind_is_reported_with_the_step_and_a_hint() {
    let stderr = rejected("unknown_action_kind.jsonc");
    assert_has(
        &stderr,
        "error: unknown_action_kind.jsonc:8:9: step `Start`: unknown kind `Comand` \
         (did you mean `Command`?); expected one of `Pool`, `Command`",
    );
}

// ---------------------------------------------------------------------------------------------
// Steps, transitions and the entrypoint

#[test]
fn duplicate_step_names_are_reported_at_the_second_name() {
    let stderr = rejected("duplicate_step_names.jsonc");
    assert_has(
        &stderr,
        "error: duplicate_step_names.jsonc:11:7: step `Start`: duplicate step name \
         (first defined at line 6)",
    );
}

#[test]
fn next_naming_an_unknown_step_is_reported_with_a_hint() {
    let stderr = rejected("next_unknown_step.jsonc");
    assert_has(
        &stderr,
        "error: next_unknown_step.jsonc:8:26: step `Analyze`: `next` names unknown step \
         `Implemnt` (did you mean `Implement`?)",
    );
    // The known target on the same line is not reported.
    assert!(!stderr.contains("`Review`"), "{stderr}");
}

#[test]
fn unknown_entrypoint_is_reported_with_a_hint() {
    let stderr = rejected("unknown_entrypoint.jsonc");
    assert_has(
        &stderr,
        "error: unknown_entrypoint.jsonc:3:3: entrypoint `Analyse` is not a step \
         (did you mean `Analyze`?)",
    );
}

// ---------------------------------------------------------------------------------------------
// value_schema and links

#[test]
fn invalid_value_schema_is_reported_at_the_bad_keyword() {
    let stderr = rejected("invalid_value_schema.jsonc");
    assert_has(
        &stderr,
        "error: invalid_value_schema.jsonc:8:9: step `Start`: value_schema is not a valid \
         JSON Schema at /type: \"objekt\"",
    );
}

const POOL_WITH_LINKED_INSTRUCTIONS: &str = r#"{
  "entrypoint": "Ask",
  "steps": [
    {
      "name": "Ask",
      "action": {"kind": "Pool", "instructions": {"link": "missing.md"}},
      "next": []
    }
  ]
}
"#;

#[test]
fn unreadable_instructions_link_is_reported_with_the_step() {
    let dir = tempdir_with(&[("workflow.jsonc", POOL_WITH_LINKED_INSTRUCTIONS)]);
    let stderr = rejection(validate_in(dir.path(), "workflow.jsonc", &[]));
    assert_has(
        &stderr,
        "error: workflow.jsonc:6:34: step `Ask`: cannot read link `",
    );
    assert_has(&stderr, "missing.md`: No such file or directory");
}

const COMMAND_WITH_LINKED_SCHEMA: &str = r#"{
  "entrypoint": "Check",
  "steps": [
    {
      "name": "Check",
      "value_schema": {"link": "schemas/check.json"},
      "action": {"kind": "Command", "script": "echo '[]'"},
      "next": []
    }
  ]
}
"#;

#[test]
fn unreadable_value_schema_link_is_reported_with_the_step() {
    let dir = tempdir_with(&[("workflow.jsonc", COMMAND_WITH_LINKED_SCHEMA)]);
    // A directory where the schema file should be: it exists but cannot be read as a file.
    fs::create_dir_all(dir.path().join("schemas/check.json")).expect("mkdir");
    let stderr = rejection(validate_in(dir.path(), "workflow.jsonc", &[]));
    assert_has(
        &stderr,
        "error: workflow.jsonc:6:7: step `Check`: cannot read link `",
    );
    assert_has(&stderr, "schemas/check.json`: ");
}

#[test]
fn linked_value_schema_that_is_not_json_names_its_own_location() {
    let dir = tempdir_with(&[("workflow.jsonc", COMMAND_WITH_LINKED_SCHEMA)]);
    fs::create_dir(dir.path().join("schemas")).expect("mkdir");
    fs::write(
        dir.path().join("schemas/check.json"),
        "{\n  \"type\": \"object\"\n  \"required\": [\"id\"]\n}\n",
    )
    .expect("write schema");
    let stderr = rejection(validate_in(dir.path(), "workflow.jsonc", &[]));
    assert_has(
        &stderr,
        "error: workflow.jsonc:6:7: step `Check`: linked value_schema is not valid JSON: ",
    );
    assert_has(&stderr, "schemas/check.json:2:19: Expected comma");
}

#[test]
fn links_resolve_relative_to_the_config_directory() {
    let dir = tempdir_with(&[("workflow.jsonc", POOL_WITH_LINKED_INSTRUCTIONS)]);
    fs::write(dir.path().join("missing.md"), "Answer [].").expect("write instructions");
    // Run from somewhere else: the link must still be found next to the config.
    drover()
        .current_dir(fixtures())
        .args(["config", "validate", "--config"])
        .arg(dir.path().join("workflow.jsonc"))
        .assert()
        .success();
}

// ---------------------------------------------------------------------------------------------
// Options

#[test]
fn max_concurrency_zero_at_top_level_is_rejected() {
    let stderr = rejected("max_concurrency_zero_top_level.jsonc");
    assert_has(
        &stderr,
        "error: max_concurrency_zero_top_level.jsonc:4:3: `max_concurrency` must be at least 1",
    );
}

#[test]
fn max_concurrency_zero_in_options_is_rejected() {
    let stderr = rejected("max_concurrency_zero_in_options.jsonc");
    assert_has(
        &stderr,
        "error: max_concurrency_zero_in_options.jsonc:5:5: `max_concurrency` must be at least 1",
    );
}

#[test]
fn max_concurrency_zero_in_step_options_is_rejected_with_the_step() {
    let stderr = rejected("max_concurrency_zero_in_step_options.jsonc");
    assert_has(
        &stderr,
        "error: max_concurrency_zero_in_step_options.jsonc:10:9: step `Start`: \
         `max_concurrency` must be at least 1",
    );
}

#[test]
fn max_concurrency_in_both_places_is_rejected() {
    let stderr = rejected("max_concurrency_in_both_places.jsonc");
    assert_has(
        &stderr,
        "error: max_concurrency_in_both_places.jsonc:6:5: `max_concurrency` is given both at \
         the top level and in `options`; keep one",
    );
}

#[test]
fn zero_timeout_is_rejected() {
    let stderr = rejected("zero_timeout.jsonc");
    assert_has(
        &stderr,
        "error: zero_timeout.jsonc:5:5: `timeout` must be more than zero seconds, not 0",
    );
}

#[test]
fn negative_timeout_is_rejected_with_the_step() {
    let stderr = rejected("negative_timeout.jsonc");
    assert_has(
        &stderr,
        "error: negative_timeout.jsonc:10:9: step `Start`: `timeout` must be more than zero \
         seconds, not -5",
    );
}

// ---------------------------------------------------------------------------------------------
// All problems at once

#[test]
fn every_problem_in_a_file_is_reported() {
    let stderr = rejected("many_problems.jsonc");
    for expected in [
        "many_problems.jsonc:3:3: entrypoint `Strat` is not a step (did you mean `Start`?)",
        "many_problems.jsonc:4:3: `max_concurrency` must be at least 1",
        "many_problems.jsonc:9:16: step `Start`: `next` names unknown step `Finish`",
        "many_problems.jsonc:15:7: step `End`: unknown field `option` (did you mean `options`?)",
        "many_problems.jsonc:18:7: step `End`: duplicate step name (first defined at line 12)",
        "many_problems.jsonc:19:18: step `End`: unknown kind `Comand` (did you mean `Command`?)",
        "many_problems.jsonc:24:24: step `Last`: value_schema is not a valid JSON Schema at /type",
        "many_problems.jsonc:27:19: step `Last`: `timeout` must be more than zero seconds, not 0",
        "8 problems found",
    ] {
        assert_has(&stderr, expected);
    }
    // In file order, one per line.
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 9, "{stderr}");
    assert!(lines[0].starts_with("error: many_problems.jsonc:3:3: "));
    assert!(lines[7].starts_with("many_problems.jsonc:27:19: "));
}

// ---------------------------------------------------------------------------------------------
// The entrypoint value

#[test]
fn entrypoint_value_violation_names_the_pointer_of_each_failing_field() {
    let output = validate_in(
        &fixtures(),
        "entrypoint_schema.jsonc",
        &[
            "--entrypoint-value",
            r#"{"file": 3, "lines": [1, "two"], "mode": "fast", "extra": true}"#,
        ],
    );
    let stderr = rejection(output);
    assert_has(
        &stderr,
        "error: the entrypoint value does not satisfy the value_schema of step `Review`:",
    );
    for expected in [
        "at /file: 3 is not of type \"string\"",
        "at /lines/1: \"two\" is not of type \"integer\"",
        "at /mode: \"fast\" is not one of",
        "at /owner: \"owner\" is a required property",
        "at /extra: Additional properties are not allowed",
    ] {
        assert_has(&stderr, expected);
    }
}

#[test]
fn entrypoint_value_that_satisfies_the_schema_is_accepted() {
    drover()
        .current_dir(fixtures())
        .args(["config", "validate", "--config", "entrypoint_schema.jsonc"])
        .args(["--entrypoint-value", r#"{"file": "a.rs", "owner": "ann"}"#])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "entrypoint_schema.jsonc: valid, 1 steps",
        ));
}

#[test]
fn entrypoint_value_is_read_from_a_file_with_at() {
    let dir = tempdir_with(&[
        (
            "good.json",
            r#"{"file": "a.rs", "owner": "ann", "lines": [3, 4]}"#,
        ),
        ("bad.json", r#"{"file": "a.rs", "owner": 7}"#),
    ]);
    let good = format!("@{}", dir.path().join("good.json").display());
    let bad = format!("@{}", dir.path().join("bad.json").display());

    let output = validate_in(
        &fixtures(),
        "entrypoint_schema.jsonc",
        &["--entrypoint-value", &good],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));

    let output = validate_in(
        &fixtures(),
        "entrypoint_schema.jsonc",
        &["--entrypoint-value", &bad],
    );
    let stderr = rejection(output);
    assert_has(&stderr, "at /owner: 7 is not of type \"string\"");
}

#[test]
fn entrypoint_value_that_is_not_json_is_rejected() {
    let output = validate_in(
        &fixtures(),
        "entrypoint_schema.jsonc",
        &["--entrypoint-value", r#"{"file": "a.rs","#],
    );
    let stderr = rejection(output);
    assert_has(
        &stderr,
        "error: --entrypoint-value: not valid JSON: EOF while parsing",
    );
}

#[test]
fn entrypoint_value_file_that_is_not_json_is_rejected_with_its_name() {
    let dir = tempdir_with(&[("value.json", "{'file': 'a.rs'}")]);
    let arg = format!("@{}", dir.path().join("value.json").display());
    let output = validate_in(
        &fixtures(),
        "entrypoint_schema.jsonc",
        &["--entrypoint-value", &arg],
    );
    let stderr = rejection(output);
    assert_has(&stderr, "value.json: not valid JSON: key must be a string");
}

#[test]
fn entrypoint_value_file_that_is_missing_is_rejected() {
    let output = validate_in(
        &fixtures(),
        "entrypoint_schema.jsonc",
        &["--entrypoint-value", "@no-such-value.json"],
    );
    let stderr = rejection(output);
    assert_has(
        &stderr,
        "error: --entrypoint-value: cannot read `no-such-value.json`",
    );
}

// ---------------------------------------------------------------------------------------------
// `drover config schema`

fn published_schema() -> Value {
    let output = drover()
        .args(["config", "schema"])
        .output()
        .expect("drover runs");
    assert!(output.status.success(), "{}", text(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("`drover config schema` prints JSON")
}

/// Parses a JSONC file the way an editor would: with jsonc-parser, not with drover's loader.
fn parse_jsonc(path: &Path) -> Value {
    let source = fs::read_to_string(path).expect("read config");
    let options = jsonc_parser::ParseOptions {
        allow_comments: true,
        allow_trailing_commas: true,
        allow_loose_object_property_names: false,
        allow_missing_commas: false,
        allow_single_quoted_strings: false,
        allow_hexadecimal_numbers: false,
        allow_unary_plus_numbers: false,
        allow_bare_decimal_point_numbers: false,
        allow_non_finite_numbers: false,
        allow_extended_string_escapes: false,
    };
    jsonc_parser::parse_to_serde_value(&source, &options)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn schema_errors(validator: &jsonschema::Validator, config: &Value) -> Vec<String> {
    validator
        .iter_errors(config)
        .map(|e| format!("{}: {e}", e.instance_path().as_str()))
        .collect()
}

#[test]
fn config_schema_accepts_every_example() {
    let schema = published_schema();
    assert_eq!(
        schema["$schema"],
        json!("https://json-schema.org/draft/2020-12/schema")
    );
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    let mut configs = example_configs();
    configs.push(fixtures().join("gsd_style.jsonc"));
    for config in configs {
        let errors = schema_errors(&validator, &parse_jsonc(&config));
        assert!(errors.is_empty(), "{}: {errors:#?}", config.display());
    }
}

#[test]
fn config_schema_rejects_unknown_fields() {
    let validator = jsonschema::validator_for(&published_schema()).expect("the schema compiles");
    let example = parse_jsonc(&examples_dir().join("linear/workflow.jsonc"));

    let mut top = example.clone();
    top["max_concurency"] = json!(4);
    let errors = schema_errors(&validator, &top);
    assert!(
        errors.iter().any(|e| e.contains("max_concurency")),
        "{errors:#?}"
    );

    let mut in_step = example.clone();
    in_step["steps"][0]["finaly"] = json!("./cleanup.sh");
    let errors = schema_errors(&validator, &in_step);
    assert!(errors.iter().any(|e| e.contains("finaly")), "{errors:#?}");

    let mut in_options = example;
    in_options["options"]["max_retry"] = json!(1);
    let errors = schema_errors(&validator, &in_options);
    assert!(
        errors.iter().any(|e| e.contains("max_retry")),
        "{errors:#?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Examples

#[test]
fn every_example_passes_validate() {
    for config in example_configs() {
        let output = drover()
            .args(["config", "validate", "--config"])
            .arg(&config)
            .output()
            .expect("drover runs");
        assert!(
            output.status.success(),
            "{}:\n{}",
            config.display(),
            text(&output.stderr)
        );
        assert_has(&text(&output.stdout), ": valid, ");
    }
}

#[test]
fn example_scripts_are_executable_posix_sh() {
    use std::os::unix::fs::PermissionsExt;
    let mut scripts = Vec::new();
    for config in example_configs() {
        for entry in fs::read_dir(config.parent().expect("dir")).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|ext| ext == "sh") {
                scripts.push(path);
            }
        }
    }
    assert!(!scripts.is_empty());
    for script in scripts {
        let mode = fs::metadata(&script).expect("stat").permissions().mode();
        assert!(mode & 0o111 != 0, "{} is not executable", script.display());
        let source = fs::read_to_string(&script).expect("read script");
        assert!(
            source.starts_with("#!/bin/sh\n"),
            "{} does not start with #!/bin/sh",
            script.display()
        );
        let syntax = std::process::Command::new("sh")
            .arg("-n")
            .arg(&script)
            .output()
            .expect("sh runs");
        assert!(
            syntax.status.success(),
            "{}: {}",
            script.display(),
            text(&syntax.stderr)
        );
    }
}

/// Steps as `drover config validate --json` reports them: (name, next).
fn steps_of(config: &Path) -> Vec<(String, Vec<String>)> {
    let output = drover()
        .args(["config", "validate", "--json", "--config"])
        .arg(config)
        .output()
        .expect("drover runs");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).expect("--json prints JSON");
    assert_eq!(report["valid"], json!(true));
    report["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| {
            let name = step["name"].as_str().expect("name").to_string();
            let next = step["next"]
                .as_array()
                .expect("next")
                .iter()
                .map(|n| n.as_str().expect("step name").to_string())
                .collect();
            (name, next)
        })
        .collect()
}

fn graph(config: &Path, format: &str) -> String {
    let output = drover()
        .args(["config", "graph", "--format", format, "--config"])
        .arg(config)
        .output()
        .expect("drover runs");
    assert!(output.status.success(), "{}", text(&output.stderr));
    text(&output.stdout)
}

#[test]
fn graph_dot_contains_every_step_and_edge() {
    for config in example_configs() {
        let dot = graph(&config, "dot");
        assert!(dot.starts_with("digraph workflow {"), "{dot}");
        for (name, next) in steps_of(&config) {
            assert_has(&dot, &format!("  \"{name}\" [label=\"{name} ("));
            for target in next {
                assert_has(&dot, &format!("  \"{name}\" -> \"{target}\";"));
            }
        }
    }
    let dot = graph(&examples_dir().join("hooks/workflow.jsonc"), "dot");
    for line in [
        "\"__start\" -> \"Greet\";",
        "\"Greet\" -> \"Done\";",
        "\"Greet\" -> \"Recover\";",
        "\"Done\" [label=\"Done (Command)\", peripheries=2];",
    ] {
        assert_has(&dot, line);
    }
    assert_eq!(dot.matches(" -> ").count(), 3, "{dot}");
}

#[test]
fn graph_mermaid_contains_every_step_and_edge() {
    for config in example_configs() {
        let mermaid = graph(&config, "mermaid");
        assert!(mermaid.starts_with("flowchart LR\n"), "{mermaid}");
        let steps = steps_of(&config);
        let id = |name: &str| {
            let i = steps
                .iter()
                .position(|(n, _)| n == name)
                .expect("known step");
            format!("s{i}")
        };
        for (name, next) in &steps {
            assert_has(&mermaid, &format!("  {}", id(name)));
            assert_has(&mermaid, &format!("\"{name} ("));
            for target in next {
                assert_has(&mermaid, &format!("  {} --> {}\n", id(name), id(target)));
            }
        }
    }
    let mermaid = graph(&examples_dir().join("fan-out/workflow.jsonc"), "mermaid");
    for line in [
        "  start((start)) --> s0\n",
        "  s0 --> s1\n",
        "  s1 --> s2\n",
        "  s2([\"Review (Pool)\"])\n",
    ] {
        assert_has(&mermaid, line);
    }
    assert_eq!(mermaid.matches(" --> ").count(), 3, "{mermaid}");
}

#[test]
fn graph_of_an_invalid_config_is_rejected() {
    let output = drover()
        .current_dir(fixtures())
        .args(["config", "graph", "--config", "duplicate_step_names.jsonc"])
        .output()
        .expect("drover runs");
    let stderr = rejection(output);
    assert_has(&stderr, "duplicate_step_names.jsonc:11:7: step `Start`");
}

/// Runs `script` with `sh -c` in example `dir`, feeding `stdin`; returns its stdout parsed as
/// JSON and its stderr.
fn run_example_script(
    dir: &Path,
    script: &str,
    stdin: &Value,
    env: &[(&str, &str)],
) -> (Value, String) {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = std::process::Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.to_string().as_bytes())
        .expect("write stdin");
    let output = child.wait_with_output().expect("script ends");
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{script} failed: {stderr}");
    let stdout = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{script} printed no JSON ({e}): {}", text(&output.stdout)));
    (stdout, stderr)
}

/// An example's config, parsed, and a lookup of its steps by name.
struct Example {
    dir: PathBuf,
    config: Value,
}

impl Example {
    fn new(name: &str) -> Self {
        let dir = examples_dir().join(name);
        let config = parse_jsonc(&dir.join("workflow.jsonc"));
        Self { dir, config }
    }

    fn step(&self, name: &str) -> &Value {
        self.config["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .find(|s| s["name"] == json!(name))
            .unwrap_or_else(|| panic!("no step {name}"))
    }

    fn hook(&self, step: &str, hook: &str) -> String {
        match &self.step(step)[hook] {
            Value::String(script) => script.clone(),
            other => other["script"].as_str().expect("hook script").to_string(),
        }
    }

    /// Checks `value` against step `kind`'s value_schema.
    #[track_caller]
    fn check(&self, kind: &str, value: &Value) {
        if let Some(schema) = self.step(kind).get("value_schema") {
            let validator = jsonschema::validator_for(schema).expect("schema compiles");
            let errors = schema_errors(&validator, value);
            assert!(errors.is_empty(), "{kind} value {value}: {errors:?}");
        }
    }

    /// Checks that `tasks` is an array of tasks `from` may emit, and returns them.
    #[track_caller]
    fn check_tasks(&self, from: &str, tasks: &Value) -> Vec<(String, Value)> {
        let next = self.step(from)["next"].as_array().expect("next");
        tasks
            .as_array()
            .unwrap_or_else(|| panic!("{from}: not an array of tasks: {tasks}"))
            .iter()
            .map(|task| {
                let kind = task["kind"].as_str().expect("task kind").to_string();
                assert!(next.contains(&json!(kind)), "{from} may not emit {kind}");
                self.check(&kind, &task["value"]);
                (kind, task["value"].clone())
            })
            .collect()
    }

    /// Runs the Command steps the way the contract describes them, without the engine: the
    /// pre hook gets the value and prints the new value; the action gets {"kind","value"} and
    /// prints tasks its step may emit, with values their target's schema accepts. Pool steps
    /// are not run. Returns every task, in the order they ran.
    fn drive(&self, entry_value: Value) -> Vec<(String, Value)> {
        let entrypoint = self.config["entrypoint"].as_str().expect("entrypoint");
        self.check(entrypoint, &entry_value);
        let mut queue = VecDeque::from([(entrypoint.to_string(), entry_value)]);
        let mut ran = Vec::new();
        while let Some((kind, value)) = queue.pop_front() {
            assert!(ran.len() < 100, "runaway example");
            ran.push((kind.clone(), value.clone()));
            let step = self.step(&kind);
            if step["action"]["kind"] != json!("Command") {
                continue;
            }
            let value = match step.get("pre") {
                Some(_) => run_example_script(&self.dir, &self.hook(&kind, "pre"), &value, &[]).0,
                None => value,
            };
            let script = step["action"]["script"].as_str().expect("script");
            let task = json!({"kind": kind, "value": value});
            let (answer, _) = run_example_script(&self.dir, script, &task, &[]);
            queue.extend(self.check_tasks(&kind, &answer));
        }
        ran
    }
}

fn kinds(tasks: &[(String, Value)]) -> Vec<&str> {
    tasks.iter().map(|(kind, _)| kind.as_str()).collect()
}

#[test]
fn linear_example_scripts_chain_from_greet_to_print() {
    let tasks = Example::new("linear").drive(json!({"name": "drover"}));
    assert_eq!(kinds(&tasks), ["Greet", "Shout", "Print"]);
    assert_eq!(tasks[2].1, json!({"text": "HELLO, DROVER!"}));
}

#[test]
fn fan_out_example_emits_one_work_task_per_item() {
    let example = Example::new("fan-out");
    let tasks = example.drive(json!({"count": 4}));
    assert_eq!(kinds(&tasks), ["Split", "Work", "Work", "Work", "Work"]);
    let tasks = example.drive(json!({"count": 2, "review": true}));
    assert_eq!(kinds(&tasks), ["Split", "Work", "Work", "Review", "Review"]);
    assert_eq!(tasks[4].1, json!({"index": 2, "square": 4}));
}

#[test]
fn fan_out_example_finally_hook_prints_no_tasks_and_a_summary() {
    let example = Example::new("fan-out");
    let finally = example.hook("Split", "finally");
    let (tasks, stderr) = run_example_script(
        &example.dir,
        &finally,
        &json!({"count": 4}),
        &[("DROVER_RUN_ID", "run-1")],
    );
    assert_eq!(tasks, json!([]));
    assert_has(&stderr, "run run-1: all 4 Work tasks");
}

#[test]
fn hooks_example_pre_hook_adds_a_field_the_action_uses() {
    let tasks = Example::new("hooks").drive(json!({"name": "drover"}));
    assert_eq!(kinds(&tasks), ["Greet", "Done"]);
    let done = &tasks[1].1;
    assert_eq!(done["greeting"], json!("hello, drover"));
    let stamp = done["received_at"].as_str().expect("received_at");
    assert!(stamp.ends_with('Z') && stamp.len() == 20, "{stamp}");
}

#[test]
fn hooks_example_post_hook_turns_an_error_into_a_recovery_task() {
    let example = Example::new("hooks");
    let post = example.hook("Greet", "post");
    let env = [("DROVER_TASK_ID", "task-7")];

    let error = json!({"kind": "Error", "input": {"name": "x"}, "error": "exit status 1"});
    let (result, _) = run_example_script(&example.dir, &post, &error, &env);
    assert_eq!(result["kind"], json!("Error"));
    assert_eq!(result["error"], error["error"]);
    let next = example.check_tasks("Greet", &result["next"]);
    assert_eq!(
        next,
        [("Recover".to_string(), json!({"failed_task": "task-7"}))]
    );

    let success = json!({
        "kind": "Success",
        "input": {"name": "x"},
        "output": [{"kind": "Done", "value": {"greeting": "hi"}}],
        "next": [{"kind": "Done", "value": {"greeting": "hi"}}],
    });
    let (result, _) = run_example_script(&example.dir, &post, &success, &env);
    assert_eq!(result, success, "a Success passes through unchanged");
}

// ---------------------------------------------------------------------------------------------
// GSD compatibility

#[test]
fn gsd_style_config_loads_unchanged() {
    let output = validate_in(&fixtures(), "gsd_style.jsonc", &["--json"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).expect("--json prints JSON");
    assert_eq!(report["entrypoint"], json!("ListFiles"));
    assert_eq!(report["max_concurrency"], json!(4));
    let steps = report["steps"].as_array().expect("steps");
    let summary: Vec<(&str, &str, bool, bool, bool)> = steps
        .iter()
        .map(|s| {
            (
                s["name"].as_str().expect("name"),
                s["action"].as_str().expect("action"),
                s["pre"].as_bool().expect("pre"),
                s["post"].as_bool().expect("post"),
                s["finally"].as_bool().expect("finally"),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("ListFiles", "Pool", false, false, true),
            ("AnalyzeFile", "Pool", true, true, false),
            ("ApplyRefactor", "Pool", false, false, false),
            ("CommitFile", "Command", false, false, false),
        ]
    );
}
