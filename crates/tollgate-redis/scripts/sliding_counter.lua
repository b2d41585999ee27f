-- sliding_counter.lua: sliding window counter (algorithm/sliding_counter.rs), state
-- "start prev cur". The two products that can pass 2^53 -- prev * (end - now) for the weighted
-- previous window, and (k + 1) * window length for the retry instant -- go through muldiv
-- (common.lua), which computes floor(a * b / c) exactly by long multiplication; everything else
-- is a sum or difference of values below 2^53.

local function sc_decode(v)
  local a, b, c = smatch(v, '^(%d+) (%d+) (%d+)$')
  return { tonum(a), tonum(b), tonum(c) }
end

local function sc_encode(s)
  return sformat('%d %d %d', s[1], s[2], s[3])
end

-- Counts as seen from now: returns now (clamped forward if the clock went backwards), window
-- start, window end, prev, cur.
local function sc_roll(p, st, now)
  local ws, we = window(p, now)
  if st == nil then return now, ws, we, 0, 0 end
  local s, prev, cur = st[1], st[2], st[3]
  if s == ws then return now, ws, we, prev, cur end
  if s > ws then
    -- The clock went back: clamped to the next window (sliding_counter.rs).
    if s > we then s = we end
    local ws2, we2 = window(p, s)
    return s, ws2, we2, prev, cur
  end
  if s == previous_start(p, ws) then return now, ws, we, cur, 0 end
  return now, ws, we, 0, 0
end

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

local function sc_step(st, now0, cost, p)
  local now, start, wend, prev, cur = sc_roll(p, st, now0)
  local limit = p.limit
  local estimate = sc_weighted(prev, now, start, wend) + cur
  local _, next_end = window(p, wend)
  local function reset_after(c)
    if c > 0 then return next_end - now end
    if prev > 0 then return wend - now end
    return 0
  end
  local d
  if limit == 0 or cost > limit then
    d = decision(false, limit, sat_sub(limit, estimate), reset_after(cur), nil, 0)
  elseif estimate + cost <= limit then
    d = decision(true, limit, limit - estimate - cost, reset_after(cur + cost), nil, 0)
  else
    local retry_at
    if cur + cost <= limit then
      retry_at = sc_earliest(prev, limit - cur - cost, start, wend)
    else
      retry_at = sc_earliest(cur, limit - cost, wend, next_end)
    end
    local retry = sat_sub(retry_at, now)
    if retry < 1 then retry = 1 end
    d = decision(false, limit, sat_sub(limit, estimate), reset_after(cur), retry, 0)
  end
  if d.allowed then cur = cur + cost end
  local keep = nil
  if prev > 0 or cur > 0 then keep = { start, prev, cur } end
  return d, keep
end

ALG[6] = {
  load = function(p) return load_string(p, sc_decode) end,
  step = sc_step,
  clamp = function(st, now, p)
    if st == nil or st[1] <= now then return nil end
    local _, wend = window(p, now)
    if st[1] > wend then return { wend, st[2], st[3] } end
    return nil
  end,
  save = function(p, old, new, ttl) save_string(p, sc_encode, old, new, ttl) end,
  -- Count g more units in the state's current window (a lease; see check.lua).
  grant = function(p, st, now, g)
    if st == nil then return { (window(p, now)), 0, g } end
    return { st[1], st[2], st[3] + g }
  end,
  -- Undo an admitted cost in the count of the window the check counted in.
  refund = function(p, now, cost)
    local v = rcall('GET', p.keys[1])
    if not v then return end
    local s = sc_decode(v)
    local start = window(p, now)
    -- Only in the window the check counted in (see fixed_window.lua's refund).
    if s[1] ~= start then return end
    s[3] = s[3] - cost
    if s[3] < 0 then s[3] = 0 end
    if s[2] == 0 and s[3] == 0 then
      rcall('DEL', p.keys[1])
    else
      rcall('SET', p.keys[1], sc_encode(s), 'KEEPTTL')
    end
  end,
}
