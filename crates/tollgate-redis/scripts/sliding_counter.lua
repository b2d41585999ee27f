-- sliding_counter.lua: sliding window counter (algorithm/sliding_counter.rs), state start,
-- prev, cur and t packed in binary (see `bin_load` in common.lua). The two products that can
-- pass 2^53 -- prev * (end - now) for the weighted previous window, and (k + 1) * window length
-- for the retry instant -- go through muldiv (common.lua), which computes floor(a * b / c)
-- exactly by long multiplication; everything else is a sum or difference of values below 2^53.

-- floor(prev * (end - now) / (end - start)), exactly.
local function sc_weighted(prev, now, start, wend)
  local len = wend - start
  if len < 1 then len = 1 end
  local q = muldiv(prev, sat_sub(wend, now), len)
  return q
end

-- Earliest instant in [start, end) at which floor(prev * (end - t) / len) <= k.
local function sc_earliest(prev, k, start, wend)
  if prev <= k then return start end
  local len = wend - start
  local q, r = muldiv(k + 1, len, prev)
  if r > 0 then q = q + 1 end
  local rr = q - 1
  if rr > len then rr = len end
  return wend - rr
end

-- reset_after for a current count c (sliding_counter.rs `decide`).
local function sc_reset(c, prev, now, wend, next_end)
  if c > 0 then return next_end - now end
  if prev > 0 then return wend - now end
  return 0
end

-- The denial of `cost` on the rolled counts, estimate being the weighted count
-- (sliding_counter.rs `decide`): remaining, reset_after, retry_after (-1 = none).
local function sc_denied(limit, now, start, wend, ne, prev, cur, cost, estimate)
  local reset = sc_reset(cur, prev, now, wend, ne)
  if limit == 0 or cost > limit then return sat_sub(limit, estimate), reset, -1 end
  local retry_at
  if cur + cost <= limit then
    retry_at = sc_earliest(prev, limit - cur - cost, start, wend)
  else
    retry_at = sc_earliest(cur, limit - cost, wend, ne)
  end
  local retry = sat_sub(retry_at, now)
  if retry < 1 then retry = 1 end
  return sat_sub(limit, estimate), reset, retry
end

-- The step on plain numbers (sliding_counter.rs): a request of `cost` at `now` on the stored
-- window start `s` (nil: no state) and counts `prev`, `cur`. Returns allowed (1/0), remaining,
-- reset_after, retry_after (-1 = none) and the state after it: start (nil: none), prev, cur.
-- Shared by `sc_step` (check.lua) and fast.lua. Redis runs this for nearly every request, so
-- the common case is written out here (windows of seconds to days, the weighted count when
-- its product stays below 2^53, the admission) rather than through the helpers, each of whose
-- calls costs Redis more than the arithmetic it does; the helpers take the rest.
local function sc_core(p, s, prev, cur, now, cost)
  local unit, len = p.unit, p.len
  local start, wend
  if unit <= 3 and now + len <= TWO53 then
    start = now - now % len
    wend = start + len
  else
    start, wend = window(p, now)
  end
  if s == nil then
    prev, cur = 0, 0
  elseif s ~= start then
    if s > start then
      -- The clock went back: clamped to the next window (sliding_counter.rs).
      if s > wend then s = wend end
      now = s
      start, wend = window(p, s)
    elseif (unit <= 3 and s == start - len) or (unit > 3 and s == previous_start(p, start)) then
      prev, cur = cur, 0
    else
      prev, cur = 0, 0
    end
  end
  -- The estimate: floor(prev * (end - now) / (end - start)) + cur (sc_weighted).
  local estimate = cur
  if prev > 0 then
    local span = wend - start
    if span < 1 then span = 1 end
    local left = wend - now
    if left < 0 then left = 0 end
    local x = prev * left
    if x + span <= TWO53 then
      estimate = estimate + (x - x % span) / span
    else
      estimate = estimate + muldiv(prev, left, span)
    end
  end
  local ne
  if unit <= 3 then ne = wend + len else ne = next_end(p, wend) end
  local limit = p.limit
  if limit > 0 and cost <= limit and estimate + cost <= limit then
    cur = cur + cost
    local reset = 0
    if cur > 0 then reset = ne - now elseif prev > 0 then reset = wend - now end
    if prev == 0 and cur == 0 then start = nil end
    return 1, limit - estimate - cost, reset, -1, start, prev, cur
  end
  local rem, reset, retry = sc_denied(limit, now, start, wend, ne, prev, cur, cost, estimate)
  if prev == 0 and cur == 0 then start = nil end
  return 0, rem, reset, retry, start, prev, cur
end

local function sc_step(st, now, cost, p)
  local s, pr, c = nil, 0, 0
  if st ~= nil then s, pr, c = st[1], st[2], st[3] end
  local a, rem, reset, retry, ns, np, nc = sc_core(p, s, pr, c, now, cost)
  if retry < 0 then retry = nil end
  local keep = nil
  if ns ~= nil then keep = { ns, np, nc } end
  return decision(a == 1, p.limit, rem, reset, retry, 0), keep
end

-- The stored state: start (nil: none), prev, cur and t, packed '<dddd' (see `bin_load`).
local function sc_get(p)
  local v = p.pre
  if not v or #v ~= 32 then
    v = bin_load(p, 32)
    if v == nil then return nil, 0, 0, nil end
  end
  return sunpack('<dddd', v)
end

-- Write the state start `ns` (nil: none), prev `np`, cur `nc` over the stored one (`os`, `op`,
-- `oc`, `ot`, as `sc_get` returns them): nothing when equal; the current count alone
-- (SETRANGE, the TTL kept) when only it changed and it was counting already (a count starting
-- in this window moves the expiry from this window's end to the next one's); else the whole
-- state with its TTL. Returns the new state's t. (Numbers, not tables: a table per call costs
-- Redis more than the arithmetic.)
local function sc_put(p, os, op, oc, ot, ns, np, nc, ttl)
  if ns == nil then
    if os ~= nil then rcall('DEL', p.keys[1]) end
    return nil
  end
  if os == ns and op == np then
    if oc == nc then return ot end
    if oc > 0 and ot ~= nil and ot <= p.now then
      rcall('SETRANGE', p.keys[1], '16', spack('<d', nc))
      return ot
    end
  end
  bin_set(p, spack('<dddd', ns, np, nc, p.now), ttl)
  return p.now
end

-- The same as tables {start, prev, cur, t}, for check.lua.
local function sc_load(p)
  local s, pr, c, t = sc_get(p)
  if s == nil then return nil end
  return { s, pr, c, t }
end

local function sc_save(p, old, new, ttl)
  local os, op, oc, ot = nil, 0, 0, nil
  if old ~= nil then os, op, oc, ot = old[1], old[2], old[3], old[4] end
  if new == nil then
    sc_put(p, os, op, oc, ot, nil, 0, 0, ttl)
    return
  end
  new[4] = sc_put(p, os, op, oc, ot, new[1], new[2], new[3], ttl)
end

ALG[6] = {
  load = sc_load,
  step = sc_step,
  clamp = function(st, now, p)
    if st == nil or st[1] <= now then return nil end
    local _, wend = window(p, now)
    if st[1] > wend then return { wend, st[2], st[3] } end
    return nil
  end,
  save = sc_save,
  -- Count g more units in the state's current window (a lease; see check.lua).
  grant = function(p, st, now, g)
    if st == nil then return { (window(p, now)), 0, g } end
    return { st[1], st[2], st[3] + g }
  end,
  -- Undo an admitted cost in the count of the window the check counted in.
  refund = function(p, now, cost)
    local s, pr, c = sc_get(p)
    -- Only in the window the check counted in (see fixed_window.lua's refund).
    if s == nil or s ~= window(p, now) then return end
    c = c - cost
    if c < 0 then c = 0 end
    if pr == 0 and c == 0 then
      rcall('DEL', p.keys[1])
    else
      rcall('SETRANGE', p.keys[1], '16', spack('<d', c))
    end
  end,
}
