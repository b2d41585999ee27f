#![warn(unreachable_pub)]
//! # tollgate-redis
//!
//! The Redis, Redis Sentinel and Redis Cluster store for tollgate: counters shared by every tollgate process.
//!
//! Each request costs one call of one Lua function ([`script`]; `FCALL`, or `EVALSHA` on servers
//! without functions) that checks all of the
//! request's counters atomically with exactly the semantics of the in-memory store
//! ([`tollgate_core::MemoryStore`]): the same algorithms (ported to Lua, integer-exact), the same
//! all-or-nothing and shadow rules, the same handling of a key repeated in one request. Time
//! comes from the Redis server's `TIME` unless the caller passes it, so app servers with skewed
//! clocks agree. On Redis Cluster, counters in different slots are checked by concurrent calls,
//! one per slot, and a request blocked in one slot gives back what the others consumed (see
//! `docs/operations.md`, "Redis Cluster").
//!
//! Modules: [`keys`] (key layout, escaping, exactness bounds), [`script`] (the Lua script and its
//! wire format), [`store`] ([`RedisStore`], connections, timeouts, health), `sentinel` (a
//! master found through Redis Sentinel, followed through failovers), [`guard`] (the failure
//! policy and circuit breaker around it: [`Guarded`]), [`lease`] (`sync: lease`: shares of a
//! window's count spent locally, exact across instances), [`batch`] (`sync: batched`: counts kept
//! locally and flushed in batches, approximate with a bounded overshoot), [`limits`] (what each
//! limit's sync mode did).

pub mod batch;
mod coalesce;
mod counter;
pub mod guard;
pub mod keys;
pub mod lease;
pub mod limits;
mod refill;
pub mod script;
mod sentinel;
mod single;
pub mod store;

pub use guard::{Guarded, Policy, RedisSettings};
pub use keys::KeyLayout;
pub use store::{Coalescing, Receipt, RedisOptions, RedisStore};
