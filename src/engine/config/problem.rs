//! Config problems: what was wrong and exactly where, so a user can jump to the spot.

use std::fmt;
use std::path::{Path, PathBuf};

use super::jsonc::LineCol;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub at: Option<LineCol>,
    pub step: Option<String>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(at) = self.at {
            write!(f, ":{at}")?;
        }
        write!(f, ": ")?;
        if let Some(step) = &self.step {
            write!(f, "step `{step}`: ")?;
        }
        write!(f, "{}", self.message)
    }
}

/// Every problem found in a config, in file order.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigErrors {
    pub problems: Vec<Problem>,
}

impl ConfigErrors {
    pub fn single(file: &Path, message: impl Into<String>) -> Self {
        Self {
            problems: vec![Problem {
                file: file.to_path_buf(),
                at: None,
                step: None,
                message: message.into(),
            }],
        }
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.problems.len();
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{problem}")?;
        }
        if count > 1 {
            write!(f, "\n{count} problems found")?;
        }
        Ok(())
    }
}

/// The closest candidate to `wrong`, if one is close enough to be what was meant.
pub fn did_you_mean<'a>(
    wrong: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|candidate| (strsim::jaro_winkler(wrong, candidate), candidate))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

/// `" (did you mean `x`?)"` or nothing.
pub fn hint<'a>(wrong: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    did_you_mean(wrong, candidates)
        .map(|near| format!(" (did you mean `{near}`?)"))
        .unwrap_or_default()
}
