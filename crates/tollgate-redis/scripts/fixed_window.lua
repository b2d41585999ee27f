-- fixed_window.lua: one counter per aligned window (algorithm/fixed_window.rs), state
-- "start count". Window bounds come from window() in common.lua (epoch- and calendar-aligned,
-- a port of window.rs), so a script evaluated with Redis TIME needs nothing from the caller.

-- Take an admitted `cost` off the state in `p.keys[1]` if it is still the window that began at
-- `start` (see `refund` below); shared with envoy_fixed_window.lua's non-Envoy keys.
local function fw_refund_in(p, start, cost)
  local v = rcall('GET', p.keys[1])
  if not v then return end
  local s = pair_decode(v)
  if s[1] ~= start then return end
  s[2] = s[2] - cost
  if s[2] <= 0 then
    rcall('DEL', p.keys[1])
  else
    rcall('SET', p.keys[1], pair_encode(s), 'KEEPTTL')
  end
end

local function fw_step(st, now, cost, p)
  local start, wend = window(p, now)
  local count = 0
  if st ~= nil then
    if st[1] == start then
      count = st[2]
    elseif st[1] > start then
      -- The clock went back: count in the state's window, clamped to the next one, as at its
      -- start (fixed_window.rs).
      if st[1] > wend then st = { wend, st[2] } end
      now = st[1]
      start, wend = window(p, now)
      count = st[2]
    end
  end
  local limit = p.limit
  local reset = 0
  if count > 0 then reset = sat_sub(wend, now) end
  if limit == 0 or cost > limit then
    local rem = 0
    if count < limit then rem = limit - count end
    return decision(false, limit, rem, reset, nil, 0), st
  end
  if count + cost <= limit then
    count = count + cost
    local r = 0
    local keep = nil
    if count > 0 then
      r = sat_sub(wend, now)
      keep = { start, count }
    end
    return decision(true, limit, limit - count, r, nil, 0), keep
  end
  return decision(false, limit, limit - count, reset, sat_sub(wend, now), 0), st
end

ALG[4] = {
  load = function(p) return load_string(p, pair_decode) end,
  step = fw_step,
  clamp = function(st, now, p)
    if st == nil or st[1] <= now then return nil end
    local _, wend = window(p, now)
    if st[1] > wend then return { wend, st[2] } end
    return nil
  end,
  save = function(p, old, new, ttl) save_string(p, pair_encode, old, new, ttl) end,
  -- Count g more units in the state's window (a lease; see check.lua).
  grant = function(p, st, now, g)
    if st == nil then return { (window(p, now)), g } end
    return { st[1], st[2] + g }
  end,
  -- Undo an admitted cost, only in the window it went into (`now` is the check's time). A
  -- state in another window was rolled on by other requests since: this cost is not in it, and
  -- taking it off would let that window admit more than its limit. (A check that ran on a clock
  -- gone backwards counted in the later window and is not refunded: the safe side.)
  refund = function(p, now, cost) fw_refund_in(p, window(p, now), cost) end,
}
