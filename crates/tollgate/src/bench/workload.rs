//! What `tollgate bench` sends: descriptor templates (`key=user_{key}`), the key space they draw
//! from and its distribution (uniform or Zipf).
//!
//! The load generator shares the machine with the server, so building a request must be cheap:
//! templates are split once into literal segments (JSON-escaped once) and `{key}` holes, and a
//! request is a few `extend_from_slice` calls plus one integer format. Randomness is a small
//! SplitMix64 per worker (no shared state, no dependency); Zipf uses rejection-inversion
//! (Hörmann & Derflinger 1996), O(1) memory and time whatever `--keys` is.

use anyhow::{bail, Context};
use std::fmt::Write as _;
use tollgate_proto::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use tollgate_proto::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_proto::pb::google::protobuf::UInt64Value;

/// The placeholder replaced by the drawn key number.
const HOLE: &str = "{key}";

/// How keys are drawn from `0..keys`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    /// Every key equally likely.
    Uniform,
    /// Key `k` (0-based) with probability proportional to `1 / (k + 1)^s`.
    Zipf(f64),
    /// Every key in turn, from the seed on (worker `w` of `n` takes `seed + w`, then every
    /// `n`-th): `--keys N` requests touch N distinct keys, e.g. to fill a server's memory.
    Sequential,
}

impl std::str::FromStr for Distribution {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s.split_once(':') {
            None if s == "uniform" => Ok(Distribution::Uniform),
            None if s == "sequential" => Ok(Distribution::Sequential),
            Some(("zipf", exp)) => {
                let e: f64 = exp
                    .parse()
                    .with_context(|| format!("zipf exponent '{exp}' is not a number"))?;
                if !(e.is_finite() && e > 0.0) {
                    bail!("zipf exponent must be > 0, got {e}");
                }
                Ok(Distribution::Zipf(e))
            }
            _ => bail!(
                "distribution must be `uniform`, `zipf:S` (e.g. zipf:1.1) or `sequential`, got '{s}'"
            ),
        }
    }
}

/// A text with `{key}` holes: literal parts alternate with holes, starting and ending with a
/// literal (possibly empty).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Template {
    parts: Vec<String>,
}

impl Template {
    fn parse(text: &str, hole: &str) -> Self {
        Self {
            parts: text.split(hole).map(str::to_string).collect(),
        }
    }

    /// Append the text with every hole replaced by `key`.
    fn render_into(&self, key: u64, out: &mut String) {
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                let _ = write!(out, "{key}");
            }
            out.push_str(part);
        }
    }

    fn render(&self, key: u64) -> String {
        let mut out = String::new();
        self.render_into(key, &mut out);
        out
    }
}

/// The request of every call, with holes for the key.
#[derive(Debug, Clone)]
pub struct Workload {
    domain: String,
    /// One descriptor per `--descriptor`, each a list of `(key, value)` templates.
    descriptors: Vec<Vec<(Template, Template)>>,
    hits: Option<u64>,
    keys: u64,
    distribution: Distribution,
    /// The whole `/v1/check` body as one template (literal parts already JSON).
    json: Template,
}

impl Workload {
    /// `descriptors` are `k=v;k2=v2` texts (as `tollgate check`), any part may hold `{key}`.
    pub fn new(
        domain: &str,
        descriptors: &[String],
        hits: Option<u64>,
        keys: u64,
        distribution: Distribution,
    ) -> anyhow::Result<Self> {
        if descriptors.is_empty() {
            bail!("give at least one --descriptor, e.g. 'user=user_{{key}}'");
        }
        if keys == 0 {
            bail!("--keys must be at least 1");
        }
        let descriptors = descriptors
            .iter()
            .map(|d| {
                Ok(crate::check::parse_descriptor(d)?
                    .iter()
                    .map(|(k, v)| (Template::parse(k, HOLE), Template::parse(v, HOLE)))
                    .collect())
            })
            .collect::<anyhow::Result<Vec<Vec<_>>>>()?;
        // Render the body once by serde_json with a plain-ASCII marker (JSON leaves it as is) in
        // each hole, then split on the marker: only the key digits are spliced in per request.
        let marker = "@@tollgate-bench-key@@";
        let marked: Vec<Vec<(String, String)>> = descriptors
            .iter()
            .map(|entries: &Vec<(Template, Template)>| {
                entries
                    .iter()
                    .map(|(k, v)| (k.parts.join(marker), v.parts.join(marker)))
                    .collect()
            })
            .collect();
        let body = crate::check::request_body(domain, &marked, hits);
        let json = Template::parse(&body.to_string(), marker);
        Ok(Self {
            domain: domain.to_string(),
            descriptors,
            hits,
            keys,
            distribution,
            json,
        })
    }

    /// The sampler of worker `worker` of `workers`: each draws its own sequence from `seed`.
    pub fn sampler(&self, seed: u64, worker: usize, workers: usize) -> KeySampler {
        let mut k = KeySampler::new(
            self.keys,
            self.distribution,
            seed ^ (worker as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        if self.distribution == Distribution::Sequential {
            let (w, n) = (worker as u64 % self.keys, workers.max(1) as u64 % self.keys);
            k.sequential = Some(((seed % self.keys + w) % self.keys, n));
        }
        k
    }

    /// The `/v1/check` JSON body for `key`.
    pub fn http_body(&self, key: u64) -> String {
        let mut out =
            String::with_capacity(self.json.parts.iter().map(String::len).sum::<usize>() + 32);
        self.json.render_into(key, &mut out);
        out
    }

    /// The Envoy RLS request for `key`. `--hits` goes into each descriptor's `hits_addend`
    /// (a `UInt64Value`, so any cost including 0 is exact; the request-level field is a u32
    /// where 0 means 1).
    pub fn grpc_request(&self, key: u64) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: self
                .descriptors
                .iter()
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .iter()
                        .map(|(k, v)| Entry {
                            key: k.render(key),
                            value: v.render(key),
                        })
                        .collect(),
                    hits_addend: self.hits.map(|value| UInt64Value { value }),
                    ..RateLimitDescriptor::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }
}

/// SplitMix64: tiny, fast, good enough to spread load over keys (not for cryptography).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-shift (bias below 2^-32 for any sane `n`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Draws key numbers in `0..keys`.
#[derive(Debug, Clone)]
pub struct KeySampler {
    rng: Rng,
    keys: u64,
    zipf: Option<Zipf>,
    /// `Sequential`: the next key and the step (both below `keys`).
    sequential: Option<(u64, u64)>,
}

impl KeySampler {
    fn new(keys: u64, distribution: Distribution, seed: u64) -> Self {
        Self {
            rng: Rng::new(seed),
            keys,
            zipf: match distribution {
                Distribution::Zipf(s) => Some(Zipf::new(keys, s)),
                Distribution::Uniform | Distribution::Sequential => None,
            },
            sequential: None,
        }
    }

    /// The next key number.
    pub fn next_key(&mut self) -> u64 {
        if let Some((next, stride)) = &mut self.sequential {
            let key = *next;
            // Both below `keys`: the sum cannot overflow for any key space below 2^63.
            *next = (*next + *stride) % self.keys;
            return key;
        }
        match &self.zipf {
            None => self.rng.below(self.keys),
            Some(z) => z.sample(&mut self.rng) - 1,
        }
    }
}

/// Zipf over `1..=n` with exponent `s` by rejection-inversion (Hörmann & Derflinger, "Rejection-
/// inversion to generate variates from monotone discrete distributions", 1996), as in Apache
/// Commons RNG: invert the integral of the continuous density `x^-s`, accept when the draw falls
/// under the discrete mass. Works for any `s > 0` including 1.
#[derive(Debug, Clone)]
struct Zipf {
    n: f64,
    s: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    threshold: f64,
}

impl Zipf {
    fn new(n: u64, s: f64) -> Self {
        let mut z = Self {
            n: n as f64,
            s,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            threshold: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(z.n + 0.5);
        z.threshold = 2.0 - z.h_integral_inv(z.h_integral(2.5) - z.h(2.0));
        z
    }

    fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            let u = self.h_integral_n + rng.next_f64() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inv(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.threshold || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    /// `x^-s`.
    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    /// An antiderivative of `h`: `(x^(1-s) - 1) / (1 - s)`, or `ln x` at `s = 1`.
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.s) * log_x) * log_x
    }

    fn h_integral_inv(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (helper1(t) * x).exp()
    }
}

/// `ln(1 + x) / x`, accurate near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1) / x`, accurate near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_distributions() {
        assert_eq!(
            "uniform".parse::<Distribution>().unwrap(),
            Distribution::Uniform
        );
        assert_eq!(
            "zipf:1.1".parse::<Distribution>().unwrap(),
            Distribution::Zipf(1.1)
        );
        assert_eq!(
            "sequential".parse::<Distribution>().unwrap(),
            Distribution::Sequential
        );
        for bad in ["zipf", "zipf:0", "zipf:-1", "zipf:x", "normal", ""] {
            assert!(bad.parse::<Distribution>().is_err(), "{bad}");
        }
    }

    #[test]
    fn http_body_is_the_json_of_the_template() {
        let w = Workload::new(
            "api",
            &[
                "user=user_{key};k\"q={key}x{key}".into(),
                "generic_key=global".into(),
            ],
            Some(3),
            10,
            Distribution::Uniform,
        )
        .unwrap();
        let body: serde_json::Value = serde_json::from_str(&w.http_body(42)).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"domain": "api", "hits_addend": 3, "descriptors": [
                {"entries": [{"key": "user", "value": "user_42"}, {"key": "k\"q", "value": "42x42"}]},
                {"entries": [{"key": "generic_key", "value": "global"}]},
            ]})
        );
        let no_hits =
            Workload::new("a", &["u={key}".into()], None, 1, Distribution::Uniform).unwrap();
        assert_eq!(
            no_hits.http_body(0),
            r#"{"descriptors":[{"entries":[{"key":"u","value":"0"}]}],"domain":"a"}"#
        );
    }

    #[test]
    fn grpc_request_renders_the_same_template() {
        let w = Workload::new(
            "api",
            &["user=u{key}".into()],
            Some(0),
            10,
            Distribution::Uniform,
        )
        .unwrap();
        let r = w.grpc_request(7);
        assert_eq!(r.domain, "api");
        assert_eq!(r.descriptors.len(), 1);
        assert_eq!(r.descriptors[0].entries[0].key, "user");
        assert_eq!(r.descriptors[0].entries[0].value, "u7");
        assert_eq!(r.descriptors[0].hits_addend, Some(UInt64Value { value: 0 }));
    }

    #[test]
    fn rejects_bad_workloads() {
        assert!(Workload::new("a", &[], None, 1, Distribution::Uniform).is_err());
        assert!(Workload::new("a", &["u".into()], None, 1, Distribution::Uniform).is_err());
        assert!(Workload::new("a", &["u=1".into()], None, 0, Distribution::Uniform).is_err());
    }

    fn histogram(keys: u64, d: Distribution, draws: u32) -> Vec<u32> {
        let w = Workload::new("a", &["u={key}".into()], None, keys, d).unwrap();
        let mut s = w.sampler(12345, 0, 1);
        let mut counts = vec![0u32; keys as usize];
        for _ in 0..draws {
            counts[s.next_key() as usize] += 1;
        }
        counts
    }

    #[test]
    fn uniform_covers_the_key_space_evenly() {
        let counts = histogram(10, Distribution::Uniform, 100_000);
        for c in counts {
            // Expected 10,000 each; 5 standard deviations is about +-475.
            assert!((9_500..=10_500).contains(&c), "{c}");
        }
    }

    #[test]
    fn zipf_matches_its_probability_mass() {
        for s in [0.5, 1.0, 1.1, 2.0] {
            let n = 50;
            let draws = 200_000;
            let counts = histogram(n, Distribution::Zipf(s), draws);
            let norm: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
            for (i, &c) in counts.iter().enumerate() {
                let p = ((i + 1) as f64).powf(-s) / norm;
                let expected = p * f64::from(draws);
                let sd = (expected * (1.0 - p)).sqrt();
                assert!(
                    (f64::from(c) - expected).abs() <= 5.0 * sd + 1.0,
                    "s={s} key {i}: {c} draws, expected {expected:.0}"
                );
            }
        }
    }

    #[test]
    fn zipf_stays_in_range_for_huge_key_spaces() {
        let w = Workload::new(
            "a",
            &["u={key}".into()],
            None,
            1 << 40,
            Distribution::Zipf(1.1),
        )
        .unwrap();
        let mut s = w.sampler(1, 0, 1);
        for _ in 0..10_000 {
            assert!(s.next_key() < 1 << 40);
        }
    }

    #[test]
    fn sequential_workers_cover_every_key_once_per_pass() {
        let w = Workload::new(
            "api",
            &["user={key}".into()],
            None,
            10,
            Distribution::Sequential,
        )
        .unwrap();
        let mut seen = Vec::new();
        for worker in 0..3 {
            let mut k = w.sampler(4, worker, 3);
            // Worker 0 of 3 from seed 4: 4, 7, 0 (wrapped), ...
            seen.extend((0..4).map(|_| k.next_key()));
        }
        let mut distinct = seen.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct, (0..10).collect::<Vec<_>>(), "{seen:?}");
        assert_eq!(&seen[..3], &[4, 7, 0]);
    }
}
