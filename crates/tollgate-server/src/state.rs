//! Shared service state: the current rules (swapped atomically on reload), the backend (store), the clock,
//! metrics and request limits. Cheap to clone (one `Arc`); every transport holds a clone.

use crate::backend::{Backend, Guarded};
use crate::metrics::{Metrics, RuleSlots};
use crate::policy::{DecisionPolicy, TollgatePolicy};
use crate::stats::{StatSlots, Stats};
use arc_swap::ArcSwap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tollgate_core::clock::{Clock, Micros, MonotonicWallClock, SystemClock};
use tollgate_core::queue::{LineKey, Waitlist};
use tollgate_core::rules::{LoadOptions, RuleSet};
use tollgate_core::store::Store;
use tollgate_core::MemoryStore;

/// A validated rule set and where it came from.
#[derive(Debug)]
pub struct LoadedRules {
    /// The rules.
    pub set: RuleSet,
    /// Content hash of the rule files (hex), stable across restarts for the same files.
    pub hash: String,
    /// Incremented by every successful (re)load of this process, starting at 1.
    pub generation: u64,
    /// When these rules were loaded (µs since the epoch, wall clock).
    pub loaded_at: Micros,
    /// Pre-resolved metric counters of `set`'s rules (`RuleSlots::new`; the `Default`, no
    /// slots, also works, on the slower map path).
    pub(crate) counters: RuleSlots,
    /// Pre-resolved live statistics of `set`'s rules (`StatSlots::new`; the `Default`
    /// records nothing).
    pub(crate) stats: StatSlots,
    /// The rule files `set` was built from (`(file name, text)`), so that a registry change
    /// rebuilds the rules with the same files without reading them again. Empty for inline
    /// rules.
    pub file_sources: Arc<[(String, String)]>,
}

impl LoadedRules {
    /// Rules not read from files (tests, embedding): hash `"inline"`, generation 1.
    pub fn inline(set: RuleSet) -> Self {
        Self {
            counters: RuleSlots::new(&set),
            stats: StatSlots::new(&set),
            set,
            hash: "inline".into(),
            generation: 1,
            loaded_at: SystemClock.now(),
            file_sources: Arc::from(Vec::new()),
        }
    }
}

/// The last failed reload, shown by `GET /v1/rules` until a reload succeeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReloadError {
    /// When it failed (µs since the epoch).
    pub at: Micros,
    /// Each problem as `file:line:column: message`.
    pub errors: Vec<String>,
}

/// Limits on request size and shape (bad input is rejected with 400/413 before any work).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Maximum HTTP body in bytes.
    pub max_body_bytes: usize,
    /// Maximum descriptors per request.
    pub max_descriptors: usize,
    /// Maximum entries per descriptor.
    pub max_entries: usize,
    /// Maximum key length in characters (JSON Schema's `maxLength`; at most 4x in bytes).
    pub max_key_bytes: usize,
    /// Maximum value length in characters.
    pub max_value_bytes: usize,
    /// Maximum domain length in characters.
    pub max_domain_bytes: usize,
    /// Maximum cost (`hits_addend`) of one request or descriptor.
    pub max_hits: u64,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 * 1024,
            max_descriptors: 64,
            max_entries: 16,
            max_key_bytes: 256,
            max_value_bytes: 1024,
            max_domain_bytes: 256,
            max_hits: u32::MAX as u64,
        }
    }
}

struct Shared {
    rules: ArcSwap<LoadedRules>,
    last_reload_error: Mutex<Option<ReloadError>>,
    backend: Backend,
    memory: Option<Arc<MemoryStore>>,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    stats: Stats,
    limits: RequestLimits,
    rules_path: Option<PathBuf>,
    rule_listing: LoadOptions,
    policy: Arc<dyn DecisionPolicy>,
    shutting_down: AtomicBool,
    /// The active rules have a limit with a `queue` ([`RuleSet::has_queues`]): one relaxed load
    /// tells a request whether to look for queues at all.
    queued: AtomicBool,
    /// The lines of requests that rules with a `queue` make wait.
    queue: Arc<Waitlist<LineKey>>,
    /// Held while new rules are computed and swapped in (file reload, registry change), so that
    /// one cannot swap in rules built from what the other is replacing.
    rules_update: Mutex<()>,
    /// One permit: admin work (rule compilation, large listings) runs one at a time on a
    /// blocking thread ([`AppState::admin_work`]).
    admin: tokio::sync::Semaphore,
    /// The xDS subscription's state, when rules come from an xDS server.
    xds: std::sync::OnceLock<Arc<crate::xds_status::XdsStatus>>,
    /// The tracer of the decisions, when traces are on ([`crate::otel`]).
    tracing: Option<Arc<crate::otel::Tracing>>,
}

/// The state every handler and background task shares. Clone freely.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("rules_generation", &self.rules().generation)
            .field("limits", &self.0.limits)
            .finish_non_exhaustive()
    }
}

/// Builds an [`AppState`].
pub struct AppStateBuilder {
    rules: LoadedRules,
    backend: Backend,
    memory: Option<Arc<MemoryStore>>,
    clock: Arc<dyn Clock>,
    limits: RequestLimits,
    rules_path: Option<PathBuf>,
    rule_listing: LoadOptions,
    policy: Arc<dyn DecisionPolicy>,
    live_stats: bool,
    queue_max_waiting: usize,
    tracing: Option<Arc<crate::otel::Tracing>>,
}

impl AppStateBuilder {
    /// The rules this state will start with.
    pub fn rules(&self) -> &LoadedRules {
        &self.rules
    }
    /// Use this clock (default: [`MonotonicWallClock`], which does not follow wall-clock steps).
    /// Tests pass a `ManualClock`.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
    /// Use this store instead of a fresh memory store.
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.backend = Backend::Local(store);
        self.memory = None;
        self
    }
    /// Use this memory store (it is also swept periodically by `serve`).
    pub(crate) fn memory_store(mut self, store: Arc<MemoryStore>) -> Self {
        self.backend = Backend::Local(store.clone());
        self.memory = Some(store);
        self
    }
    /// Use Redis (its `local` fallback store is swept like the memory store).
    pub fn redis(mut self, guarded: Arc<Guarded>) -> Self {
        self.memory = Some(guarded.local_store().clone());
        self.backend = Backend::Redis(guarded);
        self
    }
    /// Use two Redis: `per_second` for the counters of limits whose unit is second, `main` for
    /// the others (start both with one `local` fallback store: the main one's is swept).
    pub(crate) fn redis_split(mut self, main: Arc<Guarded>, per_second: Arc<Guarded>) -> Self {
        self.memory = Some(main.local_store().clone());
        self.backend = Backend::RedisSplit(main, per_second);
        self
    }
    /// Request limits.
    pub(crate) fn limits(mut self, limits: RequestLimits) -> Self {
        self.limits = limits;
        self
    }
    /// Where the rules come from (shown by `/v1/rules`, watched by [`crate::reload`]).
    pub fn rules_path(mut self, path: PathBuf) -> Self {
        self.rules_path = Some(path);
        self
    }
    /// Which files of a rules directory are rule files (for reloads).
    pub(crate) fn rule_listing(mut self, listing: LoadOptions) -> Self {
        self.rule_listing = listing;
        self
    }
    /// The decision's semantics (default: `TollgatePolicy`).
    pub(crate) fn policy(mut self, policy: Arc<dyn DecisionPolicy>) -> Self {
        self.policy = policy;
        self
    }
    /// Record the live statistics of `/v1/stats` and `/dashboard` (default: on).
    pub fn live_stats(mut self, on: bool) -> Self {
        self.live_stats = on;
        self
    }
    /// The most requests that may wait at once in the queues of rules with a `queue` option, all
    /// lines together (`--queue-max-waiting`; default
    /// [`tollgate_core::queue::DEFAULT_MAX_WAITING`]).
    pub fn queue_max_waiting(mut self, n: usize) -> Self {
        self.queue_max_waiting = n;
        self
    }
    /// Trace the decisions with this tracer (default: no traces).
    pub(crate) fn tracing(mut self, tracing: Option<Arc<crate::otel::Tracing>>) -> Self {
        self.tracing = tracing;
        self
    }
    /// The state.
    pub fn build(self) -> AppState {
        let metrics = Metrics::new();
        metrics.rules_loaded(&self.rules.set);
        let stats = Stats::default();
        stats.set_enabled(self.live_stats);
        // The first load is the first entry of the reload ring.
        stats.reloaded(self.clock.now(), self.rules.generation, &[]);
        let queued = self.rules.set.has_queues();
        warn_longer_than_the_cap(&self.rules.set, self.queue_max_waiting);
        AppState(Arc::new(Shared {
            rules: ArcSwap::from_pointee(self.rules),
            last_reload_error: Mutex::new(None),
            backend: self.backend,
            memory: self.memory,
            clock: self.clock,
            metrics,
            stats,
            limits: self.limits,
            rules_path: self.rules_path,
            rule_listing: self.rule_listing,
            policy: self.policy,
            shutting_down: AtomicBool::new(false),
            queued: AtomicBool::new(queued),
            queue: Arc::new(Waitlist::new(self.queue_max_waiting)),
            rules_update: Mutex::new(()),
            admin: tokio::sync::Semaphore::new(1),
            xds: std::sync::OnceLock::new(),
            tracing: self.tracing,
        }))
    }
}

impl AppState {
    /// A builder with a fresh memory store ([`tollgate_core::memory::DEFAULT_MAX_KEYS`]) and a
    /// [`MonotonicWallClock`].
    pub fn builder(rules: LoadedRules) -> AppStateBuilder {
        let memory = Arc::new(MemoryStore::new(tollgate_core::memory::DEFAULT_MAX_KEYS));
        AppStateBuilder {
            rules,
            backend: Backend::Local(memory.clone()),
            memory: Some(memory),
            clock: Arc::new(MonotonicWallClock::new()),
            limits: RequestLimits::default(),
            rules_path: None,
            rule_listing: LoadOptions::default(),
            policy: Arc::new(TollgatePolicy),
            live_stats: true,
            queue_max_waiting: tollgate_core::queue::DEFAULT_MAX_WAITING,
            tracing: None,
        }
    }

    /// Shorthand: `builder(LoadedRules::inline(set)).build()`.
    pub fn new(set: RuleSet) -> Self {
        Self::builder(LoadedRules::inline(set)).build()
    }

    /// The current rules. Hold the `Arc` for the whole request so a reload cannot change the
    /// rules under it.
    pub fn rules(&self) -> Arc<LoadedRules> {
        self.0.rules.load_full()
    }

    /// Swap in new rules atomically and clear the last reload error.
    pub(crate) fn swap_rules(&self, rules: LoadedRules) {
        warn_longer_than_the_cap(&rules.set, self.0.queue.max_waiting());
        self.0.metrics.rules_loaded(&rules.set);
        self.0.stats.rules_loaded(&rules.set);
        self.0
            .queued
            .store(rules.set.has_queues(), Ordering::Relaxed);
        self.0.rules.store(Arc::new(rules));
        *self.lock_error() = None;
    }

    /// The xDS subscription's state, when rules come from an xDS server.
    pub(crate) fn xds(&self) -> Option<&Arc<crate::xds_status::XdsStatus>> {
        self.0.xds.get()
    }

    /// Rules come from an xDS server, whose subscription reports to `status`.
    pub(crate) fn set_xds(&self, status: Arc<crate::xds_status::XdsStatus>) {
        let _ = self.0.xds.set(status);
    }

    /// Hold this while computing rules from the running ones and swapping them in (file reload,
    /// registry change): the two never interleave.
    pub(crate) fn rules_update_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.0
            .rules_update
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Run `work` (rule compilation, a large listing) off the request path: on a blocking
    /// thread, one such job at a time (the others wait without holding a thread), so admin work
    /// takes at most one core and never a runtime worker that decisions need. Decisions take no
    /// lock that it holds: they read the rules through one atomic pointer. `None` when `work`
    /// panicked.
    pub(crate) async fn admin_work<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let _turn = self.0.admin.acquire().await.ok()?;
        tokio::task::spawn_blocking(work).await.ok()
    }

    /// Swap in new rules atomically, keeping the last reload error (a registry change: the
    /// files are as broken as they were).
    pub(crate) fn replace_rules(&self, rules: LoadedRules) {
        warn_longer_than_the_cap(&rules.set, self.0.queue.max_waiting());
        self.0.metrics.rules_loaded(&rules.set);
        self.0.stats.rules_loaded(&rules.set);
        self.0
            .queued
            .store(rules.set.has_queues(), Ordering::Relaxed);
        self.0.rules.store(Arc::new(rules));
    }

    /// Record a failed reload (the running rules stay).
    pub(crate) fn set_reload_error(&self, error: ReloadError) {
        *self.lock_error() = Some(error);
    }

    /// The last failed reload since the last successful one.
    pub(crate) fn last_reload_error(&self) -> Option<ReloadError> {
        self.lock_error().clone()
    }

    fn lock_error(&self) -> std::sync::MutexGuard<'_, Option<ReloadError>> {
        self.0
            .last_reload_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Where counters live.
    pub(crate) fn backend(&self) -> &Backend {
        &self.0.backend
    }

    /// The store for logs and `/v1/rules`: `memory`, or the Redis URL with its password redacted.
    pub(crate) fn store_label(&self) -> String {
        let per_second = self
            .backend()
            .per_second()
            .map(|p| format!(", per-second limits on {}", p.store().url()))
            .unwrap_or_default();
        match self.backend().redis() {
            Some(g) => match g.store().options().prefix.as_str() {
                // The envoy profile's default: keys as envoyproxy/ratelimit writes them.
                "" => format!("{} (no key prefix){per_second}", g.store().url()),
                prefix => format!("{} (prefix {prefix}){per_second}", g.store().url()),
            },
            None => "memory".into(),
        }
    }

    /// The memory store, when there is one (the memory backend, or Redis' `local` fallback), for
    /// periodic sweeping.
    pub fn memory_store(&self) -> Option<&Arc<MemoryStore>> {
        self.0.memory.as_ref()
    }

    /// The clock.
    pub fn clock(&self) -> &dyn Clock {
        &*self.0.clock
    }

    /// Current time from the state's clock.
    pub fn now(&self) -> Micros {
        self.0.clock.now()
    }

    /// The tracer of the decisions; `None` when traces are off.
    #[inline]
    pub(crate) fn tracing(&self) -> Option<&crate::otel::Tracing> {
        self.0.tracing.as_deref()
    }

    /// Metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }

    /// Write the `/metrics` families of everything this state holds: the decision counters,
    /// the memory store, the Redis stores, xDS, the decision policy and traces (the one list
    /// of what the service exports; the rule registry adds its own where it runs).
    pub(crate) fn expose(&self, out: &mut crate::exposition::Exposition) {
        self.metrics().expose(out);
        if let Some(m) = self.memory_store() {
            crate::metrics::expose_memory(out, m);
        }
        crate::store_metrics::expose(out, self.backend(), &self.rules().set);
        if let Some(x) = self.xds() {
            x.expose(out);
        }
        self.policy().expose(out);
        if let Some(t) = self.tracing() {
            t.expose(out);
        }
    }

    /// The live statistics (`/v1/stats`, `/dashboard`).
    pub(crate) fn stats(&self) -> &Stats {
        &self.0.stats
    }

    /// Request limits.
    pub(crate) fn limits(&self) -> &RequestLimits {
        &self.0.limits
    }

    /// Where rules are loaded from, if from files.
    pub(crate) fn rules_path(&self) -> Option<&PathBuf> {
        self.0.rules_path.as_ref()
    }

    /// Which files of a rules directory are rule files.
    pub(crate) fn rule_listing(&self) -> LoadOptions {
        self.0.rule_listing
    }

    /// The decision's semantics.
    pub(crate) fn policy(&self) -> &dyn DecisionPolicy {
        &*self.0.policy
    }

    /// Whether the active rules have a limit with a `queue`.
    pub(crate) fn has_queues(&self) -> bool {
        self.0.queued.load(Ordering::Relaxed)
    }

    /// The lines of requests that rules with a `queue` make wait.
    pub(crate) fn queue(&self) -> &Arc<Waitlist<LineKey>> {
        &self.0.queue
    }

    /// Mark the service as shutting down (health checks turn unhealthy).
    pub(crate) fn begin_shutdown(&self) {
        self.0.shutting_down.store(true, Ordering::Relaxed);
    }

    /// Whether shutdown has begun.
    pub(crate) fn shutting_down(&self) -> bool {
        self.0.shutting_down.load(Ordering::Relaxed)
    }
}

/// A WARN for each rule whose `queue.max_length` is above the process's cap on waiters
/// (`--queue-max-waiting`): its line can never be that long, and holds a fair share of the cap
/// only while other lines wait too.
fn warn_longer_than_the_cap(rules: &RuleSet, max_waiting: usize) {
    if !rules.has_queues() {
        return;
    }
    for limit in rules.limits() {
        if let Some(q) = limit.queue.filter(|q| q.max_length > max_waiting) {
            tracing::warn!(
                rule = %limit.id,
                max_length = q.max_length,
                queue_max_waiting = max_waiting,
                "queue max_length is above --queue-max-waiting: the line holds at most the \
                 process's cap, and only its fair share of it while other lines wait"
            );
        }
    }
}
