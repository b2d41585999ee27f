//! Per-client request rates: for each candidate key (`ip`, `header:X-Api-Key`, `ip+path`, ...)
//! every client's peak count in each window length, and from their distribution a suggested
//! limit and the burst check.
//!
//! Memory is bounded: a key group tracks at most `max_clients` distinct clients exactly (a
//! hash map from the client's key to a few counters per window); requests of clients beyond
//! the cap are counted in the totals only and reported as untracked. A client's key is kept
//! whole up to [`MAX_KEY`] bytes; a longer one as its start and a hash of the whole (see
//! [`bounded_key`]), so that a log of long keys costs no more per client than one of short ones. Windows are aligned to
//! the epoch and a client's counters keep only its current window and its peak, so a line up
//! to one window out of order counts in the window at hand.

use super::parse::Record;
use std::collections::HashMap;

/// One part of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    Ip,
    /// The path without its query.
    Path,
    Method,
    Host,
    Header(String),
    /// A CSV trace's descriptor as written.
    Descriptor,
    /// A CSV trace's descriptor entry of this key.
    Entry(String),
}

/// A candidate key: parts joined by `+`.
#[derive(Debug, Clone)]
pub(crate) struct KeySpec {
    pub name: String,
    pub parts: Vec<Part>,
}

impl std::str::FromStr for KeySpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts = s
            .split('+')
            .map(|p| {
                let p = p.trim();
                Ok(match p {
                    "ip" => Part::Ip,
                    "path" => Part::Path,
                    "method" => Part::Method,
                    "host" => Part::Host,
                    "descriptor" => Part::Descriptor,
                    _ => match p.split_once(':') {
                        Some(("header", h)) if !h.is_empty() => Part::Header(h.to_owned()),
                        Some(("entry", e)) if !e.is_empty() => Part::Entry(e.to_owned()),
                        _ => {
                            return Err(format!(
                                "unknown key part '{p}': expected ip, path, method, host, \
                                 header:NAME, descriptor or entry:KEY, joined by +"
                            ))
                        }
                    },
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(KeySpec {
            name: s.to_owned(),
            parts,
        })
    }
}

impl KeySpec {
    /// The client's key of `r` under this spec, written into `out`.
    pub(crate) fn write(&self, r: &Record<'_>, out: &mut String) {
        out.clear();
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            match p {
                Part::Ip => out.push_str(r.ip),
                Part::Path => out.push_str(r.path.split('?').next().unwrap_or("")),
                Part::Method => out.push_str(r.method),
                Part::Host => out.push_str(r.host),
                Part::Header(h) => out.push_str(r.header(h).unwrap_or("-")),
                Part::Descriptor => {
                    if let Some(e) = r.event {
                        out.push_str(&e.raw_descriptor);
                    }
                }
                Part::Entry(k) => {
                    if let Some((_, v)) = r
                        .event
                        .and_then(|e| e.descriptor.entries.iter().find(|(ek, _)| ek == k))
                    {
                        out.push_str(v);
                    }
                }
            }
        }
    }
}

/// Most bytes of a client's key kept as written.
pub(crate) const MAX_KEY: usize = 64;
/// Of a longer key: the bytes kept from its start (the rest of [`MAX_KEY`] holds `…#` and the
/// hash).
const KEPT: usize = 44;

/// `key` within [`MAX_KEY`] bytes: itself when it fits, else its first [`KEPT`] bytes (cut at
/// a character boundary), `…#` and 16 hex digits of a 64-bit hash of the whole key. Two
/// distinct long keys stay distinct but for a hash collision (about one chance in 2^64 per
/// pair); the start still tells a reader what the key was.
pub(crate) fn bounded_key(key: &mut String) {
    if key.len() <= MAX_KEY {
        return;
    }
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same key gives the same hash in every run.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    let hash = h.finish();
    let mut cut = KEPT;
    while !key.is_char_boundary(cut) {
        cut -= 1;
    }
    key.truncate(cut);
    use std::fmt::Write as _;
    let _ = write!(key, "…#{hash:016x}");
}

/// A window length in microseconds with its name as given (`1s`, `1m`, `1h`, `10s`, `1d`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Window {
    pub name: String,
    pub us: u64,
}

impl std::str::FromStr for Window {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (n, unit) = s.split_at(split);
        let n: u64 = if n.is_empty() {
            1
        } else {
            n.parse().map_err(|_| format!("window '{s}': bad number"))?
        };
        let unit_s = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ => {
                return Err(format!(
                    "window '{s}': expected a number and s, m, h or d (e.g. 1s, 10s, 1m, 1h)"
                ))
            }
        };
        if n == 0 || n > 366 * 86_400 / unit_s {
            return Err(format!("window '{s}': must be between 1s and 366d"));
        }
        Ok(Window {
            name: s.to_owned(),
            us: n * unit_s * 1_000_000,
        })
    }
}

/// One client's counters in one window length.
#[derive(Debug, Clone, Copy, Default)]
struct WinCount {
    window: u64,
    count: u32,
    peak: u32,
}

/// The clients of one key spec.
pub(crate) struct Group {
    pub spec: KeySpec,
    index: HashMap<Box<str>, u32>,
    /// Per client: its key's requests, then one [`WinCount`] per window.
    requests: Vec<u64>,
    counts: Vec<WinCount>,
    nwin: usize,
    pub total: u64,
    /// Requests of clients beyond the cap (not tracked per client).
    pub untracked: u64,
    max_clients: usize,
    scratch: String,
}

impl Group {
    pub(crate) fn new(spec: KeySpec, nwin: usize, max_clients: usize) -> Self {
        Group {
            spec,
            index: HashMap::new(),
            requests: Vec::new(),
            counts: Vec::new(),
            nwin,
            total: 0,
            untracked: 0,
            max_clients,
            scratch: String::new(),
        }
    }

    pub(crate) fn clients(&self) -> usize {
        self.requests.len()
    }

    /// Count `r` (of cost `hits`).
    pub(crate) fn add(&mut self, r: &Record<'_>, hits: u64, windows: &[Window]) {
        self.total += hits;
        let mut key = std::mem::take(&mut self.scratch);
        self.spec.write(r, &mut key);
        bounded_key(&mut key);
        let id = match self.index.get(key.as_str()) {
            Some(&id) => id as usize,
            None if self.requests.len() >= self.max_clients => {
                self.untracked += hits;
                self.scratch = key;
                return;
            }
            None => {
                let id = self.requests.len();
                self.index.insert(key.as_str().into(), id as u32);
                self.requests.push(0);
                self.counts
                    .extend(std::iter::repeat_n(WinCount::default(), self.nwin));
                id
            }
        };
        self.scratch = key;
        self.requests[id] += hits;
        let hits = u32::try_from(hits).unwrap_or(u32::MAX);
        for (c, w) in self.counts[id * self.nwin..(id + 1) * self.nwin]
            .iter_mut()
            .zip(windows)
        {
            let win = r.t_us / w.us;
            if win > c.window || c.count == 0 {
                c.window = win;
                c.count = 0;
            }
            c.count = c.count.saturating_add(hits);
            c.peak = c.peak.max(c.count);
        }
    }

    /// Every client's peak count in window `w` (by index), sorted ascending.
    pub(crate) fn peaks(&self, w: usize) -> Vec<u32> {
        let mut v: Vec<u32> = (0..self.clients())
            .map(|i| self.counts[i * self.nwin + w].peak)
            .collect();
        v.sort_unstable();
        v
    }

    /// The heavy hitters: clients that each sent at least [`HEAVY_SHARE`] percent of the
    /// requests tracked per client and at least [`HEAVY_FAIR`] times an even share of them.
    /// Their keys, requests and ids, most requests first.
    pub(crate) fn heavy(&self) -> Vec<(String, u64, u32)> {
        let tracked: u64 = self.requests.iter().sum();
        let clients = self.clients() as u64;
        if tracked == 0 {
            return Vec::new();
        }
        // requests / tracked >= SHARE / 100 and >= FAIR / clients, in integers.
        let heavy = |n: u64| {
            u128::from(n) * 100 >= u128::from(HEAVY_SHARE) * u128::from(tracked)
                && u128::from(n) * u128::from(clients)
                    >= u128::from(HEAVY_FAIR) * u128::from(tracked)
        };
        let mut found: Vec<(String, u64, u32)> = self
            .index
            .iter()
            .filter(|(_, &i)| heavy(self.requests[i as usize]))
            .map(|(k, &i)| (k.to_string(), self.requests[i as usize], i))
            .collect();
        found.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        found
    }

    /// The requests tracked per client (the total less the untracked).
    pub(crate) fn tracked(&self) -> u64 {
        self.requests.iter().sum()
    }

    /// [`Group::peaks`] of every client but those of `skip` (ids).
    pub(crate) fn peaks_without(&self, w: usize, skip: &[u32]) -> Vec<u32> {
        let mut v: Vec<u32> = (0..self.clients())
            .filter(|i| !skip.contains(&(*i as u32)))
            .map(|i| self.counts[i * self.nwin + w].peak)
            .collect();
        v.sort_unstable();
        v
    }

    fn peak(&self, client: usize, w: usize) -> u32 {
        self.counts[client * self.nwin + w].peak
    }

    /// The clients with their key, requests and peaks, most requests first, at most `n`.
    pub(crate) fn top(&self, n: usize) -> Vec<(String, u64, Vec<u32>)> {
        let mut ids: Vec<(&str, u32)> = self.index.iter().map(|(k, &i)| (&**k, i)).collect();
        ids.sort_unstable_by(|a, b| {
            self.requests[b.1 as usize]
                .cmp(&self.requests[a.1 as usize])
                .then(a.0.cmp(b.0))
        });
        ids.truncate(n);
        ids.into_iter()
            .map(|(k, i)| {
                let i = i as usize;
                (
                    k.to_owned(),
                    self.requests[i],
                    (0..self.nwin).map(|w| self.peak(i, w)).collect(),
                )
            })
            .collect()
    }

    /// The clients whose peak in window `w` is above `limit`: their keys (at most `n`), how
    /// many, and their requests.
    pub(crate) fn over(&self, w: usize, limit: u64, n: usize) -> (Vec<String>, usize, u64) {
        let mut keys = Vec::new();
        let (mut count, mut requests) = (0, 0);
        let mut ids: Vec<(&str, u32)> = self
            .index
            .iter()
            .map(|(k, &i)| (&**k, i))
            .filter(|&(_, i)| u64::from(self.peak(i as usize, w)) > limit)
            .collect();
        ids.sort_unstable_by(|a, b| {
            self.requests[b.1 as usize]
                .cmp(&self.requests[a.1 as usize])
                .then(a.0.cmp(b.0))
        });
        for (k, i) in ids {
            count += 1;
            requests += self.requests[i as usize];
            if keys.len() < n {
                keys.push(k.to_owned());
            }
        }
        (keys, count, requests)
    }

    /// Bursty clients: a peak of at least [`BURST_MIN`] requests in the short window `s` that
    /// is at least [`BURST_RATIO`] times the client's average rate over its peak long window
    /// `p`, among clients within `limit` per `p`. Their keys (at most `n`, largest burst
    /// first), how many, and the largest burst.
    pub(crate) fn bursty(
        &self,
        s: (usize, u64),
        p: (usize, u64),
        limit: u64,
        n: usize,
    ) -> (Vec<(String, u32)>, usize, u32) {
        let mut found: Vec<(&str, u32)> = self
            .index
            .iter()
            .map(|(k, &i)| (&**k, i as usize))
            .filter(|&(_, i)| u64::from(self.peak(i, p.0)) <= limit)
            .filter(|&(_, i)| is_bursty(self.peak(i, s.0), s.1, self.peak(i, p.0), p.1))
            .map(|(k, i)| (k, self.peak(i, s.0)))
            .collect();
        found.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let largest = found.first().map_or(0, |f| f.1);
        let count = found.len();
        found.truncate(n);
        (
            found.into_iter().map(|(k, b)| (k.to_owned(), b)).collect(),
            count,
            largest,
        )
    }
}

/// A heavy hitter sends at least this percentage of a key's requests...
pub(crate) const HEAVY_SHARE: u64 = 5;
/// ...and at least this many times an even share of them (with 21 clients, 24 %; with
/// fewer than 6 clients no one can be told apart from the rest).
pub(crate) const HEAVY_FAIR: u64 = 5;

/// Below this many clients (heavy hitters left out) the 99th percentile is the busiest
/// client's peak: a suggestion from so few is a first guess.
pub(crate) const SMALL_SAMPLE: usize = 100;

/// Fewest requests in the short window for a burst to count.
pub(crate) const BURST_MIN: u32 = 10;
/// How many times its long-window average rate a client's short-window peak must be.
pub(crate) const BURST_RATIO: u64 = 10;

fn is_bursty(peak_s: u32, s_us: u64, peak_p: u32, p_us: u64) -> bool {
    // peak_s / s >= RATIO * peak_p / p, in integers.
    peak_s >= BURST_MIN
        && u128::from(peak_s) * u128::from(p_us)
            >= u128::from(BURST_RATIO) * u128::from(peak_p) * u128::from(s_us)
}

/// The `p`-th percentile (0..=100) of sorted `v`, nearest rank; 0 for none.
pub(crate) fn percentile(v: &[u32], p: u64) -> u32 {
    if v.is_empty() {
        return 0;
    }
    let rank = (v.len() as u64 * p).div_ceil(100).max(1) as usize;
    v[rank - 1]
}

/// The smallest "human" number at least `x`: 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power
/// of ten (integers only).
pub(crate) fn human_at_least(x: f64) -> u64 {
    if x <= 1.0 {
        return 1;
    }
    let mut mag = 1u64;
    loop {
        for m in [10, 15, 20, 25, 30, 40, 50, 60, 80] {
            let v = m * mag / 10;
            if v >= 1 && v as f64 >= x && (m * mag) % 10 == 0 {
                return v;
            }
        }
        if mag > u64::MAX / 100 {
            return u64::MAX;
        }
        mag *= 10;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_human_numbers() {
        assert_eq!(human_at_least(0.2), 1);
        assert_eq!(human_at_least(1.2), 2);
        assert_eq!(human_at_least(52.5), 60);
        assert_eq!(human_at_least(60.0), 60);
        assert_eq!(human_at_least(61.0), 80);
        assert_eq!(human_at_least(81.0), 100);
        assert_eq!(human_at_least(101.0), 150);
        assert_eq!(human_at_least(2400.0), 2500);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 50), 50);
        assert_eq!(percentile(&v, 99), 99);
        assert_eq!(percentile(&v, 100), 100);
        assert_eq!(percentile(&[7], 99), 7);
        assert_eq!(percentile(&[], 99), 0);
    }

    #[test]
    fn parses_keys_and_windows() {
        let k: KeySpec = "ip+header:X-Api-Key".parse().unwrap();
        assert_eq!(k.parts, [Part::Ip, Part::Header("X-Api-Key".into())]);
        assert!("ip+nope".parse::<KeySpec>().is_err());
        assert_eq!("10s".parse::<Window>().unwrap().us, 10_000_000);
        assert_eq!("1h".parse::<Window>().unwrap().us, 3_600_000_000);
        assert!("0s".parse::<Window>().is_err());
        assert!("5x".parse::<Window>().is_err());
    }

    #[test]
    fn bursts_are_relative_to_the_long_window() {
        // 60 in a second, 60 in the minute: 60 times the minute's average.
        assert!(is_bursty(60, 1_000_000, 60, 60_000_000));
        // Steady: 40 in a second, 1,700 in the minute.
        assert!(!is_bursty(40, 1_000_000, 1700, 60_000_000));
        // Too few to speak of a burst.
        assert!(!is_bursty(3, 1_000_000, 3, 60_000_000));
    }

    #[test]
    fn long_keys_keep_their_start_and_a_hash() {
        let mut short = "a".repeat(MAX_KEY);
        bounded_key(&mut short);
        assert_eq!(short, "a".repeat(MAX_KEY));
        let long = |end: &str| {
            let mut k = format!("{}{end}", "é".repeat(5000));
            bounded_key(&mut k);
            k
        };
        let (a, b) = (long("1"), long("2"));
        assert!(a.len() <= MAX_KEY, "{} bytes", a.len());
        assert!(a.starts_with(&"é".repeat(KEPT / 2)), "{a}");
        assert_ne!(a, b);
        assert_eq!(a, long("1"));
    }
}
