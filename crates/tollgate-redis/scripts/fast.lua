-- fast.lua: the one-item check of the counting algorithms (fixed_window, sliding_window_counter),
-- as Redis Functions of their own: what check.lua does for a request of one such item and no
-- lease, without its generic driver (no item list, no per-item tables, no multi-item
-- bookkeeping), because Redis runs this for nearly every request and every Lua operation costs
-- it CPU. The algorithm itself is the one check.lua uses (`fw_core`, `sc_roll` and `sc_decide`
-- on numbers; `fw_load`/`fw_save`, `sc_load`/`sc_save` for the state): one implementation.
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
    local t = rcall('TIME')
    now = tonum(t[1]) * 1000000 + tonum(t[2])
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
  local old = fw_load(p)
  local s, c = nil, 0
  if old ~= nil then s, c = old[1], old[2] end
  local allowed, rem, reset, retry, ks, kc = fw_core(p, s, c, now, cost)
  local new = nil
  if ks ~= nil then new = { ks, kc } end
  fw_save(p, old, new, fast_ttl(reset, grace))
  local a = 0
  if allowed then a = 1 end
  return spack('<ddddd', now, a, rem, reset, retry)
end

local function sc_fast(KEYS, ARGV)
  local p, now0, cost, grace = fast_item(KEYS, ARGV)
  local old = sc_load(p)
  local s, pr, c = nil, 0, 0
  if old ~= nil then s, pr, c = old[1], old[2], old[3] end
  local now, start, wend, prev, cur = sc_roll(p, s, pr, c, now0)
  local allowed, rem, reset, retry = sc_decide(p, now, start, wend, prev, cur, cost)
  local a = 0
  if allowed then
    a = 1
    cur = cur + cost
  end
  local new = nil
  if prev > 0 or cur > 0 then new = { start, prev, cur } end
  sc_save(p, old, new, fast_ttl(reset, grace))
  return spack('<ddddd', now0, a, rem, reset, retry)
end
