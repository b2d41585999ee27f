//! Shared by the core bench (`benches/core.rs`), the instruction-count harness
//! (`examples/hotpath.rs`) and the paired timing harness (`examples/versus.rs`), so all three
//! measure exactly the same keys and quotas.
#![allow(dead_code)] // each includer uses its own subset

use governor::clock::Clock as GClock;
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota as GQuota, RateLimiter};
use std::num::NonZeroU32;
use tollgate_core::clock::SECOND;
use tollgate_core::{Algorithm, CheckItem, MemoryStore, Micros, Quota, Store, Unit};

/// 2026-11-22T00:00:00Z: where tollgate's injected time line starts.
pub const BASE: Micros = 1_795_305_600 * SECOND;

/// `n` distinct keys shaped like a per-IP counter: `api|ip=10.x.y.z`.
pub fn keys(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            format!(
                "api|ip=10.{}.{}.{}",
                (i >> 16) & 255,
                (i >> 8) & 255,
                i & 255
            )
        })
        .collect()
}

/// governor's keyed limiter (a `DashMap` of `String` keys) on clock `C`.
pub type Governor<C> =
    RateLimiter<String, DashMapStateStore<String>, C, NoOpMiddleware<<C as GClock>::Instant>>;

/// governor's quota for a workload: `admit` = so large everything passes, else 1 per hour.
pub fn governor_quota(admit: bool) -> GQuota {
    if admit {
        GQuota::per_second(NonZeroU32::MAX)
    } else {
        GQuota::per_hour(NonZeroU32::MIN)
    }
}

/// Our GCRA quota for the same workload (time advances 1 µs per check).
pub fn gcra_quota(admit: bool) -> Quota {
    if admit {
        Quota::new(1_000_000_000, Unit::Minute)
    } else {
        Quota::new(1, Unit::Hour)
    }
    .with_algorithm(Algorithm::Gcra)
}

/// One keyed check of cost 1 through `MemoryStore::check_one`: whether it was allowed.
pub fn check(store: &MemoryStore, q: &Quota, key: &str, now: Micros) -> bool {
    store
        .check_one(now, &CheckItem::hit("api", key, q))
        .expect("the memory store cannot fail")
        .allowed
}
