//! Coalescing one-item checks: the requests that arrive while calls are in flight go to Redis
//! together, as one call of the batched function (`scripts/fast.lua`).
//!
//! Redis runs one command at a time on one core, so what limits a fleet on one Redis is the CPU
//! Redis spends per decision, and much of a one-item check's cost is the call itself (parsing
//! the `FCALL`, `TIME`, the reply) rather than its key. A store sends a request at once, from the
//! caller's own task, while nothing waits and no call is in flight; otherwise the request waits
//! for the next batch, which a sender task sends as soon as the call in flight comes back,
//! carrying every request that arrived meanwhile (at most [`MAX_BATCH`]). A second call goes out
//! beside the first only when the line grows long ([`SECOND_SLOT_AT`]) or a request has waited
//! [`SECOND_SLOT_AFTER`] (a Redis far away, a slow call): so an idle store adds no wait, a busy
//! one pays a call's fixed cost (and Redis' wake-up and socket work) once per large batch, and a
//! far one still keeps two calls in flight. Each request is still decided on its own, in
//! arrival order (a key may repeat in a batch: each request sees the ones before), and one
//! request's failure (its key holds a value tollgate did not write) fails only that request.
//!
//! Requests of one batch share the time they are decided at: Redis `TIME` once per call, or the
//! caller's time when the store decides at the caller's clock (only requests bringing the same
//! time share a batch). This module keeps the waiting line; the store sends the batches
//! (`RedisStore::drive`).

use crate::script::{FastAnswer, FastItem};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tollgate_core::{Micros, StoreError};

/// Batches in flight at once, per store. Two keep Redis busy while a reply travels back and the
/// next batch forms; more only splits the line into smaller batches. The second is opened only
/// as [`SECOND_SLOT_AT`] and [`SECOND_SLOT_AFTER`] say: on a near Redis, waiting for the call in
/// flight and sending one larger batch costs Redis less per request than a second small call.
pub(crate) const MAX_IN_FLIGHT: usize = 2;
/// Requests waiting that open the second slot at once: they arrive faster than one call at a
/// time carries them.
pub(crate) const SECOND_SLOT_AT: usize = MAX_BATCH / 2;
/// How long a request waits for the call in flight before it opens the second slot: a near
/// Redis answers a batch well within it, so the line waits for that call; a far one does not,
/// and its requests go out beside it after this long, not after a whole round trip.
pub(crate) const SECOND_SLOT_AFTER: Duration = Duration::from_millis(1);
/// Requests in one call at most (the call's keys and reply grow with it, and Redis runs a call
/// without interruption).
pub(crate) const MAX_BATCH: usize = 64;
/// Requests waiting at most. Beyond it a request is refused at once (Redis is not keeping up:
/// the waiting line would only grow).
pub(crate) const MAX_WAITING: usize = 65_536;

/// What a waiting request learns.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Redis decided it at the batch's time.
    Answer(Micros, FastAnswer),
    /// The call failed, or Redis raised an error for this request.
    Failed(StoreError),
    /// The batch could not be sent (the server cannot run the function): the request goes by
    /// the general check.
    Unbatched,
}

/// One request waiting for its batch.
#[derive(Debug)]
pub(crate) struct Job {
    /// The time it is decided at (`None`: Redis `TIME`); a batch shares one.
    pub now: Option<Micros>,
    /// Its counter key.
    pub key: String,
    /// Its packed request.
    pub item: FastItem,
    /// Its caller waits no longer than this.
    pub deadline: Instant,
    /// Where its outcome goes (closed when the caller gave up).
    pub tx: oneshot::Sender<Outcome>,
}

#[derive(Debug, Default)]
struct Line {
    in_flight: usize,
    jobs: VecDeque<Job>,
}

/// The waiting line of one store, and its counts.
#[derive(Debug, Default)]
pub(crate) struct Coalescer {
    line: Mutex<Line>,
}

/// Why a request could not join the line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Full;

impl Coalescer {
    /// Put `job` in the line. `Ok(true)`: no batch is in flight, or one is and the line has
    /// reached [`SECOND_SLOT_AT`]: the caller starts a sender (which counts as in flight until
    /// [`Coalescer::next_batch`] returns nothing to it). `Ok(false)`: the job waits for a sender;
    /// after [`SECOND_SLOT_AFTER`] its caller may [`Coalescer::open_second`]. `Err(Full)`:
    /// [`MAX_WAITING`] requests wait already.
    pub(crate) fn push(&self, job: Job) -> Result<bool, Full> {
        let mut line = self.line.lock().unwrap_or_else(|e| e.into_inner());
        if line.jobs.len() >= MAX_WAITING {
            // Callers that gave up leave their requests behind: drop those first.
            line.jobs.retain(|j| !j.tx.is_closed());
            if line.jobs.len() >= MAX_WAITING {
                return Err(Full);
            }
        }
        line.jobs.push_back(job);
        if line.in_flight == 0
            || (line.in_flight < MAX_IN_FLIGHT && line.jobs.len() >= SECOND_SLOT_AT)
        {
            line.in_flight += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether the caller may send its request at once, by itself: nothing waits and nothing is
    /// in flight. It then holds that slot until [`Coalescer::release`].
    pub(crate) fn try_alone(&self) -> bool {
        let mut line = self.line.lock().unwrap_or_else(|e| e.into_inner());
        if line.jobs.is_empty() && line.in_flight == 0 {
            line.in_flight += 1;
            return true;
        }
        false
    }

    /// A request has waited [`SECOND_SLOT_AFTER`]: `true` when requests still wait and a slot is
    /// free, which the caller then hands to a new sender.
    pub(crate) fn open_second(&self) -> bool {
        let mut line = self.line.lock().unwrap_or_else(|e| e.into_inner());
        if !line.jobs.is_empty() && line.in_flight < MAX_IN_FLIGHT {
            line.in_flight += 1;
            return true;
        }
        false
    }

    /// A request sent by itself is done. `true`: requests wait, and the caller starts a sender,
    /// which keeps the slot; `false`: the slot is free again.
    pub(crate) fn release(&self) -> bool {
        let mut line = self.line.lock().unwrap_or_else(|e| e.into_inner());
        if line.jobs.is_empty() {
            line.in_flight -= 1;
            return false;
        }
        true
    }

    /// Give a slot back without starting a sender (no runtime to start one on).
    pub(crate) fn give_back(&self) {
        let mut line = self.line.lock().unwrap_or_else(|e| e.into_inner());
        line.in_flight -= 1;
    }

    /// The next batch for a sender: the requests at the front of the line that share the first
    /// one's time, at most [`MAX_BATCH`], skipping those whose caller has gone. Empty when the
    /// line is: the sender stops and no longer counts as in flight.
    pub(crate) fn next_batch(&self) -> Vec<Job> {
        let mut line = self.line.lock().unwrap_or_else(|e| e.into_inner());
        let mut batch = Vec::new();
        while batch.len() < MAX_BATCH {
            let Some(front) = line.jobs.front() else {
                break;
            };
            if front.tx.is_closed() {
                line.jobs.pop_front();
                continue;
            }
            if batch.first().is_some_and(|f: &Job| f.now != front.now) {
                break;
            }
            batch.extend(line.jobs.pop_front());
        }
        if batch.is_empty() {
            line.in_flight -= 1;
        }
        batch
    }

    /// Requests waiting (for tests and diagnostics).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.line.lock().unwrap().jobs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn job(key: &str, now: Option<Micros>) -> (Job, oneshot::Receiver<Outcome>) {
        let (tx, rx) = oneshot::channel();
        let job = Job {
            now,
            key: key.into(),
            item: [0; 34],
            deadline: Instant::now() + Duration::from_secs(1),
            tx,
        };
        (job, rx)
    }

    #[test]
    fn an_idle_line_sends_at_once_and_a_busy_one_batches() {
        let c = Coalescer::default();
        let mut rxs = Vec::new();
        for (i, expect) in [true, false, false, false, false].into_iter().enumerate() {
            let (j, rx) = job(&format!("k{i}"), None);
            rxs.push(rx);
            assert_eq!(c.push(j), Ok(expect), "request {i}");
        }
        // The one sender takes what is there: all five, in order.
        let b = c.next_batch();
        let keys: Vec<_> = b.iter().map(|j| j.key.as_str()).collect();
        assert_eq!(keys, ["k0", "k1", "k2", "k3", "k4"]);
        // Its call in flight: a newcomer waits for it, starting no sender...
        let (j, _rx) = job("k5", None);
        assert_eq!(c.push(j), Ok(false));
        // ...until it has waited long enough: then it opens the second slot, once.
        assert!(c.open_second());
        assert!(!c.open_second(), "two in flight at most");
        assert_eq!(c.next_batch().len(), 1);
        assert!(c.next_batch().is_empty(), "the second sender stops");
        assert!(!c.open_second(), "nothing waits");
        assert!(c.next_batch().is_empty(), "the first sender stops");
        assert!(c.try_alone(), "idle again");
    }

    #[test]
    fn a_long_line_opens_the_second_slot_at_once() {
        let c = Coalescer::default();
        let mut rxs = Vec::new();
        let (j, rx) = job("first", None);
        rxs.push(rx);
        assert_eq!(c.push(j), Ok(true));
        assert_eq!(c.next_batch().len(), 1, "the first call leaves");
        for i in 1..=SECOND_SLOT_AT {
            let (j, rx) = job(&i.to_string(), None);
            rxs.push(rx);
            assert_eq!(c.push(j), Ok(i == SECOND_SLOT_AT), "waiting: {i}");
        }
        // Both slots taken now: the line waits for either.
        let (j, rx) = job("more", None);
        rxs.push(rx);
        assert_eq!(c.push(j), Ok(false));
        assert!(!c.open_second());
        assert_eq!(c.next_batch().len(), SECOND_SLOT_AT + 1);
    }

    #[test]
    fn an_idle_store_sends_alone_and_hands_its_slot_to_a_sender_when_others_wait() {
        let c = Coalescer::default();
        assert!(c.try_alone());
        assert!(
            !c.try_alone(),
            "a call in flight: the next request joins the line"
        );
        // A request arriving now waits, and starts no sender (the call in flight will carry on).
        let (j, _rx) = job("k", None);
        assert_eq!(c.push(j), Ok(false));
        assert!(!c.try_alone(), "someone waits: join the line");
        // The one sent alone is done: its slot goes to a sender for the waiting request.
        assert!(c.release());
        assert_eq!(c.next_batch().len(), 1);
        assert!(c.next_batch().is_empty(), "that sender stops");
        // Idle again: one alone, its slot given back, one alone again.
        assert!(c.try_alone());
        c.give_back();
        assert!(c.try_alone() && !c.try_alone());
        assert!(!c.release(), "nothing waits: the slot is free");
        assert!(c.try_alone());
    }

    #[test]
    fn a_batch_shares_one_time_and_keeps_arrival_order() {
        let c = Coalescer::default();
        let mut rxs = Vec::new();
        for (k, now) in [
            ("a", Some(1)),
            ("b", Some(1)),
            ("c", Some(2)),
            ("d", Some(1)),
        ] {
            let (j, rx) = job(k, now);
            rxs.push(rx);
            c.push(j).unwrap();
        }
        let names = |b: Vec<Job>| b.into_iter().map(|j| j.key).collect::<Vec<_>>();
        assert_eq!(names(c.next_batch()), ["a", "b"]);
        assert_eq!(names(c.next_batch()), ["c"]);
        assert_eq!(names(c.next_batch()), ["d"]);
    }

    #[test]
    fn callers_that_gave_up_are_skipped_and_batches_are_bounded() {
        let c = Coalescer::default();
        let mut rxs = Vec::new();
        for i in 0..MAX_BATCH + 10 {
            let (j, rx) = job(&i.to_string(), None);
            c.push(j).unwrap();
            // Every other caller goes away before its batch leaves.
            if i % 2 == 0 {
                drop(rx);
            } else {
                rxs.push(rx);
            }
        }
        let b = c.next_batch();
        assert_eq!(b.len(), (MAX_BATCH + 10) / 2);
        assert!(b.iter().all(|j| j.key.parse::<usize>().unwrap() % 2 == 1));
        assert_eq!(c.waiting(), 0);
    }

    #[test]
    fn a_full_line_refuses_newcomers_after_dropping_the_abandoned() {
        let c = Coalescer::default();
        let mut keep = Vec::new();
        for i in 0..MAX_WAITING {
            let (j, rx) = job("k", None);
            c.push(j).unwrap();
            if i == 0 {
                keep.push(rx);
            }
            // The rest give up at once.
        }
        // The abandoned ones make room.
        let (j, rx) = job("k", None);
        assert!(c.push(j).is_ok());
        keep.push(rx);
        assert_eq!(c.waiting(), 2);
        // A line full of live callers refuses.
        for _ in 0..MAX_WAITING - 2 {
            let (j, rx) = job("k", None);
            c.push(j).unwrap();
            keep.push(rx);
        }
        let (j, _rx) = job("k", None);
        assert_eq!(c.push(j), Err(Full));
    }
}
