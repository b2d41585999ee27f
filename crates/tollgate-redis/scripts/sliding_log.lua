-- sliding_log.lua: sliding window log (algorithm/sliding_log.rs).
--
-- Redis state is two keys. The sorted set holds the admitted entries: score = admission time
-- (clamped, see below), member = "<cum>:<cost>:<request id>:<item index>", where cum is the
-- running total of the costs logged so far including this entry, zero-padded to 16 digits. The
-- set's order (score, then member) is the order in which entries were logged, because every
-- entry is logged at `now` after every later-stamped entry was clamped to `now`; so cum grows
-- along the set and the cost of any run of entries is a difference of two cums. The second key
-- ("...:sum") holds "v2:<horizon>": entries scored at or below the horizon are gone even if still
-- in the set (see pruning), or the marker NO_HORIZON.
--
-- Bounded work per call, whatever the log length: the sum in the window is cum(newest) minus
-- cum(newest expired entry), found with ZCOUNT and two single-entry ZRANGEs; retry_after is a
-- binary search over at most `excess` ranks (every cost is at least 1); no member list is
-- fetched or parsed. Pruning removes at most LOG_PRUNE expired entries per write (by rank,
-- without reading them); when more are left, the horizon records that they are gone. Only a
-- clock step backwards does work proportional to the log, once: entries from the future are
-- rescored to `now`, and entries below a horizon that now lies ahead of the window are removed.
--
-- Clamp (as in Rust): an entry later than `now` is treated as logged at `now`, and written so.
--
-- The Lua state of a key is lazy: { h, added, ... } means "the persisted log (read through h),
-- plus the entries this request added (all at `now`)", so a key repeated in one request sees the
-- earlier item's tentative entries, and save() applies only the difference. Entries with equal
-- times may sit in another order than the Rust log's, which changes nothing: decisions depend on
-- times and sums.

local LOG_PRUNE = 16
local NO_HORIZON = -TWO53
local LOG_REBASE = 4503599627370496 -- 2^52: cums are renumbered from 0 before passing it

local function log_parse(m)
  local c, k = smatch(m, '^(%d+):(%d+):')
  return tonum(c), tonum(k)
end

local function log_member(cum, cost, rest)
  return sformat('%016d', cum) .. ':' .. fmt(cost) .. ':' .. rest
end

-- Write the horizon, with the set's TTL (ttl = nil: none, as the set has none).
local function log_mark(p, h, ttl)
  if ttl ~= nil then
    rcall('SET', p.keys[2], 'v2:' .. fmt(h), 'PX', ttl)
  else
    rcall('SET', p.keys[2], 'v2:' .. fmt(h))
  end
end

-- Rewrite the set with cums renumbered in set order (members keep their cost and request id,
-- scores unchanged): reads a log written by an older version of this script (member
-- "<time>:<cost>:<request id>:<item index>", sum key = plain sum), or restarts cums near 2^52.
local function log_renumber(p)
  local z = p.keys[1]
  local all = rcall('ZRANGE', z, 0, -1, 'WITHSCORES')
  local pttl = rcall('PTTL', z)
  rcall('DEL', z)
  local cum = 0
  local args = {}
  for j = 1, #all, 2 do
    local _, c, rest = smatch(all[j], '^(%d+):(%d+):(.*)$')
    if c then
      cum = cum + tonum(c)
      args[#args + 1] = all[j + 1]
      args[#args + 1] = log_member(cum, tonum(c), rest)
    end
    if #args >= 1000 or (j + 2 > #all and #args > 0) then
      rcall('ZADD', z, unpack(args))
      args = {}
    end
  end
  if pttl > 0 and rcall('EXISTS', z) == 1 then rcall('PEXPIRE', z, pttl) end
end

-- The persisted log: { h = horizon } or { h = nil } when there is none.
local function log_load(p)
  local z, s = p.keys[1], p.keys[2]
  local v = rcall('GET', s)
  local h = nil
  if v then h = tonum(smatch(v, '^v2:(%-?%d+)$')) end
  if h ~= nil then return { h = h, added = {} } end
  if rcall('EXISTS', z) == 0 then return { h = nil, added = {} } end
  log_renumber(p)
  local pttl = rcall('PTTL', z)
  if pttl == -2 then
    rcall('DEL', s)
    return { h = nil, added = {} }
  end
  if pttl > 0 then log_mark(p, NO_HORIZON, pttl) else log_mark(p, NO_HORIZON, nil) end
  return { h = NO_HORIZON, added = {} }
end

local function log_step(st, now, cost, p)
  local len, limit, z = p.len, p.limit, p.keys[1]
  local cut = now - len
  local eff = cut
  if st.h ~= nil and st.h > eff then eff = st.h end
  -- Persisted entries: `dead` expired ones first (ranks 0..dead-1), then the live ones, whose
  -- costs sum to top - base; `first` is the oldest live one (cum, time). phys_top is the cum
  -- of the newest entry in the set, dead or alive (new entries continue from it).
  local dead, live, base, top, last, future = nil, false, 0, 0, nil, false
  local phys_top, first_cum, first_t = 0, 0, 0
  if st.h ~= nil then
    local newest = rcall('ZRANGE', z, -1, -1, 'WITHSCORES')
    if #newest == 2 then
      phys_top = log_parse(newest[1])
      last = tonum(newest[2])
      if last > eff then
        live, top = true, phys_top
        if last > now then
          future = true
          last = now
        end
        dead = rcall('ZCOUNT', z, '-inf', fmt(eff))
        if dead > 0 then
          local pair = rcall('ZRANGE', z, dead - 1, dead, 'WITHSCORES')
          base = log_parse(pair[1])
          first_cum, first_t = log_parse(pair[3]), tonum(pair[4])
        else
          local one = rcall('ZRANGE', z, 0, 0, 'WITHSCORES')
          local c, k = log_parse(one[1])
          base, first_cum, first_t = c - k, c, tonum(one[2])
        end
      else
        last = nil
      end
    end
  end
  local added = {}
  local added_sum = 0
  for i, e in ipairs(st.added) do
    added[i] = e
    added_sum = added_sum + e
  end
  -- dead is only worth passing on when it counts what save() prunes (entries up to cut).
  local ns = { h = st.h, added = added, now = now, cut = cut, live = live, future = future,
               phys_top = phys_top, stepped = true }
  if eff == cut then ns.dead = dead end
  local count = top - base + added_sum
  if #added > 0 then last = now end
  local function empties_in()
    if last == nil then return 0 end
    return sat_sub(last + len, now)
  end
  if limit == 0 or cost > limit then
    return decision(false, limit, sat_sub(limit, count), empties_in(), nil, 0), ns
  end
  if count + cost <= limit then
    if cost > 0 then
      added[#added + 1] = cost
      last = now
    end
    return decision(true, limit, limit - count - cost, empties_in(), nil, 0), ns
  end
  -- Wait until enough of the oldest entries have left the window: the first entry whose cum
  -- reaches base + excess. Persisted entries come first, then this request's (at `now`).
  -- Every cost is at least 1, so it is at most `excess` ranks past the first live one.
  local to_free = count + cost - limit
  local retry = len
  if to_free <= top - base then
    local target = base + to_free
    local t = first_t
    if first_cum < target then
      local lo = dead + 1
      local hi = math.min(dead + to_free - 1, rcall('ZCARD', z) - 1)
      while lo < hi do
        local mid = lo + idiv(hi - lo, 2)
        if log_parse(rcall('ZRANGE', z, mid, mid)[1]) >= target then
          hi = mid
        else
          lo = mid + 1
        end
      end
      t = tonum(rcall('ZRANGE', z, lo, lo, 'WITHSCORES')[2])
    end
    if t > now then t = now end
    retry = sat_sub(t + len, now)
  end
  return decision(false, limit, sat_sub(limit, count), empties_in(), retry, 0), ns
end

local function log_save(p, old, new, ttl)
  local z, s = p.keys[1], p.keys[2]
  local now = new.now
  if not new.live and #new.added == 0 then
    -- Nothing left in the window: forget the key (UNLINK frees a long set off the main thread).
    if old.h ~= nil then rcall('UNLINK', z, s) end
    new.h = nil
    return
  end
  local changed = false
  local h = old.h
  if not old.stepped and h ~= nil then
    -- First write of this key in the request: prune, clamp.
    if new.cut < h then
      -- The clock went back behind a horizon: drop what it covered, for good.
      rcall('ZREMRANGEBYSCORE', z, '-inf', fmt(h))
      h = NO_HORIZON
      changed = true
    else
      local dead = new.dead
      if dead == nil then dead = rcall('ZCOUNT', z, '-inf', fmt(new.cut)) end
      if dead > 0 then
        local n = math.min(dead, LOG_PRUNE)
        rcall('ZREMRANGEBYRANK', z, 0, n - 1)
        if dead > n then h = new.cut else h = NO_HORIZON end
        changed = true
      end
    end
    if new.future then
      local fut = rcall('ZRANGEBYSCORE', z, '(' .. fmt(now), '+inf')
      local args = {}
      for j, m in ipairs(fut) do
        args[#args + 1] = fmt(now)
        args[#args + 1] = m
        if #args >= 1000 or j == #fut then
          rcall('ZADD', z, 'XX', unpack(args))
          args = {}
        end
      end
      changed = true
    end
  end
  if #new.added > #old.added then
    local cum = new.phys_top
    if old.stepped then
      -- An earlier item of this request may have written the set since it was read.
      local newest = rcall('ZRANGE', z, -1, -1)
      if #newest > 0 then cum = log_parse(newest[1]) end
    end
    if cum > LOG_REBASE then
      log_renumber(p)
      cum = log_parse(rcall('ZRANGE', z, -1, -1)[1])
    end
    for i = #old.added + 1, #new.added do
      cum = cum + new.added[i]
      rcall('ZADD', z, fmt(now), log_member(cum, new.added[i], p.reqid .. ':' .. fmt(p.idx)))
    end
    if h == nil then h = NO_HORIZON end
    changed = true
  end
  -- A later item of this request on the same key saves with this state as `old`: it must see
  -- the horizon as written now, not as loaded.
  new.h = h
  if not changed then return end
  log_mark(p, h, ttl)
  rcall('PEXPIRE', z, ttl)
end

ALG[5] = {
  load = log_load,
  step = log_step,
  save = log_save,
  -- Undo an admitted cost: remove exactly the entry this request's item added (logged at `now`
  -- unless a backward clock step clamped it since; then it stays, which only over-counts), and
  -- renumber the few entries logged after it so cums stay contiguous.
  refund = function(p, now, cost)
    local z, s = p.keys[1], p.keys[2]
    if log_load(p).h == nil then return end
    local tail = ':' .. fmt(cost) .. ':' .. p.reqid .. ':' .. fmt(p.idx)
    for _, m in ipairs(rcall('ZRANGEBYSCORE', z, fmt(now), fmt(now))) do
      if #m == 16 + #tail and string.sub(m, 17) == tail then
        local rank = rcall('ZRANK', z, m)
        local later = rcall('ZRANGE', z, rank + 1, -1, 'WITHSCORES')
        rcall('ZREM', z, m)
        for j = 1, #later, 2 do
          local c, k, rest = smatch(later[j], '^(%d+):(%d+):(.*)$')
          rcall('ZREM', z, later[j])
          rcall('ZADD', z, later[j + 1], log_member(tonum(c) - cost, tonum(k), rest))
        end
        if rcall('ZCARD', z) == 0 then rcall('DEL', z, s) end
        return
      end
    end
  end,
}
