//! Rules hot reload: poll the rules path (the set of rule files and a hash of their contents,
//! which also catches Kubernetes ConfigMap symlink swaps), reload on `SIGHUP` whatever changed,
//! debounce, validate, swap atomically. A broken file keeps the running rules; the error is
//! logged with file:line, shown by `GET /v1/rules` and counted in
//! `tollgate_rule_reloads_total{result="failure"}`.
//!
//! Losing files is treated like breaking them, never as removing rules: a listed rule file that
//! cannot be read (dangling symlink, a ConfigMap `..data` pointing nowhere, permission denied)
//! fails the load, and so does a missing rules path (see
//! [`tollgate_core::rules::RuleSet::load`]). Only a file gone from the directory listing removes
//! its domain, and not the last one: a reload from some rule files to none is refused, because a
//! lost mount or a stray `rm` must not unlimit all traffic.
//!
//! Counters survive reloads: the memory store keys a counter by its counter key, algorithm and
//! period, so a limit whose descriptor path is unchanged keeps its state.
//!
//! The domains registered through the rule registry ([`crate::registry`]) are parsed with the
//! files on every reload: a reload swaps in files and registered domains together.

use crate::metrics::RuleSlots;
use crate::registry::Registry;
use crate::state::{AppState, LoadedRules, ReloadError};
use siphasher::sip128::{Hasher128, SipHasher13};
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tollgate_core::clock::{Clock, SystemClock};
use tollgate_core::rules::{LoadOptions, RuleDefaults, RuleErrors};

/// The files [`tollgate_core::rules::RuleSet::load`] reads for `path`, sorted: the file itself, or the visible
/// `*.yaml` / `*.yml` entries of a directory (symlinks followed; dangling ones included, so the
/// fingerprint sees a link lose its target). See [`tollgate_core::rules::rule_files`].
pub fn rule_files(path: &Path) -> Vec<PathBuf> {
    tollgate_core::rules::rule_files(path)
}

/// A hash of the rule files' names and contents (unreadable files and a missing path hash
/// distinctly), as 32 hex digits.
pub fn fingerprint(path: &Path) -> String {
    fingerprint_with(path, LoadOptions::default())
}

/// [`fingerprint`] of the files `options` list.
pub(crate) fn fingerprint_with(path: &Path, options: LoadOptions) -> String {
    let mut h = SipHasher13::new_with_keys(0x746f_6c6c_6761_7465, 0x7275_6c65_7321);
    if std::fs::metadata(path).is_err() {
        h.write(b"\x00missing");
    }
    for f in tollgate_core::rules::rule_files_with(path, options) {
        h.write(f.display().to_string().as_bytes());
        h.write_u8(0);
        match std::fs::read(&f) {
            Ok(bytes) => {
                h.write_u64(bytes.len() as u64);
                h.write(&bytes);
            }
            Err(e) => h.write(format!("\x00unreadable {e}").as_bytes()),
        }
    }
    format!("{:032x}", h.finish128().as_u128())
}

/// Load and validate the rules at `path`.
pub fn load(path: &Path, generation: u64) -> Result<LoadedRules, RuleErrors> {
    load_with(
        path,
        LoadOptions::default(),
        generation,
        RuleDefaults::default(),
    )
}

/// Load and validate the rules at `path`: a directory listed as `options` say, with the
/// server's [`RuleDefaults`] applied (a reload applies the running rules' defaults again).
pub(crate) fn load_with(
    path: &Path,
    options: LoadOptions,
    generation: u64,
    defaults: RuleDefaults,
) -> Result<LoadedRules, RuleErrors> {
    load_combined(path, options, generation, defaults, &[])
}

/// [`load_with`], with the registry's domains (`registered`) added to the files' (a domain
/// defined by a file keeps the file's rules: see [`crate::registry::combine`]).
pub(crate) fn load_combined(
    path: &Path,
    options: LoadOptions,
    generation: u64,
    defaults: RuleDefaults,
    registered: &[crate::registry::Registered],
) -> Result<LoadedRules, RuleErrors> {
    let hash = fingerprint_with(path, options);
    let (files, read_errors) = tollgate_core::rules::read_sources(path, options)?;
    let set =
        crate::registry::combine(&files, read_errors, registered, options)?.with_defaults(defaults);
    Ok(LoadedRules {
        counters: RuleSlots::new(&set),
        stats: crate::stats::StatSlots::new(&set),
        set,
        hash,
        generation,
        loaded_at: SystemClock.now(),
        file_sources: files.into(),
    })
}

/// Reload now: swap in the rules at `path`, or keep the running ones and record the error.
/// Returns whether the new rules are active.
pub fn reload_now(state: &AppState, path: &Path) -> bool {
    reload_with(state, path, None)
}

/// [`reload_now`], the domains of `registry` (when one runs) kept beside the files'.
pub(crate) fn reload_with(state: &AppState, path: &Path, registry: Option<&Registry>) -> bool {
    let _update = state.rules_update_lock();
    let running = state.rules();
    let generation = running.generation + 1;
    let registered = registry.map(|r| r.registered()).unwrap_or_default();
    let loaded = load_combined(
        path,
        state.rule_listing(),
        generation,
        running.set.defaults(),
        &registered,
    )
    .map_err(|errors| errors.iter().map(ToString::to_string).collect::<Vec<_>>())
    .and_then(|rules| {
        // Rules the backend cannot serve (count-min sketch on Redis) are refused like
        // invalid ones.
        let problems = state.backend().unsupported(&rules.set);
        if problems.is_empty() {
            Ok(rules)
        } else {
            Err(problems)
        }
    })
    .and_then(|rules| {
        // Every rule file gone at once looks like a lost mount, not a decision: unlimited
        // traffic is the one outcome a rate limiter must never reach by accident.
        if rules.file_sources.is_empty() && !running.file_sources.is_empty() {
            Err(vec![format!(
                "{}: no rule files left, which would remove every domain ({} loaded) and \
                     limit no request; refused. To remove every limit, keep one file holding \
                     only `domain: <name>`, or restart",
                path.display(),
                running.set.domains().count()
            )])
        } else {
            Ok(rules)
        }
    });
    match loaded {
        Ok(rules) => {
            tracing::info!(
                path = %path.display(),
                version = %rules.hash,
                generation,
                domains = rules.set.domains().count(),
                limits = rules.set.limits().count(),
                "rules reloaded"
            );
            // Only a file gone from the directory drops its domain (an unreadable one fails the
            // load): deliberate, but it unlimits traffic, so it is said loudly.
            let removed: Vec<&str> = running
                .set
                .domains()
                .map(|d| d.name.as_str())
                .filter(|name| rules.set.domain(name).is_none())
                .collect();
            if !removed.is_empty() {
                tracing::warn!(
                    path = %path.display(),
                    removed = %removed.join(", "),
                    "domains removed with their rule files: their requests are no longer limited"
                );
            }
            if rules.set.is_empty() {
                tracing::warn!(
                    path = %path.display(),
                    "no rate-limit domains in the rules: no request will be limited"
                );
            }
            drop(running);
            let generation = rules.generation;
            state.swap_rules(rules);
            state.metrics().reload(true);
            state.stats().reloaded(state.now(), generation, &[]);
            true
        }
        Err(errors) => {
            for e in &errors {
                tracing::error!(
                    path = %path.display(),
                    error = %e,
                    "rules reload failed; keeping the running rules"
                );
            }
            state
                .stats()
                .reloaded(state.now(), state.rules().generation, &errors);
            state.set_reload_error(ReloadError {
                at: SystemClock.now(),
                errors,
            });
            state.metrics().reload(false);
            false
        }
    }
}

/// How the watcher behaves.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// How often to compare fingerprints.
    pub interval: Duration,
    /// After a change, wait this long for the files to settle before loading.
    pub debounce: Duration,
    /// The rule registry, when one runs: its domains are kept beside the files'.
    pub registry: Option<Arc<Registry>>,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(500),
            debounce: Duration::from_millis(100),
            registry: None,
        }
    }
}

/// Watch `path` until `shutdown` turns true: reload when the fingerprint changes (after it has
/// been stable for `debounce`) and on every `SIGHUP`.
///
/// The `SIGHUP` handler is installed when this is called (call it inside the runtime), not when
/// the future is first polled, so a `SIGHUP` right after start-up cannot kill the process.
pub fn watch(
    state: AppState,
    path: PathBuf,
    options: WatchOptions,
    shutdown: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send {
    let hup = Hangup::new();
    watch_loop(state, path, options, shutdown, hup)
}

async fn watch_loop(
    state: AppState,
    path: PathBuf,
    options: WatchOptions,
    mut shutdown: watch::Receiver<bool>,
    mut hup: Hangup,
) {
    let listing = state.rule_listing();
    let fp = {
        let p = path.clone();
        move || {
            let p = p.clone();
            async move {
                tokio::task::spawn_blocking(move || fingerprint_with(&p, listing))
                    .await
                    .unwrap_or_default()
            }
        }
    };
    let mut last = state.rules().hash.clone();
    if last == "inline" {
        last = fp().await;
    }
    let mut tick = tokio::time::interval(options.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut looked = false;
    loop {
        let forced = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = tick.tick() => false,
            _ = hup.recv() => true,
        };
        let mut now = fp().await;
        if !forced && !looked {
            // The first tick is immediate: from here on, only the next tick or a SIGHUP sees a
            // change (tests wait for this line before changing the files).
            looked = true;
            tracing::debug!(path = %path.display(), "rules watcher took its first look");
        }
        if !forced && now == last {
            continue;
        }
        // Debounce: wait until two fingerprints in a row agree (editors write in steps).
        for _ in 0..20 {
            tokio::time::sleep(options.debounce).await;
            let again = fp().await;
            if again == now {
                break;
            }
            now = again;
        }
        if forced {
            tracing::info!("SIGHUP: reloading rules");
        }
        let st = state.clone();
        let p = path.clone();
        let registry = options.registry.clone();
        let _ =
            tokio::task::spawn_blocking(move || reload_with(&st, &p, registry.as_deref())).await;
        // A failed load is not retried until the files change again (or SIGHUP).
        last = now;
    }
}

/// `SIGHUP` as a stream (never fires where signals are unavailable).
struct Hangup {
    #[cfg(unix)]
    sig: Option<tokio::signal::unix::Signal>,
}

impl Hangup {
    fn new() -> Self {
        #[cfg(unix)]
        {
            let sig = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .map_err(|e| tracing::warn!(error = %e, "cannot listen for SIGHUP"))
                .ok();
            Self { sig }
        }
        #[cfg(not(unix))]
        Self {}
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some(s) = &mut self.sig {
            if s.recv().await.is_some() {
                return;
            }
        }
        std::future::pending::<()>().await
    }
}
