-- gcra.lua: GCRA (algorithm/gcra.rs), state = the theoretical arrival time `tat` as a string.
-- Products: cost * T <= burst * T = cap, and the Rust side rejects quotas with cap >= 2^51,
-- so every value here stays below 2^53 and plain double arithmetic is exact.

local function gcra_step(tat, now, cost, p)
  local t = p.T
  if t == 0 then return deny_forever(0), tat end
  local burst = p.burst
  local cap = t * burst
  -- Clock stepped back: a tat beyond now + cap is clamped to it (gcra.rs `clamp`).
  if tat ~= nil and tat > now + cap then tat = now + cap end
  local base = now
  if tat ~= nil and tat > now then base = tat end
  local backlog = base - now
  local remaining_before = idiv(sat_sub(cap, backlog), t)
  if cost > burst then
    return decision(false, p.limit, remaining_before, backlog, nil, 0), tat
  end
  local new_tat = base + cost * t
  local new_backlog = new_tat - now
  if new_backlog <= cap then
    local keep = nil
    if new_tat > now then keep = new_tat end
    return decision(true, p.limit, idiv(cap - new_backlog, t), new_backlog, nil, 0), keep
  end
  return decision(false, p.limit, remaining_before, backlog, new_backlog - cap, 0), tat
end

-- Undo an admitted cost: tat -= cost * T. A tat at or before `now` means "full": delete.
local function tat_refund(p, now, cost)
  local v = rcall('GET', p.keys[1])
  if not v then return end
  local tat = tonum(v) - cost * p.T
  if tat <= now then
    rcall('DEL', p.keys[1])
  else
    rcall('SET', p.keys[1], fmt(tat), 'KEEPTTL')
  end
end

-- The clamped tat when it differs (see gcra_step), else nil.
local function tat_clamp(tat, now, p)
  if tat ~= nil and p.T > 0 and tat > now + p.T * p.burst then return now + p.T * p.burst end
  return nil
end

ALG[1] = {
  load = function(p) return load_string(p, tonum) end,
  step = gcra_step,
  clamp = tat_clamp,
  save = function(p, old, new, ttl) save_string(p, fmt, old, new, ttl) end,
  refund = function(p, now, cost) tat_refund(p, now, cost) end,
}
