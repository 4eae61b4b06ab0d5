//! Which agent did a Pool task's work, as the runner records it: a note at the end of the
//! action's transition detail (or of a late answer's log outcome), e.g.
//! `Success, 2 next task(s); answered by "agent-2"`.
//!
//! Free text rather than a record field, so recording it needs no new record version (and no
//! storage version bump). `inspect` reads the name back for its JSON with `agent_in`. The name
//! is JSON-quoted, so it cannot contain the unescaped quote that opens the note: the last
//! note in a text is always the one this module appended, whatever the name or the text
//! before it holds.

/// The hook log phase under which a late answer is recorded.
pub const LATE_ANSWER: &str = "late-answer";

const ANSWERED: &str = "; answered by ";
const HELD: &str = "; held by ";

/// `text` with the note naming `agent`: "answered by" when it answered, "held by" when its
/// work ended without an answer (abandoned, unreadable response file, agent kicked).
pub fn append(text: &str, answered: bool, agent: &str) -> String {
    let verb = if answered { ANSWERED } else { HELD };
    let quoted = serde_json::Value::String(agent.to_string()).to_string();
    format!("{text}{verb}{quoted}")
}

/// The agent named by the note `append` put at the end of `text`, if there is one.
pub fn agent_in(text: &str) -> Option<String> {
    let quoted = [ANSWERED, HELD]
        .iter()
        .filter_map(|verb| {
            let at = text.rfind(&format!("{verb}\""))?;
            Some(&text[at + verb.len()..])
        })
        // Both found: the later note (the shorter rest) is the one appended last.
        .min_by_key(|rest| rest.len())?;
    serde_json::from_str::<String>(quoted).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_is_read_back_from_the_note() {
        let text = append("Success, 0 next task(s)", true, "agent-2");
        assert_eq!(text, r#"Success, 0 next task(s); answered by "agent-2""#);
        assert_eq!(agent_in(&text).as_deref(), Some("agent-2"));
        let text = append("Error: gone; retry as attempt 2", false, "x");
        assert_eq!(text, r#"Error: gone; retry as attempt 2; held by "x""#);
        assert_eq!(agent_in(&text).as_deref(), Some("x"));
    }

    #[test]
    fn names_and_texts_that_look_like_notes_do_not_confuse_it() {
        let tricky = r#"a "; held by "b"#;
        let text = append(
            r#"Error: invalid answer; answered by "evil""#,
            false,
            tricky,
        );
        assert_eq!(agent_in(&text).as_deref(), Some(tricky));
        assert_eq!(agent_in("Success, 0 next task(s)"), None);
        assert_eq!(agent_in("Timeout"), None);
    }
}
