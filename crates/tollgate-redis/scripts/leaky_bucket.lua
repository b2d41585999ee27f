-- leaky_bucket.lua: leaky bucket as a queue (algorithm/leaky_bucket.rs), state = `free_at`
-- (when the queue is empty) as a string. Same arithmetic bounds as gcra.lua; the difference is
-- `delay`: an admitted request waits behind the backlog already queued.

local function leaky_step(free_at, now, cost, p)
  local t = p.T
  if t == 0 then return deny_forever(0), free_at end
  local burst = p.burst
  local cap = t * burst
  local base = now
  if free_at ~= nil and free_at > now then base = free_at end
  local backlog = base - now
  local remaining_before = idiv(sat_sub(cap, backlog), t)
  if cost > burst then
    return decision(false, p.limit, remaining_before, backlog, nil, 0), free_at
  end
  local new_free = base + cost * t
  local new_backlog = new_free - now
  if new_backlog <= cap then
    local keep = nil
    if new_free > now then keep = new_free end
    local delay = backlog
    if cost == 0 then delay = 0 end
    return decision(true, p.limit, idiv(cap - new_backlog, t), new_backlog, nil, delay), keep
  end
  return decision(false, p.limit, remaining_before, backlog, new_backlog - cap, 0), free_at
end

ALG[2] = {
  load = function(p) return load_string(p, tonumber) end,
  step = leaky_step,
  save = function(p, old, new, ttl) save_string(p, fmt, old, new, ttl) end,
  -- The queue position is a timestamp like GCRA's tat: the same refund applies.
  refund = function(p, now, cost) tat_refund(p, now, cost) end,
}
