-- fixed_window.lua: one counter per aligned window (algorithm/fixed_window.rs), state start,
-- count and t packed in binary (see `bin_load` in common.lua). Window bounds come from window() in common.lua (epoch- and calendar-aligned,
-- a port of window.rs), so a script evaluated with Redis TIME needs nothing from the caller.

-- Take an admitted `cost` off the "start count" state in `p.keys[1]` if it is still the window
-- that began at `start` (see `refund` below): envoy_fixed_window.lua's non-Envoy keys.
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

-- The step on plain numbers: the stored window start `s` (nil: no state) and its count.
-- Returns allowed, remaining, reset_after, retry_after (-1 = none), and the state to keep as
-- start and count (start nil: none). Shared by `fw_step` (check.lua) and fast.lua.
local function fw_core(p, s, cnt, now, cost)
  -- The window written out for seconds to days (common.lua `window`): a call costs Redis more.
  local len = p.len
  local start, wend
  if p.unit <= 3 and now + len <= TWO53 then
    start = now - now % len
    wend = start + len
  else
    start, wend = window(p, now)
  end
  local count = 0
  if s ~= nil then
    if s == start then
      count = cnt
    elseif s > start then
      -- The clock went back: count in the state's window, clamped to the next one, as at its
      -- start (fixed_window.rs).
      if s > wend then s = wend end
      now = s
      start, wend = window(p, now)
      count = cnt
    end
  end
  local limit = p.limit
  local reset = 0
  -- (now is in [start, wend), so wend - now > 0.)
  if count > 0 then reset = wend - now end
  if limit == 0 or cost > limit then
    local rem = 0
    if count < limit then rem = limit - count end
    return false, rem, reset, -1, s, cnt
  end
  if count + cost <= limit then
    count = count + cost
    if count > 0 then return true, limit - count, wend - now, -1, start, count end
    return true, limit, 0, -1, nil, 0
  end
  return false, limit - count, reset, wend - now, s, cnt
end

local function fw_step(st, now, cost, p)
  local s, c = nil, 0
  if st ~= nil then s, c = st[1], st[2] end
  local allowed, rem, reset, retry, ks, kc = fw_core(p, s, c, now, cost)
  if retry < 0 then retry = nil end
  local keep = nil
  if ks ~= nil then
    if st ~= nil and ks == st[1] and kc == st[2] then keep = st else keep = { ks, kc } end
  end
  return decision(allowed, p.limit, rem, reset, retry, 0), keep
end

-- The stored state: start (nil: none), count and t, packed '<ddd' (see `bin_load`).
local function fw_get(p)
  local v = p.pre
  if not v or #v ~= 24 then
    v = bin_load(p, 24)
    if v == nil then return nil, 0, nil end
  end
  return sunpack('<ddd', v)
end

-- Write the state start `ns` (nil: none), count `nc` over the stored one (`os`, `oc`, `ot`, as
-- `fw_get` returns them): nothing when equal, the count alone (SETRANGE, the TTL kept) in the
-- same window, else the whole state with its TTL. Returns the new state's t.
local function fw_put(p, os, oc, ot, ns, nc, ttl)
  if ns == nil then
    if os ~= nil then rcall('DEL', p.keys[1]) end
    return nil
  end
  if os == ns then
    if oc == nc then return ot end
    if ot ~= nil and ot <= p.now then
      rcall('SETRANGE', p.keys[1], '8', spack('<d', nc))
      return ot
    end
  end
  bin_set(p, spack('<ddd', ns, nc, p.now), ttl)
  return p.now
end

-- The same as tables {start, count, t}, for check.lua.
local function fw_load(p)
  local s, c, t = fw_get(p)
  if s == nil then return nil end
  return { s, c, t }
end

local function fw_save(p, old, new, ttl)
  local os, oc, ot = nil, 0, nil
  if old ~= nil then os, oc, ot = old[1], old[2], old[3] end
  if new == nil then
    fw_put(p, os, oc, ot, nil, 0, ttl)
    return
  end
  new[3] = fw_put(p, os, oc, ot, new[1], new[2], ttl)
end

ALG[4] = {
  load = fw_load,
  step = fw_step,
  clamp = function(st, now, p)
    if st == nil or st[1] <= now then return nil end
    local _, wend = window(p, now)
    if st[1] > wend then return { wend, st[2] } end
    return nil
  end,
  save = fw_save,
  -- Count g more units in the state's window (a lease; see check.lua).
  grant = function(p, st, now, g)
    if st == nil then return { (window(p, now)), g } end
    return { st[1], st[2] + g }
  end,
  -- Undo an admitted cost, only in the window it went into (`now` is the check's time). A
  -- state in another window was rolled on by other requests since: this cost is not in it, and
  -- taking it off would let that window admit more than its limit. (A check that ran on a clock
  -- gone backwards counted in the later window and is not refunded: the safe side.)
  refund = function(p, now, cost)
    local s, c = fw_get(p)
    if s == nil or s ~= window(p, now) then return end
    c = c - cost
    if c <= 0 then
      rcall('DEL', p.keys[1])
    else
      rcall('SETRANGE', p.keys[1], '8', spack('<d', c))
    end
  end,
}
