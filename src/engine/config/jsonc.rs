//! Strict JSON-with-comments parsing that remembers where every value came from.
//!
//! jsonc-parser's defaults accept JSON5-isms (missing commas, `NaN`, single quotes); drover's
//! contract allows comments and trailing commas and nothing looser, so every option is set
//! explicitly. Numbers are converted by serde_json so that an out-of-range literal is an error
//! instead of a silent `null`. The location index maps JSON pointers to `line:column`, which is
//! how schema and model errors found later name the place in the file.

use std::collections::HashMap;
use std::fmt;

use jsonc_parser::ast::{self, ObjectPropName};
use jsonc_parser::{CollectOptions, CommentCollectionStrategy, ParseOptions};
use serde_json::{Map, Value};

/// A 1-based line and column in a text file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineCol {
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for LineCol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// Where each JSON pointer of a parsed document starts. For object members this is the key, so
/// "unknown field" points at the field name.
#[derive(Debug, Default, Clone)]
pub struct Locations {
    by_pointer: HashMap<String, LineCol>,
}

impl Locations {
    /// The location of `pointer`, or of its nearest ancestor that has one.
    pub fn find(&self, pointer: &str) -> Option<LineCol> {
        let mut current = pointer;
        loop {
            if let Some(found) = self.by_pointer.get(current) {
                return Some(*found);
            }
            let cut = current.rfind('/')?;
            current = &current[..cut];
        }
    }
}

impl Locations {
    /// The shortest recorded pointer below `under` whose last token is `token`.
    pub fn find_below(&self, under: &str, token: &str) -> Option<String> {
        let prefix = format!("{under}/");
        let suffix = format!("/{token}");
        self.by_pointer
            .keys()
            .filter(|pointer| pointer.starts_with(&prefix) && pointer.ends_with(&suffix))
            .min_by_key(|pointer| (pointer.len(), pointer.as_str()))
            .cloned()
    }
}

/// A parse failure with its position.
#[derive(Debug, Clone)]
pub struct JsoncError {
    pub at: Option<LineCol>,
    pub message: String,
}

pub fn strict_options() -> ParseOptions {
    ParseOptions {
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
    }
}

/// Parses `text` strictly. All problems found after a successful syntax parse (duplicate keys,
/// out-of-range numbers) are reported together.
pub fn parse(text: &str) -> Result<(Value, Locations), Vec<JsoncError>> {
    let collect = CollectOptions {
        comments: CommentCollectionStrategy::Off,
        tokens: false,
    };
    let parsed = jsonc_parser::parse_to_ast(text, &collect, &strict_options()).map_err(|e| {
        vec![JsoncError {
            at: Some(LineCol {
                line: e.line_display(),
                column: e.column_display(),
            }),
            message: syntax_message(text, &e),
        }]
    })?;
    let Some(root) = parsed.value else {
        return Err(vec![JsoncError {
            at: None,
            message: "the file is empty".to_string(),
        }]);
    };
    let mut converter = Converter {
        lines: LineIndex::new(text),
        locations: Locations::default(),
        errors: Vec::new(),
    };
    let value = converter.convert(&root, String::new());
    if converter.errors.is_empty() {
        Ok((value, converter.locations))
    } else {
        Err(converter.errors)
    }
}

/// The parser's message, plus the offending text when the parser only says "unexpected word"
/// (a bare `NaN` or `Infinity` is scanned as a word, so the message alone would not say why).
fn syntax_message(text: &str, error: &jsonc_parser::errors::ParseError) -> String {
    use jsonc_parser::errors::ParseErrorKind;
    let kind = error.kind();
    let range = error.range();
    let found = text
        .get(range.start..range.end)
        .filter(|found| !found.is_empty() && found.chars().count() <= 40);
    match (kind, found) {
        (ParseErrorKind::UnexpectedWord | ParseErrorKind::UnexpectedToken, Some(found)) => {
            if matches!(found, "NaN" | "Infinity") {
                format!("`{found}` is not valid JSON: Infinity and NaN are not allowed")
            } else {
                format!("{kind} `{found}`")
            }
        }
        _ => kind.to_string(),
    }
}

struct Converter<'t> {
    lines: LineIndex<'t>,
    locations: Locations,
    errors: Vec<JsoncError>,
}

impl Converter<'_> {
    fn convert(&mut self, node: &ast::Value<'_>, pointer: String) -> Value {
        let start = node_start(node);
        self.locations
            .by_pointer
            .entry(pointer.clone())
            .or_insert_with(|| self.lines.line_col(start));
        match node {
            ast::Value::StringLit(s) => Value::String(s.value.to_string()),
            ast::Value::BooleanLit(b) => Value::Bool(b.value),
            ast::Value::NullKeyword(_) => Value::Null,
            ast::Value::NumberLit(n) => match serde_json::from_str::<serde_json::Number>(n.value) {
                Ok(number) => Value::Number(number),
                Err(_) => {
                    self.errors.push(JsoncError {
                        at: Some(self.lines.line_col(n.range.start)),
                        message: format!("number `{}` is out of range", n.value),
                    });
                    Value::Null
                }
            },
            ast::Value::Array(array) => Value::Array(
                array
                    .elements
                    .iter()
                    .enumerate()
                    .map(|(i, element)| self.convert(element, format!("{pointer}/{i}")))
                    .collect(),
            ),
            ast::Value::Object(object) => {
                let mut map = Map::new();
                for prop in &object.properties {
                    let (key, key_start) = match &prop.name {
                        ObjectPropName::String(s) => (s.value.to_string(), s.range.start),
                        ObjectPropName::Word(w) => (w.value.to_string(), w.range.start),
                    };
                    let child = format!("{pointer}/{}", escape_pointer_token(&key));
                    let key_at = self.lines.line_col(key_start);
                    if map.contains_key(&key) {
                        self.errors.push(JsoncError {
                            at: Some(key_at),
                            message: format!("duplicate key `{key}`"),
                        });
                        continue;
                    }
                    self.locations.by_pointer.insert(child.clone(), key_at);
                    let value = self.convert(&prop.value, child);
                    map.insert(key, value);
                }
                Value::Object(map)
            }
        }
    }
}

fn node_start(node: &ast::Value<'_>) -> usize {
    match node {
        ast::Value::StringLit(v) => v.range.start,
        ast::Value::NumberLit(v) => v.range.start,
        ast::Value::BooleanLit(v) => v.range.start,
        ast::Value::Object(v) => v.range.start,
        ast::Value::Array(v) => v.range.start,
        ast::Value::NullKeyword(v) => v.range.start,
    }
}

/// RFC 6901 escaping of one reference token.
pub fn escape_pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

struct LineIndex<'t> {
    text: &'t str,
    line_starts: Vec<usize>,
}

impl<'t> LineIndex<'t> {
    fn new(text: &'t str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Self { text, line_starts }
    }

    fn line_col(&self, offset: usize) -> LineCol {
        let line = self.line_starts.partition_point(|&start| start <= offset);
        let line_start = self.line_starts[line.saturating_sub(1)];
        let column = self
            .text
            .get(line_start..offset)
            .map_or(1, |prefix| prefix.chars().count() + 1);
        LineCol { line, column }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_trailing_commas_are_accepted() {
        let (value, _) = parse("{\n // c\n \"a\": [1, 2,], /* b */\n}").unwrap();
        assert_eq!(value, serde_json::json!({"a": [1, 2]}));
    }

    #[test]
    fn json5_looseness_is_rejected() {
        for text in [
            "{\"a\": 1 \"b\": 2}",
            "{\"a\": NaN}",
            "{'a': 1}",
            "{a: 1}",
            "{\"a\": 0x10}",
            "{\"a\": +1}",
            "{\"a\": .5}",
        ] {
            assert!(parse(text).is_err(), "accepted {text}");
        }
    }

    #[test]
    fn bare_nan_is_named_in_the_message() {
        let errors = parse("{\n  \"a\": NaN\n}").unwrap_err();
        assert_eq!(errors[0].at, Some(LineCol { line: 2, column: 8 }));
        assert!(errors[0].message.contains("`NaN` is not valid JSON"));
    }

    #[test]
    fn out_of_range_number_is_an_error_with_position() {
        let errors = parse("{\n  \"a\": 1e400\n}").unwrap_err();
        assert_eq!(errors[0].at, Some(LineCol { line: 2, column: 8 }));
    }

    #[test]
    fn locations_point_at_keys_and_elements() {
        let (_, locations) = parse("{\n  \"steps\": [\n    {\"name\": \"x\"}\n  ]\n}").unwrap();
        assert_eq!(
            locations.find("/steps"),
            Some(LineCol { line: 2, column: 3 })
        );
        assert_eq!(
            locations.find("/steps/0"),
            Some(LineCol { line: 3, column: 5 })
        );
        assert_eq!(
            locations.find("/steps/0/name"),
            Some(LineCol { line: 3, column: 6 })
        );
        assert_eq!(
            locations.find("/steps/0/nope/deeper"),
            Some(LineCol { line: 3, column: 5 })
        );
    }

    #[test]
    fn duplicate_keys_are_reported() {
        let errors = parse("{\"a\": 1,\n \"a\": 2}").unwrap_err();
        assert!(errors[0].message.contains("duplicate key `a`"));
        assert_eq!(errors[0].at, Some(LineCol { line: 2, column: 2 }));
    }
}
