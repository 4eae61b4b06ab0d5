//! The agent protocol as `drover-pool protocol` prints it: everything an agent (an LLM given
//! only this text, a person, a script) needs to loop correctly, with the exact commands for
//! that agent. `--pool`/`--root` appear in those commands only when they were given on the
//! `protocol` command line; they are never invented.

/// Quotes `word` for a POSIX shell, leaving plain words as they are.
pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// `drover-pool get-task --name NAME`, plus `--pool P` / `--root R` exactly when given.
pub fn get_task_command(name: &str, pool: Option<&str>, root: Option<&str>) -> String {
    let mut command = format!("drover-pool get-task --name {}", shell_quote(name));
    if let Some(pool) = pool {
        command.push_str(" --pool ");
        command.push_str(&shell_quote(pool));
    }
    if let Some(root) = root {
        command.push_str(" --root ");
        command.push_str(&shell_quote(root));
    }
    command
}

const EXAMPLE_TASK: &str = r#"{"kind": "Task", "task_id": "01JQ3ZK2D8V7M1X9R4T6B0N5CE", "attempt": 1,
 "response_file": "/run/user/1000/drover/pools/default/responses/01JQ3ZJY0P2W8S5F7H9K1M3N4Q-01JQ3ZK2D8V7M1X9R4T6B0N5CE-1.json",
 "instructions": "Read the file and list the functions that need tests. ...",
 "task": {"kind": "Analyze", "value": {"file": "src/lib.rs"}},
 "next_steps": [{"kind": "WriteTest", "value_schema": {"type": "object", "required": ["function"],
                 "properties": {"function": {"type": "string"}}}}]}"#;

const EXAMPLE_ANSWER: &str = r#"[{"kind": "WriteTest", "value": {"function": "parse"}}, {"kind": "WriteTest", "value": {"function": "render"}}]"#;

/// The whole protocol for agent `name`.
pub fn render(name: &str, pool: Option<&str>, root: Option<&str>) -> String {
    let get_task = get_task_command(name, pool, root);
    let quoted_name = shell_quote(name);
    format!(
        r#"# drover agent protocol: agent `{name}`

You are agent `{name}`, a long-lived worker in a drover pool. A workflow runner hands you
tasks one at a time through the pool daemon. You do each task, write your answer to a file, and
ask for the next one, until you are told to stop (a `Kicked` message).

## The loop

1. Ask for a task by running exactly:

   ```sh
   {get_task}
   ```

   It blocks until a task is assigned to you (this may take a long time; that is normal), then
   prints ONE JSON object on stdout and exits 0. Lines on stderr (such as "waiting for the pool
   daemon") are only information. If your shell tool times out before the command returns,
   simply run the same command again.
2. If the object's `"kind"` is `"Kicked"`: stop. Do not run get-task again; exit.
3. If its `"kind"` is `"Task"`: do the work that `instructions` describes, for the input in
   `task`. Then write your answer to the file named by `response_file` (see "Answering").
4. Immediately go back to step 1. There is no confirmation to wait for.

If get-task exits with a non-zero status it printed the reason on stderr. Status 2 with "already
waiting" means another agent is using the name `{name}` right now: stop and report it.

## Messages

A task:

```json
{EXAMPLE_TASK}
```

- `task_id`, `attempt`: which task this is (a retried task comes back with a higher `attempt`).
- `response_file`: the absolute path where your answer must be written.
- `instructions`: what to do (markdown), including the steps you may answer with.
- `task`: your input: `kind` is the step name, `value` its data.
- `next_steps`: the only kinds you may answer with, each with the JSON Schema its `value` must
  satisfy (`{{}}` accepts any value). Empty means you must answer `[]`.

An order to exit:

```json
{{"kind": "Kicked", "reason": "kicked by drover-pool kick"}}
```

## Answering

Your answer is a JSON array of next tasks, each `{{"kind": K, "value": V}}`:

- `K` must be one of the `kind`s listed in `next_steps`, and nothing else.
- `V` must satisfy that kind's `value_schema`.
- One element per follow-up task: several elements fan out into several tasks.
- `[]` means this task needs no follow-up: that branch of the workflow ends.

For the example task above, a valid answer is:

```json
{EXAMPLE_ANSWER}
```

Write the file in one go, only once you are done with the task: either write it to a temporary
file in the same directory (a name NOT ending in `.json`) and rename it onto `response_file`, or
write the whole file and close it. For example:

```sh
RESPONSE_FILE='/run/user/1000/drover/pools/default/responses/01JQ3ZJY0P2W8S5F7H9K1M3N4Q-01JQ3ZK2D8V7M1X9R4T6B0N5CE-1.json'  # the task's response_file
cat > "$RESPONSE_FILE.tmp" <<'EOF'
[{{"kind": "WriteTest", "value": {{"function": "parse"}}}}]
EOF
mv "$RESPONSE_FILE.tmp" "$RESPONSE_FILE"
```

The file is read as soon as it is closed or renamed into place, so never write it partially.

## Rules

- An answer that is not a JSON array of valid tasks (text that is not JSON, an unknown kind, a
  kind not in `next_steps`, a value that fails its schema) makes the task fail with an error.
- You hold one task at a time. Running get-task while you still hold an unanswered task abandons
  it: that task fails with the error "agent requested a new task without answering". Always
  write the answer first, then run get-task.
- Use only your own name, `{quoted_name}`, exactly as in the command above.
- On `Kicked`, exit at once.
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_words_stay_plain_and_others_are_quoted() {
        assert_eq!(shell_quote("agent-1"), "agent-1");
        assert_eq!(shell_quote("/tmp/x.y"), "/tmp/x.y");
        assert_eq!(shell_quote("my dir"), "'my dir'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
    }

    #[test]
    fn no_flags_given_means_none_in_the_text() {
        let text = render("a", None, None);
        assert!(
            text.contains("\n   drover-pool get-task --name a\n"),
            "{text}"
        );
        assert!(!text.contains("--pool"), "{text}");
        assert!(!text.contains("--root"), "{text}");
    }

    #[test]
    fn given_flags_are_repeated_exactly() {
        let text = render("a", Some("p1"), None);
        assert!(
            text.contains("\n   drover-pool get-task --name a --pool p1\n"),
            "{text}"
        );
        assert!(!text.contains("--root"), "{text}");

        let text = render("a", None, Some("/tmp/r"));
        assert!(
            text.contains("\n   drover-pool get-task --name a --root /tmp/r\n"),
            "{text}"
        );
        assert!(!text.contains("--pool"), "{text}");

        let text = render("worker 2", Some("p1"), Some("/tmp/my root"));
        assert!(
            text.contains(
                "\n   drover-pool get-task --name 'worker 2' --pool p1 --root '/tmp/my root'\n"
            ),
            "{text}"
        );
        assert_eq!(text.matches("--pool").count(), 1, "{text}");
        assert_eq!(text.matches("--root").count(), 1, "{text}");
    }

    #[test]
    fn examples_are_valid_messages() {
        let task: crate::pool::protocol::AgentMessage =
            serde_json::from_str(EXAMPLE_TASK).expect("the example task parses");
        let crate::pool::protocol::AgentMessage::Task { response_file, .. } = task else {
            panic!("the example is a task")
        };
        let text = render("a", None, None);
        assert!(
            text.contains(&format!("RESPONSE_FILE='{response_file}'")),
            "the shell example writes the example task's response file"
        );
        let answer: Vec<crate::pool::protocol::TaskRef> =
            serde_json::from_str(EXAMPLE_ANSWER).expect("the example answer parses");
        assert_eq!(answer.len(), 2);
        let kicked: crate::pool::protocol::AgentMessage =
            serde_json::from_str(r#"{"kind": "Kicked", "reason": "kicked by drover-pool kick"}"#)
                .expect("the kicked example parses");
        assert!(matches!(
            kicked,
            crate::pool::protocol::AgentMessage::Kicked { .. }
        ));
    }
}
