//! The registry in Redis: shared by every instance that uses the same Redis and key prefix.
//!
//! Keys (no TTL; one hash tag, so a Redis Cluster keeps them in one slot and the scripts may
//! touch them together):
//! - `{<prefix>:registry}:revision`: the registry's last revision (an integer);
//! - `{<prefix>:registry}:domains`: a hash, domain -> its current version;
//! - `{<prefix>:registry}:history:<domain>`: a list of the domain's versions as JSON, newest
//!   first (the head is the current one), trimmed to the history length.
//!
//! Writes are Lua scripts, so the `If-Match` check, the domain cap, the revision increment and
//! the write are one atomic step however many instances write at once. Each change is then
//! announced on the channel `<prefix>:registry:changes` (its revision as the message).
//!
//! Instances follow the registry two ways (`follow`): a subscription to the channel (a change
//! is applied as soon as its message arrives) and a poll of the revision key every
//! `poll_interval` (250 ms by default), which catches a message missed while the subscription
//! was down. While Redis cannot be reached the running rules stay as they are.
//!
//! Redis can lose the registry (flushed, restarted without persistence, failed over to a
//! replica that lagged, restored from an old backup). Revisions only grow, so an instance
//! knows Redis lost changes when the revision key is missing while it knows a revision above
//! 0 (deleting every domain keeps the key), or when it is below the revision the instance
//! knows. The instance then writes back what it knows with [`RedisRegistry::restore`]: one
//! script that only writes while Redis is still behind that revision, so instances racing to
//! restore write once, and the one that knows the newest revision has the last word. The write
//! scripts take the writer's known revision too and refuse a write to a registry that is behind
//! it, so a change is never made on top of a lost registry (the writer restores first).

use super::{Entry, Expect, Refused, Snapshot, Version};
use std::time::Duration;
use tollgate_core::StoreError;
use tollgate_redis::RedisStore;

/// Bound on each registry call to Redis.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Puts one version: `{status, current, previous}` with status the new revision, 0 (stale), -1
/// (cap) or -3 (the registry is behind the writer's known revision, `ARGV[7]`: restore first),
/// and `previous` the version replaced (JSON; absent when none), read in the same step as the
/// write so that the answer describes this write whoever else writes at the same time.
const PUT: &str = r#"
local known = tonumber(ARGV[7])
if known > 0 and tonumber(redis.call('GET', KEYS[1]) or '0') < known then return {-3, 0} end
local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local previous = false
if cur > 0 then previous = redis.call('LINDEX', KEYS[3], 0) end
local expect = tonumber(ARGV[2])
if (expect == -2 and cur == 0) or (expect > 0 and expect ~= cur) then return {0, cur} end
if cur == 0 and redis.call('HLEN', KEYS[2]) >= tonumber(ARGV[4]) then return {-1, cur} end
local rev = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[1], rev)
redis.call('LPUSH', KEYS[3], '{"version":' .. rev .. ',' .. ARGV[3])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[5]) - 1)
redis.call('PUBLISH', ARGV[6], rev)
return {rev, cur, previous}
"#;

/// Deletes a domain: `{status, current}` with status the new revision, 0 (stale), -2 (absent)
/// or -3 (behind the writer's known revision, `ARGV[4]`). The revision key stays when the last
/// domain goes: an empty registry at revision n is not a lost one.
const DELETE: &str = r#"
local known = tonumber(ARGV[4])
if known > 0 and tonumber(redis.call('GET', KEYS[1]) or '0') < known then return {-3, 0} end
local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if cur == 0 then return {-2, 0} end
local expect = tonumber(ARGV[2])
if expect > 0 and expect ~= cur then return {0, cur} end
local rev = redis.call('INCR', KEYS[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3])
redis.call('PUBLISH', ARGV[3], rev)
return {rev, cur}
"#;

/// Writes back a registry Redis lost: `{1, before}` when written, `{0, before}` when Redis is
/// not behind `ARGV[1]` (the revision the caller knows; `before` is Redis's). `ARGV[2]` is the
/// channel, then per domain: name, current version, number of versions, the versions as JSON
/// (newest first). Without a revision key, Redis's revision is taken as the highest version
/// its domains hash holds (only the revision key may have been lost, evicted): a registry that
/// is not behind gets its revision key back and is otherwise left alone.
const RESTORE: &str = r#"
local known = tonumber(ARGV[1])
local rev = redis.call('GET', KEYS[1])
local cur = tonumber(rev or '0')
if not rev then
  for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
    if tonumber(v) > cur then cur = tonumber(v) end
  end
end
if cur >= known then
  if not rev and cur > 0 then redis.call('SET', KEYS[1], cur) end
  return {0, cur}
end
for _, d in ipairs(redis.call('HKEYS', KEYS[2])) do redis.call('DEL', KEYS[3] .. d) end
redis.call('DEL', KEYS[2])
local i = 3
while i <= #ARGV do
  local d, n = ARGV[i], tonumber(ARGV[i + 2])
  redis.call('HSET', KEYS[2], d, ARGV[i + 1])
  for j = 1, n do redis.call('RPUSH', KEYS[3] .. d, ARGV[i + 2 + j]) end
  i = i + 3 + n
end
redis.call('SET', KEYS[1], known)
redis.call('PUBLISH', ARGV[2], known)
return {1, cur}
"#;

/// The whole registry, atomically: `{}` when there is no revision key, else
/// `{revision, domain, n, version_1, ..., version_n, domain, n, ...}`.
const LOAD: &str = r#"
local rev = redis.call('GET', KEYS[1])
if not rev then return {} end
local out = {rev}
local names = redis.call('HKEYS', KEYS[2])
table.sort(names)
for _, d in ipairs(names) do
  local versions = redis.call('LRANGE', KEYS[3] .. d, 0, -1)
  out[#out + 1] = d
  out[#out + 1] = tostring(#versions)
  for _, v in ipairs(versions) do out[#out + 1] = v end
end
return out
"#;

/// What a `PUT` wrote: the new version, and the version it replaced (`None`: the domain was
/// new), as one atomic step saw them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The new version.
    pub version: u64,
    /// The version replaced.
    pub previous: Option<Version>,
}

/// The registry's keys and channel under one prefix.
#[derive(Debug, Clone)]
pub struct RedisRegistry {
    store: RedisStore,
    revision: String,
    domains: String,
    history: String,
    channel: String,
}

impl RedisRegistry {
    /// The registry of `store` (its connection, its key prefix).
    pub fn new(store: RedisStore) -> Self {
        let prefix = store.options().prefix.clone();
        let tag = format!("{{{prefix}:registry}}");
        Self {
            revision: format!("{tag}:revision"),
            domains: format!("{tag}:domains"),
            history: format!("{tag}:history:"),
            channel: format!("{prefix}:registry:changes"),
            store,
        }
    }

    /// The channel changes are announced on.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    fn eval(&self, script: &str, domain: Option<&str>) -> redis::Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script)
            .arg(3)
            .arg(&self.revision)
            .arg(&self.domains);
        match domain {
            Some(d) => cmd.arg(format!("{}{d}", self.history)),
            None => cmd.arg(&self.history),
        };
        cmd
    }

    /// The registry's revision; `None` when Redis holds no registry.
    pub async fn revision(&self) -> Result<Option<u64>, StoreError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(&self.revision);
        self.store.command(&cmd, CALL_TIMEOUT).await
    }

    /// The whole registry; `None` when Redis holds none (no revision key).
    pub async fn load(&self) -> Result<Option<Snapshot>, StoreError> {
        let flat: Vec<String> = self
            .store
            .command(&self.eval(LOAD, None), CALL_TIMEOUT)
            .await?;
        let bad = |what: &str| StoreError::Unavailable(format!("registry in Redis: {what}"));
        let mut items = flat.into_iter();
        let Some(revision) = items.next() else {
            return Ok(None);
        };
        let mut snapshot = Snapshot {
            revision: revision
                .parse()
                .map_err(|_| bad("revision is not a number"))?,
            ..Snapshot::default()
        };
        while let Some(domain) = items.next() {
            let n: usize = items
                .next()
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| bad("truncated reply"))?;
            let versions = items
                .by_ref()
                .take(n)
                .map(|v| serde_json::from_str::<Version>(&v))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(&format!("domain `{domain}`: {e}")))?;
            // A domain without versions lost its history key (evicted): an error, so the
            // running rules stay rather than lose that domain.
            if versions.is_empty() {
                return Err(bad(&format!(
                    "domain `{domain}` has no versions (its history key is gone)"
                )));
            }
            snapshot
                .domains
                .insert(domain.clone(), Entry { domain, versions });
        }
        Ok(Some(snapshot))
    }

    /// Store `version` (its number is ignored: the script gives the next revision) as the
    /// current version of `domain`. What was written, or why it was refused. `known` is the
    /// revision the writer knows: a registry behind it is refused ([`Refused::Behind`]).
    pub async fn put(
        &self,
        domain: &str,
        version: &Version,
        expect: Expect,
        max_domains: usize,
        history: usize,
        known: u64,
    ) -> Result<Result<Written, Refused>, StoreError> {
        // The JSON of `version` without its `version` field and opening brace: the script puts
        // `{"version":<revision>,` in front.
        let rest = serde_json::json!({
            "updated_at_ms": version.updated_at_ms,
            "updated_by": version.updated_by,
            "rules": version.rules,
        })
        .to_string();
        let mut cmd = self.eval(PUT, Some(domain));
        cmd.arg(domain)
            .arg(expect_arg(expect))
            .arg(&rest[1..])
            .arg(max_domains)
            .arg(history.max(1))
            .arg(&self.channel)
            .arg(known);
        let reply: redis::Value = self.store.command(&cmd, CALL_TIMEOUT).await?;
        let bad = || StoreError::Unavailable("registry script: bad reply".into());
        let redis::Value::Array(items) = reply else {
            return Err(bad());
        };
        let int = |v: Option<&redis::Value>| match v {
            Some(redis::Value::Int(n)) => Ok(*n),
            _ => Err(bad()),
        };
        let (status, cur) = (int(items.first())?, int(items.get(1))?);
        Ok(match status {
            0 => Err(Refused::Stale((cur > 0).then_some(cur as u64))),
            -1 => Err(Refused::Full),
            -3 => Err(Refused::Behind),
            rev if rev > 0 => {
                let previous = match items.get(2) {
                    Some(redis::Value::BulkString(json)) => Some(
                        serde_json::from_slice::<Version>(json)
                            .map_err(|e| StoreError::Unavailable(format!("registry entry: {e}")))?,
                    ),
                    _ => None,
                };
                Ok(Written {
                    version: rev as u64,
                    previous,
                })
            }
            _ => return Err(bad()),
        })
    }

    /// Delete `domain`: the new revision and the version deleted, or why it was refused.
    /// `known` as for [`RedisRegistry::put`].
    pub async fn delete(
        &self,
        domain: &str,
        expect: Expect,
        known: u64,
    ) -> Result<Result<(u64, u64), Refused>, StoreError> {
        let mut cmd = self.eval(DELETE, Some(domain));
        cmd.arg(domain)
            .arg(expect_arg(expect))
            .arg(&self.channel)
            .arg(known);
        let reply: Vec<i64> = self.store.command(&cmd, CALL_TIMEOUT).await?;
        Ok(match reply.as_slice() {
            [-2, _] => Err(Refused::NotFound),
            [-3, _] => Err(Refused::Behind),
            [0, cur] => Err(Refused::Stale((*cur > 0).then_some(*cur as u64))),
            [rev, cur] if *rev > 0 => Ok((*rev as u64, *cur as u64)),
            _ => return Err(StoreError::Unavailable("registry script: bad reply".into())),
        })
    }

    /// Write `snapshot` (what this instance knows, at its revision) back into Redis if Redis is
    /// behind it (lost changes), atomically. `Some(before)` when it was written (`before`:
    /// Redis's revision then, 0 for none), `None` when Redis was not behind.
    pub async fn restore(&self, snapshot: &Snapshot) -> Result<Option<u64>, StoreError> {
        let mut cmd = self.eval(RESTORE, None);
        cmd.arg(snapshot.revision).arg(&self.channel);
        for (name, entry) in &snapshot.domains {
            let Some(current) = entry.current() else {
                continue;
            };
            cmd.arg(name).arg(current.version).arg(entry.versions.len());
            for v in &entry.versions {
                let json = serde_json::to_string(v)
                    .map_err(|e| StoreError::Unavailable(format!("registry entry: {e}")))?;
                cmd.arg(json);
            }
        }
        let reply: Vec<i64> = self.store.command(&cmd, CALL_TIMEOUT).await?;
        match reply.as_slice() {
            [1, before] => Ok(Some(*before as u64)),
            [0, _] => Ok(None),
            _ => Err(StoreError::Unavailable("registry script: bad reply".into())),
        }
    }
}

/// `expect` as the scripts read it: -1 any, -2 must exist, else the version.
fn expect_arg(expect: Expect) -> i64 {
    match expect {
        Expect::Any => -1,
        Expect::Exists => -2,
        Expect::Version(v) => v as i64,
    }
}

/// Subscribe to `channel` on the Redis at `url` (a single server: `redis://`, `rediss://`,
/// `redis+unix://`); each message wakes `notify`. Reconnects (every second) until `shutdown`.
pub(crate) async fn subscribe(
    url: String,
    channel: String,
    notify: std::sync::Arc<tokio::sync::Notify>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    use futures_util::StreamExt;
    let Ok(client) = redis::Client::open(url.as_str()) else {
        return;
    };
    loop {
        let connected = async {
            let mut pubsub = tokio::time::timeout(CALL_TIMEOUT, client.get_async_pubsub())
                .await
                .ok()?
                .ok()?;
            tokio::time::timeout(CALL_TIMEOUT, pubsub.subscribe(&channel))
                .await
                .ok()?
                .ok()?;
            Some(pubsub)
        };
        let pubsub = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            p = connected => p,
        };
        if let Some(pubsub) = pubsub {
            tracing::debug!(channel = %channel, "registry: subscribed to changes");
            // Anything may have changed while unsubscribed: look now.
            notify.notify_one();
            let mut messages = pubsub.into_on_message();
            loop {
                tokio::select! {
                    _ = shutdown.wait_for(|s| *s) => return,
                    m = messages.next() => match m {
                        Some(_) => notify.notify_one(),
                        None => break,
                    },
                }
            }
        }
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
