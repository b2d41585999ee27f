-- flush.lua: one instance's batch of `sync: batched` counts (batch.rs), applied atomically and
-- at most once. Self-contained (not part of the check function): the instance names every
-- window, so the script needs no clock and none of the algorithms.
--
-- KEYS[i]: the counter key of entry i (the key check.lua keeps the counter in); the sequences
-- applied to it live in the hash KEYS[i] .. ':b' (same hash tag, same slot), one field per
-- instance, expiring with the counter.
-- ARGV[1]: the instance id. Then per entry: algorithm (4 fixed_window, 6 sliding_window_counter),
-- TTL in ms, the batch's sequence number (increasing per instance), the number of windows n, and
-- n times: window start, the next window's start, the previous window's
-- start, units admitted in that window.
--
-- A batch whose sequence is not above the one the instance last applied to a counter is not
-- applied again (a retry after a timeout that Redis had applied): idempotent per counter.
-- Units land in the window they were admitted in: added to the count of the stored window when
-- it is that window; a state of an earlier window is rolled on (the sliding counter keeps a
-- previous window's count as `prev`); a sliding counter already in the next window takes them
-- as its `prev`; a state further on makes them moot (their window is over) and they are dropped.
--
-- Returns, per entry, the stored state after the flush: start, prev, count (fixed_window's
-- prev is 0; all 0 when there is no state).

-- The state is the one check.lua keeps (common.lua `bin_load`): numbers packed '<d', the last,
-- t, the time of the write that set the TTL. A state this script creates or moves to another
-- window gets t = 2^53 (no time here), so the next check sets its TTL; one it adds to in its
-- window keeps its t, and gets a longer TTL when it needs one.

local TWO53 = 9007199254740992
local inst = ARGV[1]
local out = {}
local a = 2
for _, key in ipairs(KEYS) do
  local alg, ttl, seq, n = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
    tonumber(ARGV[a + 3])
  a = a + 4
  local s, p, c, t = nil, 0, 0, TWO53
  local v = redis.call('GET', key)
  if v then
    if alg == 4 and #v == 24 then
      s, c, t = struct.unpack('<ddd', v)
    elseif alg == 6 and #v == 32 then
      s, p, c, t = struct.unpack('<dddd', v)
    else
      error('tollgate: ' .. key .. ' holds ' .. #v .. ' bytes, not a counter state')
    end
  end
  local seqkey = key .. ':b'
  local last = tonumber(redis.call('HGET', seqkey, inst) or '0')
  local apply = seq > last
  local changed = false
  for _ = 1, n do
    local w, nx, pw, d = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
      tonumber(ARGV[a + 3])
    a = a + 4
    if apply and d > 0 then
      if s == nil or s < w then
        if alg == 6 and s ~= nil and s == pw then
          p, c = c, 0
        else
          p, c = 0, 0
        end
        s = w
        c = d
        t = TWO53
        changed = true
      elseif s == w then
        c = c + d
        changed = true
      elseif alg == 6 and s == nx then
        p = p + d
        changed = true
      end
    end
  end
  if changed then
    if alg == 4 then
      redis.call('SET', key, struct.pack('<ddd', s, c, t), 'KEEPTTL')
    else
      redis.call('SET', key, struct.pack('<dddd', s, p, c, t), 'KEEPTTL')
    end
    if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
  end
  if apply then
    redis.call('HSET', seqkey, inst, seq)
    if redis.call('PTTL', seqkey) < ttl then redis.call('PEXPIRE', seqkey, ttl) end
  end
  local k = #out
  out[k + 1], out[k + 2], out[k + 3] = s or 0, p, c
end
return out
