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
-- ARGV: now ('' = Redis TIME), request id, mode ('c' | 'r'), single ('1' | '0'), grace ms,
--       item count, then 13 fields per item: algorithm, cost, shadow, limit, burst, T,
--       unit, multiplier, nominal period, index in the request, count denied, envoy key
--       layout, EXPIRE seconds (envoy layout).
-- KEYS: one per item, two for a sliding log (the set and its sum).
-- Returns: { now, blocked, then per item: allowed, limit, remaining, reset_after,
--            retry_after (-1 = none), delay, count (envoy_fixed_window's count, -1 = none) }.

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local reqid, mode, single = ARGV[2], ARGV[3], ARGV[4] == '1'
local grace = tonumber(ARGV[5])
local n = tonumber(ARGV[6])

local items = {}
local k = 1
for i = 1, n do
  local b = 6 + (i - 1) * 13
  local p = {
    alg = tonumber(ARGV[b + 1]), cost = tonumber(ARGV[b + 2]), shadow = ARGV[b + 3] == '1',
    limit = tonumber(ARGV[b + 4]), burst = tonumber(ARGV[b + 5]), T = tonumber(ARGV[b + 6]),
    unit = tonumber(ARGV[b + 7]), mult = tonumber(ARGV[b + 8]), len = tonumber(ARGV[b + 9]),
    idx = tonumber(ARGV[b + 10]), reqid = reqid,
    cd = ARGV[b + 11] == '1', envoy = ARGV[b + 12] == '1', expire = tonumber(ARGV[b + 13]),
    now = now,
  }
  p.keys = { KEYS[k] }
  k = k + 1
  if p.alg == 5 then
    p.keys[2] = KEYS[k]
    k = k + 1
  end
  items[i] = p
end

local function ttl_ms(reset)
  local ms = idiv(reset + 999, 1000)
  if ms < 1 then ms = 1 end
  return ms + grace
end

local out = { now, 0 }
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
  return out
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
  a.save(p, stored[name], nx, ttl_ms(d.reset))
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
  if single or commit[i] then
    ALG[p.alg].save(p, stored[name], nexts[i], ttl_ms(decisions[i].reset))
    stored[name] = nexts[i]
  else
    keep_clamp(p)
  end
end

for i = 1, n do emit(i, decisions[i]) end
return out
