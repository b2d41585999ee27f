//! The decision log (`--decision-log off|denied|all`): one INFO line per limited descriptor
//! naming its domain, rule and key, so that an operator can see who was refused and by which
//! rule without turning on debug logs.
//!
//! The log is itself rate-limited: a flood of denials must not fill the disk or take the CPU
//! the decisions need. At most [`DecisionLogConfig::max_per_second`] lines are written per
//! second; the lines beyond are counted, and the first line written in a later second is
//! preceded by one line saying how many were suppressed. With the log off a decision costs one
//! relaxed atomic load.
//!
//! The lines go through `tracing` with the target [`TARGET`], so they take the service's log
//! format (`TOLLGATE_LOG_FORMAT=json` gives one JSON object per line) and the binary lets them
//! through whatever the level of the other logs. Keys are the request's descriptor values
//! (user ids, addresses, API keys): the log can hold personal data, which is why it is off by
//! default.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;
use tollgate_core::limiter::{Descriptor, Status};

/// The `tracing` target of the decision lines.
pub const TARGET: &str = "tollgate::decision";

/// Which decisions are logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DecisionLogMode {
    /// None (the default).
    #[default]
    Off,
    /// Descriptors over their limit (shadow-mode ones too, marked `shadow=true`).
    Denied,
    /// Every descriptor a limit applied to.
    All,
}

impl std::str::FromStr for DecisionLogMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" => Ok(Self::Off),
            "denied" => Ok(Self::Denied),
            "all" => Ok(Self::All),
            other => Err(format!("`{other}`: expected off, denied or all")),
        }
    }
}

/// `--decision-log` and `--decision-log-max-per-second`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecisionLogConfig {
    /// What is logged.
    pub mode: DecisionLogMode,
    /// Most lines written per second; the rest are counted and reported.
    pub max_per_second: u32,
}

impl Default for DecisionLogConfig {
    fn default() -> Self {
        Self {
            mode: DecisionLogMode::Off,
            max_per_second: 100,
        }
    }
}

/// The mode in force ([`install`]): 0 off, 1 denied, 2 all.
static MODE: AtomicU8 = AtomicU8::new(0);

/// The line budget of the process.
struct Budget {
    /// When the log was installed: seconds are counted from it.
    start: Instant,
    /// Most lines a second.
    max: u32,
    /// The second being counted, lines written in it, lines suppressed since the last report.
    state: Mutex<(u64, u32, u64)>,
}

static BUDGET: OnceLock<Budget> = OnceLock::new();

/// Turn the log on as `config` says, for the whole process (the log is process-wide, like the
/// logger it writes to). The first configuration installed keeps its line budget.
pub fn install(config: DecisionLogConfig) {
    let mode = match config.mode {
        DecisionLogMode::Off => 0,
        DecisionLogMode::Denied => 1,
        DecisionLogMode::All => 2,
    };
    if mode > 0 {
        BUDGET.get_or_init(|| Budget {
            start: Instant::now(),
            max: config.max_per_second.max(1),
            state: Mutex::new((0, 0, 0)),
        });
    }
    MODE.store(mode, Ordering::Relaxed);
}

/// Whether a line may be written now; when lines were suppressed before it, that count (to
/// report first).
fn admit() -> Option<u64> {
    let budget = BUDGET.get()?;
    let second = budget.start.elapsed().as_secs();
    let mut s = budget.state.lock().unwrap_or_else(|e| e.into_inner());
    if s.0 != second {
        s.0 = second;
        s.1 = 0;
    }
    if s.1 >= budget.max {
        s.2 += 1;
        return None;
    }
    s.1 += 1;
    Some(std::mem::take(&mut s.2))
}

/// `key=value;key2=value2`, the form `tollgate check --descriptor` takes.
fn key_text(entries: &[(String, String)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            out.push(';');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    out
}

/// Log the limited descriptors of one decided request, as the installed mode says.
pub(crate) fn record(domain: &str, statuses: &[Status<'_>], descriptors: &[Descriptor], hits: u64) {
    let mode = MODE.load(Ordering::Relaxed);
    if mode == 0 {
        return;
    }
    for (status, desc) in statuses.iter().zip(descriptors) {
        let Status::Limited {
            limit, decision, ..
        } = status
        else {
            continue;
        };
        if mode == 1 && decision.allowed {
            continue;
        }
        let Some(suppressed) = admit() else {
            continue;
        };
        if suppressed > 0 {
            tracing::info!(
                target: TARGET,
                suppressed,
                "decision log: lines suppressed (more than --decision-log-max-per-second)"
            );
        }
        let outcome = if decision.allowed {
            "allowed"
        } else {
            "denied"
        };
        tracing::info!(
            target: TARGET,
            domain,
            rule = %limit.id,
            name = limit.name.as_deref().unwrap_or(""),
            // As a string, not displayed: the text format quotes and escapes it (its values
            // are the client's), the JSON format writes it as a JSON string.
            key = key_text(&desc.entries).as_str(),
            outcome,
            shadow = limit.shadow_mode,
            hits = desc.hits.unwrap_or(hits),
            limit = decision.limit,
            remaining = decision.reported_remaining(),
            "decision"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_bad_ones_say_what_is_expected() {
        assert_eq!("off".parse(), Ok(DecisionLogMode::Off));
        assert_eq!("Denied".parse(), Ok(DecisionLogMode::Denied));
        assert_eq!("all".parse(), Ok(DecisionLogMode::All));
        let e = "some".parse::<DecisionLogMode>().unwrap_err();
        assert!(e.contains("off, denied or all"), "{e}");
    }

    #[test]
    fn keys_read_as_check_takes_them() {
        let entries = vec![
            ("user".to_owned(), "alice".to_owned()),
            ("path".to_owned(), "/a".to_owned()),
        ];
        assert_eq!(key_text(&entries), "user=alice;path=/a");
    }
}
