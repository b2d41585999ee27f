-- check.lua: the driver. One call checks every item of a request (or of one cluster slot's
-- share of it) atomically, with the semantics of MemoryStore::check (tollgate-core memory.rs):
--
--   * items are evaluated in order; a key repeated in the request sees the earlier item's
--     tentative state;
--   * the request is blocked when any non-shadow item is denied; then nothing is written and
--     every admitted item with a cost reports a cost-0 query against the stored state instead;
--   * otherwise the admitted items' states are written in order (a denied shadow item writes
--     nothing); a request of exactly one item writes its (normalised) state whatever the outcome,
--     like MemoryStore's single-item path;
--   * except envoy_fixed_window items (store.rs `consumes`): a denied one writes its count, an
--     admitted one writes when no item is denied or it counts denied requests;
--   * a state back to full is deleted; every write sets a TTL of reset_after rounded up to whole
--     milliseconds (at least 1) plus the configured grace;
--   * a state an algorithm clamps (the clock went back, see its `clamp`) is written clamped even
--     by a blocked request or a denied shadow item, which write nothing else (memory.rs
--     `keep_clamp`): otherwise every retry would find it as far ahead as before.
--
-- Mode 'r' (refund) undoes the given admitted items of an earlier call with the same request id
-- and time, then answers a cost-0 query for each: used when another cluster slot blocked.
--
-- ARGV[1]: the call and its items packed little-endian (struct.pack, see script.rs `arguments`):
--   header '<ddBBH': now (-1 = Redis TIME), grace ms, mode (0 check, 1 refund), single, count;
--   per item '<BBBBBddddddddd': algorithm, shadow, unit, count denied, envoy key layout, then
--   cost, limit, burst, T, multiplier, nominal period, index in the request, EXPIRE seconds,
--   lease (units wanted beyond the cost for an instance's lease; 0 = none); a tiered item
--   (algorithm 8) then has its tier table (tiers.lua).
--   Packed numbers cost Redis a copy each, where one string argument per field cost it an
--   argument object and a `tonumber` (a strtod) each.
-- ARGV[2]: the request id.
-- KEYS: one per item, two for a sliding log (the set and its sum).
-- Returns one string, '<d' x (2 + 7 per item): now, blocked, then per item: allowed, limit,
-- remaining, reset_after, retry_after (-1 = none), delay, count (envoy_fixed_window's count;
-- for a leasing item, the units granted to the lease; -1 = none).
--
-- Leases (fixed_window and sliding_window_counter only, tiered or not; the Rust side refuses
-- others): an admitted item that asks for `lease` units also takes up to that many more of the
-- window's remaining count (a tiered item's: its tier's), at most a LEASE_SHARE-th of it (so
-- the last units of a window go out one by one), counted now as if admitted. The instance
-- spends them locally in this window and gives back what it did not spend with a refund at
-- this call's time. Nothing is granted to a blocked request.
--
-- The whole driver is the function `check` (a Redis Function, loaded once, or the body of an
-- EVAL script; see script.rs).

-- A lease takes at most this share of what the window has left (see above).
local LEASE_SHARE = 8

-- Grant item p's lease on top of its admitted cost: d is its decision (remaining after the
-- cost), st the state after the cost; returns the state with the granted units counted.
local function grant(p, d, st, now)
  local g = idiv(d.remaining, LEASE_SHARE)
  if p.lease < g then g = p.lease end
  d.count = g
  if g <= 0 then
    d.count = 0
    return st
  end
  d.remaining = d.remaining - g
  return ALG[p.alg].grant(p, st, now, g)
end

local function check(KEYS, ARGV)
  bind()
  local packed, reqid = ARGV[1], ARGV[2]
  local now, grace, modecode, singlecode, n, pos = sunpack('<ddBBH', packed)
  if now < 0 then
    local t = rcall('TIME')
    now = tonum(t[1]) * 1000000 + tonum(t[2])
  end
  local mode, single = 'c', singlecode == 1
  if modecode == 1 then mode = 'r' end

  local items = {}
  local k = 1
  for i = 1, n do
    local alg, shadow, unit, cd, envoy, cost, limit, burst, t, mult, len, idx, expire, lease
    alg, shadow, unit, cd, envoy, cost, limit, burst, t, mult, len, idx, expire, lease, pos =
      sunpack('<BBBBBddddddddd', packed, pos)
    local p = {
      alg = alg, cost = cost, shadow = shadow == 1, limit = limit, burst = burst, T = t,
      unit = unit, mult = mult, len = len, idx = idx, reqid = reqid, cd = cd == 1,
      envoy = envoy == 1, expire = expire, now = now, keys = { KEYS[k] }, lease = lease,
    }
    k = k + 1
    if alg == 5 then
      p.keys[2] = KEYS[k]
      k = k + 1
    end
    if alg == 8 then pos = tiers_unpack(p, packed, pos) end
    items[i] = p
  end

  local out = { now, 0 }
  local function reply()
    return spack('<' .. string.rep('d', #out), unpack(out))
  end
  local function emit(i, d)
    local b = 2 + (i - 1) * 7
    local allowed = 0
    if d.allowed then allowed = 1 end
    local retry = -1
    if d.retry ~= nil then retry = d.retry end
    out[b + 1], out[b + 2], out[b + 3] = allowed, d.limit, d.remaining
    out[b + 4], out[b + 5], out[b + 6] = d.reset, retry, d.delay
    out[b + 7] = d.count or -1
  end

  if mode == 'r' then
    for _, p in ipairs(items) do ALG[p.alg].refund(p, now, p.cost) end
    for i, p in ipairs(items) do
      local a = ALG[p.alg]
      emit(i, (a.step(a.load(p), now, 0, p)))
    end
    return reply()
  end

  -- One item (the common request): its state is loaded, stepped and written whatever the
  -- outcome (see `single` above), so none of the bookkeeping below is needed.
  if single and n == 1 then
    local p = items[1]
    local a = ALG[p.alg]
    local old = a.load(p)
    local d, nx = a.step(old, now, p.cost, p)
    if not d.allowed and not p.shadow then out[2] = 1 end
    if p.lease > 0 and d.allowed then nx = grant(p, d, nx, now) end
    a.save(p, old, nx, ttl_ms(d.reset, grace))
    emit(1, d)
    return reply()
  end

  -- States by key name: `stored` = what Redis holds now, `pending` = tentative in this request.
  local stored, pending, seen = {}, {}, {}
  local decisions, nexts = {}, {}
  for i, p in ipairs(items) do
    local a, name = ALG[p.alg], p.keys[1]
    if not seen[name] then
      seen[name] = true
      stored[name] = a.load(p)
      pending[name] = stored[name]
    end
    local d, nx = a.step(pending[name], now, p.cost, p)
    pending[name] = nx
    decisions[i], nexts[i] = d, nx
  end

  -- Write the clamped stored state of item p, when its algorithm clamps it.
  local function keep_clamp(p)
    local a, name = ALG[p.alg], p.keys[1]
    if a.clamp == nil then return end
    local c = a.clamp(stored[name], now, p)
    if c == nil then return end
    local d, nx = a.step(c, now, 0, p)
    a.save(p, stored[name], nx, ttl_ms(d.reset, grace))
    stored[name] = nx
  end

  local blocked, any_denied = false, false
  for i, p in ipairs(items) do
    if not decisions[i].allowed then
      any_denied = true
      if not p.shadow then blocked = true end
    end
  end
  if blocked then out[2] = 1 end

  -- Whether item i keeps its new state (store.rs `consumes`).
  local commit = {}
  for i, p in ipairs(items) do
    local d = decisions[i]
    if p.alg == 7 then
      commit[i] = (not d.allowed) or p.cd or not any_denied
    else
      commit[i] = d.allowed and not blocked
    end
  end

  -- An admitted item that does not consume reports a cost-0 query against the stored state.
  for i, p in ipairs(items) do
    if decisions[i].allowed and p.cost > 0 and not commit[i] then
      local a = ALG[p.alg]
      decisions[i] = (a.step(stored[p.keys[1]], now, 0, p))
    end
  end

  for i, p in ipairs(items) do
    local name = p.keys[1]
    if p.lease > 0 and commit[i] and decisions[i].allowed then
      nexts[i] = grant(p, decisions[i], nexts[i], now)
    end
    if single or commit[i] then
      ALG[p.alg].save(p, stored[name], nexts[i], ttl_ms(decisions[i].reset, grace))
      stored[name] = nexts[i]
    else
      keep_clamp(p)
    end
  end

  for i = 1, n do emit(i, decisions[i]) end
  return reply()
end
