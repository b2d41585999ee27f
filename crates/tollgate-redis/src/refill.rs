//! Single-flight lease refills: while one call is getting units for a leased counter, the other
//! requests of this instance that find none in hand wait for that call instead of each sending
//! its own.
//!
//! Without it, every request that arrives while a lease is being refilled goes to Redis as
//! `exact` would: a burst of calls at every refill of a busy counter, and while Redis stalls (a
//! pause, a slow network) one call per waiting request, all landing on Redis when it wakes.
//! With it there is one call per counter in flight; when it comes back its grant serves the
//! waiters from hand (units Redis counted already: exact), and a waiter the grant does not cover
//! asks Redis itself, so no request waits for more than one refill before its own call.
//! Only one-item requests wait (a request of several limits decides them together).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// The refills in flight of one store, by lease (counter key and tier).
#[derive(Debug, Default)]
pub(crate) struct Refills {
    map: Mutex<HashMap<String, Arc<Notify>>>,
    /// Requests that waited for another request's refill instead of calling Redis.
    pub(crate) waited: AtomicU64,
}

/// What a request that needs a refill does.
pub(crate) enum Begin<'a> {
    /// Call Redis: this request's call is the lease's refill until the guard drops.
    Lead(Lead<'a>),
    /// Another request's call is refilling the lease: wait for it ([`Refills::finished`]).
    Wait(Arc<Notify>),
}

/// The refill in flight of one lease; dropping it (the call answered, failed or was given up)
/// wakes the requests waiting for it.
pub(crate) struct Lead<'a> {
    refills: &'a Refills,
    key: String,
    notify: Arc<Notify>,
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        let mut map = self.refills.lock();
        if map
            .get(&self.key)
            .is_some_and(|n| Arc::ptr_eq(n, &self.notify))
        {
            map.remove(&self.key);
        }
        drop(map);
        self.notify.notify_waiters();
    }
}

impl Refills {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refill the lease `key`, or wait for the refill already in flight.
    pub(crate) fn begin(&self, key: String) -> Begin<'_> {
        let mut map = self.lock();
        if let Some(n) = map.get(&key) {
            return Begin::Wait(n.clone());
        }
        let notify = Arc::new(Notify::new());
        map.insert(key.clone(), notify.clone());
        Begin::Lead(Lead {
            refills: self,
            key,
            notify,
        })
    }

    /// Until the refill `notify` of lease `key` is over (at once if it is already).
    pub(crate) async fn finished(&self, key: &str, notify: &Arc<Notify>) {
        let done = notify.notified();
        tokio::pin!(done);
        done.as_mut().enable();
        // It may have ended between `begin` and `enable`: its wake-up went to no one.
        let in_flight = self.lock().get(key).is_some_and(|n| Arc::ptr_eq(n, notify));
        if in_flight {
            done.await;
        }
    }

    /// Refills in flight now.
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_refill_per_lease_and_its_end_wakes_every_waiter() {
        let r = Refills::default();
        let Begin::Lead(lead) = r.begin("a".into()) else {
            panic!("the first request leads");
        };
        let Begin::Lead(other) = r.begin("b".into()) else {
            panic!("another lease has its own refill");
        };
        let waits: Vec<_> = (0..3)
            .map(|_| match r.begin("a".into()) {
                Begin::Wait(n) => n,
                Begin::Lead(_) => panic!("a refill of `a` is in flight"),
            })
            .collect();
        assert_eq!(r.in_flight(), 2);
        let waiting = futures_util::future::join_all(waits.iter().map(|n| r.finished("a", n)));
        tokio::pin!(waiting);
        // Nobody is woken while the refill is in flight.
        assert!(futures_util::FutureExt::now_or_never(waiting.as_mut()).is_none());
        drop(lead);
        waiting.await;
        assert_eq!(r.in_flight(), 1);
        // A waiter that comes late for a refill that already ended does not wait.
        r.finished("a", &waits[0]).await;
        drop(other);
        assert_eq!(r.in_flight(), 0);
        assert!(matches!(r.begin("a".into()), Begin::Lead(_)));
    }
}
