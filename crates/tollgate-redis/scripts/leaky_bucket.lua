-- leaky_bucket.lua: leaky bucket as a queue (algorithm/leaky_bucket.rs), state = `free_at`
-- (when the queue is empty) as a string. Admission is exactly GCRA's (gcra.lua, loaded before
-- this file); the queue adds `delay`: an admitted request waits behind the backlog queued.

local function leaky_step(free_at, now, cost, p)
  local d, keep = gcra_step(free_at, now, cost, p)
  if d.allowed and cost > 0 and free_at ~= nil and free_at > now then
    d.delay = (tat_clamp(free_at, now, p) or free_at) - now
  end
  return d, keep
end

ALG[2] = {
  load = function(p) return load_string(p, tonum) end,
  step = leaky_step,
  clamp = tat_clamp,
  save = function(p, old, new, ttl) save_string(p, fmt, old, new, ttl) end,
  -- The queue position is a timestamp like GCRA's tat: the same refund applies.
  refund = function(p, now, cost) tat_refund(p, now, cost) end,
}
