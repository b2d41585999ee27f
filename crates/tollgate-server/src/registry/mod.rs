//! The rule registry: services register their limits at run time over the HTTP API
//! (`/v1/domains`), the registry validates and stores them, and every instance serves them.
//!
//! - **One owner per domain.** A domain is defined by a rules file or by the registry, never
//!   both: a write to a file's domain is refused (409 naming the file), and should a file later
//!   define a registered domain, the file wins on the instances that have it (a WARN says which
//!   registered domain it hides). `combine` builds the running rules that way.
//! - **Same rules, same checks.** A body is a rules file for one domain (YAML or JSON, or the
//!   service-registration shape of `shape`), validated by the same parser with the same
//!   messages, positions inside the body.
//! - **Same swap.** A change is applied like a file reload: the files already loaded and the
//!   registered domains make one rule set, swapped in atomically, so counters of unchanged
//!   limits keep their state. Each domain is parsed once per version and the files once per
//!   reload (a change parses only its domain), on a blocking thread (`AppState::admin_work`).
//! - **Storage** ([`storage`]): memory only, a directory, or Redis (shared by every instance,
//!   followed through a channel and a polled revision key, with the directory as a local
//!   snapshot for a start while Redis is down). When Redis loses the registry (flushed,
//!   restarted empty), the instances write back what they know (`Registry::sync_redis`).
//! - **Security.** Writes need the admin token (bearer, compared in constant time on SHA-256
//!   digests, so neither content nor length leak through timing); it is never logged. Each
//!   change is logged (target `tollgate::audit`: domain, old and new version, caller) and
//!   counted; bodies, domains and descriptors are capped.

pub(crate) mod error;
pub(crate) mod shape;
pub mod storage;

use crate::exposition::{Exposition, Kind};
use crate::metrics::RuleSlots;
use crate::state::{AppState, LoadedRules};
use error::RegistryError;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use storage::dir::DirStorage;
use storage::redis::RedisRegistry;
use storage::{Entry, Expect, Refused, Snapshot, Version};
use tokio::sync::watch;
use tollgate_core::clock::{Clock, SystemClock};
use tollgate_core::rules::{LoadOptions, RuleError, RuleErrors, RuleSet};

/// `tollgate serve`'s registry settings (`--admin-token-file`, `--registry-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryConfig {
    /// File holding the admin token; without it the registry answers no request (its rules
    /// are still served).
    pub token_file: Option<PathBuf>,
    /// The registry directory (memory store), or the local snapshot (Redis store).
    pub dir: Option<PathBuf>,
    /// Most domains the registry holds.
    pub max_domains: usize,
    /// Most descriptors (at every depth) of one registered domain.
    pub max_descriptors: usize,
    /// Largest body of a `PUT`, in bytes.
    pub max_body_bytes: usize,
    /// Versions kept per domain (the current one included).
    pub history: usize,
    /// Redis: how often the revision key is polled.
    pub poll_interval: Duration,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            token_file: None,
            dir: None,
            max_domains: 1000,
            max_descriptors: 1000,
            max_body_bytes: 256 * 1024,
            history: 10,
            poll_interval: Duration::from_millis(250),
        }
    }
}

impl RegistryConfig {
    /// Whether the registry runs: an admin token or a registry directory is configured.
    pub(crate) fn enabled(&self) -> bool {
        self.token_file.is_some() || self.dir.is_some()
    }
}

/// The file name registered domains carry in the running rules (`registry:<domain>`), shown
/// as their source by `/v1/rules`.
pub(crate) fn source_name(domain: &str) -> String {
    format!("registry:{domain}")
}

/// Whether a domain's file name is a registered domain's ([`source_name`]).
pub(crate) fn is_registered_source(file: &str) -> bool {
    file.starts_with("registry:")
}

/// A registered domain as the running rules take it.
#[derive(Debug, Clone)]
pub(crate) struct Registered {
    /// The domain.
    pub(crate) domain: String,
    /// Its rules text.
    pub(crate) rules: String,
    /// Its rules, already parsed and validated (as `registry:<domain>`), when known: a
    /// rebuild then parses only the domains that changed.
    pub(crate) compiled: Option<Arc<RuleSet>>,
}

/// The rule set of the files (`files` as read, `read_errors` the files that could not be) and
/// the registered domains no file defines (a file's domain hides a registered one). Only the
/// files can make it fail: registered domains were validated when stored.
pub(crate) fn combine(
    files: &[(String, String)],
    read_errors: Vec<RuleError>,
    registered: &[Registered],
    options: LoadOptions,
) -> Result<RuleSet, RuleErrors> {
    let file_set = RuleSet::from_read_sources(files, read_errors, options)?;
    combine_parsed(&file_set, registered)
}

/// [`combine`] on the files' rule set already parsed: the registered domains are added as
/// they were compiled ([`Registered::compiled`]; parsed here only when not), so the cost is
/// a copy of the rules, not a parse of every domain.
fn combine_parsed(file_set: &RuleSet, registered: &[Registered]) -> Result<RuleSet, RuleErrors> {
    let mut parsed: Vec<RuleSet> = Vec::new();
    let mut compiled: Vec<&RuleSet> = Vec::new();
    for r in registered {
        if let Some(d) = file_set.domain(&r.domain) {
            tracing::warn!(
                domain = %r.domain,
                file = %d.file,
                "registered domain hidden by a rules file defining it (the file owns it)"
            );
            continue;
        }
        match &r.compiled {
            Some(set) => compiled.push(set),
            None => parsed.push(RuleSet::from_sources(&[(
                source_name(&r.domain),
                r.rules.clone(),
            )])?),
        }
    }
    if compiled.is_empty() && parsed.is_empty() {
        return Ok(file_set.clone());
    }
    let parts: Vec<&RuleSet> = std::iter::once(file_set)
        .chain(compiled)
        .chain(parsed.iter())
        .collect();
    RuleSet::merged(&parts)
}

/// Whether `name` can be registered: 1 to 128 of `A-Z a-z 0-9 . _ : -`, not starting with `.`
/// (a domain name is a file name in the registry directory, and a URL path segment).
pub(crate) fn valid_domain(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

/// Where the registry keeps its domains.
#[derive(Debug)]
enum Backing {
    Memory,
    Dir(DirStorage),
    Redis {
        redis: RedisRegistry,
        snapshot: Option<DirStorage>,
    },
}

/// Counters of the registry (rendered by `/metrics`).
#[derive(Debug, Default)]
struct Counters {
    puts: AtomicU64,
    deletes: AtomicU64,
    syncs_ok: AtomicU64,
    syncs_failed: AtomicU64,
    restores: AtomicU64,
}

/// Rule file texts and the rule set parsed from them.
type ParsedFiles = (Arc<[(String, String)]>, Arc<RuleSet>);

/// A running registry, shared by the HTTP API that serves it and the rules watcher.
#[derive(Debug)]
pub struct Registry {
    config: RegistryConfig,
    token: Option<[u8; 32]>,
    backing: Backing,
    /// The registry as last installed, less the domains that do not validate here (served).
    snapshot: RwLock<Arc<Snapshot>>,
    /// The registry as last installed, all of it: what is written back into a Redis that lost
    /// it (an instance that cannot serve a domain, an older version, must not drop it).
    stored: RwLock<Arc<Snapshot>>,
    writes: tokio::sync::Mutex<()>,
    /// Each served registered domain's rules, parsed and validated, with the version they are
    /// of: a change re-parses only the domains whose version moved.
    compiled: std::sync::Mutex<BTreeMap<String, (u64, Arc<RuleSet>)>>,
    /// The files' rule set last built, and the file texts it was built from (compared by
    /// pointer: a file reload replaces them).
    files: std::sync::Mutex<Option<ParsedFiles>>,
    counters: Counters,
    /// Redis: whether the last look at Redis failed (a WARN is logged on each transition).
    redis_down: AtomicBool,
    /// Kept in memory only: whether the first registration warned that it is lost on restart.
    warned_memory: AtomicBool,
}

/// How a `PUT` went (or would go, on a dry run).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct PutOutcome {
    /// The domain.
    pub(crate) domain: String,
    /// Whether the domain was new.
    pub(crate) created: bool,
    /// Nothing was stored (`?dry_run=true`).
    pub(crate) dry_run: bool,
    /// The version before (`None`: new).
    pub(crate) previous_version: Option<u64>,
    /// The version now (`None` on a dry run).
    pub(crate) version: Option<u64>,
    /// What changed, limit by limit.
    pub(crate) changes: Changes,
}

/// The limits a change adds, removes and changes (each described in one line).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct Changes {
    /// Limits that are new (`id: description`).
    pub(crate) added: Vec<String>,
    /// Limits that are gone.
    pub(crate) removed: Vec<String>,
    /// Limits whose settings change.
    pub(crate) changed: Vec<Changed>,
    /// How many limits stay as they are (their counters keep their state).
    pub(crate) unchanged: usize,
}

/// One changed limit.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Changed {
    /// The rule's id.
    pub(crate) id: String,
    /// Its settings before.
    pub(crate) from: String,
    /// Its settings after.
    pub(crate) to: String,
}

/// One line describing a limit's settings.
fn describe(l: &tollgate_core::rules::Limit) -> String {
    let mut s = match l.quota {
        None => "unlimited".to_string(),
        Some(q) => {
            let p = q.period();
            let unit = if p.multiplier == 1 {
                p.unit.as_str().to_string()
            } else {
                format!("{} {}s", p.multiplier, p.unit.as_str())
            };
            format!("{} per {unit} ({})", q.limit(), q.algorithm().as_str())
        }
    };
    for (on, what) in [
        (l.shadow_mode, "shadow_mode"),
        (l.quota_mode, "quota_mode"),
        (l.share_threshold, "share_threshold"),
        (l.shadowban, "shadowban"),
    ] {
        if on {
            s.push_str(", ");
            s.push_str(what);
        }
    }
    if let Some(t) = &l.degrade {
        s.push_str(&format!(", degrade below {t} remaining"));
    }
    if let Some(t) = &l.tiers {
        s.push_str(&format!(", tiers by {:?}:", t.key));
        for v in &t.levels {
            s.push_str(&format!(
                " {:?} {}/{}/{}",
                v.value, v.guaranteed, v.ceiling, v.reserve
            ));
        }
    }
    if let Some(m) = &l.message {
        s.push_str(&format!(", message {m:?}"));
    }
    if let Some(n) = &l.name {
        s.push_str(&format!(", name {n:?}"));
    }
    s
}

/// What changes in `domain` from `old` to `new`.
fn diff(old: &RuleSet, new: &RuleSet, domain: &str) -> Changes {
    let limits = |set: &RuleSet| -> BTreeMap<String, String> {
        set.limits()
            .filter(|l| l.domain == domain)
            .map(|l| (l.id.clone(), describe(l)))
            .collect()
    };
    let (before, after) = (limits(old), limits(new));
    let mut changes = Changes::default();
    for (id, to) in &after {
        match before.get(id) {
            None => changes.added.push(format!("{id}: {to}")),
            Some(from) if from != to => changes.changed.push(Changed {
                id: id.clone(),
                from: from.clone(),
                to: to.clone(),
            }),
            Some(_) => changes.unchanged += 1,
        }
    }
    for (id, from) in &before {
        if !after.contains_key(id) {
            changes.removed.push(format!("{id}: {from}"));
        }
    }
    changes
}

/// The time now, in ms since the epoch (the wall clock: a record for humans).
fn now_ms() -> u64 {
    SystemClock.now() / 1000
}

/// Read the admin token: the file's content, surrounding whitespace trimmed; empty is an error.
pub fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read the admin token file {}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        anyhow::bail!("the admin token file {} is empty", path.display());
    }
    Ok(token.to_string())
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl Registry {
    fn new(config: RegistryConfig, token: Option<&str>, backing: Backing) -> Self {
        Self {
            config,
            token: token.map(|t| digest(t.as_bytes())),
            backing,
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            stored: RwLock::new(Arc::new(Snapshot::default())),
            writes: tokio::sync::Mutex::new(()),
            compiled: std::sync::Mutex::new(BTreeMap::new()),
            files: std::sync::Mutex::new(None),
            counters: Counters::default(),
            redis_down: AtomicBool::new(false),
            warned_memory: AtomicBool::new(false),
        }
    }

    /// A registry kept in memory, empty, whose admin token is `token`: what `start` opens
    /// without `--registry-dir` or Redis, for embedding the API (and tests) without a token
    /// file.
    pub fn in_memory(token: &str) -> Arc<Self> {
        Arc::new(Self::new(
            RegistryConfig::default(),
            Some(token),
            Backing::Memory,
        ))
    }

    /// The settings.
    pub(crate) fn config(&self) -> &RegistryConfig {
        &self.config
    }

    /// The registry as last applied.
    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The registry as last installed, domains that do not validate here included.
    fn stored(&self) -> Arc<Snapshot> {
        self.stored
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_snapshot(&self, snapshot: Snapshot) {
        *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(snapshot);
    }

    /// The registered domains, as the running rules take them.
    pub(crate) fn registered(&self) -> Vec<Registered> {
        let compiled = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        self.snapshot()
            .domains
            .values()
            .filter_map(|e| {
                e.current().map(|v| Registered {
                    domain: e.domain.clone(),
                    rules: v.rules.clone(),
                    compiled: compiled
                        .get(&e.domain)
                        .filter(|(version, _)| *version == v.version)
                        .map(|(_, set)| set.clone()),
                })
            })
            .collect()
    }

    /// Where the registry lives: `memory`, `directory`, or `redis`.
    pub(crate) fn storage_kind(&self) -> &'static str {
        match self.backing {
            Backing::Memory => "memory",
            Backing::Dir(_) => "directory",
            Backing::Redis { .. } => "redis",
        }
    }

    /// Whether an admin token is configured (without one, no registry request is answered).
    pub(crate) fn writable(&self) -> bool {
        self.token.is_some()
    }

    /// Whether `token` is the admin token, compared in constant time (on SHA-256 digests);
    /// `None` when no token is configured.
    pub(crate) fn token_matches(&self, token: &[u8]) -> Option<bool> {
        use subtle::ConstantTimeEq;
        let expected = self.token.as_ref()?;
        Some(bool::from(digest(token.trim_ascii()).ct_eq(expected)))
    }

    /// Check a request's `Authorization` header value: the admin token as a bearer token.
    pub(crate) fn authorize(&self, authorization: Option<&[u8]>) -> Result<(), RegistryError> {
        let Some(expected) = &self.token else {
            return Err(RegistryError::WritesOff(
                "no admin token is configured (start serve with --admin-token-file)",
            ));
        };
        let Some(value) = authorization else {
            return Err(RegistryError::Unauthenticated);
        };
        let token = value
            .strip_prefix(b"Bearer ")
            .or_else(|| value.strip_prefix(b"bearer "))
            .ok_or(RegistryError::Unauthenticated)?;
        use subtle::ConstantTimeEq;
        if bool::from(digest(token.trim_ascii()).ct_eq(expected)) {
            Ok(())
        } else {
            Err(RegistryError::WrongToken)
        }
    }

    /// Validate `rules` as the rules of `domain` on `state`'s store: the rule set of the body,
    /// as file `file` (`body` for positions in a request's body, [`source_name`] to serve it).
    fn validate(
        &self,
        state: &AppState,
        domain: &str,
        rules: &str,
        caps: bool,
        file: &str,
    ) -> Result<RuleSet, RegistryError> {
        let set = RuleSet::from_sources(&[(file.to_string(), rules.to_string())])
            .map_err(RegistryError::InvalidRules)?;
        let Some(d) = set.domains().next() else {
            return Err(RegistryError::InvalidBody(
                "the body defines no domain".into(),
            ));
        };
        if d.name != domain {
            return Err(RegistryError::DomainMismatch {
                body: d.name.clone(),
                path: domain.to_string(),
            });
        }
        if caps && d.descriptor_count() > self.config.max_descriptors {
            return Err(RegistryError::TooManyDescriptors {
                count: d.descriptor_count(),
                max: self.config.max_descriptors,
            });
        }
        let problems = state.backend().unsupported(&set);
        if !problems.is_empty() {
            return Err(RegistryError::Unsupported(problems.join("; ")));
        }
        Ok(set)
    }

    /// Install `snapshot` (entries that no longer validate are dropped, each with an ERROR) and
    /// apply it to `state`: on a blocking thread ([`AppState::admin_work`]), so that however
    /// many limits there are, no runtime worker waits for the rebuild.
    async fn install(self: &Arc<Self>, state: &AppState, snapshot: Snapshot) {
        let (me, st) = (self.clone(), state.clone());
        if state
            .admin_work(move || me.install_now(&st, snapshot))
            .await
            .is_none()
        {
            tracing::error!("registry: the rebuild failed; keeping the running rules");
        }
    }

    fn install_now(&self, state: &AppState, mut snapshot: Snapshot) {
        *self.stored.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(snapshot.clone());
        let mut compiled = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = BTreeMap::new();
        snapshot.domains.retain(|name, entry| {
            let Some(v) = entry.current() else {
                return false;
            };
            if let Some(known) = compiled.remove(name).filter(|(ver, _)| *ver == v.version) {
                next.insert(name.clone(), known);
                return true;
            }
            match self.validate(state, name, &v.rules, false, &source_name(name)) {
                Ok(set) => {
                    next.insert(name.clone(), (v.version, Arc::new(set)));
                    true
                }
                Err(e) => {
                    tracing::error!(domain = %name, version = v.version, error = %e,
                        "registered domain is not valid here; not served");
                    false
                }
            }
        });
        *compiled = next;
        drop(compiled);
        self.set_snapshot(snapshot);
        self.apply(state);
    }

    /// The rule set of the running files, parsed once per file reload.
    fn file_set(
        &self,
        running: &LoadedRules,
        state: &AppState,
    ) -> Result<Arc<RuleSet>, RuleErrors> {
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((sources, set)) = files.as_ref() {
            if Arc::ptr_eq(sources, &running.file_sources) {
                return Ok(set.clone());
            }
        }
        let set = Arc::new(RuleSet::from_read_sources(
            &running.file_sources,
            Vec::new(),
            state.rule_listing(),
        )?);
        *files = Some((running.file_sources.clone(), set.clone()));
        Ok(set)
    }

    /// Swap in the running files' rules with the registered domains (counters of unchanged
    /// limits keep their state). On failure the running rules stay (and an ERROR says why).
    /// Only the domains whose version changed are parsed ([`Registry::install`]); the rest is
    /// a copy.
    fn apply(&self, state: &AppState) -> bool {
        let _update = state.rules_update_lock();
        let running = state.rules();
        let registered = self.registered();
        let set = match self
            .file_set(&running, state)
            .and_then(|files| combine_parsed(&files, &registered))
        {
            Ok(set) => set.with_defaults(running.set.defaults()),
            Err(e) => {
                tracing::error!(error = %e, "registry: cannot apply; keeping the running rules");
                return false;
            }
        };
        let generation = running.generation + 1;
        tracing::info!(
            generation,
            registered = registered.len(),
            domains = set.domains().count(),
            limits = set.limits().count(),
            "registry applied"
        );
        state.replace_rules(LoadedRules {
            counters: RuleSlots::new(&set),
            stats: crate::stats::StatSlots::new(&set),
            set,
            hash: running.hash.clone(),
            generation,
            loaded_at: SystemClock.now(),
            file_sources: running.file_sources.clone(),
        });
        // The new generation is listed with the reloads, where the dashboard looks for it.
        state.stats().registry_applied(state.now(), generation);
        true
    }

    /// Register (or replace) `domain` with `body` (rules, or the service-registration shape).
    pub(crate) async fn put(
        self: &Arc<Self>,
        state: &AppState,
        domain: &str,
        body: &str,
        expect: Expect,
        dry_run: bool,
        caller: &str,
    ) -> Result<PutOutcome, RegistryError> {
        if !valid_domain(domain) {
            return Err(RegistryError::InvalidDomain(domain.to_string()));
        }
        let rules = if shape::is_service_shape(body) {
            shape::to_rules(domain, body)?
        } else {
            body.to_string()
        };
        let new_set = self.validate(state, domain, &rules, true, "body")?;
        self.check_owner(state, domain)?;
        let _write = self.writes.lock().await;
        let snapshot = self.snapshot();
        let current = snapshot
            .domains
            .get(domain)
            .and_then(Entry::current)
            .map(|v| v.version);
        let (max, history) = (self.config.max_domains, self.config.history);
        let shared = match &self.backing {
            Backing::Redis { redis, .. } if !dry_run => Some(redis),
            _ => None,
        };
        // This instance's view decides for a local registry (writes are serialised by
        // `writes`) and for a dry run; Redis decides for a shared one, in the write's own step.
        if shared.is_none() {
            if !expect.met_by(current) {
                return Err(stale(domain, expect, current));
            }
            if current.is_none() && snapshot.domains.len() >= max {
                return Err(RegistryError::TooManyDomains { max });
            }
        }
        let version = Version {
            version: 0,
            updated_at_ms: now_ms(),
            updated_by: caller.to_string(),
            rules,
        };
        let outcome = |previous: Option<u64>, old: &RuleSet, written: Option<u64>| PutOutcome {
            domain: domain.to_string(),
            created: previous.is_none(),
            dry_run,
            previous_version: previous,
            version: written,
            changes: diff(old, &new_set, domain),
        };
        if dry_run {
            return Ok(outcome(current, &state.rules().set, None));
        }
        let outcome = match (&self.backing, shared) {
            (Backing::Redis { .. }, Some(redis)) => {
                let written = self
                    .write_redis(state, redis, |known| {
                        redis.put(domain, &version, expect, max, history, known)
                    })
                    .await?
                    .map_err(|r| refused(domain, expect, r, max))?;
                // The diff against the version this write replaced, as Redis had it.
                let old = written
                    .previous
                    .as_ref()
                    .and_then(|p| {
                        RuleSet::from_sources(&[(source_name(domain), p.rules.clone())]).ok()
                    })
                    .unwrap_or_default();
                outcome(
                    written.previous.as_ref().map(|p| p.version),
                    &old,
                    Some(written.version),
                )
            }
            _ => {
                let old = outcome(current, &state.rules().set, None);
                let (next, entry) = storage::put(&snapshot, domain, version, expect, max, history)
                    .map_err(|r| refused(domain, expect, r, max))?;
                self.write_dir(|dir| {
                    dir.write_entry(&entry)
                        .and_then(|()| dir.write_revision(next.revision))
                })?;
                let v = next.revision;
                self.install(state, next).await;
                if matches!(self.backing, Backing::Memory)
                    && !self.warned_memory.swap(true, Relaxed)
                {
                    tracing::warn!(
                        domain,
                        "registry kept in memory only (no --registry-dir): registered domains \
                         are lost on restart"
                    );
                }
                PutOutcome {
                    version: Some(v),
                    ..old
                }
            }
        };
        self.counters.puts.fetch_add(1, Relaxed);
        if let Some(v) = outcome.version {
            state
                .stats()
                .registry_changed(state.now(), "put", domain, v);
        }
        tracing::info!(
            target: "tollgate::audit",
            action = "put",
            domain,
            old_version = outcome.previous_version.unwrap_or(0),
            new_version = outcome.version.unwrap_or(0),
            caller,
            "registry change"
        );
        Ok(outcome)
    }

    /// Unregister `domain`; the new registry revision.
    pub(crate) async fn delete(
        self: &Arc<Self>,
        state: &AppState,
        domain: &str,
        expect: Expect,
        caller: &str,
    ) -> Result<(u64, u64), RegistryError> {
        self.check_owner(state, domain)?;
        let _write = self.writes.lock().await;
        let snapshot = self.snapshot();
        let mut current = snapshot
            .domains
            .get(domain)
            .and_then(Entry::current)
            .map(|v| v.version);
        let max = self.config.max_domains;
        let revision = match &self.backing {
            Backing::Memory | Backing::Dir(_) => {
                let next = storage::delete(&snapshot, domain, expect)
                    .map_err(|r| refused(domain, expect, r, max))?;
                self.write_dir(|dir| {
                    dir.remove_entry(domain)
                        .and_then(|()| dir.write_revision(next.revision))
                })?;
                let v = next.revision;
                self.install(state, next).await;
                v
            }
            Backing::Redis { redis, .. } => {
                let (revision, deleted) = self
                    .write_redis(state, redis, |known| redis.delete(domain, expect, known))
                    .await?
                    .map_err(|r| refused(domain, expect, r, max))?;
                // The version Redis deleted (this instance's view may be behind).
                current = Some(deleted);
                revision
            }
        };
        let old = current.unwrap_or(0);
        self.counters.deletes.fetch_add(1, Relaxed);
        state
            .stats()
            .registry_changed(state.now(), "delete", domain, revision);
        tracing::info!(
            target: "tollgate::audit",
            action = "delete",
            domain,
            old_version = old,
            new_version = revision,
            caller,
            "registry change"
        );
        Ok((old, revision))
    }

    /// Write to the registry directory, when that is the storage.
    fn write_dir(
        &self,
        write: impl FnOnce(&DirStorage) -> std::io::Result<()>,
    ) -> Result<(), RegistryError> {
        let Backing::Dir(dir) = &self.backing else {
            return Ok(());
        };
        write(dir).map_err(|e| {
            RegistryError::Storage(format!("cannot write to {}: {e}", dir.path().display()))
        })
    }

    /// One write script on Redis, given the revision this instance knows: when Redis is behind
    /// it (it lost the registry), write the registry back once and retry; then follow Redis.
    async fn write_redis<T, F, Fut>(
        self: &Arc<Self>,
        state: &AppState,
        redis: &RedisRegistry,
        write: F,
    ) -> Result<Result<T, Refused>, RegistryError>
    where
        F: Fn(u64) -> Fut,
        Fut: std::future::Future<Output = Result<Result<T, Refused>, tollgate_core::StoreError>>,
    {
        let mut restored = false;
        let written = loop {
            match write(self.stored().revision).await? {
                Err(Refused::Behind) if !restored => {
                    restored = true;
                    self.restore_redis(redis).await?;
                    self.sync_redis(state).await;
                }
                r => break r,
            }
        };
        self.sync_redis(state).await;
        Ok(written)
    }

    /// 409 when a rules file defines `domain`.
    fn check_owner(&self, state: &AppState, domain: &str) -> Result<(), RegistryError> {
        let rules = state.rules();
        match rules.set.domain(domain) {
            Some(d) if !is_registered_source(&d.file) => Err(RegistryError::FileOwned {
                domain: domain.to_string(),
                file: d.file.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Redis: load the registry and apply it when it changed. Returns whether Redis answered.
    ///
    /// Revisions only grow, so a Redis without a revision key while this instance knows one
    /// above 0 (deleting every domain keeps the key), or at a lower revision than this instance
    /// knows, lost changes (flushed, restarted without persistence, failed over to a lagging
    /// replica, restored from an old backup). Applying it would silently drop registered
    /// limits; instead this instance writes back what it knows ([`RedisRegistry::restore`],
    /// only while Redis is still behind it, so racing instances write once and the newest
    /// knowledge wins) and then applies what Redis holds.
    pub(crate) async fn sync_redis(self: &Arc<Self>, state: &AppState) -> bool {
        let Backing::Redis { redis, snapshot } = &self.backing else {
            return true;
        };
        for attempt in 0..2 {
            let loaded = match redis.load().await {
                Ok(loaded) => loaded,
                Err(e) => {
                    self.redis_failed(&e);
                    return false;
                }
            };
            self.counters.syncs_ok.fetch_add(1, Relaxed);
            if self.redis_down.swap(false, Relaxed) {
                tracing::info!("registry: Redis answers again");
            }
            let stored = self.stored();
            if loaded.as_ref().map_or(0, |l| l.revision) < stored.revision {
                if attempt == 0 {
                    if let Err(e) = self.restore_redis(redis).await {
                        self.redis_failed(&e);
                        return false;
                    }
                    continue;
                }
                // Lost again in between: the next look tries again.
                return true;
            }
            let Some(loaded) = loaded else {
                return true;
            };
            if loaded == *stored {
                return true;
            }
            if let Some(dir) = snapshot {
                if let Err(e) = dir.write_snapshot(&stored, &loaded) {
                    tracing::warn!(dir = %dir.path().display(), error = %e,
                        "registry: cannot write the local snapshot");
                }
            }
            tracing::info!(
                revision = loaded.revision,
                domains = loaded.domains.len(),
                "registry: applying a change from Redis"
            );
            self.install(state, loaded).await;
            return true;
        }
        true
    }

    /// Redis: write back the registry this instance knows if Redis is behind it (see
    /// [`Registry::sync_redis`]); a WARN and `tollgate_registry_restores_total` when it was.
    async fn restore_redis(&self, redis: &RedisRegistry) -> Result<(), RegistryError> {
        let stored = self.stored();
        if stored.revision == 0 {
            return Ok(());
        }
        if let Some(before) = redis.restore(&stored).await? {
            self.counters.restores.fetch_add(1, Relaxed);
            tracing::warn!(
                revision = stored.revision,
                redis_revision = before,
                domains = stored.domains.len(),
                "registry: Redis had lost registry changes (flushed, restarted without \
                 persistence, or back at an older state); wrote back the registry this \
                 instance knows"
            );
        }
        Ok(())
    }

    /// Count a failed look at Redis; a WARN when Redis was answering until now.
    fn redis_failed(&self, e: &dyn std::fmt::Display) {
        self.counters.syncs_failed.fetch_add(1, Relaxed);
        if !self.redis_down.swap(true, Relaxed) {
            tracing::warn!(error = %e,
                "registry: cannot read the registry from Redis; keeping the running rules");
        }
    }

    /// The registry's families on `/metrics`.
    pub(crate) fn expose(&self, out: &mut Exposition) {
        let snapshot = self.snapshot();
        let c = &self.counters;
        out.family(
            "tollgate_registry_changes_total",
            Kind::Counter,
            "Registry changes made through this instance, by action.",
        )
        .sample(&[("action", "put")], c.puts.load(Relaxed))
        .sample(&[("action", "delete")], c.deletes.load(Relaxed));
        out.single(
            "tollgate_registry_domains",
            Kind::Gauge,
            "Domains in the registry as last applied.",
            snapshot.domains.len(),
        );
        out.single(
            "tollgate_registry_revision",
            Kind::Gauge,
            "The registry's revision as last applied.",
            snapshot.revision,
        );
        if let Backing::Redis { .. } = self.backing {
            out.family(
                "tollgate_registry_syncs_total",
                Kind::Counter,
                "Reads of the registry from Redis, by result.",
            )
            .sample(&[("result", "ok")], c.syncs_ok.load(Relaxed))
            .sample(&[("result", "failure")], c.syncs_failed.load(Relaxed));
            out.single(
                "tollgate_registry_restores_total",
                Kind::Counter,
                "Times this instance wrote the registry back into a Redis that had lost changes.",
                c.restores.load(Relaxed),
            );
        }
    }
}

fn stale(domain: &str, expect: Expect, current: Option<u64>) -> RegistryError {
    RegistryError::Stale {
        domain: domain.to_string(),
        expected: match expect {
            Expect::Version(v) => v.to_string(),
            Expect::Exists | Expect::Any => "any version".into(),
        },
        current,
    }
}

fn refused(domain: &str, expect: Expect, r: Refused, max: usize) -> RegistryError {
    match r {
        Refused::Stale(current) => stale(domain, expect, current),
        Refused::Full => RegistryError::TooManyDomains { max },
        Refused::NotFound => RegistryError::NotFound(domain.to_string()),
        Refused::Behind => RegistryError::Storage(
            "the registry in Redis lost changes and could not be written back yet".into(),
        ),
    }
}

/// Start the registry of `config` on `state` (nothing when it is off): open its storage, load
/// the registered domains (from Redis, or the local snapshot when Redis cannot be reached),
/// apply them, and with Redis follow the changes until `shutdown`. `store_url` is `--store` (for
/// the change subscription; never logged).
pub(crate) async fn start(
    state: &AppState,
    config: &RegistryConfig,
    store_url: &str,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Option<Running>> {
    if !config.enabled() {
        return Ok(None);
    }
    if config.max_domains == 0 || config.max_descriptors == 0 || config.max_body_bytes == 0 {
        anyhow::bail!(
            "--registry-max-domains, --registry-max-descriptors and --registry-max-body-bytes must be at least 1"
        );
    }
    let token = config.token_file.as_deref().map(read_token).transpose()?;
    let dir = config
        .dir
        .as_deref()
        .map(|d| {
            DirStorage::open(d).map_err(|e| {
                anyhow::anyhow!("cannot use the registry directory {}: {e}", d.display())
            })
        })
        .transpose()?;
    let local = |dir: &Option<DirStorage>| -> anyhow::Result<Snapshot> {
        match dir {
            Some(d) => d
                .load()
                .map_err(|e| anyhow::anyhow!("cannot read the registry directory: {e}")),
            None => Ok(Snapshot::default()),
        }
    };
    let (backing, initial) = match state.backend().redis() {
        Some(guarded) => {
            let redis = RedisRegistry::new(guarded.store().clone());
            let initial = match redis.load().await {
                Ok(Some(s)) => {
                    let old = local(&dir).unwrap_or_default();
                    if old.revision > s.revision {
                        // Redis lost changes this snapshot holds: start from it; the follower
                        // writes it back (see `Registry::sync_redis`).
                        tracing::warn!(
                            revision = old.revision,
                            redis_revision = s.revision,
                            "registry: Redis is behind the local snapshot; starting from the \
                             snapshot"
                        );
                        old
                    } else {
                        if let Some(d) = &dir {
                            if let Err(e) = d.write_snapshot(&old, &s) {
                                tracing::warn!(error = %e,
                                    "registry: cannot write the local snapshot");
                            }
                        }
                        s
                    }
                }
                Ok(None) => local(&dir)?,
                Err(e) => {
                    let s = local(&dir)?;
                    tracing::warn!(
                        error = %e,
                        domains = s.domains.len(),
                        snapshot = ?config.dir,
                        "registry: Redis cannot be reached at start; serving the local snapshot \
                         until it answers"
                    );
                    s
                }
            };
            (
                Backing::Redis {
                    redis,
                    snapshot: dir,
                },
                initial,
            )
        }
        None => match dir {
            Some(d) => {
                let s = local(&Some(d.clone()))?;
                (Backing::Dir(d), s)
            }
            None => {
                // Said again as a WARN when a domain is first registered: an admin token set
                // for the dashboard alone is no registry in use.
                tracing::info!(
                    "registry kept in memory only (no --registry-dir): registered domains are \
                     lost on restart"
                );
                (Backing::Memory, Snapshot::default())
            }
        },
    };
    if token.is_none() {
        tracing::info!(
            "registry is closed over HTTP: no --admin-token-file (registered domains are served)"
        );
    }
    let registry = Arc::new(Registry::new(config.clone(), token.as_deref(), backing));
    tracing::info!(
        storage = registry.storage_kind(),
        revision = initial.revision,
        domains = initial.domains.len(),
        "registry started"
    );
    registry.install(state, initial).await;
    let Backing::Redis { redis, .. } = &registry.backing else {
        return Ok(Some(Running {
            registry,
            follower: None,
        }));
    };
    let notify = Arc::new(tokio::sync::Notify::new());
    let single = !store_url.contains("+cluster://");
    if single {
        tokio::spawn(storage::redis::subscribe(
            store_url.to_string(),
            redis.channel().to_string(),
            notify.clone(),
            shutdown.clone(),
        ));
    }
    let state = state.clone();
    let follower = tokio::spawn(follow(registry.clone(), state, notify, shutdown));
    Ok(Some(Running {
        registry,
        follower: Some(follower),
    }))
}

/// A started registry ([`start`]).
#[derive(Debug)]
pub(crate) struct Running {
    /// The registry, for the transports that serve it.
    pub(crate) registry: Arc<Registry>,
    /// With Redis, the task following changes made through other instances (it ends at
    /// shutdown).
    pub(crate) follower: Option<tokio::task::JoinHandle<()>>,
}

/// Redis: look at the revision key every poll interval and whenever a change is announced, and
/// load and apply the registry when it moved, until `shutdown`.
async fn follow(
    registry: Arc<Registry>,
    state: AppState,
    notify: Arc<tokio::sync::Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    let Backing::Redis { redis, .. } = &registry.backing else {
        return;
    };
    let mut tick = tokio::time::interval(registry.config.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
            _ = notify.notified() => {}
        }
        let known = registry.stored().revision;
        match redis.revision().await {
            Ok(Some(r)) if r == known => {
                if registry.redis_down.swap(false, Relaxed) {
                    tracing::info!("registry: Redis answers again");
                }
            }
            // No registry yet, and none known.
            Ok(None) if known == 0 => {}
            // Changed, or lost (missing, or behind `known`): `sync_redis` tells which.
            Ok(_) => {
                registry.sync_redis(&state).await;
            }
            Err(e) => registry.redis_failed(&e),
        }
    }
}
