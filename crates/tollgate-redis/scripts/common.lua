-- common.lua: exact integer helpers and aligned windows shared by every algorithm.
--
-- Redis runs Lua 5.1, whose only number type is the IEEE double. Every quantity the store keeps
-- (microsecond timestamps, counts, emission intervals) is an integer below 2^53, where doubles
-- are exact, and the Rust side rejects quotas that could leave that range (see keys.rs). What
-- is NOT exact in doubles is division and the few products that can pass 2^53, so:
--   * idiv(a, b) = floor(a / b) is computed as (a - a % b) / b: the remainder is exact, a - r
--     is an exact multiple of b, and dividing an exact multiple is exact. Lua's `%` is
--     a - floor(a / b) * b, exact for integers 0 <= a, 0 < b with a + b <= 2^53: a quotient
--     just below an integer n is at least 1 / b below it, more than half the spacing of
--     doubles there (at most n / 2^53, and n * b < a + b). Beyond that only fmod is exact
--     (`imod`); the hot paths test the bound inline instead of calling a function, since a call
--     of math.fmod costs Redis far more than the operator.
--   * muldiv(a, b, c) = floor(a * b / c) and the remainder, exactly, even when a * b >= 2^53.
--   * numbers are written with sformat('%d') (tostring keeps only 14 digits).
-- This file is concatenated in front of the algorithm files and check.lua (see script.rs).

-- The library functions in locals, looked up once instead of on every use. A Redis Function's
-- code cannot see them while it is being loaded, only when it runs: `bind` sets them at the start
-- of each call (a no-op once set, as they stay set while the function stays loaded).
local tonum, fmod, sformat, smatch, rcall, spack, sunpack
local function bind()
  if rcall ~= nil then return end
  tonum, fmod, sformat, smatch = tonumber, math.fmod, string.format, string.match
  rcall, spack, sunpack = redis.call, struct.pack, struct.unpack
end

local TWO53 = 9007199254740992
local DAY = 86400000000

-- a mod b for integers 0 <= a < 2^53, 0 < b < 2^53 (see above).
local function imod(a, b)
  if a + b <= TWO53 then return a % b end
  return fmod(a, b)
end

local function idiv(a, b)
  return (a - imod(a, b)) / b
end

local function fmt(x)
  return sformat('%d', x)
end

-- The TTL of a state `reset` µs from its reset: whole milliseconds rounded up, at least 1, plus
-- the grace (ms). (reset + 999 is far below 2^53: `%` is exact.)
local function ttl_ms(reset, grace)
  local ms = reset + 999
  ms = (ms - ms % 1000) / 1000
  if ms < 1 then ms = 1 end
  return ms + grace
end

-- floor(a * b / c) and (a * b) mod c for integers 0 <= a, b < 2^53, 0 < c < 2^53, assuming the
-- quotient is below 2^53. Fast path: a double product below 2^53 is exact (and a true product at
-- or above 2^53 rounds to at least 2^53, so the test cannot be fooled). Slow path: long
-- multiplication over the bits of a, most significant first, keeping a_prefix * b = q * c + r
-- with 0 <= r < c. Doubling and adding b mod c are done as "r >= c - x ? r - (c - x) : r + x",
-- so no intermediate exceeds c (< 2^53) and every step is exact. At most 53 iterations, and only
-- for the sliding-window-counter products prev * elapsed and (k + 1) * window length, which
-- pass 2^53 only for large counts over long windows.
local function muldiv(a, b, c)
  local p = a * b
  if p < TWO53 then
    local r
    if p + c <= TWO53 then r = p % c else r = fmod(p, c) end
    return (p - r) / c, r
  end
  local bq = idiv(b, c)
  local br = b - bq * c
  local bits = {}
  local x = a
  while x > 0 do
    local bit = x % 2 -- (exact: x / 2 is exact in doubles)
    bits[#bits + 1] = bit
    x = (x - bit) / 2
  end
  -- r + x (both below c) as quotient carry and remainder, without exceeding c.
  local function add(r, x)
    if r >= c - x then return 1, r - (c - x) end
    return 0, r + x
  end
  local q, r = 0, 0
  for i = #bits, 1, -1 do
    local carry
    carry, r = add(r, r)
    q = q * 2 + carry
    if bits[i] == 1 then
      carry, r = add(r, br)
      q = q + bq + carry
    end
  end
  return q, r
end

-- Calendar arithmetic: Howard Hinnant's days_from_civil / civil_from_days, as in window.rs.
-- Only ever called with dates from 1969 on, so every division is of non-negative numbers.
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = idiv(y, 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = idiv(153 * mp + 2, 5) + d - 1
  local doe = yoe * 365 + idiv(yoe, 4) - idiv(yoe, 100) + doy
  return era * 146097 + doe - 719468
end

local function civil_from_days(z)
  z = z + 719468
  local era = idiv(z, 146097)
  local doe = z - era * 146097
  local yoe = idiv(doe - idiv(doe, 1460) + idiv(doe, 36524) - idiv(doe, 146096), 365)
  local doy = doe - (365 * yoe + idiv(yoe, 4) - idiv(yoe, 100))
  local mp = idiv(5 * doy + 2, 153)
  local d = doy - idiv(153 * mp + 2, 5) + 1
  local m
  if mp < 10 then m = mp + 3 else m = mp - 9 end
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m, d
end

local function day_start(day)
  if day < 0 then day = 0 end
  return day * DAY
end

local function month_start(index)
  local y = 1970 + idiv(index, 12)
  local m = index % 12 + 1
  return day_start(days_from_civil(y, m, 1))
end

-- The half-open window [start, end) of the period containing now (window.rs `window`).
-- p.unit: 0 second, 1 minute, 2 hour, 3 day, 4 week, 5 month, 6 year; p.mult >= 1;
-- p.len = nominal length (unit x multiplier) in microseconds.
local function window(p, now)
  local unit, m = p.unit, p.mult
  if unit <= 3 then
    local len = p.len
    local start
    if now + len <= TWO53 then start = now - now % len else start = now - fmod(now, len) end
    return start, start + len
  elseif unit == 4 then
    -- 1970-01-01 was a Thursday; Monday 1969-12-29 is day -3.
    local day = idiv(now, DAY) + 3
    local week = idiv(day, 7)
    local first = week - imod(week, m)
    local start_day = first * 7 - 3
    return day_start(start_day), day_start(start_day + 7 * m)
  else
    local y, mo = civil_from_days(idiv(now, DAY))
    if unit == 5 then
      local index = (y - 1970) * 12 + (mo - 1)
      local first = index - imod(index, m)
      return month_start(first), month_start(first + m)
    end
    local index = y - 1970
    local first = index - imod(index, m)
    return month_start(first * 12), month_start((first + m) * 12)
  end
end

-- The start of the window just before the one starting at `start`.
local function previous_start(p, start)
  if start == 0 then return 0 end
  if p.unit <= 3 then return start - p.len end
  local s = window(p, start - 1)
  return s
end

-- The end of the window just after the one ending at `wend`.
local function next_end(p, wend)
  if p.unit <= 3 then return wend + p.len end
  local _, e = window(p, wend)
  return e
end

local function sat_sub(a, b)
  if a > b then return a - b end
  return 0
end

-- A decision: allowed, limit, remaining, reset_after, retry_after (nil = never), delay.
local function decision(allowed, limit, remaining, reset, retry, delay)
  return { allowed = allowed, limit = limit, remaining = remaining, reset = reset,
           retry = retry, delay = delay or 0 }
end

local function deny_forever(limit)
  return decision(false, limit, 0, 0, nil, 0)
end

-- A state of two integers as stored: "a b" (fixed window "start count", token bucket
-- "tokens last").
local function pair_decode(v)
  local a, b = smatch(v, '^(%d+) (%d+)$')
  return { tonum(a), tonum(b) }
end

local function pair_encode(s)
  return sformat('%d %d', s[1], s[2])
end

-- Plain string-valued state: GET, decode; SET with a TTL, or DEL when back to full. The string
-- read is kept in p.raw, so that saving compares the new encoding with it instead of encoding
-- the old state again (an item that did not load its key, a repeat, has none).
local function load_string(p, decode)
  local v = rcall('GET', p.keys[1])
  if not v then return nil end
  p.raw = v
  return decode(v)
end

local function save_string(p, encode, old, new, ttl_ms)
  local o, n = p.raw, nil
  p.raw = nil
  if o == nil and old ~= nil then o = encode(old) end
  if new ~= nil then n = encode(new) end
  if o == n then return end
  if n == nil then
    rcall('DEL', p.keys[1])
  else
    rcall('SET', p.keys[1], n, 'PX', ttl_ms)
  end
end

-- The counting algorithms (fixed_window, sliding_window_counter) keep their state as numbers
-- packed in binary ('<d' each, struct.pack): decoding and encoding it costs Redis one call each,
-- where a "start count" text cost it a pattern match and a conversion per number, and the count
-- alone can be rewritten in place (SETRANGE, which keeps the TTL). The last number, t, is the
-- time of the write that set the TTL: a later write in the same window keeps that TTL only if
-- its time is not before t (the clock did not go back), since the TTL set at t covers the window
-- as seen from t (the writers test `t ~= nil and t <= now`). A state written without a time
-- (flush.lua) has t = 2^53: the next write sets the TTL.
--
-- The stored value of p.keys[1] if it is `len` bytes; nil when there is none; an error (the
-- key's name and size) when it is a string of another size, which no tollgate writes there.
-- p.pre, when set, is the value already read (fast.lua reads a batch's keys with one MGET;
-- false: none).
local function bin_load(p, len)
  local v = p.pre
  if v == nil then v = rcall('GET', p.keys[1]) end
  if not v then return nil end
  if #v ~= len then
    error('tollgate: ' .. p.keys[1] .. ' holds ' .. #v .. ' bytes, not a counter state of ' .. len)
  end
  return v
end

-- Write the whole state `v` of p.keys[1] with a TTL of `ttl` ms. MGET (p.pre) answers "none"
-- for a value of another type too, where GET fails with WRONGTYPE: a key read so and found
-- empty is written only if it is still absent (NX), and is another type's otherwise. (A
-- request that writes nothing there, a query of cost 0, answers as for an empty counter.)
local function bin_set(p, v, ttl)
  if p.pre == false then
    if not rcall('SET', p.keys[1], v, 'NX', 'PX', fmt(ttl)) then
      error('WRONGTYPE Operation against a key holding the wrong kind of value', 0)
    end
  else
    rcall('SET', p.keys[1], v, 'PX', fmt(ttl))
  end
end

local ALG = {}
