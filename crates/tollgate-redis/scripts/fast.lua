-- fast.lua: the check of one-item requests on the counting algorithms (fixed_window,
-- sliding_window_counter), as a Redis Function of its own: what check.lua does for a request of
-- one such item and no lease, without its generic driver (no per-item tables, no multi-item
-- bookkeeping), because Redis runs this for nearly every request and every Lua operation costs
-- it CPU. One call answers a batch of such requests, each on its own (the store coalesces the
-- requests that arrive while a call is in flight, see coalesce.rs), so the call's fixed cost
-- (the FCALL, TIME, reading the keys, the reply) is paid once per batch, and a key with several
-- requests in the batch is read and written once. The algorithm itself is the one check.lua
-- uses (`fw_core`, `sc_roll` and `sc_decide` on numbers; `fw_get`/`fw_put`, `sc_get`/`sc_put`
-- for the state): one implementation. Only in the library loaded with FUNCTION LOAD (script.rs
-- `library`), not in the EVAL form.
--
-- KEYS: the batch's counter keys, each once; or, on a Redis Cluster, only the first (the call
--   is routed by it), and the keys follow the packed requests in ARGV. A cluster batch holds the
--   keys of several slots that one node serves (the function's flag `allow-cross-slot-keys`):
--   they are read one GET each (MGET spans one slot), and a key the node does not serve (its
--   slot moved, or is moving) fails only its requests, which read and wrote nothing: the caller
--   sends those again on their own.
-- ARGV[1]: '<dd' now (-1 = Redis TIME), grace ms; then per request '<ddddBBH' (struct.pack, see
--   script.rs `fast_item`, `fast_command`): cost, limit, nominal period, multiplier, unit,
--   algorithm (4 = fixed_window, 6 = sliding_window_counter) plus 16 when its key has further
--   requests in the batch and 32 on the last request of a key that has several, and its key's
--   place in KEYS. A key's requests are decided in order, each seeing the ones before.
-- Returns '<d' now, then '<dddd' per request: allowed (1/0; -1 = this request failed),
-- remaining, reset_after, retry_after (-1 = none). Being the only item of its request, a request
-- is blocked when it is denied and not shadow: the caller knows that. When some requests failed
-- (a key holding a value tollgate did not write, a write refused), the reply is an array: the
-- packed string, then each failed request's error in order. A failure of one request's key never
-- fails the others.

-- The item, reused by every request: a table per request would cost more than the fields.
local FP = { keys = {} }

-- A counter's state as numbers: start (nil: none), x, y and t (see `bin_load`); a fixed window's
-- x is its count, a sliding counter's x and y its previous and current window's counts.
local function fast_get(p, alg)
  if alg == 4 then
    local s, c, t = fw_get(p)
    return s, c, 0, t
  end
  return sc_get(p)
end

-- One request of `cost` at `now` on the state (s, x, y), as `sc_core` returns it, for either
-- algorithm.
local function fast_decide(p, alg, s, x, y, now, cost)
  if alg == 4 then
    local allowed, rem, reset, retry, ks, kc = fw_core(p, s, x, now, cost)
    if allowed then return 1, rem, reset, retry, ks, kc, 0 end
    return 0, rem, reset, retry, ks, kc, 0
  end
  return sc_core(p, s, x, y, now, cost)
end

-- Write the state (ns, nx, ny) over the stored one (os, ox, oy, ot), its TTL from `reset`.
local function fast_put(p, alg, os, ox, oy, ot, ns, nx, ny, reset, grace)
  if alg == 4 then
    fw_put(p, os, ox, ot, ns, nx, ttl_ms(reset, grace))
  elseif ns == nil then
    sc_put(p, os, ox, oy, ot, nil, 0, 0, 0)
  else
    sc_put(p, os, ox, oy, ot, ns, nx, ny, ttl_ms(reset, grace))
  end
end

-- One request alone on its key in the batch: read, decide, write (per algorithm, without the
-- generic layers above: most requests take this path).
local function fw_one(p, now, cost, grace)
  local s, c, t = fw_get(p)
  local allowed, rem, reset, retry, ks, kc = fw_core(p, s, c, now, cost)
  fw_put(p, s, c, t, ks, kc, ttl_ms(reset, grace))
  if allowed then return 1, rem, reset, retry end
  return 0, rem, reset, retry
end

local function sc_one(p, now, cost, grace)
  local s, pr, c, t = sc_get(p)
  local a, rem, reset, retry, ns, np, nc = sc_core(p, s, pr, c, now, cost)
  sc_put(p, s, pr, c, t, ns, np, nc, ttl_ms(reset, grace))
  return a, rem, reset, retry
end

local FAST_ONE = { [4] = fw_one, [6] = sc_one }

-- The reply's format per batch size, built once.
local FAST_FMT = {}

-- The reply's numbers, one table reused by every call (`unpack` takes the call's share): a new
-- table per call, grown as it fills, costs Redis more than the checks' arithmetic.
local FAST_OUT = {}

local function fast_many(KEYS, ARGV)
  bind()
  local a = ARGV[1]
  local now, grace, pos = sunpack('<dd', a)
  if now < 0 then
    -- (Lua converts the two decimal strings itself, exactly: both are integers below 2^53.)
    local t = rcall('TIME')
    now = t[1] * 1000000 + t[2]
  end
  local n = (#a - 16) / 36
  local out = FAST_OUT
  out[1] = now
  local p = FP
  p.now = now
  -- Every key read at once (one command, not one per request); on a cluster one GET each.
  local keys, values, missing = KEYS, nil, nil
  if #ARGV > 1 then
    keys, values = { unpack(ARGV, 2) }, {}
    for k = 1, #keys do
      local ok, v = pcall(rcall, 'GET', keys[k])
      if ok then
        values[k] = v
      else
        if type(v) == 'table' then v = v.err end
        v = tostring(v)
        -- Another type's value reads as none, as MGET answers (see `bin_set`).
        if string.sub(v, 1, 9) == 'WRONGTYPE' then
          values[k] = false
        else
          missing = missing or {}
          missing[k] = v
          values[k] = false
        end
      end
    end
  else
    values = rcall('MGET', unpack(KEYS))
  end
  -- A key with several requests in the batch (a hot key; the caller flags them) is read once,
  -- its requests decided in turn on the state the one before left, and written once after its
  -- last: the same decisions and the same stored state as one request at a time.
  local shared = nil
  local failed = nil
  local function fail(i, e)
    -- redis.call raises a table {err = ...}; error() a string.
    if type(e) == 'table' then e = e.err end
    failed = failed or {}
    failed[i] = tostring(e)
    local j = 4 * i - 2
    out[j], out[j + 1], out[j + 2], out[j + 3] = -1, 0, 0, -1
  end
  -- The requests are decided in one protected run, not one `pcall` each (a call each would
  -- cost Redis more than a request's arithmetic): a request that raises an error (its key holds
  -- a value tollgate did not write, its write was refused) ends the run there, fails alone, and
  -- the next run goes on after it. A request raises only before or in its own write, so what it
  -- wrote is nothing or all.
  local i = 0
  local function run()
    -- (Locals, not the enclosing call's upvalues: cheaper to read in the loop.)
    local a, p, out, values, keys, now, grace, n = a, p, out, values, keys, now, grace, n
    local kp = p.keys
    while i < n do
      i = i + 1
      local cost, limit, len, mult, unit, alg, k
      cost, limit, len, mult, unit, alg, k, pos = sunpack('<ddddBBH', a, pos)
      p.unit, p.mult, p.len, p.limit, kp[1] = unit, mult, len, limit, keys[k]
      local j = 4 * i - 2
      -- The flags: 16, the key has more requests after this one; 32, this is its last of
      -- several.
      local flags = alg - alg % 16
      alg = alg - flags
      local one = FAST_ONE[alg]
      if one == nil then error('tollgate: no one-item check for algorithm ' .. alg) end
      if missing ~= nil and missing[k] ~= nil then
        -- Its key is not this node's: nothing read, nothing written.
        fail(i, missing[k])
      elseif flags == 0 then
        p.pre = values[k]
        out[j], out[j + 1], out[j + 2], out[j + 3] = one(p, now, cost, grace)
      else
        local last = flags == 32
        shared = shared or {}
        local e = shared[k]
        if e == nil then
          e = { pre = values[k], idx = {} }
          shared[k] = e
          p.pre = e.pre
          local ok, s, x, y, t = pcall(fast_get, p, alg)
          if ok then
            e.os, e.ox, e.oy, e.ot, e.s, e.x, e.y = s, x, y, t, s, x, y
          else
            e.err = s
          end
        end
        local idx = e.idx
        idx[#idx + 1] = i
        if e.err ~= nil then
          fail(i, e.err)
        else
          local al, rem, reset, retry, ns, nx, ny = fast_decide(p, alg, e.s, e.x, e.y, now, cost)
          out[j], out[j + 1], out[j + 2], out[j + 3] = al, rem, reset, retry
          e.s, e.x, e.y, e.reset = ns, nx, ny, reset
        end
        if last and e.err == nil then
          p.pre = e.pre
          local ok, err = pcall(fast_put, p, alg, e.os, e.ox, e.oy, e.ot, e.s, e.x, e.y, e.reset, grace)
          if not ok then
            for _, r in ipairs(idx) do fail(r, err) end
          end
        end
      end
    end
  end
  while true do
    local ok, err = pcall(run)
    if ok then break end
    fail(i, err)
  end
  p.pre = nil
  local f = FAST_FMT[n]
  if f == nil then
    f = '<d' .. string.rep('dddd', n)
    FAST_FMT[n] = f
  end
  local packed = spack(f, unpack(out, 1, 4 * n + 1))
  if failed == nil then return packed end
  local errs = { packed }
  for i = 1, n do
    if failed[i] ~= nil then errs[#errs + 1] = failed[i] end
  end
  return errs
end
