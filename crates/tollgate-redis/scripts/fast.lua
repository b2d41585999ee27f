-- fast.lua: the check of one-item requests on the counting algorithms (fixed_window,
-- sliding_window_counter), as a Redis Function of its own: what check.lua does for a request of
-- one such item and no lease, without its generic driver (no per-item tables, no multi-item
-- bookkeeping), because Redis runs this for nearly every request and every Lua operation costs
-- it CPU. One call answers a batch of such requests, each on its own (the store coalesces the
-- requests that arrive while a call is in flight, see coalesce.rs), so the call's fixed cost
-- (the FCALL, TIME, the reply) is paid once per batch. The algorithm itself is the one check.lua
-- uses (`fw_core`, `sc_roll` and `sc_decide` on numbers; `fw_get`/`fw_put`, `sc_get`/`sc_put`
-- for the state): one implementation. Only in the library loaded with FUNCTION LOAD (script.rs
-- `library`), not in the EVAL form.
--
-- KEYS: one counter key per request of the batch (a key may repeat: the requests are decided
-- in order, each seeing the ones before).
-- ARGV[1]: '<dd' now (-1 = Redis TIME), grace ms; then per key '<ddddBB' (struct.pack, see
--   script.rs `fast_item`): cost, limit, nominal period, multiplier, unit, algorithm (4 =
--   fixed_window, 6 = sliding_window_counter).
-- Returns '<d' now, then '<dddd' per request: allowed (1/0; -1 = this request failed),
-- remaining, reset_after, retry_after (-1 = none). Being the only item of its request, a request
-- is blocked when it is denied and not shadow: the caller knows that. When some requests failed
-- (a key holding a value tollgate did not write, a write refused), the reply is an array: the
-- packed string, then each failed request's error in order. A failure of one request's key never
-- fails the others.

-- The item, reused by every request: a table per request would cost more than the fields.
local FP = { keys = {} }

-- A TTL for `reset` µs: whole milliseconds rounded up, at least 1, plus the grace (check.lua).
local function fast_ttl(reset, grace)
  local ms = idiv(reset + 999, 1000)
  if ms < 1 then ms = 1 end
  return ms + grace
end

local function fw_one(p, now, cost, grace)
  local s, c, t = fw_get(p)
  local allowed, rem, reset, retry, ks, kc = fw_core(p, s, c, now, cost)
  fw_put(p, s, c, t, ks, kc, fast_ttl(reset, grace))
  if allowed then return 1, rem, reset, retry end
  return 0, rem, reset, retry
end

local function sc_one(p, now0, cost, grace)
  local s, pr, c, t = sc_get(p)
  local now, start, wend, prev, cur = sc_roll(p, s, pr, c, now0)
  local allowed, rem, reset, retry = sc_decide(p, now, start, wend, prev, cur, cost)
  local a = 0
  if allowed then
    a = 1
    cur = cur + cost
  end
  if prev > 0 or cur > 0 then
    sc_put(p, s, pr, c, t, start, prev, cur, fast_ttl(reset, grace))
  else
    sc_put(p, s, pr, c, t, nil, 0, 0, 0)
  end
  return a, rem, reset, retry
end

local FAST_STEP = { [4] = fw_one, [6] = sc_one }
-- The reply's format per batch size, built once.
local FAST_FMT = {}

local function fast_many(KEYS, ARGV)
  bind()
  local a = ARGV[1]
  local now, grace, pos = sunpack('<dd', a)
  if now < 0 then
    -- (Lua converts the two decimal strings itself, exactly: both are integers below 2^53.)
    local t = rcall('TIME')
    now = t[1] * 1000000 + t[2]
  end
  local n = #KEYS
  local out = { now }
  local errs = nil
  local p = FP
  p.now = now
  -- Every key read at once (one command, not one per request); a key repeated in the batch is
  -- read again when its turn comes, after the requests before it wrote.
  local values = rcall('MGET', unpack(KEYS))
  local seen = {}
  for i = 1, n do
    local cost, limit, len, mult, unit, alg
    cost, limit, len, mult, unit, alg, pos = sunpack('<ddddBB', a, pos)
    local key = KEYS[i]
    p.unit, p.mult, p.len, p.limit, p.keys[1] = unit, mult, len, limit, key
    if seen[key] then
      p.pre = nil
    else
      p.pre = values[i]
      seen[key] = true
    end
    local step = FAST_STEP[alg]
    local ok, al, rem, reset, retry
    if step == nil then
      ok, al = false, 'tollgate: no one-item check for algorithm ' .. alg
    else
      ok, al, rem, reset, retry = pcall(step, p, now, cost, grace)
    end
    local j = 4 * i - 2
    if ok then
      out[j], out[j + 1], out[j + 2], out[j + 3] = al, rem, reset, retry
    else
      -- redis.call raises a table {err = ...}; error() a string.
      if type(al) == 'table' then al = al.err end
      errs = errs or {}
      errs[#errs + 1] = tostring(al)
      out[j], out[j + 1], out[j + 2], out[j + 3] = -1, 0, 0, -1
    end
  end
  local f = FAST_FMT[n]
  if f == nil then
    f = '<d' .. string.rep('dddd', n)
    FAST_FMT[n] = f
  end
  p.pre = nil
  local packed = spack(f, unpack(out))
  if errs == nil then return packed end
  table.insert(errs, 1, packed)
  return errs
end
