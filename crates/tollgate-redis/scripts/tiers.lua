-- tiers.lua: priority tiers sharing one limit (algorithm/tiers.rs), over a fixed window or a
-- sliding window counter. State "start prev1 cur1 prev2 cur2 ...": the window start, then each
-- tier's previous and current window counts, in level order (previous counts are 0 under a
-- fixed window). The parent's count is the algorithm's count of the tiers' sums, so parent and
-- tier are decided in this one step on one key. See tiers.rs for the rules and the invariant.
--
-- An item's tier table follows its fixed fields in the packed arguments (script.rs): '<BBB'
-- (levels, the request's tier from 0, sliding), then '<ddd' per level (guaranteed, ceiling,
-- reserve).

-- Beyond any instant a step computes (they stay below 2^53); a literal: library globals such as
-- `math` are not visible while a Redis Function loads (common.lua, `bind`).
local TR_NEVER = TWO53 * 2

-- Reads item p's tier table at pos of the packed arguments; returns the position after it.
local function tiers_unpack(p, packed, pos)
  local n, tier, sliding
  n, tier, sliding, pos = sunpack('<BBB', packed, pos)
  p.tier, p.sliding, p.levels = tier, sliding == 1, {}
  for i = 1, n do
    local g, c, r
    g, c, r, pos = sunpack('<ddd', packed, pos)
    p.levels[i] = { g, c, r }
  end
  return pos
end

local function tr_decode(v)
  local nums = {}
  for x in string.gmatch(v, '%d+') do nums[#nums + 1] = tonum(x) end
  local st = { start = nums[1] or 0, prev = {}, cur = {} }
  for i = 1, idiv(#nums - 1, 2) do
    st.prev[i], st.cur[i] = nums[2 * i], nums[2 * i + 1]
  end
  return st
end

local function tr_encode(st)
  local parts = { fmt(st.start) }
  for i = 1, #st.cur do
    parts[#parts + 1] = fmt(st.prev[i])
    parts[#parts + 1] = fmt(st.cur[i])
  end
  return table.concat(parts, ' ')
end

-- The state as seen from now, copied (a loaded or pending state is never changed in place):
-- returns now (moved to the state's window when that is ahead), window start, end, state.
local function tr_roll(p, st, now)
  local n = #p.levels
  local ws, we = window(p, now)
  local function empty(start)
    local s = { start = start, prev = {}, cur = {} }
    for i = 1, n do s.prev[i], s.cur[i] = 0, 0 end
    return s
  end
  if st == nil or #st.cur ~= n or #st.prev ~= n then return now, ws, we, empty(ws) end
  local s = { start = st.start, prev = {}, cur = {} }
  for i = 1, n do
    if p.sliding then s.prev[i] = st.prev[i] else s.prev[i] = 0 end
    s.cur[i] = st.cur[i]
  end
  if s.start == ws then return now, ws, we, s end
  if s.start > ws then
    local at = s.start
    if at > we then at = we end
    local ws2, we2 = window(p, at)
    s.start = ws2
    return at, ws2, we2, s
  end
  if p.sliding and s.start == previous_start(p, ws) then
    for i = 1, n do s.prev[i], s.cur[i] = s.cur[i], 0 end
    s.start = ws
    return now, ws, we, s
  end
  return now, ws, we, empty(ws)
end

-- What tier t (1-based) could take now: the least of what its ceiling, the parent and the
-- better of its guarantee and borrowing leave it.
local function tr_room(p, t, limit, c, parent)
  local lv = p.levels[t]
  local others = 0
  for u = 1, #p.levels do
    if u ~= t then others = others + sat_sub(p.levels[u][1], c[u]) end
  end
  local ceil = lv[2]
  if ceil > limit then ceil = limit end
  local room = sat_sub(ceil, c[t])
  local free = sat_sub(limit, parent)
  if free < room then room = free end
  local best = sat_sub(lv[1], c[t])
  local borrow = sat_sub(sat_sub(free, others), lv[3])
  if borrow > best then best = borrow end
  if best < room then room = best end
  return room
end

local function tr_step(st, now0, cost, p)
  local n = #p.levels
  if n == 0 then return decision(false, 0, 0, 0, nil, 0), st end
  local t = p.tier
  if t > n - 1 then t = n - 1 end
  t = t + 1
  local sliding = p.sliding
  local now, start, wend, s = tr_roll(p, st, now0)
  local limit, lv = p.limit, p.levels[t]
  local ceil = lv[2]
  if ceil > limit then ceil = limit end
  local c, ps, cs = {}, 0, 0
  for i = 1, n do
    local w = 0
    if sliding then w = sc_weighted(s.prev[i], now, start, wend) end
    c[i] = w + s.cur[i]
    ps, cs = ps + s.prev[i], cs + s.cur[i]
  end
  local parent = cs
  if sliding then parent = parent + sc_weighted(ps, now, start, wend) end
  local room = tr_room(p, t, limit, c, parent)
  local allowed = cost <= room
  if allowed then
    s.cur[t] = s.cur[t] + cost
    cs = cs + cost
  end
  local _, next_end = window(p, wend)
  local reset = 0
  if cs > 0 then
    if sliding then reset = next_end - now else reset = wend - now end
  elseif ps > 0 then
    reset = wend - now
  end
  local remaining = room
  if allowed then remaining = room - cost end
  local retry = nil
  if not allowed then
    local others_g = 0
    for u = 1, n do
      if u ~= t then others_g = others_g + p.levels[u][1] end
    end
    local reach = sat_sub(sat_sub(limit, others_g), lv[3])
    local g_or_ceil = lv[1]
    if ceil < g_or_ceil then g_or_ceil = ceil end
    if g_or_ceil > reach then reach = g_or_ceil end
    if cost <= ceil and cost <= reach then
      -- When a counter of prev/cur under cap admits the cost (0: now; TR_NEVER: never, as
      -- far as this counter goes).
      local function wait(cap, prev, cur)
        if sliding then
          local q = { unit = p.unit, mult = p.mult, len = p.len, limit = cap }
          local d = sc_step({ start, prev, cur }, now, cost, q)
          if d.allowed then return 0 end
          if d.retry == nil then return TR_NEVER end
          return d.retry
        elseif cur + cost <= cap then
          return 0
        elseif cost <= cap then
          return wend - now
        end
        return TR_NEVER
      end
      local others = 0
      for u = 1, n do
        if u ~= t then others = others + sat_sub(p.levels[u][1], c[u]) end
      end
      local borrow_cap = sat_sub(sat_sub(limit, others), lv[3])
      local binding = math.max(wait(ceil, s.prev[t], s.cur[t]), wait(limit, ps, cs))
      local either = math.min(wait(lv[1], s.prev[t], s.cur[t]), wait(borrow_cap, ps, cs))
      local at = math.max(binding, either)
      local bound = wend - now
      if sliding then bound = next_end - now end
      if at > bound then at = bound end
      if at < 1 then at = 1 end
      retry = at
    end
  end
  local keep = nil
  for i = 1, n do
    if s.prev[i] > 0 or s.cur[i] > 0 then keep = s end
  end
  return decision(allowed, ceil, remaining, reset, retry, 0), keep
end

ALG[8] = {
  load = function(p) return load_string(p, tr_decode) end,
  step = tr_step,
  clamp = function(st, now, p)
    if st == nil or st.start <= now then return nil end
    local _, wend = window(p, now)
    if st.start > wend then return { start = wend, prev = st.prev, cur = st.cur } end
    return nil
  end,
  save = function(p, old, new, ttl) save_string(p, tr_encode, old, new, ttl) end,
  -- Undo an admitted cost of the item's tier, only in the window it went into (see
  -- fixed_window.lua's refund).
  refund = function(p, now, cost)
    local v = rcall('GET', p.keys[1])
    if not v then return end
    local s = tr_decode(v)
    local n = #p.levels
    if s.start ~= window(p, now) or #s.cur ~= n or n == 0 then return end
    local t = p.tier
    if t > n - 1 then t = n - 1 end
    t = t + 1
    s.cur[t] = sat_sub(s.cur[t], cost)
    local any = false
    for i = 1, n do
      if s.prev[i] > 0 or s.cur[i] > 0 then any = true end
    end
    if any then
      rcall('SET', p.keys[1], tr_encode(s), 'KEEPTTL')
    else
      rcall('DEL', p.keys[1])
    end
  end,
}
