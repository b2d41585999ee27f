-- envoy_fixed_window.lua: envoyproxy/ratelimit's fixed window (algorithm/envoy_fixed_window.rs):
-- epoch-aligned windows of envoy's fixed lengths, the cost counted before the comparison (a
-- denied step keeps its count), reset at the end of the window whatever the count, from `now`
-- in whole seconds as envoy computes it.
--
-- Two key layouts. tollgate's: the counter's key holds "start count" like fixed_window.lua.
-- envoy's (p.envoy): KEYS[i] is envoyproxy/ratelimit's cache key without its window start
-- (`<prefix><domain>_<key>_<value>_..._`); the counter is the integer at that key followed by
-- the window start in seconds, written with INCRBY then EXPIRE <window + jitter> as envoy
-- writes it, so envoy and tollgate instances on one Redis share it. (That key is not declared
-- in KEYS: standalone Redis only; the store refuses the layout on a cluster.)

local ENVOY_DIVIDER = { [0] = 1, 60, 3600, 86400, 604800, 2592000, 31536000 }

local function ef_window(p, now)
  local len = ENVOY_DIVIDER[p.unit] * p.mult * 1000000
  local start = now - now % len
  return start, start + len
end

local function ef_key(p, start)
  return p.keys[1] .. fmt(idiv(start, 1000000))
end

local function ef_step(st, now, cost, p)
  local start, wend = ef_window(p, now)
  local before = 0
  if st ~= nil and st[1] == start then before = st[2] end
  local after = before + cost
  local limit = p.limit
  local allowed = after <= limit
  local rem, retry = 0, nil
  if allowed then
    rem = limit - after
  elseif cost <= limit then
    retry = wend - now
  end
  local keep = nil
  if after > 0 then keep = { start, after } end
  local d = decision(allowed, limit, rem, wend - (now - now % 1000000), retry, 0)
  -- The count after this step (envoy's INCRBY reply): its statistics split the hits with it.
  d.count = after
  return d, keep
end

ALG[7] = {
  load = function(p)
    if not p.envoy then return load_string(p, pair_decode) end
    local start = ef_window(p, p.now)
    local v = rcall('GET', ef_key(p, start))
    if not v then return nil end
    return { start, tonum(v) or 0 }
  end,
  step = ef_step,
  save = function(p, old, new, ttl)
    if not p.envoy then return save_string(p, pair_encode, old, new, ttl) end
    if new == nil then return end
    local o = 0
    if old ~= nil and old[1] == new[1] then o = old[2] end
    if new[2] == o then return end
    local key = ef_key(p, new[1])
    rcall('INCRBY', key, new[2] - o)
    rcall('EXPIRE', key, p.expire)
  end,
  -- Undo an admitted cost in the window it went into (see fixed_window.lua).
  refund = function(p, now, cost)
    local start = ef_window(p, now)
    if p.envoy then
      local key = ef_key(p, start)
      if rcall('EXISTS', key) == 1 then rcall('DECRBY', key, cost) end
      return
    end
    fw_refund_in(p, start, cost)
  end,
}
