//! Rules: which limit applies to a request descriptor, loaded from envoyproxy/ratelimit's YAML
//! format plus tollgate's extensions (see `docs/rules.md`).
//!
//! A [`RuleSet`] is built once from files ([`RuleSet::load`]) or strings
//! ([`RuleSet::from_sources`]), fully validated (every problem reported with file, line and
//! column in [`RuleErrors`]), then never changes: a reload builds a new one and swaps an `Arc`,
//! so readers need no lock and a bad reload leaves the running rules untouched.
//!
//! Matching follows envoyproxy/ratelimit exactly. A request descriptor with N entries matches a
//! path of depth N in a domain's descriptor tree; at each level the entry `(key, value)` picks
//! the descriptor with that key and exactly that value, else the first (in file order) with a
//! wildcard value matching it, else the one with that key and no value. The `rate_limit` of the
//! node reached applies ([`Resolution`]). Each distinct request value gets its own counter
//! (`domain|k1=v1|k2=v2`, escaped), except under a wildcard with `share_threshold: true`.
//!
//! The code is split by concern: `yaml` builds a position-keeping YAML tree, `decode`
//! validates it into a specification, `tree` compiles and resolves, `error` reports.
//!
//! ```
//! use tollgate_core::rules::{Resolution, RuleSet};
//!
//! let rules = RuleSet::from_sources(&[(
//!     "api.yaml".to_string(),
//!     "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n"
//!         .to_string(),
//! )])
//! .unwrap();
//! match rules.resolve("api", &[("user", "alice")]) {
//!     Resolution::Limited { limit, counter_key, .. } => {
//!         assert_eq!(limit.quota.unwrap().limit(), 100);
//!         assert_eq!(counter_key, "api|user=alice");
//!     }
//!     other => panic!("unexpected {other:?}"),
//! }
//! ```

mod decode;
mod degrade;
mod error;
mod fields;
mod http;
mod metadata;
mod queue;
mod stats;
mod tiers;
mod tree;
mod yaml;

pub use degrade::DegradeThreshold;
pub use error::{RuleError, RuleErrors};
pub use fields::{edit_distance, nearest};
pub use metadata::MetaValue;
pub use queue::{
    Priority, QueuePolicy, LOWEST, MAX_LENGTH as MAX_QUEUE_LENGTH, MAX_WAIT as MAX_QUEUE_WAIT,
    MIN_WAIT as MIN_QUEUE_WAIT,
};
pub use stats::StatsKey;
pub use tiers::{supports as tiers_support, TierLevel, Tiers, MAX_LEVELS as MAX_TIER_LEVELS};

use crate::quota::{Algorithm, Quota, SyncMode};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use tree::{Found, Tree};

/// The counter key of a descriptor taken literally (no rule's `share_threshold` applied):
/// `domain|k1=v1|k2=v2`, escaped like [`Resolution::Limited::counter_key`].
pub fn counter_key(domain: &str, entries: &[(&str, &str)]) -> String {
    tree::counter_key(domain, entries.iter().copied())
}

/// Append `value` to a counter key under construction, escaped as [`counter_key`] escapes
/// values: `counter_key(d, &[(k, "")])` followed by `value` pushed here is
/// `counter_key(d, &[(k, value)])`. For callers that build many keys of one prefix.
pub fn push_escaped(key: &mut String, value: &str) {
    tree::escape_into(key, value)
}

/// One rule: a descriptor's `rate_limit` and the descriptor-level options that go with it.
///
/// Rule sets build their limits; anyone else starts from [`Limit::new`] and sets the options
/// with the `with_*` methods (fields may be added, so there is no struct literal outside this
/// crate).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limit {
    /// The rule's path, unique in a rule set: the domain, then `key` or `key=value` per level,
    /// joined by `|` and escaped like counter keys (e.g. `api|user`, `api|path=/login|ip`).
    /// Used as the metric key and the rule's identity.
    pub id: String,
    /// The domain the rule belongs to.
    pub domain: String,
    /// `rate_limit.name`, which other rules may `replace`.
    pub name: Option<String>,
    /// The quota; `None` for `unlimited: true`.
    pub quota: Option<Quota>,
    /// `shadow_mode`: evaluate and count, but always answer OK.
    pub shadow_mode: bool,
    /// `message`: a hint returned to throttled clients.
    pub message: Option<String>,
    /// The names in `rate_limit.replaces`.
    pub replaces: Vec<String>,
    /// `detailed_metric`: include the request's value in the metric key.
    pub detailed_metric: bool,
    /// `value_to_metric`: include the descriptor values in the metric key.
    pub value_to_metric: bool,
    /// `share_threshold`: under a wildcard value, all matching values share one counter.
    pub share_threshold: bool,
    /// `quota_mode`: when this limit is over, the request is still OK unless every quota-mode
    /// limit of the request is over (or a limit not in quota mode is); see
    /// [`crate::limiter::Verdict::allowed`].
    pub quota_mode: bool,
    /// `metadata`: an arbitrary map of the descriptor, returned to Envoy as dynamic metadata
    /// when the limit passes (and the service is configured to return it).
    pub metadata: Option<BTreeMap<String, MetaValue>>,
    /// `degrade`: allowed answers whose remaining count is below this carry a degrade signal
    /// ([`DegradeThreshold::signals`]).
    pub degrade: Option<DegradeThreshold>,
    /// `shadowban`: this rule's denials are answered to the client as if allowed, without the
    /// request going through (the transports mark them; see docs/rules.md).
    pub shadowban: bool,
    /// `queue`: a request this rule denies waits for capacity, within these bounds, instead of
    /// being refused (see [`crate::queue`]).
    pub queue: Option<QueuePolicy>,
    /// `tiers`: the limit is a capacity shared by priority tiers ([`Tiers`]; docs/rules.md).
    pub tiers: Option<Tiers>,
    /// The rule names an `algorithm`; otherwise [`RuleDefaults::algorithm`] applies.
    pub algorithm_named: bool,
    /// The rule names a `sync` mode; otherwise [`RuleDefaults::sync`] applies where the
    /// algorithm supports it.
    pub sync_named: bool,
    /// An [`Algorithm::EnvoyFixedWindow`] rule counts the hits of requests that another limit
    /// denies ([`RuleDefaults::count_denied_hits`]; see [`crate::store::CheckItem::count_denied`]).
    pub count_denied_hits: bool,
    /// The rule's stats key as envoyproxy/ratelimit names it (`domain.key_value.key`), used as
    /// the rule's metric name.
    pub stats: StatsKey,
    /// The file the rule is defined in.
    pub file: String,
    /// The line of the descriptor that defines the rule (1-based).
    pub line: usize,
}

/// `with_*` builder methods that each set the field their argument is named after:
/// `with_x(x: T) => value;` is `fn with_x(mut self, x: T) -> Self`, setting `self.x = value`.
macro_rules! with {
    ($($(#[$doc:meta])* $method:ident($field:ident: $ty:ty) => $value:expr;)+) => {
        $(
            $(#[$doc])*
            pub fn $method(mut self, $field: $ty) -> Self {
                self.$field = $value;
                self
            }
        )+
    };
}

impl Limit {
    /// The limit `id` of `domain` with `quota` (`None`: `unlimited: true`), every option off:
    /// no name, message, `replaces` or metadata, not in shadow or quota mode, stats key the
    /// domain alone, defined nowhere (file `""`, line 0). The `with_*` methods set the rest.
    pub fn new(id: impl Into<String>, domain: impl Into<String>, quota: Option<Quota>) -> Self {
        let domain = domain.into();
        Limit {
            id: id.into(),
            stats: StatsKey::of_descriptor(&domain, []),
            domain,
            name: None,
            quota,
            shadow_mode: false,
            message: None,
            replaces: Vec::new(),
            detailed_metric: false,
            value_to_metric: false,
            share_threshold: false,
            quota_mode: false,
            metadata: None,
            degrade: None,
            shadowban: false,
            queue: None,
            tiers: None,
            algorithm_named: false,
            sync_named: false,
            count_denied_hits: false,
            file: String::new(),
            line: 0,
        }
    }

    with! {
        /// With `rate_limit.name` set ([`Limit::name`]).
        with_name(name: impl Into<String>) => Some(name.into());
        /// With `message` set ([`Limit::message`]).
        with_message(message: impl Into<String>) => Some(message.into());
        /// With `shadow_mode` set ([`Limit::shadow_mode`]).
        with_shadow_mode(shadow_mode: bool) => shadow_mode;
        /// With `quota_mode` set ([`Limit::quota_mode`]).
        with_quota_mode(quota_mode: bool) => quota_mode;
        /// With the names it replaces ([`Limit::replaces`]).
        with_replaces(replaces: Vec<String>) => replaces;
        /// With `metadata` set ([`Limit::metadata`]).
        with_metadata(metadata: BTreeMap<String, MetaValue>) => Some(metadata);
        /// With a degrade threshold ([`Limit::degrade`]).
        with_degrade(degrade: DegradeThreshold) => Some(degrade);
        /// With `shadowban` set ([`Limit::shadowban`]).
        with_shadowban(shadowban: bool) => shadowban;
        /// With a queue ([`Limit::queue`]).
        with_queue(queue: QueuePolicy) => Some(queue);
        /// With [`Limit::count_denied_hits`] set.
        with_count_denied_hits(count_denied_hits: bool) => count_denied_hits;
        /// With priority tiers sharing its quota ([`Limit::tiers`]).
        with_tiers(tiers: Tiers) => Some(tiers);
        /// With its stats key ([`Limit::stats`]).
        with_stats(stats: StatsKey) => stats;
    }

    /// Defined at `line` (1-based; 0 when not in a file) of `file` ([`Limit::file`]).
    pub fn with_source(mut self, file: impl Into<String>, line: usize) -> Self {
        self.file = file.into();
        self.line = line;
        self
    }

    /// Whether the rule is `unlimited: true`.
    pub fn is_unlimited(&self) -> bool {
        self.quota.is_none()
    }
}

/// One domain: the rules of one file.
#[derive(Debug, Clone)]
pub struct Domain {
    /// The domain name.
    pub name: String,
    /// The file it was loaded from.
    pub file: String,
    tree: Tree,
    http: Option<crate::request::HttpActions>,
    /// Its limits' positions in its rule set's limits (contiguous: built one domain at a time).
    limits: std::ops::Range<usize>,
}

impl Domain {
    /// How many descriptors (nodes of the descriptor tree, at every depth) the domain has: what
    /// a size cap on a domain counts.
    pub fn descriptor_count(&self) -> usize {
        self.tree.node_count()
    }

    /// The domain's `http` section (how a request's descriptors are derived), when it has one.
    pub fn http(&self) -> Option<&crate::request::HttpActions> {
        self.http.as_ref()
    }
}

/// What applies to one request descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolution<'a> {
    /// No rule matches (or unknown domain, or matched node has no rate_limit): OK with no limit.
    NoMatch,
    /// Matched a rule with `unlimited: true`: no state touched.
    Unlimited(&'a Limit),
    /// Matched a rule with a quota. `counter_key` identifies this counter.
    Limited {
        /// The rule.
        limit: &'a Limit,
        /// The counter: `domain|k1=v1|k2=v2` with the request's values (or the wildcard
        /// pattern under `share_threshold`), each part escaped (`\`, `|`, `=` prefixed by `\`).
        /// A tiered rule's tier entry is not part of it: every tier shares the parent counter.
        counter_key: String,
        /// A tiered rule ([`Limit::tiers`]): the request's tier, 0 the highest priority (the
        /// last level when the descriptor has no tier entry or names no level). `None` for a
        /// rule without tiers.
        tier: Option<u8>,
    },
}

/// An immutable, validated set of rules: one [`Domain`] per file.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    /// Sorted by name.
    domains: Vec<Domain>,
    by_name: HashMap<String, usize>,
    limits: Vec<Limit>,
    defaults: RuleDefaults,
    /// Some limit has a `queue`: without one, nothing on the decision path looks for queues.
    queued: bool,
}

/// Server-wide settings that apply to the rules rather than being written in them (so a rule
/// file means what the server is configured to make it mean, e.g. envoyproxy/ratelimit's
/// fixed window for rules that name no algorithm). Kept with the rule set so that a reload
/// applies them again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RuleDefaults {
    /// The algorithm of rules that name none (and of per-request limit overrides); `None`:
    /// [`Algorithm::default`].
    pub algorithm: Option<Algorithm>,
    /// [`Algorithm::EnvoyFixedWindow`] limits count hits on every descriptor of a request that
    /// another limit denies (envoyproxy/ratelimit's default; off is its
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`). A denied limit itself always counts.
    pub count_denied_hits: bool,
    /// The sync mode of rules that name none, where their algorithm supports it (the others
    /// stay [`SyncMode::Exact`]).
    pub sync: SyncMode,
}

impl RuleDefaults {
    /// The algorithm of rules that name none.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm.unwrap_or_default()
    }
}

impl RuleSet {
    /// A rule set with no domains: every descriptor resolves to [`Resolution::NoMatch`].
    pub fn empty() -> Self {
        Self::default()
    }

    /// Loads a file (one domain) or a directory (every `*.yaml` / `*.yml` file in it, one domain
    /// each, not recursive). Hidden entries are skipped, so a Kubernetes ConfigMap mount works:
    /// its visible `*.yaml` entries are symlinks into the hidden `..data` directory, and are
    /// followed. An empty directory gives an empty rule set.
    ///
    /// A rule file that is listed but cannot be read is an error, never a skipped file: a
    /// dangling symlink (a ConfigMap `..data` pointing nowhere, a link whose target was deleted),
    /// permission denied, an I/O error. Only an entry that is gone from the directory is gone
    /// from the rules. A missing or unreadable rules path is an error too.
    pub fn load(path: &Path) -> Result<RuleSet, RuleErrors> {
        Self::load_with(path, LoadOptions::default())
    }

    /// [`RuleSet::load`] with the directory listed as `options` say (envoyproxy/ratelimit's
    /// runtime folder: any extension, dot files included).
    pub fn load_with(path: &Path, options: LoadOptions) -> Result<RuleSet, RuleErrors> {
        let (files, errors) = read_sources(path, options)?;
        Self::from_read_sources(&files, errors, options)
    }

    /// [`RuleSet::load_with`] on what [`read_sources`] returned (the files read, and the
    /// problems met reading them): the rule set, or every problem, the reading ones first.
    pub fn from_read_sources(
        files: &[(String, String)],
        errors: Vec<RuleError>,
        options: LoadOptions,
    ) -> Result<RuleSet, RuleErrors> {
        let mut errors = errors;
        match Self::from_sources_with(files, options.merge_domains) {
            Ok(set) if errors.is_empty() => Ok(set),
            Ok(_) => Err(RuleErrors(errors)),
            Err(RuleErrors(more)) => {
                errors.extend(more);
                Err(RuleErrors(errors))
            }
        }
    }

    /// Parses in-memory files: (file name used in error messages, YAML text). Each file is one
    /// domain; a domain defined by two files is an error.
    pub fn from_sources(files: &[(String, String)]) -> Result<RuleSet, RuleErrors> {
        Self::from_sources_with(files, false)
    }

    /// [`RuleSet::from_sources`]; with `merge_domains` (envoyproxy/ratelimit's
    /// `MERGE_DOMAIN_CONFIG`) a domain defined by several files has the top-level descriptors of
    /// all of them, in file order; a top-level descriptor defined twice is still an error.
    pub(crate) fn from_sources_with(
        files: &[(String, String)],
        merge_domains: bool,
    ) -> Result<RuleSet, RuleErrors> {
        let mut errors: Vec<RuleError> = Vec::new();
        let mut specs: Vec<(&str, decode::DomainSpec)> = Vec::new();
        let mut seen: HashMap<String, &str> = HashMap::new();
        for (file, text) in files {
            let parsed = yaml::parse(text);
            let mut file_errors: fields::Errors = parsed
                .errors
                .into_iter()
                .map(|e| (e.pos, e.message))
                .collect();
            let broken_yaml = parsed.root.is_none() && !file_errors.is_empty();
            let spec = if broken_yaml {
                None
            } else {
                decode::decode_file(parsed.root.as_ref(), &mut file_errors)
            };
            let mut spec = spec;
            if merge_domains {
                if let Some(first) = spec.as_ref().and_then(|sp| seen.get(&sp.name)) {
                    let first: &str = first;
                    let extra = spec.take().map(|sp| sp.descriptors).unwrap_or_default();
                    let target = specs
                        .iter_mut()
                        .find(|(f, _)| *f == first)
                        .map(|(_, sp)| sp);
                    if let Some(target) = target {
                        for mut d in extra {
                            let dup = target
                                .descriptors
                                .iter()
                                .any(|o| o.key == d.key && o.value == d.value);
                            if dup {
                                file_errors.push((
                                    d.pos,
                                    format!(
                                        "duplicate descriptor: key `{}` already defined at the top level of domain `{}` in {first}",
                                        d.key, target.name
                                    ),
                                ));
                            } else {
                                d.file = Some(file.clone());
                                target.descriptors.push(d);
                            }
                        }
                    }
                }
            }
            if let Some(spec) = &spec {
                if let Some(first) = seen.get(&spec.name) {
                    file_errors.push((
                        spec.name_pos,
                        format!(
                            "duplicate domain `{}`: already defined in {first}",
                            spec.name
                        ),
                    ));
                } else {
                    seen.insert(spec.name.clone(), file);
                }
            }
            file_errors.sort_by_key(|(pos, _)| (pos.line, pos.column));
            errors.extend(
                file_errors
                    .into_iter()
                    .map(|(pos, message)| RuleError::new(file, pos.line, pos.column, message)),
            );
            if let Some(spec) = spec {
                specs.push((file, spec));
            }
        }
        if !errors.is_empty() {
            return Err(RuleErrors(errors));
        }
        specs.sort_by(|a, b| a.1.name.cmp(&b.1.name));
        let mut set = RuleSet::default();
        for (file, spec) in specs {
            let start = set.limits.len();
            let tree = Tree::build(&spec.name, file, spec.descriptors, &mut set.limits);
            let mut http = spec.http;
            if let Some(h) = &mut http {
                let tier_keys: Vec<&str> = set.limits[start..]
                    .iter()
                    .filter_map(|l| l.tiers.as_ref().map(|t| t.key.as_str()))
                    .collect();
                h.skip_absent_tiers(&tier_keys);
            }
            set.by_name.insert(spec.name.clone(), set.domains.len());
            set.domains.push(Domain {
                name: spec.name,
                file: file.to_string(),
                tree,
                http,
                limits: start..set.limits.len(),
            });
        }
        set.queued = set.limits.iter().any(|l| l.queue.is_some());
        Ok(set)
    }

    /// The rule set of every domain of `parts` (each as it is in its part, defaults not
    /// applied: call [`RuleSet::with_defaults`] on the result): what parsing all their files
    /// together would give, built without parsing anything again, so that a service which
    /// changes one domain among many parses only that one. A domain in two parts is an error.
    pub fn merged(parts: &[&RuleSet]) -> Result<RuleSet, RuleErrors> {
        let mut all: Vec<(&Domain, &RuleSet)> = parts
            .iter()
            .flat_map(|p| p.domains.iter().map(move |d| (d, *p)))
            .collect();
        all.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        if let Some(w) = all.windows(2).find(|w| w[0].0.name == w[1].0.name) {
            return Err(RuleErrors(vec![RuleError::new(
                &w[1].0.file,
                0,
                0,
                format!(
                    "duplicate domain `{}`: already defined in {}",
                    w[1].0.name, w[0].0.file
                ),
            )]));
        }
        let mut set = RuleSet::default();
        set.limits
            .reserve(all.iter().map(|(d, _)| d.limits.len()).sum());
        for (d, part) in all {
            let start = set.limits.len();
            set.limits
                .extend_from_slice(part.limits.get(d.limits.clone()).unwrap_or_default());
            let offset = start as isize - d.limits.start as isize;
            set.by_name.insert(d.name.clone(), set.domains.len());
            set.domains.push(Domain {
                name: d.name.clone(),
                file: d.file.clone(),
                tree: d.tree.shifted(offset),
                http: d.http.clone(),
                limits: start..set.limits.len(),
            });
        }
        set.queued = set.limits.iter().any(|l| l.queue.is_some());
        Ok(set)
    }

    /// The same rules with `defaults` applied: rules that name no algorithm take
    /// `defaults.algorithm`, rules that name no sync mode take `defaults.sync` where their
    /// algorithm supports it, and every limit takes `defaults.count_denied_hits`.
    pub fn with_defaults(mut self, defaults: RuleDefaults) -> Self {
        for l in &mut self.limits {
            // A tiered rule keeps its algorithm when the default cannot keep tiers.
            let fits = l.tiers.is_none() || tiers::supports(defaults.algorithm());
            if !l.algorithm_named && fits {
                l.quota = l.quota.map(|q| q.with_algorithm(defaults.algorithm()));
            }
            // A tiered rule is `exact` unless it names `sync: lease` (see `tiers::decode`): no
            // default sync mode applies (a default `batched` could not keep tiers).
            if !l.sync_named && l.tiers.is_none() {
                l.quota = l.quota.map(|q| {
                    let sync = if defaults.sync.supports(q.algorithm()) {
                        defaults.sync
                    } else {
                        SyncMode::Exact
                    };
                    q.with_sync(sync)
                });
            }
            l.count_denied_hits = defaults.count_denied_hits;
        }
        self.defaults = defaults;
        self
    }

    /// The limits that name a sync mode their algorithm (a default one) cannot keep, and those
    /// with a `flush_interval` that the defaults left unbatched, as `file:line: message`: a
    /// shared store refuses such rules.
    pub fn unleasable(&self) -> Vec<String> {
        self.limits
            .iter()
            .filter_map(|l| {
                let q = l.quota?;
                if !q.sync().supports(q.algorithm()) {
                    return Some(format!(
                        "{}:{}: `sync: {}` needs algorithm fixed_window or sliding_window_counter, \
                         not {} (the default algorithm; name one in the rule)",
                        l.file,
                        l.line,
                        q.sync(),
                        q.algorithm()
                    ));
                }
                // A rule naming another mode is refused when decoded; this one names none.
                (q.flush_interval().is_some() && q.sync() != SyncMode::Batched).then(|| {
                    let why = if l.tiers.is_some() {
                        "a tiered rule is never batched".to_string()
                    } else if self.defaults.sync == SyncMode::Batched {
                        format!("its algorithm {} cannot be batched", q.algorithm())
                    } else {
                        format!("the default sync mode is {}", self.defaults.sync)
                    };
                    format!(
                        "{}:{}: `flush_interval` applies only to `sync: batched`, and this limit \
                         is `sync: {}` ({why}; name `sync: batched` or drop `flush_interval`)",
                        l.file,
                        l.line,
                        q.sync()
                    )
                })
            })
            .collect()
    }

    /// Whether some limit has a `queue` ([`Limit::queue`]), computed once when the set is built:
    /// transports look for queues only then, so rule sets without one decide as if queues did
    /// not exist.
    pub fn has_queues(&self) -> bool {
        self.queued
    }

    /// The defaults applied to these rules ([`RuleSet::with_defaults`]).
    pub fn defaults(&self) -> RuleDefaults {
        self.defaults
    }

    /// Resolves one request descriptor (its entries in order) in a domain.
    pub fn resolve(&self, domain: &str, entries: &[(&str, &str)]) -> Resolution<'_> {
        let Some(d) = self.by_name.get(domain).and_then(|&i| self.domains.get(i)) else {
            return Resolution::NoMatch;
        };
        match d.tree.resolve(&d.name, entries) {
            Found::Nothing => Resolution::NoMatch,
            Found::Limit {
                limit,
                counter_key,
                tier,
            } => match self.limits.get(limit) {
                None => Resolution::NoMatch,
                Some(l) if l.quota.is_none() => Resolution::Unlimited(l),
                Some(l) => Resolution::Limited {
                    limit: l,
                    counter_key,
                    tier: l.tiers.as_ref().map(|t| t.index_of(tier)),
                },
            },
        }
    }

    /// Resolves a descriptor given as a set of entries with no order (an Envoy quota bucket's
    /// id, a map): the entries are put in the order of the domain's descriptor tree, found
    /// depth first (at each level the entries whose key the level has, tried in the order
    /// given; the first order that uses every entry and reaches a rule wins), then resolved as
    /// [`RuleSet::resolve`] does. Returns the ordered entries with the resolution; no order
    /// reaches a rule: [`Resolution::NoMatch`] and the entries as given.
    pub fn resolve_unordered<'e>(
        &self,
        domain: &str,
        entries: &[(&'e str, &'e str)],
    ) -> (Vec<(&'e str, &'e str)>, Resolution<'_>) {
        let Some(d) = self.by_name.get(domain).and_then(|&i| self.domains.get(i)) else {
            return (entries.to_vec(), Resolution::NoMatch);
        };
        match d.tree.order(entries) {
            None => (entries.to_vec(), Resolution::NoMatch),
            Some(order) => {
                let ordered: Vec<(&str, &str)> = order.iter().map(|&i| entries[i]).collect();
                let resolution = self.resolve(domain, &ordered);
                (ordered, resolution)
            }
        }
    }

    /// The domains, sorted by name.
    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.iter()
    }

    /// The domain called `name`.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.by_name.get(name).and_then(|&i| self.domains.get(i))
    }

    /// Every limit, for listing and metrics: by domain name, then in file order (depth first).
    pub fn limits(&self) -> impl Iterator<Item = &Limit> {
        self.limits.iter()
    }

    /// The limits of `domain` (one of this set's domains; another set's gives what is at its
    /// positions here, or nothing), in file order: without a pass over every limit.
    pub fn limits_of(&self, domain: &Domain) -> &[Limit] {
        self.limits.get(domain.limits.clone()).unwrap_or_default()
    }

    /// The position of `limit` in [`RuleSet::limits`] when it is one of this set's limits (found
    /// by address, in O(1): for per-rule tables such as a server's pre-resolved metric counters;
    /// a limit of another set, even an equal one, gives `None`).
    pub fn index_of(&self, limit: &Limit) -> Option<usize> {
        let size = std::mem::size_of::<Limit>();
        let offset = (limit as *const Limit as usize).checked_sub(self.limits.as_ptr() as usize)?;
        let i = offset / size;
        (offset % size == 0 && self.limits.get(i).is_some_and(|l| std::ptr::eq(l, limit)))
            .then_some(i)
    }

    /// Whether there are no domains.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }
}

/// The rule files of `path` (as [`RuleSet::load_with`] lists them) read into
/// `(file name, text)` pairs, with the problems of the files that could not be read; `Err` when
/// `path` itself cannot be read. [`RuleSet::from_read_sources`] makes the rule set of them; a
/// caller that adds rules from elsewhere (a registry) parses the texts together with its own.
#[allow(clippy::type_complexity)]
pub fn read_sources(
    path: &Path,
    options: LoadOptions,
) -> Result<(Vec<(String, String)>, Vec<RuleError>), RuleErrors> {
    let (paths, mut errors) = list(path, options)?;
    let mut files = Vec::new();
    for p in paths {
        let name = p.display().to_string();
        match std::fs::read_to_string(&p) {
            Ok(text) => files.push((name, text)),
            Err(e) => errors.push(unreadable(&p, &e)),
        }
    }
    Ok((files, errors))
}

/// The files [`RuleSet::load`] reads for `path`, sorted: the path itself when it is not a
/// directory, else its visible `*.yaml` / `*.yml` entries that are not directories, unreadable
/// ones (dangling symlinks, permission denied) included. Empty when the path cannot be read.
pub fn rule_files(path: &Path) -> Vec<PathBuf> {
    rule_files_with(path, LoadOptions::default())
}

/// [`rule_files`] with the directory listed as `options` say.
pub fn rule_files_with(path: &Path, options: LoadOptions) -> Vec<PathBuf> {
    list(path, options)
        .map(|(paths, _)| paths)
        .unwrap_or_default()
}

/// How a rules path is read: which entries of a directory are rule files, and whether files may
/// share a domain. The default is tollgate's: visible
/// `*.yaml` / `*.yml` files. envoyproxy/ratelimit's runtime folder reads every file whatever
/// its extension, dot files too unless told to ignore them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadOptions {
    /// Every file is a rule file, whatever its extension (else only `*.yaml` / `*.yml`).
    pub any_extension: bool,
    /// Entries whose name starts with `.` are read too (else skipped).
    pub dotfiles: bool,
    /// Several files may define one domain: their top-level descriptors are merged
    /// (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`); else that is an error.
    pub merge_domains: bool,
    /// Files in subdirectories (real ones, not symlinks) are rule files too.
    pub recursive: bool,
}

/// [`rule_files`] and the problems met while listing (an entry that cannot be examined is
/// listed: reading it reports why); `Err` when `path` itself cannot be read.
fn list(path: &Path, options: LoadOptions) -> Result<(Vec<PathBuf>, Vec<RuleError>), RuleError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| {
        RuleError::new(
            &shown,
            0,
            0,
            format!("cannot read rules: {}", why(path, &e)),
        )
    })?;
    if !meta.is_dir() {
        return Ok((vec![path.to_path_buf()], Vec::new()));
    }
    let entries = std::fs::read_dir(path)
        .map_err(|e| RuleError::new(&shown, 0, 0, format!("cannot read rules directory: {e}")))?;
    let mut paths = Vec::new();
    let mut errors = Vec::new();
    list_dir(path, entries, options, 0, &mut paths, &mut errors);
    paths.sort();
    errors.sort_by(|a, b| a.file.cmp(&b.file));
    Ok((paths, errors))
}

/// Deepest subdirectory [`LoadOptions::recursive`] reads.
const MAX_SUBDIRECTORY_DEPTH: usize = 16;

/// The rule files among `entries` (of the directory `dir`, `depth` levels below the rules path)
/// into `paths`, the problems into `errors`.
fn list_dir(
    dir: &Path,
    entries: std::fs::ReadDir,
    options: LoadOptions,
    depth: usize,
    paths: &mut Vec<PathBuf>,
    errors: &mut Vec<RuleError>,
) {
    let shown = dir.display().to_string();
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                errors.push(RuleError::new(
                    &shown,
                    0,
                    0,
                    format!("cannot read rules directory: {e}"),
                ));
                continue;
            }
        };
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let hidden = name.starts_with('.') && !options.dotfiles;
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if hidden || !(yaml || options.any_extension) {
            continue;
        }
        let p = entry.path();
        // Follows symlinks. A directory named *.yaml is not a rule file; an entry that cannot be
        // examined is listed, so that losing a file is never mistaken for removing it.
        match std::fs::metadata(&p) {
            // envoy's runtime loader walks real subdirectories, not symlinked ones.
            Ok(m) if m.is_dir() => {
                let real_dir = std::fs::symlink_metadata(&p).is_ok_and(|l| l.is_dir());
                if options.recursive && real_dir && depth < MAX_SUBDIRECTORY_DEPTH {
                    match std::fs::read_dir(&p) {
                        Ok(sub) => list_dir(&p, sub, options, depth + 1, paths, errors),
                        Err(e) => errors.push(RuleError::new(
                            p.display().to_string(),
                            0,
                            0,
                            format!("cannot read rules directory: {e}"),
                        )),
                    }
                }
            }
            Ok(m) if m.is_file() => paths.push(p),
            Ok(_) => {
                errors.push(RuleError::new(
                    p.display().to_string(),
                    0,
                    0,
                    "not a regular file",
                ));
            }
            // Reading it fails too, and [`RuleSet::load`] reports that.
            Err(_) => paths.push(p),
        }
    }
}

/// The error for a rule file that cannot be read, naming a dangling symlink's target.
fn unreadable(p: &Path, e: &std::io::Error) -> RuleError {
    RuleError::new(
        p.display().to_string(),
        0,
        0,
        format!("cannot read: {}", why(p, e)),
    )
}

/// What `e` means for `p`: for a dangling symlink, which target is missing.
fn why(p: &Path, e: &std::io::Error) -> String {
    let is_link = std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
    match std::fs::read_link(p) {
        Ok(target) if is_link && e.kind() == std::io::ErrorKind::NotFound => format!(
            "dangling symlink: its target {} does not exist ({e})",
            target.display()
        ),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{Algorithm, Unit};
    use std::time::Duration;

    #[test]
    fn merged_parts_resolve_as_the_files_parsed_together() {
        let files: Vec<(String, String)> = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, d)| {
                (
                    format!("{d}.yaml"),
                    format!(
                        "domain: {d}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {}}}\n    descriptors:\n      - key: n\n        value: v\n        rate_limit: {{unit: hour, requests_per_unit: {}}}\n  - key: other\n    rate_limit: {{unit: second, requests_per_unit: 7}}\n",
                        i + 1,
                        i + 10
                    ),
                )
            })
            .collect();
        let together = RuleSet::from_sources(&files).unwrap();
        let parts: Vec<RuleSet> = [&files[2], &files[0], &files[1]]
            .iter()
            .map(|f| RuleSet::from_sources(std::slice::from_ref(*f)).unwrap())
            .collect();
        let merged = RuleSet::merged(&parts.iter().collect::<Vec<_>>()).unwrap();
        for d in merged.domains() {
            let of = merged.limits_of(d);
            assert_eq!(of.len(), 3);
            assert!(of.iter().all(|l| l.domain == d.name));
        }
        assert_eq!(
            merged.limits().collect::<Vec<_>>(),
            together.limits().collect::<Vec<_>>()
        );
        for d in ["a", "b", "c", "x"] {
            for entries in [
                &[("k", "1")][..],
                &[("k", "1"), ("n", "v")],
                &[("other", "z")],
            ] {
                let (m, t) = (merged.resolve(d, entries), together.resolve(d, entries));
                assert_eq!(m, t, "{d} {entries:?}");
                if let Resolution::Limited { limit, .. } = m {
                    assert!(merged.index_of(limit).is_some());
                }
            }
        }
        let twice = RuleSet::merged(&[&parts[0], &parts[0]]).unwrap_err();
        assert!(
            twice.to_string().contains("duplicate domain `c`"),
            "{twice}"
        );
    }

    fn set(text: &str) -> RuleSet {
        match RuleSet::from_sources(&[("t.yaml".to_string(), text.to_string())]) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    fn errors(text: &str) -> Vec<RuleError> {
        match RuleSet::from_sources(&[("t.yaml".to_string(), text.to_string())]) {
            Ok(_) => panic!("expected errors"),
            Err(e) => e.0,
        }
    }

    fn key(r: Resolution<'_>) -> String {
        match r {
            Resolution::Limited { counter_key, .. } => counter_key,
            other => panic!("not limited: {other:?}"),
        }
    }

    #[test]
    fn rule_set_is_send_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<RuleSet>();
        check::<RuleErrors>();
    }

    #[test]
    fn escaped_values_cannot_forge_a_two_entry_key() {
        let s = set("domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
");
        let one = key(s.resolve("d", &[("a", "x|b=c")]));
        let two = key(s.resolve("d", &[("a", "x"), ("b", "c")]));
        assert_eq!(one, r"d|a=x\|b\=c");
        assert_eq!(two, "d|a=x|b=c");
        assert_ne!(one, two);
        // A trailing backslash cannot swallow the separator either.
        let three = key(s.resolve("d", &[("a", "x\\"), ("b", "c")]));
        assert_eq!(three, r"d|a=x\\|b=c");
        let four = key(s.resolve("d", &[("a", r"x\|b=c")]));
        assert_ne!(four, three);
        assert_ne!(four, one);
    }

    #[test]
    fn escaped_domain_and_key() {
        let s = set("domain: \"a|b\"\ndescriptors:\n  - key: \"k=1\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
        assert_eq!(key(s.resolve("a|b", &[("k=1", "v")])), r"a\|b|k\=1=v");
        assert_eq!(s.limits().next().map(|l| l.id.as_str()), Some(r"a\|b|k\=1"));
    }

    #[test]
    fn precedence_exact_then_wildcard_then_key_only() {
        let s = set("domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: a*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: ab*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: abc
    rate_limit: {unit: second, requests_per_unit: 4}
");
        let lim = |v: &str| match s.resolve("d", &[("k", v)]) {
            Resolution::Limited { limit, .. } => limit.quota.map(|q| q.limit()),
            _ => None,
        };
        assert_eq!(lim("abc"), Some(4));
        assert_eq!(lim("abd"), Some(2)); // first wildcard in file order wins
        assert_eq!(lim("a"), Some(2));
        assert_eq!(lim("zzz"), Some(1));
        assert_eq!(lim(""), Some(1));
    }

    #[test]
    fn share_threshold_uses_pattern() {
        let s = set("domain: d
descriptors:
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: model
    value: m-*
    rate_limit: {unit: hour, requests_per_unit: 100}
");
        assert_eq!(
            key(s.resolve("d", &[("path", "/files/a")])),
            "d|path=/files/*"
        );
        assert_eq!(
            key(s.resolve("d", &[("path", "/files/b")])),
            "d|path=/files/*"
        );
        assert_eq!(key(s.resolve("d", &[("model", "m-1")])), "d|model=m-1");
    }

    #[test]
    fn depth_must_match() {
        let s = set("domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: b
        value: x
        descriptors:
          - key: c
            rate_limit: {unit: second, requests_per_unit: 3}
");
        assert_eq!(key(s.resolve("d", &[("a", "1")])), "d|a=1");
        assert_eq!(
            s.resolve("d", &[("a", "1"), ("b", "x")]),
            Resolution::NoMatch
        );
        assert_eq!(
            key(s.resolve("d", &[("a", "1"), ("b", "x"), ("c", "z")])),
            "d|a=1|b=x|c=z"
        );
        assert_eq!(
            s.resolve("d", &[("a", "1"), ("b", "y"), ("c", "z")]),
            Resolution::NoMatch
        );
        assert_eq!(
            s.resolve("d", &[("a", "1"), ("b", "x"), ("c", "z"), ("d", "w")]),
            Resolution::NoMatch
        );
        assert_eq!(s.resolve("d", &[]), Resolution::NoMatch);
        assert_eq!(s.resolve("other", &[("a", "1")]), Resolution::NoMatch);
        let long: Vec<(&str, &str)> = vec![("a", "1"); 40];
        assert_eq!(s.resolve("d", &long), Resolution::NoMatch);
    }

    #[test]
    fn extensions_decode() {
        let s = set("domain: d
descriptors:
  - key: u
    message: slow down
    rate_limit:
      unit: minute
      unit_multiplier: 15
      requests_per_unit: 7
      algorithm: gcra
      burst: 3
  - key: s
    rate_limit:
      unit: second
      requests_per_unit: 7
      algorithm: count_min_sketch
      sketch_width: 100
      sketch_depth: 3
");
        let l: Vec<&Limit> = s.limits().collect();
        let q = l[0].quota.expect("quota");
        assert_eq!(q.limit(), 7);
        assert_eq!(q.period().unit, Unit::Minute);
        assert_eq!(q.period().multiplier, 15);
        assert_eq!(q.algorithm(), Algorithm::Gcra);
        assert_eq!(q.burst(), Some(3));
        assert_eq!(l[0].message.as_deref(), Some("slow down"));
        assert_eq!(l[0].line, 3);
        let q = l[1].quota.expect("quota");
        assert_eq!((q.sketch().width, q.sketch().depth), (100, 3));
        assert_eq!(q.burst(), None);
        assert_eq!(q.algorithm(), Algorithm::CountMinSketch);
    }

    #[test]
    fn collects_several_errors_in_order() {
        let e = errors(
            "domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - value: x
  - key: b
    bogus: 1
    rate_limit: {unit: second, requests_per_unit: \"ten\"}
",
        );
        let got: Vec<(usize, &str)> = e.iter().map(|e| (e.line, e.message.as_str())).collect();
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[0].0, 4);
        assert!(got[0].1.contains("invalid `unit`"));
        assert_eq!(got[1].0, 5);
        assert!(got[1].1.contains("missing required field `key`"));
        assert_eq!(got[2].0, 7);
        assert!(got[2].1.contains("unknown field `bogus`"));
        assert_eq!(got[3].0, 8);
        assert!(got[3]
            .1
            .contains("`requests_per_unit` must be an unsigned integer"));
        assert_eq!(e[3].column, 51);
        assert_eq!(
            e[2].to_string(),
            "t.yaml:7:5: unknown field `bogus` in a descriptor (allowed: key, value, rate_limit, descriptors, shadow_mode, detailed_metric, value_to_metric, share_threshold, quota_mode, metadata, message, degrade, shadowban, queue, tiers)"
        );
    }

    #[test]
    fn degrade_and_shadowban_decode() {
        let s = set("domain: d
descriptors:
  - key: a
    degrade: {below_remaining: 20%}
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: b
    degrade:
      below_remaining: 3
    shadowban: true
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 10}
");
        let l: Vec<&Limit> = s.limits().collect();
        assert_eq!(l[0].degrade, Some(DegradeThreshold::Percent(20)));
        assert!(!l[0].shadowban);
        assert_eq!(l[1].degrade, Some(DegradeThreshold::Remaining(3)));
        assert!(l[1].shadowban);
        assert_eq!((l[2].degrade, l[2].shadowban), (None, false));
    }

    #[test]
    fn degrade_and_shadowban_refuse_nonsense() {
        let cases = [
            ("degrade: {below_remaining: 0%}\n    rate_limit: {unit: second, requests_per_unit: 10}", 4, "from 1% to 100%, found 0%"),
            ("degrade: {below_remaining: 120%}\n    rate_limit: {unit: second, requests_per_unit: 10}", 4, "from 1% to 100%, found 120%"),
            ("degrade: {below_remaining: 2.5%}\n    rate_limit: {unit: second, requests_per_unit: 10}", 4, "whole percentage"),
            ("degrade: {below_remaining: 0}\n    rate_limit: {unit: second, requests_per_unit: 10}", 4, "`below_remaining` must be at least 1"),
            ("degrade: {below_remaining: 11}\n    rate_limit: {unit: second, requests_per_unit: 10}", 4, "more than the 10 this limit can ever have left"),
            ("degrade: {}\n    rate_limit: {unit: second, requests_per_unit: 10}", 4, "missing required field `below_remaining`"),
            ("degrade: {below: 5}\n    rate_limit: {unit: second, requests_per_unit: 10}", 4, "unknown field `below` in `degrade`"),
            ("degrade: 20%", 4, "`degrade` must be a mapping"),
            ("degrade: {below_remaining: 5}", 4, "`degrade` needs a `rate_limit`"),
            ("degrade: {below_remaining: 5}\n    rate_limit: {unlimited: true}", 4, "cannot be used with `unlimited: true`"),
            ("shadowban: yes please\n    rate_limit: {unit: second, requests_per_unit: 10}", 4, "`shadowban` must be true or false"),
            ("shadowban: true", 4, "`shadowban` needs a `rate_limit`"),
            ("shadowban: true\n    rate_limit: {unlimited: true}", 4, "`shadowban` cannot be used with `unlimited: true`"),
            ("shadowban: true\n    shadow_mode: true\n    rate_limit: {unit: second, requests_per_unit: 10}", 4, "cannot be combined with `shadow_mode`"),
        ];
        for (fields, line, want) in cases {
            let text = format!("domain: d\ndescriptors:\n  - key: k\n    {fields}\n");
            let e = errors(&text);
            assert!(e.iter().all(|e| e.line == line), "{fields}: {e:?}");
            assert!(
                e.iter().any(|e| e.message.contains(want)),
                "{fields}: {e:?}"
            );
        }
    }

    const TIERED: &str = "domain: api
descriptors:
  - key: api
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: fixed_window}
    tiers:
      key: plan
      levels:
        - value: paid
          guaranteed: 60
        - value: free
          guaranteed: 10
          ceiling: 80
          reserve: 20
    descriptors:
      - key: region
        rate_limit: {unit: second, requests_per_unit: 5}
";

    #[test]
    fn tiers_decode_and_resolve() {
        let s = set(TIERED);
        let l = s.limits().next().expect("limit");
        let t = l.tiers.as_ref().expect("tiers");
        assert_eq!(t.key, "plan");
        assert_eq!(
            t.levels,
            [
                TierLevel::new("paid", 60, 100, 0),
                TierLevel::new("free", 10, 80, 20)
            ]
        );
        let tier = |entries: &[(&str, &str)]| match s.resolve("api", entries) {
            Resolution::Limited {
                limit,
                counter_key,
                tier,
            } => (limit.id.clone(), counter_key, tier),
            other => panic!("{entries:?}: {other:?}"),
        };
        let parent = ("api|api".to_string(), "api|api=x".to_string());
        assert_eq!(
            tier(&[("api", "x"), ("plan", "paid")]),
            (parent.0.clone(), parent.1.clone(), Some(0))
        );
        assert_eq!(
            tier(&[("api", "x"), ("plan", "free")]),
            (parent.0.clone(), parent.1.clone(), Some(1))
        );
        // No tier entry, or a value no level lists: the last level.
        assert_eq!(
            tier(&[("api", "x"), ("plan", "gold")]),
            (parent.0.clone(), parent.1.clone(), Some(1))
        );
        assert_eq!(
            tier(&[("api", "x")]),
            (parent.0.clone(), parent.1.clone(), Some(1))
        );
        // Nested descriptors still resolve as usual, without a tier.
        assert_eq!(
            tier(&[("api", "x"), ("region", "eu")]),
            (
                "api|api|region".to_string(),
                "api|api=x|region=eu".to_string(),
                None
            )
        );
        assert_eq!(
            s.resolve("api", &[("api", "x"), ("plan", "paid"), ("region", "eu")]),
            Resolution::NoMatch
        );
        // Outside a tiered rule, an entry with the tier key is an ordinary entry.
        assert_eq!(s.resolve("api", &[("plan", "paid")]), Resolution::NoMatch);
        // The server's default algorithm applies only where it can keep tiers; no default sync.
        let d = s.clone().with_defaults(RuleDefaults {
            algorithm: Some(Algorithm::Gcra),
            sync: SyncMode::Lease,
            ..RuleDefaults::default()
        });
        let q: Vec<Quota> = d.limits().filter_map(|l| l.quota).collect();
        assert_eq!(q[0].algorithm(), Algorithm::FixedWindow);
        assert_eq!(q[0].sync(), SyncMode::Exact);
        assert_eq!(q[1].algorithm(), Algorithm::Gcra);
        let unnamed = set(&TIERED.replace(", algorithm: fixed_window", ""));
        let q = unnamed
            .with_defaults(RuleDefaults {
                algorithm: Some(Algorithm::TokenBucket),
                ..RuleDefaults::default()
            })
            .limits()
            .next()
            .and_then(|l| l.quota)
            .expect("quota");
        assert_eq!(q.algorithm(), Algorithm::SlidingWindowCounter);
        // A tiered rule may name `sync: lease`, and keeps it whatever the default.
        let leased = set(&TIERED.replace("algorithm: fixed_window", "sync: lease"));
        for defaults in [
            RuleDefaults::default(),
            RuleDefaults {
                sync: SyncMode::Batched,
                ..RuleDefaults::default()
            },
        ] {
            let q = leased
                .clone()
                .with_defaults(defaults)
                .limits()
                .next()
                .and_then(|l| l.quota)
                .expect("quota");
            assert_eq!(q.sync(), SyncMode::Lease);
        }
    }

    #[test]
    fn tiers_refuse_nonsense() {
        let rl = "rate_limit: {unit: second, requests_per_unit: 100}";
        let two = "levels: [{value: paid, guaranteed: 60}, {value: free, guaranteed: 10}]";
        let cases: Vec<(String, usize, &str)> = vec![
            (format!("{rl}\n    tiers: {{key: plan, {two}}}\n    descriptors:\n      - key: plan\n        rate_limit: {{unit: second, requests_per_unit: 1}}"), 7, "has key `plan`, which its `tiers.key` uses"),
            (format!("tiers: {{key: plan, {two}}}"), 4, "`tiers` needs a `rate_limit`"),
            (format!("rate_limit: {{unlimited: true}}\n    tiers: {{key: plan, {two}}}"), 5, "cannot be used with `unlimited: true`"),
            (format!("rate_limit: {{unit: second, requests_per_unit: 100, algorithm: gcra}}\n    tiers: {{key: plan, {two}}}"), 4, "tiered rule `k` needs algorithm fixed_window or sliding_window_counter, not gcra"),
            (format!("rate_limit: {{unit: second, requests_per_unit: 100, sync: batched}}\n    tiers: {{key: plan, {two}}}"), 4, "cannot use `sync: batched`: batched counts are approximate"),
            (format!("{rl}\n    tiers: {{key: plan, levels: []}}"), 5, "`levels` has 0 entries; a tiered rule has 1 to 16"),
            (format!("{rl}\n    tiers: {{key: plan, levels: [{}]}}", vec!["{value: a, guaranteed: 1}"; 17].join(", ")), 5, "`levels` has 17 entries"),
            (format!("{rl}\n    tiers: {{levels: [{{value: a, guaranteed: 1}}]}}"), 5, "missing required field `key`"),
            (format!("{rl}\n    tiers: {{key: plan}}"), 5, "missing required field `levels`"),
            (format!("{rl}\n    tiers: {{key: plan, levels: [{{value: a, guaranteed: 1}}, {{value: a, guaranteed: 1}}]}}"), 5, "duplicate tier value `a`"),
            (format!("{rl}\n    tiers: {{key: plan, levels: [{{value: a, guaranteed: 60}}, {{value: b, guaranteed: 50}}]}}"), 5, "guarantee 110 in all, more than its limit of 100"),
            (format!("{rl}\n    tiers: {{key: plan, levels: [{{value: a, guaranteed: 60, ceiling: 50}}]}}"), 5, "`ceiling` 50 is below its `guaranteed` 60"),
            (format!("{rl}\n    tiers: {{key: plan, levels: [{{value: a, guaranteed: 1, ceiling: 101}}]}}"), 5, "`ceiling` 101 is more than the limit of 100"),
            (format!("{rl}\n    tiers: {{key: plan, levels: [{{value: a, guaranteed: 1}}, {{value: b, guaranteed: 1, reserve: 101}}]}}"), 5, "`reserve` 101 is more than the limit of 100"),
            (format!("{rl}\n    tiers: {{key: plan, levels: [{{value: a, guaranteed: 1, reserve: 5}}]}}"), 5, "first (highest priority) level"),
            (format!("{rl}\n    tiers: {{key: plan, levels: [{{value: a}}]}}"), 5, "missing required field `guaranteed`"),
            (format!("{rl}\n    tiers: {{key: plan, levels: [{{value: a, guaranteed: -1}}]}}"), 5, "`guaranteed` must not be negative"),
            (format!("{rl}\n    tiers: {{key: plan, levels: [{{value: a, guaranteed: 1, share: 2}}]}}"), 5, "unknown field `share` in a tier level"),
            (format!("{rl}\n    tiers: [plan]"), 5, "`tiers` must be a mapping"),
        ];
        for (fields, line, want) in cases {
            let text = format!("domain: d\ndescriptors:\n  - key: k\n    {fields}\n");
            let e = errors(&text);
            assert!(e.iter().all(|e| e.line == line), "{fields}: {e:?}");
            assert!(
                e.iter().any(|e| e.message.contains(want)),
                "{fields}: {e:?}"
            );
        }
    }

    #[test]
    fn flush_interval_per_limit() {
        let one = |fields: &str| {
            format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 9, {fields}}}\n"
            )
        };
        let q = |s: &RuleSet| s.limits().next().and_then(|l| l.quota).expect("quota");
        let fast = set(&one("sync: batched, flush_interval: 50ms"));
        assert_eq!(q(&fast).flush_interval(), Some(Duration::from_millis(50)));
        assert_eq!(
            q(&set(&one("sync: batched, flush_interval: 1.5s"))).flush_interval(),
            Some(Duration::from_millis(1_500))
        );
        assert_eq!(q(&set(&one("sync: batched"))).flush_interval(), None);
        // On line 4, the `rate_limit` line.
        for (fields, want) in [
            ("sync: batched, flush_interval: soon", "`flush_interval` must be a duration such as `500ms` or `2s`, found"),
            ("sync: batched, flush_interval: 0ms", "`flush_interval` must be from 1ms to 60s, found 0ms"),
            ("sync: batched, flush_interval: 61s", "`flush_interval` must be from 1ms to 60s, found 61s"),
            ("sync: batched, flush_interval: [1s]", "`flush_interval` must be a duration"),
            ("sync: lease, flush_interval: 1s", "`flush_interval` applies only to `sync: batched` (how often its counts are sent to the store); this limit is `sync: lease`"),
            ("sync: exact, flush_interval: 1s", "this limit is `sync: exact`"),
        ] {
            let e = errors(&one(fields));
            assert!(e.iter().all(|e| e.line == 4), "{fields}: {e:?}");
            assert!(e.iter().any(|e| e.message.contains(want)), "{fields}: {e:?}");
            assert!(e[0].to_string().starts_with("t.yaml:4:"), "{e:?}");
        }
        let unlimited = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, flush_interval: 1s}\n";
        assert!(errors(unlimited)[0]
            .message
            .contains("cannot be combined with `flush_interval`"));
        // Naming no mode: it is batched when `--sync-default` makes it so, refused otherwise.
        let unnamed = set(&one("algorithm: fixed_window, flush_interval: 20ms"));
        let batched = unnamed.clone().with_defaults(RuleDefaults {
            sync: SyncMode::Batched,
            ..RuleDefaults::default()
        });
        assert_eq!(q(&batched).sync(), SyncMode::Batched);
        assert_eq!(
            q(&batched).flush_interval(),
            Some(Duration::from_millis(20))
        );
        assert!(batched.unleasable().is_empty());
        let exact = unnamed.with_defaults(RuleDefaults::default());
        assert_eq!(
            exact.unleasable(),
            [
                "t.yaml:3: `flush_interval` applies only to `sync: batched`, and this limit is \
              `sync: exact` (the default sync mode is exact; name `sync: batched` or drop \
              `flush_interval`)"
            ]
        );
        let gcra = set(&one("algorithm: gcra, flush_interval: 20ms")).with_defaults(RuleDefaults {
            sync: SyncMode::Batched,
            ..RuleDefaults::default()
        });
        assert!(gcra.unleasable()[0].contains("its algorithm gcra cannot be batched"));
    }

    #[test]
    fn merged_domain_across_files() {
        let a = (
            "a.yaml".to_string(),
            "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n".to_string(),
        );
        let b = (
            "b.yaml".to_string(),
            "domain: x\ndescriptors:\n  - key: j\n    rate_limit: {unit: minute, requests_per_unit: 2}\n".to_string(),
        );
        let set = RuleSet::from_sources_with(&[a.clone(), b], true).expect("merged");
        assert_eq!(set.domains().count(), 1);
        for (key, file) in [("k", "a.yaml"), ("j", "b.yaml")] {
            match set.resolve("x", &[(key, "v")]) {
                Resolution::Limited { limit, .. } => assert_eq!(limit.file, file),
                _ => panic!("{key} not limited"),
            }
        }
        // A top-level descriptor defined in both files is still an error, naming both.
        let c = ("c.yaml".to_string(), a.1.clone());
        let e = RuleSet::from_sources_with(&[a, c], true).expect_err("duplicate");
        assert_eq!(
            e.to_string(),
            "c.yaml:3:5: duplicate descriptor: key `k` already defined at the top level of domain `x` in a.yaml"
        );
    }

    #[test]
    fn duplicate_domain_across_files() {
        let a = ("a.yaml".to_string(), "domain: x\n".to_string());
        let b = ("b.yaml".to_string(), "\ndomain: x\n".to_string());
        let e = RuleSet::from_sources(&[a, b]).expect_err("duplicate");
        assert_eq!(e.0.len(), 1);
        assert_eq!(e.0[0].file, "b.yaml");
        assert_eq!(e.0[0].line, 2);
        assert!(e.0[0]
            .message
            .contains("duplicate domain `x`: already defined in a.yaml"));
        assert_eq!(
            e.to_string(),
            "b.yaml:2:9: duplicate domain `x`: already defined in a.yaml"
        );
    }

    #[test]
    fn domains_sorted_and_limits_listed() {
        let s = RuleSet::from_sources(&[
            (
                "z.yaml".to_string(),
                "domain: zeta\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n"
                    .to_string(),
            ),
            (
                "a.yaml".to_string(),
                "domain: alpha\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 0}\n"
                    .to_string(),
            ),
        ])
        .expect("valid");
        let names: Vec<&str> = s.domains().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["alpha", "zeta"]);
        let ids: Vec<&str> = s.limits().map(|l| l.id.as_str()).collect();
        assert_eq!(ids, ["alpha|k", "zeta|k"]);
        assert!(
            matches!(s.resolve("zeta", &[("k", "v")]), Resolution::Unlimited(l) if l.id == "zeta|k")
        );
        assert_eq!(s.domain("alpha").map(|d| d.file.as_str()), Some("a.yaml"));
        assert!(RuleSet::empty().is_empty());
        assert_eq!(
            RuleSet::empty().resolve("alpha", &[("k", "v")]),
            Resolution::NoMatch
        );
    }

    #[test]
    fn garbage_never_panics() {
        let inputs = [
            "",
            "---",
            "- a\n- b",
            "domain: [1]",
            "domain: d\ndescriptors: {a: 1}",
            "domain: d\ndescriptors: [1, [2], {key: [x]}]",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: [1]",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {replaces: 3, unit: second, requests_per_unit: 1}",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {replaces: [3, {}], unit: second, requests_per_unit: 1}",
            "{[a]: b}",
            "\t\u{0}\u{feff}",
            "domain: &x d\nother: *y",
            "? a\n: b",
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: -1}}",
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1e3}}",
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: 5, requests_per_unit: 1}}",
        ];
        for text in inputs {
            let r = RuleSet::from_sources(&[("g.yaml".to_string(), text.to_string())]);
            if let Err(e) = r {
                assert!(!e.is_empty());
                for err in e.iter() {
                    assert!(!err.message.is_empty());
                }
            }
        }
    }
}
