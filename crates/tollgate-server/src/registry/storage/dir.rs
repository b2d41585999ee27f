//! The registry as a directory (`--registry-dir`): `domains/<domain>.json` per registered
//! domain (its [`Entry`], history included) and `revision`, the registry's last revision.
//!
//! Every write is atomic and durable: the new content goes to a temporary file in the same
//! directory, is flushed to disk (`fsync`), renamed over the old file (atomic on POSIX), and
//! the directory itself is flushed so the rename survives a crash. A reader (this process after
//! a restart) sees the old file or the new one, never a torn one. A removal is flushed the same
//! way. Domain names are restricted to `A-Z a-z 0-9 . _ : -` (see `valid_domain`), so a name is
//! its own file name.
//!
//! With a Redis registry the same directory is the local snapshot: written after each change
//! applied from Redis, read at start when Redis cannot be reached.

use super::{Entry, Snapshot};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A registry directory.
#[derive(Debug, Clone)]
pub(crate) struct DirStorage {
    dir: PathBuf,
}

impl DirStorage {
    /// Use `dir` (created when missing, with its `domains/` subdirectory).
    pub(crate) fn open(dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir.join("domains"))?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    fn entry_path(&self, domain: &str) -> PathBuf {
        self.dir.join("domains").join(format!("{domain}.json"))
    }

    /// Read the registry. A file that cannot be read or parsed is an error naming it (a
    /// registry that silently lost a domain would unlimit its traffic).
    pub(crate) fn load(&self) -> Result<Snapshot, String> {
        let mut snapshot = Snapshot::default();
        let revision_path = self.dir.join("revision");
        match fs::read_to_string(&revision_path) {
            Ok(text) => {
                snapshot.revision = text.trim().parse().map_err(|e| {
                    format!("{}: not a revision number: {e}", revision_path.display())
                })?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot read {}: {e}", revision_path.display())),
        }
        let domains = self.dir.join("domains");
        let listing = fs::read_dir(&domains)
            .map_err(|e| format!("cannot read {}: {e}", domains.display()))?;
        for item in listing {
            let item = item.map_err(|e| format!("cannot read {}: {e}", domains.display()))?;
            let path = item.path();
            let name = item.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue; // temporary files of an interrupted write, strays
            }
            let text = fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let entry: Entry = serde_json::from_str(&text)
                .map_err(|e| format!("{}: not a registry entry: {e}", path.display()))?;
            if entry.current().is_none() || format!("{}.json", entry.domain) != name {
                return Err(format!(
                    "{}: not a registry entry of its domain",
                    path.display()
                ));
            }
            let top = entry.versions.iter().map(|v| v.version).max().unwrap_or(0);
            snapshot.revision = snapshot.revision.max(top);
            snapshot.domains.insert(entry.domain.clone(), entry);
        }
        Ok(snapshot)
    }

    /// Write one domain's entry.
    pub(crate) fn write_entry(&self, entry: &Entry) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(entry).map_err(io::Error::other)?;
        write_atomic(&self.entry_path(&entry.domain), &bytes)
    }

    /// Remove one domain's entry (absent is fine).
    pub(crate) fn remove_entry(&self, domain: &str) -> io::Result<()> {
        match fs::remove_file(self.entry_path(domain)) {
            Ok(()) => sync_dir(&self.dir.join("domains")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Write the registry's revision.
    pub(crate) fn write_revision(&self, revision: u64) -> io::Result<()> {
        write_atomic(
            &self.dir.join("revision"),
            format!("{revision}\n").as_bytes(),
        )
    }

    /// Make the directory hold `new`, knowing it holds `old`: changed entries written, removed
    /// ones deleted, then the revision.
    pub(crate) fn write_snapshot(&self, old: &Snapshot, new: &Snapshot) -> io::Result<()> {
        for (name, entry) in &new.domains {
            if old.domains.get(name) != Some(entry) {
                self.write_entry(entry)?;
            }
        }
        for name in old.domains.keys() {
            if !new.domains.contains_key(name) {
                self.remove_entry(name)?;
            }
        }
        if old.revision != new.revision {
            self.write_revision(new.revision)?;
        }
        Ok(())
    }
}

/// Write `bytes` to `path` atomically and durably: temporary file, fsync, rename, fsync of the
/// directory.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(dir)
}

/// Flush a directory's entries (a rename or removal in it) to disk.
fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Version;
    use super::*;

    #[test]
    fn round_trip_and_snapshot_diff() {
        let dir = tollgate_testsupport::temp_dir("registry-dir-unit");
        let store = DirStorage::open(&dir).unwrap();
        assert_eq!(store.load().unwrap(), Snapshot::default());
        let entry = |d: &str, v: u64| Entry {
            domain: d.into(),
            versions: vec![Version {
                version: v,
                updated_at_ms: 5,
                updated_by: "127.0.0.1".into(),
                rules: format!("domain: {d}\n"),
            }],
        };
        let mut one = Snapshot {
            revision: 2,
            ..Snapshot::default()
        };
        one.domains.insert("a".into(), entry("a", 1));
        one.domains.insert("b".into(), entry("b", 2));
        store.write_snapshot(&Snapshot::default(), &one).unwrap();
        assert_eq!(store.load().unwrap(), one);
        let mut two = one.clone();
        two.revision = 3;
        two.domains.remove("a");
        store.write_snapshot(&one, &two).unwrap();
        assert_eq!(store.load().unwrap(), two);
        // No temporary file left behind.
        let names: Vec<String> = fs::read_dir(dir.join("domains"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["b.json"]);
        fs::write(dir.join("domains/c.json"), "{").unwrap();
        assert!(store.load().unwrap_err().contains("c.json"));
    }
}
