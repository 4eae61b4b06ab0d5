//! Loading a config: strict parse → typed model → every semantic check, collecting all
//! problems with their `file:line:column` and step before giving up.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::jsonc::{self, Locations};
use super::model::{
    ActionFile, ConfigFile, HookFile, OptionsFile, RetryDelayFile, SchemaSource, StepFile,
    TextSource,
};
use super::problem::{ConfigErrors, Problem, hint};
use super::workflow::{Action, Hook, RetryDelay, Step, StepOptions, Workflow};

/// Reads and validates the config at `path`.
pub fn load(path: &Path) -> Result<Workflow, ConfigErrors> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigErrors::single(path, format!("cannot read the config: {e}")))?;
    load_text(&text, path)
}

/// Validates config `text` as if it were read from `path` (links resolve next to `path`).
pub fn load_text(text: &str, path: &Path) -> Result<Workflow, ConfigErrors> {
    let base_dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let base_dir = std::fs::canonicalize(&base_dir).unwrap_or(base_dir);
    let mut loader = Loader {
        file: path.to_path_buf(),
        base_dir,
        locations: Locations::default(),
        problems: Vec::new(),
    };
    let (value, locations) = jsonc::parse(text).map_err(|errors| ConfigErrors {
        problems: errors
            .into_iter()
            .map(|e| Problem {
                file: path.to_path_buf(),
                at: e.at,
                step: None,
                message: e.message,
            })
            .collect(),
    })?;
    loader.locations = locations;
    let workflow = loader.build(value);
    match workflow {
        Some(workflow) if loader.problems.is_empty() => Ok(workflow),
        _ => {
            let mut problems = loader.problems;
            problems.sort_by_key(|p| p.at.map(|at| (at.line, at.column)));
            Err(ConfigErrors { problems })
        }
    }
}

struct Loader {
    file: PathBuf,
    base_dir: PathBuf,
    locations: Locations,
    problems: Vec<Problem>,
}

impl Loader {
    fn problem(&mut self, pointer: &str, step: Option<&str>, message: impl Into<String>) {
        self.problems.push(Problem {
            file: self.file.clone(),
            at: self.locations.find(pointer),
            step: step.map(str::to_string),
            message: message.into(),
        });
    }

    /// Deserializes one part of the document, turning serde's first error into a located
    /// problem with a "did you mean" hint for misspelt fields and kinds.
    fn typed<T: DeserializeOwned>(
        &mut self,
        value: Value,
        pointer: &str,
        step: Option<&str>,
    ) -> Option<T> {
        match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(typed) => Some(typed),
            Err(error) => {
                let mut at = pointer.to_string();
                for segment in error.path().iter() {
                    match segment {
                        serde_path_to_error::Segment::Seq { index } => {
                            at.push_str(&format!("/{index}"))
                        }
                        serde_path_to_error::Segment::Map { key } => {
                            at.push('/');
                            at.push_str(&jsonc::escape_pointer_token(key));
                        }
                        serde_path_to_error::Segment::Enum { .. }
                        | serde_path_to_error::Segment::Unknown => {}
                    }
                }
                let message = explain_serde_error(&error.inner().to_string());
                if let Some(unknown) = unknown_name(&message) {
                    let token = jsonc::escape_pointer_token(&unknown);
                    let with_key = format!("{at}/{token}");
                    if self.locations.find(&with_key) != self.locations.find(&at) {
                        at = with_key;
                    } else if let Some(nested) = self.locations.find_below(&at, &token) {
                        // Serde loses the path inside internally tagged enums (an action's
                        // `instructions`), so look for the key further down.
                        at = nested;
                    }
                }
                self.problem(&at, step, message);
                None
            }
        }
    }

    fn build(&mut self, mut value: Value) -> Option<Workflow> {
        let Some(object) = value.as_object_mut() else {
            self.problem("", None, "the config must be a JSON object with `steps`");
            return None;
        };
        // Steps are typed one by one so that a problem in one step does not hide the others.
        let raw_steps = match object.get_mut("steps") {
            Some(Value::Array(steps)) => std::mem::take(steps),
            _ => Vec::new(),
        };
        let top: Option<ConfigFile> = self.typed(value, "", None);
        // Names are taken from the raw steps so that a step with a typo elsewhere still counts
        // as existing for `next` and `entrypoint` checks.
        let names: Vec<Option<String>> = raw_steps
            .iter()
            .map(|raw| raw.get("name").and_then(Value::as_str).map(str::to_string))
            .collect();
        let mut step_files = Vec::with_capacity(raw_steps.len());
        for (i, raw) in raw_steps.into_iter().enumerate() {
            step_files.push(self.typed::<StepFile>(
                raw,
                &format!("/steps/{i}"),
                names[i].as_deref(),
            ));
        }
        let mut top = top?;
        if step_files.is_empty() {
            self.problem(
                "/steps",
                None,
                "`steps` is empty: a workflow needs at least one step",
            );
        }

        let global = top.options.clone().unwrap_or_default();
        let mut max_concurrency = None;
        match (top.max_concurrency, global.max_concurrency) {
            (Some(_), Some(_)) => self.problem(
                "/options/max_concurrency",
                None,
                "`max_concurrency` is given both at the top level and in `options`; keep one",
            ),
            (Some(n), None) => max_concurrency = self.concurrency(n, "/max_concurrency", None),
            (None, Some(n)) => {
                max_concurrency = self.concurrency(n, "/options/max_concurrency", None)
            }
            (None, None) => {}
        }
        let defaults = self.options(&global, &StepOptions::default(), "/options", None);

        let known: Vec<&str> = names.iter().flatten().map(String::as_str).collect();
        let mut first_seen: HashMap<&str, usize> = HashMap::new();
        for (i, name) in names.iter().enumerate() {
            let Some(name) = name else { continue };
            let pointer = format!("/steps/{i}/name");
            if name.trim().is_empty() {
                self.problem(&pointer, None, "a step name must not be empty");
            } else if let Some(&first) = first_seen.get(name.as_str()) {
                let first_at = self
                    .locations
                    .find(&format!("/steps/{first}/name"))
                    .map(|at| format!(" (first defined at line {})", at.line))
                    .unwrap_or_default();
                self.problem(
                    &pointer,
                    Some(name),
                    format!("duplicate step name{first_at}"),
                );
            } else {
                first_seen.insert(name, i);
            }
        }

        if let Some(entry) = &top.entrypoint
            && !known.contains(&entry.as_str())
        {
            let near = hint(entry, known.iter().copied());
            self.problem(
                "/entrypoint",
                None,
                format!("entrypoint `{entry}` is not a step{near}"),
            );
        }

        let mut steps = Vec::new();
        let mut resolved_steps = Vec::new();
        for (i, step_file) in step_files.into_iter().enumerate() {
            let Some(step_file) = step_file else { continue };
            if let Some((step, resolved)) = self.step(i, step_file, &known, &defaults) {
                steps.push(step);
                resolved_steps.push(resolved);
            }
        }
        if !self.problems.is_empty() {
            return None;
        }
        let entrypoint = top.entrypoint.clone();
        top.steps = resolved_steps;
        Some(Workflow::new(
            self.file.clone(),
            self.base_dir.clone(),
            entrypoint,
            max_concurrency,
            steps,
            top,
        ))
    }

    fn concurrency(&mut self, n: u64, pointer: &str, step: Option<&str>) -> Option<usize> {
        if n == 0 {
            self.problem(pointer, step, "`max_concurrency` must be at least 1");
            return None;
        }
        Some(usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn seconds(
        &mut self,
        seconds: f64,
        pointer: &str,
        step: Option<&str>,
        field: &str,
        allow_zero: bool,
    ) -> Duration {
        let valid = if allow_zero {
            seconds >= 0.0
        } else {
            seconds > 0.0
        };
        if !valid {
            let bound = if allow_zero {
                "zero or more"
            } else {
                "more than zero"
            };
            self.problem(
                pointer,
                step,
                format!("`{field}` must be {bound} seconds, not {seconds}"),
            );
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64(seconds).unwrap_or_else(|_| {
            self.problem(
                pointer,
                step,
                format!("`{field}` of {seconds} seconds is too large"),
            );
            Duration::ZERO
        })
    }

    fn options(
        &mut self,
        file: &OptionsFile,
        inherited: &StepOptions,
        pointer: &str,
        step: Option<&str>,
    ) -> StepOptions {
        let mut options = inherited.clone();
        // The run-wide cap is handled by the caller; a step's own cap limits only that step.
        options.max_concurrency = None;
        if step.is_some()
            && let Some(n) = file.max_concurrency
        {
            options.max_concurrency =
                self.concurrency(n, &format!("{pointer}/max_concurrency"), step);
        }
        if let Some(timeout) = file.timeout {
            options.timeout = Some(self.seconds(
                timeout,
                &format!("{pointer}/timeout"),
                step,
                "timeout",
                false,
            ));
        }
        if let Some(n) = file.max_retries {
            options.max_retries = n;
        }
        if let Some(flag) = file.retry_on_timeout {
            options.retry_on_timeout = flag;
        }
        if let Some(flag) = file.retry_on_invalid_response {
            options.retry_on_invalid_response = flag;
        }
        if let Some(delay) = &file.retry_delay {
            let at = format!("{pointer}/retry_delay");
            options.retry_delay = match delay {
                RetryDelayFile::Fixed(seconds) => RetryDelay {
                    initial: self.seconds(*seconds, &at, step, "retry_delay", true),
                    multiplier: 1.0,
                    max: None,
                },
                RetryDelayFile::Backoff(backoff) => {
                    let multiplier = backoff.multiplier.unwrap_or(1.0);
                    if multiplier < 1.0 {
                        self.problem(
                            &format!("{at}/multiplier"),
                            step,
                            "`multiplier` must be at least 1",
                        );
                    }
                    RetryDelay {
                        initial: self.seconds(
                            backoff.initial,
                            &format!("{at}/initial"),
                            step,
                            "initial",
                            true,
                        ),
                        multiplier,
                        max: backoff
                            .max
                            .map(|max| self.seconds(max, &format!("{at}/max"), step, "max", true)),
                    }
                }
            };
        }
        options
    }

    fn hook(&mut self, hook: &Option<HookFile>, pointer: String, step: &str) -> Option<Hook> {
        let hook = hook.as_ref()?;
        if hook.script().trim().is_empty() {
            self.problem(&pointer, Some(step), "the hook's script is empty");
        }
        Some(Hook {
            script: hook.script().to_string(),
        })
    }

    fn read_link(&mut self, link: &str, pointer: &str, step: &str) -> Option<(PathBuf, String)> {
        let path = self.base_dir.join(link);
        match std::fs::read_to_string(&path) {
            Ok(text) => Some((path, text)),
            Err(e) => {
                self.problem(
                    pointer,
                    Some(step),
                    format!("cannot read link `{}`: {e}", path.display()),
                );
                None
            }
        }
    }

    fn step(
        &mut self,
        i: usize,
        mut file: StepFile,
        known: &[&str],
        defaults: &StepOptions,
    ) -> Option<(Step, StepFile)> {
        let at = format!("/steps/{i}");
        let name = file.name.clone();
        let step = Some(name.as_str());

        for (j, target) in file.next.iter().enumerate() {
            if !known.contains(&target.as_str()) {
                let near = hint(target, known.iter().copied());
                self.problem(
                    &format!("{at}/next/{j}"),
                    step,
                    format!("`next` names unknown step `{target}`{near}"),
                );
            }
        }

        let options = match &file.options {
            Some(own) => self.options(own, defaults, &format!("{at}/options"), step),
            None => defaults.clone(),
        };

        let action = match &mut file.action {
            ActionFile::Command { script } => {
                if script.trim().is_empty() {
                    self.problem(
                        &format!("{at}/action/script"),
                        step,
                        "the action's script is empty",
                    );
                }
                Action::Command {
                    script: script.clone(),
                }
            }
            ActionFile::Pool { instructions } => {
                let text = match instructions {
                    TextSource::Text(text) => text.clone(),
                    TextSource::Inline(inline) => inline.inline.clone(),
                    TextSource::Link(link) => {
                        let (_, text) = self.read_link(
                            &link.link,
                            &format!("{at}/action/instructions"),
                            &name,
                        )?;
                        text
                    }
                };
                *instructions = TextSource::Text(text.clone());
                Action::Pool { instructions: text }
            }
        };

        let (value_schema, validator) = match file.value_schema.take() {
            None => (None, None),
            Some(source) => {
                let schema_at = format!("{at}/value_schema");
                let (schema, base_uri, in_file) = match source {
                    SchemaSource::Inline(schema) => (schema, dir_uri(&self.base_dir), true),
                    SchemaSource::Link(link) => {
                        let (path, text) = self.read_link(&link.link, &schema_at, &name)?;
                        match jsonc::parse(&text) {
                            Ok((schema, _)) => (schema, file_uri(&path), false),
                            Err(errors) => {
                                let detail = errors
                                    .first()
                                    .map(|e| match e.at {
                                        Some(pos) => {
                                            format!("{}:{pos}: {}", path.display(), e.message)
                                        }
                                        None => format!("{}: {}", path.display(), e.message),
                                    })
                                    .unwrap_or_default();
                                self.problem(
                                    &schema_at,
                                    step,
                                    format!("linked value_schema is not valid JSON: {detail}"),
                                );
                                return None;
                            }
                        }
                    }
                };
                let validator =
                    self.compile_schema(&schema, &base_uri, &schema_at, in_file, &name)?;
                file.value_schema = Some(SchemaSource::Inline(schema.clone()));
                (Some(schema), Some(Arc::new(validator)))
            }
        };

        let pre = self.hook(&file.pre, format!("{at}/pre"), &name);
        let post = self.hook(&file.post, format!("{at}/post"), &name);
        let finally_hook = self.hook(&file.finally_hook, format!("{at}/finally"), &name);

        let step = Step {
            name,
            value_schema,
            validator,
            action,
            next: file.next.clone(),
            pre,
            post,
            finally_hook,
            options,
        };
        Some((step, file))
    }

    fn compile_schema(
        &mut self,
        schema: &Value,
        base_uri: &str,
        schema_at: &str,
        in_file: bool,
        step: &str,
    ) -> Option<jsonschema::Validator> {
        if let Err(error) = jsonschema::meta::validate(schema) {
            let inner = error.instance_path().as_str().to_string();
            let pointer = if in_file {
                format!("{schema_at}{inner}")
            } else {
                schema_at.to_string()
            };
            let place = if inner.is_empty() {
                String::new()
            } else {
                format!(" at {inner}")
            };
            self.problem(
                &pointer,
                Some(step),
                format!("value_schema is not a valid JSON Schema{place}: {error}"),
            );
            return None;
        }
        match jsonschema::options().with_base_uri(base_uri).build(schema) {
            Ok(validator) => Some(validator),
            Err(error) => {
                self.problem(
                    schema_at,
                    Some(step),
                    format!("value_schema cannot be compiled: {error}"),
                );
                None
            }
        }
    }
}

fn dir_uri(dir: &Path) -> String {
    format!("file://{}/", dir.display())
}

fn file_uri(path: &Path) -> String {
    let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    format!("file://{}", absolute.display())
}

/// Serde's messages for misspelt names, with the nearest expected name added.
fn explain_serde_error(message: &str) -> String {
    let names = backticked(message);
    let is_misspelling =
        message.starts_with("unknown field") || message.starts_with("unknown variant");
    if is_misspelling && let Some((wrong, expected)) = names.split_first() {
        let near = hint(wrong, expected.iter().map(String::as_str));
        let what = if message.starts_with("unknown field") {
            "unknown field"
        } else {
            "unknown kind"
        };
        let list = expected
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let expected_text = if list.is_empty() {
            String::new()
        } else {
            format!("; expected one of {list}")
        };
        return format!("{what} `{wrong}`{near}{expected_text}");
    }
    message.to_string()
}

fn unknown_name(message: &str) -> Option<String> {
    if message.starts_with("unknown field") {
        backticked(message).into_iter().next()
    } else {
        None
    }
}

fn backticked(message: &str) -> Vec<String> {
    message
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}
