//! Rule validation errors.
//!
//! A rule file is written by a person and read by a program, so every problem is reported as
//! `file:line:column: message`, the format editors and CI annotators understand, and all the
//! problems of a load are collected into one [`RuleErrors`] so that a single `tollgate validate`
//! run shows everything to fix rather than one error per attempt.

use std::fmt;

/// One problem in a rule file, at the position of the offending YAML node.
///
/// Shown as `file:line:column: message`, or `file: message` when it concerns the whole file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct RuleError {
    /// The file name, as given to [`RuleSet::load`](super::RuleSet::load) or
    /// [`RuleSet::from_sources`](super::RuleSet::from_sources).
    pub file: String,
    /// 1-based line; 0 when the problem concerns the whole file (e.g. it cannot be read).
    pub line: usize,
    /// 1-based column; 0 when the problem concerns the whole file.
    pub column: usize,
    /// What is wrong, naming the field.
    pub message: String,
}

impl RuleError {
    /// A new error.
    pub(crate) fn new(
        file: impl Into<String>,
        line: usize,
        column: usize,
        message: impl Into<String>,
    ) -> Self {
        Self {
            file: file.into(),
            line,
            column,
            message: message.into(),
        }
    }
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file, self.line, self.column, self.message
            )
        }
    }
}

/// Every problem found while loading a rule set (never empty when returned as an error).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuleErrors(pub Vec<RuleError>);

impl RuleErrors {
    /// The errors, in file order then position order.
    pub fn iter(&self) -> std::slice::Iter<'_, RuleError> {
        self.0.iter()
    }

    /// Number of errors.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no errors.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for RuleErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RuleErrors {}

impl From<RuleError> for RuleErrors {
    fn from(e: RuleError) -> Self {
        RuleErrors(vec![e])
    }
}

impl IntoIterator for RuleErrors {
    type Item = RuleError;
    type IntoIter = std::vec::IntoIter<RuleError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a RuleErrors {
    type Item = &'a RuleError;
    type IntoIter = std::slice::Iter<'a, RuleError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}
