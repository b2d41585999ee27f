-- fast.lua: the one-item check of the counting algorithms (fixed_window, sliding_window_counter),
-- as Redis Functions of their own: what check.lua does for a request of one such item and no
-- lease, without its generic driver (no item list, no per-item tables, no multi-item
-- bookkeeping), because Redis runs this for nearly every request and every Lua operation costs
-- it CPU. The algorithm itself is the one check.lua uses (`fw_core`, `sc_roll` and `sc_decide`
-- on numbers; `fw_get`/`fw_put`, `sc_get`/`sc_put` for the state): one implementation.
-- Only in the library loaded with FUNCTION LOAD (script.rs `library`), not in the EVAL form.
--
-- KEYS[1]: the counter's key.
-- ARGV[1]: '<ddddddB' (struct.pack, see script.rs `fast_arguments`): now (-1 = Redis TIME),
--   grace ms, cost, limit, nominal period, multiplier, unit.
-- Returns '<ddddd': now, allowed (1/0), remaining, reset_after, retry_after (-1 = none). Being
-- the only item, the request is blocked when it is denied and not shadow: the caller knows that.

-- The item, reused by every call: a table per call would cost more than the fields.
local FP = { keys = {} }

local function fast_item(KEYS, ARGV)
  bind()
  local now, grace, cost, limit, len, mult, unit = sunpack('<ddddddB', ARGV[1])
  if now < 0 then
    -- (Lua converts the two decimal strings itself, exactly: both are integers below 2^53.)
    local t = rcall('TIME')
    now = t[1] * 1000000 + t[2]
  end
  local p = FP
  p.unit, p.mult, p.len, p.limit, p.now, p.keys[1] = unit, mult, len, limit, now, KEYS[1]
  return p, now, cost, grace
end

-- A TTL for `reset` µs: whole milliseconds rounded up, at least 1, plus the grace (check.lua).
local function fast_ttl(reset, grace)
  local ms = idiv(reset + 999, 1000)
  if ms < 1 then ms = 1 end
  return ms + grace
end

local function fw_fast(KEYS, ARGV)
  local p, now, cost, grace = fast_item(KEYS, ARGV)
  local s, c, t = fw_get(p)
  local allowed, rem, reset, retry, ks, kc = fw_core(p, s, c, now, cost)
  fw_put(p, s, c, t, ks, kc, fast_ttl(reset, grace))
  local a = 0
  if allowed then a = 1 end
  return spack('<ddddd', now, a, rem, reset, retry)
end

local function sc_fast(KEYS, ARGV)
  local p, now0, cost, grace = fast_item(KEYS, ARGV)
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
  return spack('<ddddd', now0, a, rem, reset, retry)
end
