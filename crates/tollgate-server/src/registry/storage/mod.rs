//! Where registered domains are kept: only in memory, in a directory (`--registry-dir`), or in
//! Redis (with the directory as a local snapshot).
//!
//! Every backend stores the same [`Entry`] per domain (its current version first, then older
//! ones for rollback) and one registry-wide revision: a change takes the next revision as the
//! domain's version, so versions never repeat, even when a domain is deleted and registered
//! again, and a stale `If-Match` can never match by accident.

pub(crate) mod dir;
pub mod redis;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One version of a registered domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// The registry revision that made it.
    pub version: u64,
    /// When (ms since the Unix epoch).
    pub updated_at_ms: u64,
    /// The caller's address.
    pub updated_by: String,
    /// The rules (YAML or JSON text, one domain).
    pub rules: String,
}

/// A registered domain and its history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The domain.
    pub(crate) domain: String,
    /// Newest first; never empty.
    pub versions: Vec<Version>,
}

impl Entry {
    /// The current version.
    pub(crate) fn current(&self) -> Option<&Version> {
        self.versions.first()
    }
}

/// The whole registry at one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The revision of the last change (0: none yet).
    pub revision: u64,
    /// The domains, by name.
    pub domains: BTreeMap<String, Entry>,
}

/// What a write expects to find (`If-Match`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Anything (no `If-Match`).
    Any,
    /// The domain exists (`If-Match: *`).
    Exists,
    /// The domain is at this version.
    Version(u64),
}

impl Expect {
    /// Whether a domain at `current` (`None`: absent) meets the expectation.
    pub(crate) fn met_by(self, current: Option<u64>) -> bool {
        match self {
            Expect::Any => true,
            Expect::Exists => current.is_some(),
            Expect::Version(v) => current == Some(v),
        }
    }
}

/// Why a write was refused by the storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The expectation was not met; the current version.
    Stale(Option<u64>),
    /// The domain cap is reached.
    Full,
    /// The domain is not registered (delete).
    NotFound,
    /// Redis: the shared registry is behind the revision the writer knows (Redis lost
    /// changes); the writer restores it and tries again.
    Behind,
}

/// `snapshot` with `domain` set to `version` (made the newest, history trimmed to `history`
/// versions), checking `expect` and the `max_domains` cap: the write of the memory and
/// directory backends (Redis does the same in a script).
pub(crate) fn put(
    snapshot: &Snapshot,
    domain: &str,
    mut version: Version,
    expect: Expect,
    max_domains: usize,
    history: usize,
) -> Result<(Snapshot, Entry), Refused> {
    let current = snapshot
        .domains
        .get(domain)
        .and_then(|e| e.current())
        .map(|v| v.version);
    if !expect.met_by(current) {
        return Err(Refused::Stale(current));
    }
    if current.is_none() && snapshot.domains.len() >= max_domains {
        return Err(Refused::Full);
    }
    let mut next = snapshot.clone();
    next.revision += 1;
    version.version = next.revision;
    let entry = next
        .domains
        .entry(domain.to_string())
        .or_insert_with(|| Entry {
            domain: domain.to_string(),
            versions: Vec::new(),
        });
    entry.versions.insert(0, version);
    entry.versions.truncate(history.max(1));
    let entry = entry.clone();
    Ok((next, entry))
}

/// `snapshot` without `domain`, checking `expect`.
pub(crate) fn delete(
    snapshot: &Snapshot,
    domain: &str,
    expect: Expect,
) -> Result<Snapshot, Refused> {
    let current = snapshot
        .domains
        .get(domain)
        .and_then(|e| e.current())
        .map(|v| v.version);
    if current.is_none() {
        return Err(Refused::NotFound);
    }
    if !expect.met_by(current) {
        return Err(Refused::Stale(current));
    }
    let mut next = snapshot.clone();
    next.revision += 1;
    next.domains.remove(domain);
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(rules: &str) -> Version {
        Version {
            version: 0,
            updated_at_ms: 1,
            updated_by: "127.0.0.1".into(),
            rules: rules.into(),
        }
    }

    #[test]
    fn versions_never_repeat_and_history_is_trimmed() {
        let s = Snapshot::default();
        let (s, e) = put(&s, "a", v("1"), Expect::Any, 10, 2).unwrap();
        assert_eq!(e.current().unwrap().version, 1);
        let (s, _) = put(&s, "a", v("2"), Expect::Version(1), 10, 2).unwrap();
        let (s, e) = put(&s, "a", v("3"), Expect::Exists, 10, 2).unwrap();
        assert_eq!(
            e.versions.iter().map(|v| v.version).collect::<Vec<_>>(),
            [3, 2]
        );
        assert_eq!(
            put(&s, "a", v("x"), Expect::Version(2), 10, 2).unwrap_err(),
            Refused::Stale(Some(3))
        );
        let s = delete(&s, "a", Expect::Any).unwrap();
        assert_eq!(delete(&s, "a", Expect::Any).unwrap_err(), Refused::NotFound);
        let (s, e) = put(&s, "a", v("4"), Expect::Any, 10, 2).unwrap();
        assert_eq!(e.current().unwrap().version, 5);
        assert_eq!(
            put(&s, "b", v("b"), Expect::Any, 1, 2).unwrap_err(),
            Refused::Full
        );
        assert_eq!(
            put(&s, "b", v("b"), Expect::Exists, 10, 2).unwrap_err(),
            Refused::Stale(None)
        );
    }
}
