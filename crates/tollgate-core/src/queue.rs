//! Waiting in line instead of being refused: the queues of rules with a `queue` option.
//!
//! A request denied only by such rules may wait for capacity instead of getting a denial. It
//! waits in the queue of one counter (the rule's id and the counter key), which is served
//! highest priority first (tier 0 before tier 1) and, within a priority, first come first
//! served. This module holds the ordering and the bounds once, for every transport: [`Queue`]
//! is one line, pure and clock-free (deadlines are [`Micros`] passed in), [`Queues`] the lines
//! of a process under a global cap, and [`Waitlist`] shares them between tasks, waking a waiter
//! when it reaches the head of its line. The transports own the timers: a waiter at the head
//! retries its decision when the store says capacity frees up, and gives up at its deadline.
//!
//! Every operation is O(log n) in the line's length; a line is dropped as soon as it is empty,
//! so there are never more lines than waiters, and never more waiters than the global cap.

use crate::clock::Micros;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

pub use crate::limiter::{wait_for, Wait};
pub use crate::rules::{Priority, LOWEST};

/// Default of the global cap on waiters in one process ([`Queues::new`]).
pub const DEFAULT_MAX_WAITING: usize = 10_000;

/// One waiter's place in its line: ordered by priority, then by arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket {
    priority: Priority,
    seq: u64,
}

impl Ticket {
    /// The waiter's priority.
    pub fn priority(&self) -> Priority {
        self.priority
    }
}

/// Why a request could not join a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refused {
    /// The line holds its `max_length` waiters already.
    #[error("queue full")]
    Full,
    /// The process holds its global cap of waiters already.
    #[error("too many requests waiting in this process")]
    TooManyWaiting,
}

#[derive(Debug)]
struct Waiter<T> {
    deadline: Micros,
    value: T,
}

/// One line: waiters by (priority, arrival), and their deadlines.
#[derive(Debug)]
pub struct Queue<T> {
    waiters: BTreeMap<Ticket, Waiter<T>>,
    deadlines: BTreeSet<(Micros, Ticket)>,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Self {
            waiters: BTreeMap::new(),
            deadlines: BTreeSet::new(),
        }
    }
}

impl<T> Queue<T> {
    /// How many wait.
    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// The waiter served next.
    pub fn head(&self) -> Option<Ticket> {
        self.waiters.keys().next().copied()
    }

    /// The waiter served last.
    pub fn tail(&self) -> Option<Ticket> {
        self.waiters.keys().next_back().copied()
    }

    /// Whether a waiter of `priority` or a higher one (a smaller number) waits: a newcomer of
    /// `priority` must then wait behind it rather than decide.
    pub fn ahead_of(&self, priority: Priority) -> bool {
        self.head().is_some_and(|h| h.priority <= priority)
    }

    /// Add `ticket` (unique in this line), giving up at `deadline`.
    fn insert(&mut self, ticket: Ticket, deadline: Micros, value: T) {
        self.deadlines.insert((deadline, ticket));
        self.waiters.insert(ticket, Waiter { deadline, value });
    }

    /// Remove `ticket`; its value when it was waiting.
    pub fn remove(&mut self, ticket: Ticket) -> Option<T> {
        let w = self.waiters.remove(&ticket)?;
        self.deadlines.remove(&(w.deadline, ticket));
        Some(w.value)
    }

    /// Remove every waiter whose deadline is `now` or earlier, earliest deadline first.
    pub fn expire(&mut self, now: Micros) -> Vec<(Ticket, T)> {
        let mut out = Vec::new();
        while let Some(&(deadline, ticket)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(w) = self.waiters.remove(&ticket) {
                out.push((ticket, w.value));
            }
        }
        out
    }

    /// The waiters in the order they are served.
    pub fn tickets(&self) -> impl Iterator<Item = Ticket> + '_ {
        self.waiters.keys().copied()
    }

    fn get_mut(&mut self, ticket: Ticket) -> Option<&mut T> {
        self.waiters.get_mut(&ticket).map(|w| &mut w.value)
    }
}

/// A waiter that joined a line ([`Queues::join`]).
#[derive(Debug)]
pub struct Joined<T> {
    /// Its place.
    pub ticket: Ticket,
    /// The waiter whose place it took: a lower-priority one in its full line, or the last of
    /// the longest line when the process's cap is reached ([`Queues::join`]).
    pub evicted: Option<(Ticket, T)>,
}

/// The lines of one process, by key (a rule's id and a counter key), under a cap on all their
/// waiters together. Empty lines are dropped.
#[derive(Debug)]
pub struct Queues<K, T> {
    lines: HashMap<K, Queue<T>>,
    /// The keys of the lines by length: the longest is where a full process makes room.
    by_len: BTreeMap<usize, HashSet<K>>,
    next: u64,
    waiting: usize,
    max_waiting: usize,
}

impl<K: Hash + Eq + Clone, T> Queues<K, T> {
    /// No lines; at most `max_waiting` waiters in all of them together.
    pub fn new(max_waiting: usize) -> Self {
        Self {
            lines: HashMap::new(),
            by_len: BTreeMap::new(),
            next: 0,
            waiting: 0,
            max_waiting,
        }
    }

    /// How many wait, in all lines.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// How many lines have waiters.
    pub fn lines(&self) -> usize {
        self.lines.len()
    }

    /// The line of `key`, when someone waits in it.
    pub fn line(&self, key: &K) -> Option<&Queue<T>> {
        self.lines.get(key)
    }

    /// Join the line of `key` (at most `max_length` long) at `priority`, giving up at
    /// `deadline`. In a full line, a newcomer of a higher priority than the last waiter takes
    /// that waiter's place (returned in [`Joined::evicted`]): a full line of low-priority
    /// requests does not keep a higher-priority one out; a newcomer of the same or a lower
    /// priority is refused.
    ///
    /// The process's cap is shared fairly among lines: when it is reached, a newcomer whose
    /// line would still be shorter than the longest line takes the place of that line's last
    /// waiter (returned in [`Joined::evicted`]), so that one counter's flood cannot keep the
    /// requests of another counter out; otherwise it is refused.
    pub fn join(
        &mut self,
        key: &K,
        max_length: usize,
        priority: Priority,
        deadline: Micros,
        value: T,
    ) -> Result<Joined<T>, Refused> {
        if max_length == 0 {
            return Err(Refused::Full);
        }
        let len = self.lines.get(key).map_or(0, Queue::len);
        let mut evicted = None;
        if len >= max_length {
            let line = self.lines.get_mut(key).ok_or(Refused::Full)?;
            let tail = line.tail().filter(|t| t.priority > priority);
            let Some(tail) = tail else {
                return Err(Refused::Full);
            };
            evicted = line.remove(tail).map(|v| (tail, v));
            self.waiting -= 1;
            self.relink(key, len, len - 1);
        } else if self.waiting >= self.max_waiting {
            evicted = Some(self.evict_longest(len).ok_or(Refused::TooManyWaiting)?);
        }
        let len = self.lines.get(key).map_or(0, Queue::len);
        let ticket = Ticket {
            priority,
            seq: self.next,
        };
        self.next += 1;
        self.lines
            .entry(key.clone())
            .or_default()
            .insert(ticket, deadline, value);
        self.waiting += 1;
        self.relink(key, len, len + 1);
        Ok(Joined { ticket, evicted })
    }

    /// Make room for a newcomer to a line of `len` waiters: remove the last waiter of the
    /// longest line when that line has at least two more waiters than the newcomer's would.
    fn evict_longest(&mut self, len: usize) -> Option<(Ticket, T)> {
        let (&longest, keys) = self.by_len.last_key_value()?;
        if longest <= len + 1 {
            return None;
        }
        let key = keys.iter().next()?.clone();
        let line = self.lines.get_mut(&key)?;
        let tail = line.tail()?;
        let value = line.remove(tail)?;
        self.waiting -= 1;
        self.relink(&key, longest, longest - 1);
        Some((tail, value))
    }

    /// Move `key` in the index by length from `from` waiters to `to` (0: not indexed).
    fn relink(&mut self, key: &K, from: usize, to: usize) {
        if from == to {
            return;
        }
        if from > 0 {
            if let Some(keys) = self.by_len.get_mut(&from) {
                keys.remove(key);
                if keys.is_empty() {
                    self.by_len.remove(&from);
                }
            }
        }
        if to > 0 {
            self.by_len.entry(to).or_default().insert(key.clone());
        }
    }

    /// Leave the line of `key`: the value when `ticket` was waiting, and the new head when the
    /// head changed (it is then that waiter's turn).
    pub fn leave(&mut self, key: &K, ticket: Ticket) -> Option<(T, Option<Ticket>)> {
        let line = self.lines.get_mut(key)?;
        let was_head = line.head() == Some(ticket);
        let value = line.remove(ticket)?;
        self.waiting -= 1;
        let (head, len) = (line.head(), line.len());
        if line.is_empty() {
            self.lines.remove(key);
        }
        self.relink(key, len + 1, len);
        Some((value, head.filter(|_| was_head)))
    }

    /// Remove the waiters of `key`'s line whose deadline is `now` or earlier.
    pub fn expire(&mut self, key: &K, now: Micros) -> Vec<(Ticket, T)> {
        let Some(line) = self.lines.get_mut(key) else {
            return Vec::new();
        };
        let gone = line.expire(now);
        self.waiting -= gone.len();
        let len = line.len();
        if line.is_empty() {
            self.lines.remove(key);
        }
        self.relink(key, len + gone.len(), len);
        gone
    }

    /// The head of `key`'s line.
    pub fn head(&self, key: &K) -> Option<Ticket> {
        self.lines.get(key).and_then(Queue::head)
    }

    /// Whether a waiter of `priority` or higher waits in `key`'s line.
    pub fn ahead_of(&self, key: &K, priority: Priority) -> bool {
        self.lines.get(key).is_some_and(|q| q.ahead_of(priority))
    }

    /// Whether `ticket` waits in `key`'s line.
    pub fn contains(&self, key: &K, ticket: Ticket) -> bool {
        self.lines
            .get(key)
            .is_some_and(|q| q.waiters.contains_key(&ticket))
    }

    fn get_mut(&mut self, key: &K, ticket: Ticket) -> Option<&mut T> {
        self.lines.get_mut(key)?.get_mut(ticket)
    }
}

/// Whether it is a waiter's turn ([`Place::turn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// It is at the head of its line: it may decide again.
    Head,
    /// It is no longer in its line: its deadline passed (another request's join swept it out),
    /// or a higher-priority newcomer took its place in a full line.
    Gone,
}

/// [`Queues`] shared between tasks: a waiter holds a [`Place`] and awaits [`Place::turn`]; it is
/// woken when it reaches the head of its line (the waiter before it was served, gave up or went
/// away). No clock and no runtime: the caller's timers decide when a head retries and when a
/// waiter gives up.
#[derive(Debug)]
pub struct Waitlist<K> {
    queues: Mutex<Queues<K, Option<Waker>>>,
}

impl<K: Hash + Eq + Clone> Waitlist<K> {
    /// At most `max_waiting` waiters in all lines together.
    pub fn new(max_waiting: usize) -> Self {
        Self {
            queues: Mutex::new(Queues::new(max_waiting)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queues<K, Option<Waker>>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many wait, in all lines.
    pub fn waiting(&self) -> usize {
        self.lock().waiting()
    }

    /// The most that may wait, in all lines together.
    pub fn max_waiting(&self) -> usize {
        self.lock().max_waiting
    }

    /// Whether a waiter of `priority` or higher waits in `key`'s line.
    pub fn ahead_of(&self, key: &K, priority: Priority) -> bool {
        self.lock().ahead_of(key, priority)
    }

    /// Join `key`'s line (see [`Queues::join`]). Waiters of that line whose deadline is `now`
    /// or earlier are removed first (and woken: they find themselves [`Turn::Gone`]), so that a
    /// waiter whose own timer is late does not hold a place. The place leaves the line when
    /// dropped.
    pub fn join(
        self: &Arc<Self>,
        key: K,
        max_length: usize,
        priority: Priority,
        now: Micros,
        deadline: Micros,
    ) -> Result<Place<K>, Refused> {
        let mut q = self.lock();
        let head_before = q.head(&key);
        for (_, waker) in q.expire(&key, now) {
            waker.into_iter().for_each(Waker::wake);
        }
        let head_after = q.head(&key);
        if head_after != head_before {
            if let Some(w) = head_after.and_then(|h| q.get_mut(&key, h)) {
                w.take().into_iter().for_each(Waker::wake);
            }
        }
        let joined = q.join(&key, max_length, priority, deadline, None)?;
        drop(q);
        // A waiter whose place was taken finds itself gone.
        if let Some((_, Some(waker))) = joined.evicted {
            waker.wake();
        }
        let ticket = joined.ticket;
        Ok(Place {
            list: self.clone(),
            key,
            ticket,
        })
    }

    fn leave(&self, key: &K, ticket: Ticket) {
        let mut q = self.lock();
        if let Some((_, Some(head))) = q.leave(key, ticket) {
            if let Some(w) = q.get_mut(key, head) {
                w.take().into_iter().for_each(Waker::wake);
            }
        }
    }

    fn poll_gone(&self, key: &K, ticket: Ticket, cx: &mut Context<'_>) -> Poll<()> {
        match self.lock().get_mut(key, ticket) {
            None => Poll::Ready(()),
            Some(w) => {
                *w = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    fn poll_turn(&self, key: &K, ticket: Ticket, cx: &mut Context<'_>) -> Poll<Turn> {
        let mut q = self.lock();
        if q.head(key) == Some(ticket) {
            return Poll::Ready(Turn::Head);
        }
        match q.get_mut(key, ticket) {
            None => Poll::Ready(Turn::Gone),
            Some(w) => {
                *w = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// A waiter's place in a [`Waitlist`] line; it leaves the line when dropped (served, given up,
/// or its client gone), and the next waiter's turn comes.
#[derive(Debug)]
pub struct Place<K: Hash + Eq + Clone> {
    list: Arc<Waitlist<K>>,
    key: K,
    ticket: Ticket,
}

impl<K: Hash + Eq + Clone> Place<K> {
    /// The line's key.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The ticket.
    pub fn ticket(&self) -> Ticket {
        self.ticket
    }

    /// Whether this waiter is at the head of its line now.
    pub fn is_head(&self) -> bool {
        self.list.lock().head(&self.key) == Some(self.ticket)
    }

    /// Resolves when this waiter is no longer in its line (a higher-priority newcomer took its
    /// place, or another's join found its deadline passed).
    pub async fn gone(&self) {
        std::future::poll_fn(|cx| self.list.poll_gone(&self.key, self.ticket, cx)).await
    }

    /// Resolves when this waiter is at the head of its line, or is no longer in it.
    pub async fn turn(&self) -> Turn {
        std::future::poll_fn(|cx| self.list.poll_turn(&self.key, self.ticket, cx)).await
    }
}

impl<K: Hash + Eq + Clone> Drop for Place<K> {
    fn drop(&mut self) {
        self.list.leave(&self.key, self.ticket);
    }
}

/// The key of a line: a rule's id and a counter key.
pub type LineKey = (String, String);

/// What one decision of a queued request gave ([`Driver::decide`]).
#[derive(Debug)]
pub enum Attempt<A> {
    /// The final answer: allowed (`true`), or refused in a way waiting cannot help (a limit
    /// without `queue` denied, or the store was unavailable).
    Done(A, bool),
    /// Denied by limits that all have a `queue` ([`wait_for`]): `answer` is the denial to give
    /// when the request cannot wait.
    Denied {
        /// The denial.
        answer: A,
        /// How it may wait.
        wait: Wait,
    },
}

/// Why a request left a line without being served, or was turned away from one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dropped {
    /// The line (or the process) was full.
    Full,
    /// Its deadline came, or the store's wait would have passed it.
    Timeout,
    /// Its client went away (the request's future was dropped while it waited).
    Gone,
    /// When its turn came, it was refused in a way waiting cannot help (a limit without `queue`
    /// denied it, or the store was unavailable).
    Refused,
}

impl Dropped {
    /// Every reason, in the order of [`Dropped::index`].
    pub const ALL: [Dropped; 4] = [
        Dropped::Full,
        Dropped::Timeout,
        Dropped::Gone,
        Dropped::Refused,
    ];

    /// Its position in [`Dropped::ALL`] (for per-reason counters).
    pub fn index(self) -> usize {
        match self {
            Dropped::Full => 0,
            Dropped::Timeout => 1,
            Dropped::Gone => 2,
            Dropped::Refused => 3,
        }
    }

    /// The metric label: `full`, `timeout`, `gone`, `refused`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::Full => "full",
            Dropped::Timeout => "timeout",
            Dropped::Gone => "gone",
            Dropped::Refused => "refused",
        }
    }
}

/// What a transport gives [`serve`]: its clock, its timer, its decision and its metrics.
pub trait Driver {
    /// The transport's answer.
    type Answer;
    /// The time now, on the clock decisions are made with.
    fn now(&self) -> Micros;
    /// Resolves at `at` on [`Driver::now`]'s clock.
    fn sleep_until(&self, at: Micros) -> impl std::future::Future<Output = ()>;
    /// Decide the request (the whole decision, all its descriptors).
    fn decide(&self) -> impl std::future::Future<Output = Attempt<Self::Answer>>;
    /// A denial for a request that waited behind others and never got to decide (its line was
    /// full, or its deadline came first): without consuming anything.
    fn refusal(
        &self,
        spot: &QueueSpot<'_>,
        why: Dropped,
    ) -> impl std::future::Future<Output = Self::Answer>;
    /// The request joined the line of `spot`.
    fn joined(&self, spot: &QueueSpot<'_>);
    /// It left that line, served after waiting `waited`.
    fn served(&self, spot: &QueueSpot<'_>, waited: Micros);
    /// It left that line unserved (`waited`), or was turned away from it (not `waited`).
    fn dropped(&self, spot: &QueueSpot<'_>, why: Dropped, waited: bool);
}

use crate::limiter::QueueSpot;

fn line_key(spot: &QueueSpot<'_>) -> LineKey {
    (spot.limit.id.clone(), spot.counter_key.clone())
}

/// A place held by [`serve`], and what to report when it is let go.
struct Held<'s, 'r, D: Driver> {
    driver: &'s D,
    spot: &'s QueueSpot<'r>,
    place: Place<LineKey>,
    deadline: Micros,
    /// Reported when dropped; a drop with nothing set is a client gone.
    left: Option<Result<Micros, Dropped>>,
}

impl<D: Driver> Drop for Held<'_, '_, D> {
    fn drop(&mut self) {
        match self.left.take() {
            Some(Ok(waited)) => self.driver.served(self.spot, waited),
            Some(Err(why)) => self.driver.dropped(self.spot, why, true),
            None => self.driver.dropped(self.spot, Dropped::Gone, true),
        }
    }
}

/// Which of two futures finished first.
enum Either<A, B> {
    Left(A),
    Right(B),
}

async fn race<A: std::future::Future, B: std::future::Future>(
    a: A,
    b: B,
) -> Either<A::Output, B::Output> {
    let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = a.as_mut().poll(cx) {
            return Poll::Ready(Either::Left(v));
        }
        b.as_mut().poll(cx).map(Either::Right)
    })
    .await
}

/// Join `spot`'s line (at most `max_length` long) at `now` until `deadline`, reporting the join,
/// or `None` (reported as dropped, `full`) when the line has no place for it.
fn enter<'s, 'r, D: Driver>(
    list: &Arc<Waitlist<LineKey>>,
    driver: &'s D,
    spot: &'s QueueSpot<'r>,
    max_length: usize,
    now: Micros,
    deadline: Micros,
) -> Option<Held<'s, 'r, D>> {
    match list.join(line_key(spot), max_length, spot.priority, now, deadline) {
        Ok(place) => {
            driver.joined(spot);
            Some(Held {
                driver,
                spot,
                place,
                deadline,
                left: None,
            })
        }
        Err(_) => {
            driver.dropped(spot, Dropped::Full, false);
            None
        }
    }
}

/// Decide a request whose rules may queue it (`spots`, from [`crate::limiter::Plan::queue_spots`],
/// not empty), waiting in line in `list` as the rules allow:
///
/// - a newcomer finding a waiter of its priority or higher in the line of one of its counters
///   joins that line without deciding (it must not overtake them);
/// - a request denied only by limits with a `queue` ([`Attempt::Denied`]) joins the line of the
///   first of them, unless the store's wait would pass its deadline (its arrival plus the
///   smallest `max_wait`) or the line is full: then it gets the denial;
/// - the head of a line decides again when the store said capacity frees up, and the next
///   waiter as soon as the head is served, gives up or goes away; a waiter gives up at its
///   deadline.
///
/// The place is left when this future ends or is dropped (the client gone): never leaked.
pub async fn serve<D: Driver>(
    list: &Arc<Waitlist<LineKey>>,
    driver: &D,
    spots: &[QueueSpot<'_>],
) -> D::Answer {
    let arrived = driver.now();
    let mut held: Option<Held<'_, '_, D>> = None;
    if let Some(spot) = spots
        .iter()
        .find(|s| list.ahead_of(&line_key(s), s.priority))
    {
        let deadline = arrived.saturating_add(spot.policy.max_wait);
        match enter(
            list,
            driver,
            spot,
            spot.policy.max_length,
            arrived,
            deadline,
        ) {
            Some(h) => held = Some(h),
            None => return driver.refusal(spot, Dropped::Full).await,
        }
    }
    // When the store said the head may pass (set while this request is the head).
    let mut retry_at: Option<Micros> = None;
    let mut last: Option<D::Answer> = None;
    loop {
        if let Some(h) = held.as_mut() {
            // `None`: its turn (to decide); `Some`: it left the line unserved, and why.
            let mut out = None;
            if !h.place.is_head() {
                // Its turn comes after an admission or a departure: it decides at once.
                match race(h.place.turn(), driver.sleep_until(h.deadline)).await {
                    Either::Left(Turn::Head) => {}
                    // Gone before its deadline: a higher-priority request took its place.
                    Either::Left(Turn::Gone) if driver.now() < h.deadline => {
                        out = Some(Dropped::Full)
                    }
                    _ => out = Some(Dropped::Timeout),
                }
            } else if let Some(at) = retry_at.take() {
                // The head waits for the store's time, unless its place is taken meanwhile.
                match race(h.place.gone(), driver.sleep_until(at)).await {
                    Either::Left(()) => out = Some(Dropped::Full),
                    Either::Right(()) if !h.place.is_head() => continue,
                    Either::Right(()) => {}
                }
            }
            if let Some(why) = out {
                h.left = Some(Err(why));
                let spot = h.spot;
                drop(held);
                return match last {
                    Some(a) => a,
                    None => driver.refusal(spot, why).await,
                };
            }
        }
        // A waiter's decision is raced with its deadline: a store that hangs must not keep it
        // past `max_wait`. A decision given up may still be counted by the store: a unit it
        // admitted is then lost to the limit, never given twice.
        let decided = match held.as_mut() {
            None => driver.decide().await,
            Some(h) => match race(driver.decide(), driver.sleep_until(h.deadline)).await {
                Either::Left(decided) => decided,
                Either::Right(()) => {
                    h.left = Some(Err(Dropped::Timeout));
                    let spot = h.spot;
                    drop(held);
                    return match last {
                        Some(a) => a,
                        None => driver.refusal(spot, Dropped::Timeout).await,
                    };
                }
            },
        };
        match decided {
            Attempt::Done(answer, allowed) => {
                if let Some(h) = held.as_mut() {
                    h.left = Some(if allowed {
                        Ok(driver.now().saturating_sub(arrived))
                    } else {
                        Err(Dropped::Refused)
                    });
                }
                return answer;
            }
            Attempt::Denied { answer, wait } => {
                let now = driver.now();
                let bound = arrived.saturating_add(wait.max_wait);
                let deadline = held.as_ref().map_or(bound, |h| h.deadline.min(bound));
                let at = now.saturating_add(wait.retry_after);
                if at > deadline {
                    match held.as_mut() {
                        Some(h) => h.left = Some(Err(Dropped::Timeout)),
                        None => {
                            if let Some(spot) =
                                spots.iter().find(|s| s.descriptor == wait.descriptor)
                            {
                                driver.dropped(spot, Dropped::Timeout, false);
                            }
                        }
                    }
                    return answer;
                }
                if let Some(h) = held.as_mut() {
                    h.deadline = deadline;
                } else {
                    let Some(spot) = spots.iter().find(|s| s.descriptor == wait.descriptor) else {
                        return answer;
                    };
                    let max_length = wait.max_length.min(spot.policy.max_length);
                    match enter(list, driver, spot, max_length, now, deadline) {
                        Some(h) => held = Some(h),
                        None => return answer,
                    }
                }
                retry_at = Some(at);
                last = Some(answer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn priority_first_then_arrival() {
        let mut q: Queues<&str, u32> = Queues::new(10);
        let free1 = q.join(&"k", 5, 1, 100, 1).unwrap().ticket;
        let free2 = q.join(&"k", 5, 1, 100, 2).unwrap().ticket;
        let paid = q.join(&"k", 5, 0, 100, 3).unwrap().ticket;
        assert_eq!(q.head(&"k"), Some(paid));
        assert!(q.ahead_of(&"k", 1) && q.ahead_of(&"k", 0));
        assert_eq!(q.leave(&"k", paid), Some((3, Some(free1))));
        assert!(!q.ahead_of(&"k", 0), "only lower priorities wait now");
        // Leaving from behind the head changes no one's turn.
        assert_eq!(q.leave(&"k", free2), Some((2, None)));
        assert_eq!(q.leave(&"k", free2), None);
        assert_eq!(q.leave(&"k", free1), Some((1, None)));
        assert_eq!((q.lines(), q.waiting()), (0, 0));
    }

    #[test]
    fn bounds_per_line_and_per_process() {
        let mut q: Queues<&str, ()> = Queues::new(3);
        q.join(&"a", 2, 1, 1, ()).unwrap();
        let last = q.join(&"a", 2, 1, 1, ()).unwrap().ticket;
        assert_eq!(q.join(&"a", 2, 1, 1, ()).unwrap_err(), Refused::Full);
        // A higher priority takes the last waiter's place.
        let joined = q.join(&"a", 2, 0, 1, ()).unwrap();
        assert_eq!(joined.evicted.map(|e| e.0), Some(last));
        assert_eq!(q.head(&"a"), Some(joined.ticket));
        assert!(q.join(&"a", 2, 0, 1, ()).unwrap().evicted.is_some());
        // Only higher priorities: the same one is refused.
        assert_eq!(q.join(&"a", 2, 0, 1, ()).unwrap_err(), Refused::Full);
        q.join(&"b", 2, 0, 1, ()).unwrap();
        // The cap is reached: the longest line makes room once, then the lines are even.
        assert!(q.join(&"c", 2, 0, 1, ()).unwrap().evicted.is_some());
        assert_eq!(
            q.join(&"d", 2, 0, 1, ()).unwrap_err(),
            Refused::TooManyWaiting
        );
        assert_eq!(q.join(&"c", 0, 0, 1, ()).unwrap_err(), Refused::Full);
    }

    #[test]
    fn one_line_cannot_keep_the_others_out_of_a_full_process() {
        let mut q: Queues<&str, u32> = Queues::new(4);
        for i in 0..4 {
            q.join(&"flood", 100, 1, 1, i).unwrap();
        }
        // The cap is reached by one line: a newcomer elsewhere takes its last place.
        let victim = q.join(&"victim", 100, 1, 1, 10).unwrap();
        assert_eq!(victim.evicted.map(|e| e.1), Some(3));
        assert_eq!(q.waiting(), 4);
        // The flooding line cannot take it back: it is the longest.
        assert_eq!(
            q.join(&"flood", 100, 0, 1, 4).unwrap_err(),
            Refused::TooManyWaiting
        );
        let other = q.join(&"other", 100, 1, 1, 20).unwrap();
        assert_eq!(other.evicted.map(|e| e.1), Some(2));
        // Lines of 2, 1 and 1: a second waiter of a line of one would not be fairer.
        assert_eq!(
            q.join(&"victim", 100, 1, 1, 11).unwrap_err(),
            Refused::TooManyWaiting
        );
        assert_eq!(
            q.join(&"new", 100, 1, 1, 30).unwrap().evicted.map(|e| e.1),
            Some(1)
        );
        // Four lines of one: the cap is shared evenly, nobody more makes room.
        assert_eq!(
            q.join(&"newer", 100, 1, 1, 40).unwrap_err(),
            Refused::TooManyWaiting
        );
        assert_eq!(q.by_len.keys().copied().collect::<Vec<_>>(), [1]);
        assert_eq!((q.waiting(), q.lines()), (4, 4));
    }

    #[test]
    fn deadlines_expire_in_order() {
        let mut q: Queues<&str, u8> = Queues::new(10);
        q.join(&"k", 9, 0, 30, 3).unwrap();
        q.join(&"k", 9, 1, 10, 1).unwrap();
        q.join(&"k", 9, 0, 20, 2).unwrap();
        assert!(q.expire(&"k", 9).is_empty());
        let gone: Vec<u8> = q.expire(&"k", 20).into_iter().map(|(_, v)| v).collect();
        assert_eq!(gone, [1, 2]);
        assert_eq!(q.waiting(), 1);
        q.expire(&"k", 30);
        assert_eq!((q.lines(), q.waiting()), (0, 0));
    }

    #[test]
    fn waitlist_wakes_the_next_head_and_frees_places_on_drop() {
        use std::future::Future;
        let list = Arc::new(Waitlist::new(10));
        let first = list.join("k", 2, 1, 0, 100).unwrap();
        let second = list.join("k", 2, 1, 0, 100).unwrap();
        assert!(matches!(list.join("k", 2, 1, 0, 100), Err(Refused::Full)));
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut turn = Box::pin(second.turn());
        assert!(turn.as_mut().poll(&mut cx).is_pending());
        assert!(first.is_head());
        drop(first);
        assert_eq!(turn.as_mut().poll(&mut cx), Poll::Ready(Turn::Head));
        drop(turn);
        // A place taken past its deadline by another's join finds itself gone.
        let third = list.join("k", 2, 1, 0, 100).unwrap();
        assert!(!third.is_head());
        let fourth = list.join("k", 2, 1, 100, 200).unwrap();
        assert_eq!(list.waiting(), 1);
        let mut turn = Box::pin(second.turn());
        assert_eq!(turn.as_mut().poll(&mut cx), Poll::Ready(Turn::Gone));
        drop(turn);
        assert!(fourth.is_head());
        drop((second, third, fourth));
        assert_eq!(list.waiting(), 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Join {
            key: u8,
            priority: u8,
            deadline: u16,
        },
        Leave(usize),
        Expire {
            key: u8,
            now: u16,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..3, 0u8..3, 0u16..100).prop_map(|(key, priority, deadline)| Op::Join {
                key,
                priority,
                deadline
            }),
            any::<usize>().prop_map(Op::Leave),
            (0u8..3, 0u16..100).prop_map(|(key, now)| Op::Expire { key, now }),
        ]
    }

    proptest! {
        /// Against a naive model (a list per key): the same waiters, served in (priority,
        /// arrival) order, within both bounds, whatever joins, leaves and expiries happen.
        #[test]
        fn matches_a_naive_model(ops in proptest::collection::vec(op(), 0..200), max_length in 1usize..6, max_waiting in 1usize..12) {
            let mut q: Queues<u8, u64> = Queues::new(max_waiting);
            // (key, priority, arrival, deadline, ticket)
            let mut model: Vec<(u8, u8, u64, u16, Ticket)> = Vec::new();
            let mut arrival = 0u64;
            for op in ops {
                match op {
                    Op::Join { key, priority, deadline } => {
                        let in_line = model.iter().filter(|m| m.0 == key).count();
                        let tail = model.iter().enumerate().filter(|(_, m)| m.0 == key).max_by_key(|(_, m)| (m.1, m.2)).map(|(i, m)| (i, m.1, m.2));
                        let got = q.join(&key, max_length, priority, u64::from(deadline), arrival);
                        if in_line >= max_length {
                            match tail {
                                Some((i, p, a)) if p > priority => {
                                    let joined = got.unwrap();
                                    prop_assert_eq!(joined.evicted.map(|e| e.1), Some(a));
                                    model.remove(i);
                                    model.push((key, priority, arrival, deadline, joined.ticket));
                                }
                                _ => prop_assert_eq!(got.unwrap_err(), Refused::Full),
                            }
                        } else if model.len() >= max_waiting {
                            // The cap is shared: the last waiter of a longest line makes room
                            // when that line is at least two longer than this one would be.
                            let longest = (0..3u8).map(|k| model.iter().filter(|m| m.0 == k).count()).max().unwrap_or(0);
                            if longest > in_line + 1 {
                                let joined = got.unwrap();
                                let (t, _) = joined.evicted.unwrap();
                                let i = model.iter().position(|m| m.4 == t).unwrap();
                                let k = model[i].0;
                                prop_assert!(k != key && model.iter().filter(|m| m.0 == k).count() == longest);
                                prop_assert_eq!(Some(t), model.iter().filter(|m| m.0 == k).map(|m| m.4).max());
                                model.remove(i);
                                model.push((key, priority, arrival, deadline, joined.ticket));
                            } else {
                                prop_assert_eq!(got.unwrap_err(), Refused::TooManyWaiting);
                            }
                        } else {
                            model.push((key, priority, arrival, deadline, got.unwrap().ticket));
                        }
                        arrival += 1;
                    }
                    Op::Leave(i) if !model.is_empty() => {
                        let m = model.remove(i % model.len());
                        let (v, _) = q.leave(&m.0, m.4).unwrap();
                        prop_assert_eq!(v, m.2);
                        prop_assert!(q.leave(&m.0, m.4).is_none(), "left twice");
                    }
                    Op::Leave(_) => {}
                    Op::Expire { key, now } => {
                        let mut gone: Vec<u64> = q.expire(&key, u64::from(now)).into_iter().map(|(_, v)| v).collect();
                        let mut expected: Vec<u64> = model.iter().filter(|m| m.0 == key && m.3 <= now).map(|m| m.2).collect();
                        model.retain(|m| !(m.0 == key && m.3 <= now));
                        gone.sort_unstable();
                        expected.sort_unstable();
                        prop_assert_eq!(gone, expected);
                    }
                }
                prop_assert_eq!(q.waiting(), model.len());
                prop_assert!(q.waiting() <= max_waiting);
                let indexed: usize = q.by_len.iter().map(|(n, keys)| n * keys.len()).sum();
                prop_assert_eq!(indexed, q.waiting());
                for (n, keys) in &q.by_len {
                    for k in keys {
                        prop_assert_eq!(q.line(k).map(Queue::len), Some(*n));
                    }
                }
                for key in 0..3u8 {
                    let mut expected: Vec<(u8, u64)> = model.iter().filter(|m| m.0 == key).map(|m| (m.1, m.2)).collect();
                    expected.sort_unstable();
                    prop_assert!(expected.len() <= max_length);
                    let served: Vec<(u8, u64)> = match q.line(&key) {
                        None => Vec::new(),
                        Some(line) => line.tickets().map(|t| (t.priority, model.iter().find(|m| m.4 == t).unwrap().2)).collect(),
                    };
                    prop_assert_eq!(&served, &expected);
                    for p in 0..3u8 {
                        prop_assert_eq!(q.ahead_of(&key, p), expected.first().is_some_and(|h| h.0 <= p));
                    }
                }
            }
        }
    }
}
