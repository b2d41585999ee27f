//! Token bucket with whole tokens.
//!
//! A bucket holds at most `burst` tokens (default `limit`) and gains one every
//! `T = period / limit`. State is the token count and the instant up to which refill has been
//! credited (`last`); refill is credited in whole tokens and the leftover fraction of a token is
//! kept by advancing `last` by exactly `tokens·T`, so nothing drifts. An untracked key is a full
//! bucket. Integer-only, so the Lua port in Redis computes identical results.
//!
//! A monotonic clock never leaves `last` after `now`. A `last` in the future means the clock
//! stepped back: it is clamped to `now` (the tokens stay as they are, nothing is refilled for
//! the step) and kept, so refill resumes from the new time instead of waiting for the clock to
//! catch up, and `retry_after`/`reset_after` stay within `burst·T`.

use super::{deny_forever, Outcome};
use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::Quota;

/// Token bucket state: `tokens` available as of `last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Whole tokens in the bucket.
    pub tokens: u64,
    /// Refill has been credited up to this instant.
    pub last: Micros,
}

/// `bucket` with `last` clamped to `now` (see the module docs). The quota plays no part; it is
/// taken so that every algorithm's `clamp` has the same signature.
pub(crate) fn clamp(bucket: Bucket, now: Micros, _quota: &Quota) -> Bucket {
    Bucket {
        last: bucket.last.min(now),
        ..bucket
    }
}

/// One step. `bucket` is `None` when the bucket is full.
pub(crate) fn step(
    bucket: Option<Bucket>,
    now: Micros,
    cost: u64,
    quota: &Quota,
) -> Outcome<Bucket> {
    let Some(t) = quota.emission_interval() else {
        return deny_forever(0, bucket);
    };
    let cap = quota.capacity().max(1);
    let Bucket {
        mut tokens,
        mut last,
    } = bucket.unwrap_or(Bucket {
        tokens: cap,
        last: now,
    });
    last = last.min(now);
    if now > last {
        let refill = (now - last) / t;
        if tokens.saturating_add(refill) >= cap {
            tokens = cap;
            last = now;
        } else {
            tokens += refill;
            last += refill * t; // refill * t <= now - last: no overflow
        }
    }
    tokens = tokens.min(cap);
    let full_in = |tokens: u64, last: Micros| {
        if tokens >= cap {
            0
        } else {
            last.saturating_add((cap - tokens).saturating_mul(t))
                .saturating_sub(now)
        }
    };
    let keep = |tokens: u64, last: Micros| (tokens < cap).then_some(Bucket { tokens, last });
    if cost > cap {
        let mut d = deny_forever(quota.limit(), bucket).0;
        d.remaining = tokens;
        d.reset_after = full_in(tokens, last);
        return (d, keep(tokens, last));
    }
    if cost <= tokens {
        tokens -= cost;
        let decision = Decision {
            allowed: true,
            limit: quota.limit(),
            remaining: tokens,
            reset_after: full_in(tokens, last),
            retry_after: None,
            delay: 0,
            count: None,
        };
        (decision, keep(tokens, last))
    } else {
        let decision = Decision {
            allowed: false,
            limit: quota.limit(),
            remaining: tokens,
            reset_after: full_in(tokens, last),
            retry_after: Some(
                last.saturating_add((cost - tokens).saturating_mul(t))
                    .saturating_sub(now),
            ),
            delay: 0,
            count: None,
        };
        // Crediting refill is not consumption: keep the normalised state.
        (decision, keep(tokens, last))
    }
}
