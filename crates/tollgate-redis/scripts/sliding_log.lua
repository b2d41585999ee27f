-- sliding_log.lua: sliding window log (algorithm/sliding_log.rs).
--
-- Redis state is two keys: a sorted set of admitted entries (score = admission time, member =
-- "<time>:<cost>:<request id>:<item index>", unique, so a refund can remove exactly the entries
-- one request added) and a string with the sum of their costs, so a check costs O(log n) rather
-- than a walk of the whole log. Entries at or before `now - period` are outside the window.
--
-- The Lua state of a key is lazy: { cutoff, added } means "the persisted entries newer than
-- cutoff, plus the entries this request added (all at `now`)", so a key repeated in one request
-- sees the earlier item's tentative entries without copying the log, and save() applies only
-- the difference (prune up to cutoff, add the new entries). Entries with equal times may sit in
-- another order than the Rust log's, which changes nothing: decisions depend on times and sums.

local function log_member_cost(m)
  return tonumber(string.match(m, '^%d+:(%d+):'))
end

local function log_costs(members)
  local s = 0
  for _, m in ipairs(members) do s = s + log_member_cost(m) end
  return s
end

-- Sum of all persisted costs (rebuilt from the set if the sum key is missing).
local function log_total(p)
  local v = redis.call('GET', p.keys[2])
  if v then return tonumber(v) end
  if redis.call('EXISTS', p.keys[1]) == 0 then return 0 end
  return log_costs(redis.call('ZRANGE', p.keys[1], 0, -1))
end

local function log_load(p)
  return { cutoff = -1, added = {} }
end

local function log_step(st, now, cost, p)
  local len, limit, z = p.len, p.limit, p.keys[1]
  local cut = now - len
  if st.cutoff > cut then cut = st.cutoff end
  local added = {}
  local added_sum = 0
  for i, e in ipairs(st.added) do
    added[i] = e
    added_sum = added_sum + e.cost
  end
  local ns = { cutoff = cut, added = added }
  local count = log_total(p) - log_costs(redis.call('ZRANGEBYSCORE', z, '-inf', fmt(cut))) + added_sum
  local last = nil
  local top = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  if #top == 2 and tonumber(top[2]) > cut then last = tonumber(top[2]) end
  if #added > 0 and (last == nil or now > last) then last = now end
  local function empties_in()
    if last == nil then return 0 end
    return sat_sub(last + len, now)
  end
  if limit == 0 or cost > limit then
    return decision(false, limit, sat_sub(limit, count), empties_in(), nil, 0), ns
  end
  if count + cost <= limit then
    if cost > 0 then
      added[#added + 1] = { t = now, cost = cost,
        member = fmt(now) .. ':' .. fmt(cost) .. ':' .. p.reqid .. ':' .. fmt(p.idx) }
      if last == nil or now > last then last = now end
    end
    return decision(true, limit, limit - count - cost, empties_in(), nil, 0), ns
  end
  -- Wait until enough of the oldest entries have left the window. Sorted order: persisted
  -- entries up to now, then this request's entries (at now), then persisted ones after now.
  local to_free = count + cost - limit
  local retry = 0
  local function take(t, c)
    retry = sat_sub(t + len, now)
    to_free = sat_sub(to_free, c)
    return to_free == 0
  end
  local added_done = #added == 0
  local done = false
  local off = 0
  while not done do
    local batch = redis.call('ZRANGEBYSCORE', z, '(' .. fmt(cut), '+inf', 'WITHSCORES',
      'LIMIT', off, 128)
    if #batch == 0 then break end
    for j = 1, #batch, 2 do
      local t = tonumber(batch[j + 1])
      if not added_done and t > now then
        added_done = true
        for _, e in ipairs(added) do
          if take(e.t, e.cost) then done = true break end
        end
        if done then break end
      end
      if take(t, log_member_cost(batch[j])) then done = true break end
    end
    off = off + 128
  end
  if not done and not added_done then
    for _, e in ipairs(added) do
      if take(e.t, e.cost) then break end
    end
  end
  return decision(false, limit, sat_sub(limit, count), empties_in(), retry, 0), ns
end

local function log_save(p, old, new, ttl)
  local z, s = p.keys[1], p.keys[2]
  local changed = false
  local sum = nil
  if new.cutoff > old.cutoff then
    local gone = redis.call('ZRANGEBYSCORE', z, '-inf', fmt(new.cutoff))
    if #gone > 0 then
      sum = log_total(p) - log_costs(gone)
      redis.call('ZREMRANGEBYSCORE', z, '-inf', fmt(new.cutoff))
      changed = true
    end
  end
  for i = #old.added + 1, #new.added do
    local e = new.added[i]
    if sum == nil then sum = log_total(p) end
    redis.call('ZADD', z, e.t, e.member)
    sum = sum + e.cost
    changed = true
  end
  if not changed then return end
  if redis.call('ZCARD', z) == 0 then
    redis.call('DEL', z, s)
    return
  end
  redis.call('SET', s, fmt(sum), 'PX', ttl)
  redis.call('PEXPIRE', z, ttl)
end

ALG[5] = {
  load = log_load,
  step = log_step,
  save = log_save,
  -- Undo an admitted cost: remove exactly the entry this request's item added.
  refund = function(p, now, cost)
    local z, s = p.keys[1], p.keys[2]
    local member = fmt(now) .. ':' .. fmt(cost) .. ':' .. p.reqid .. ':' .. fmt(p.idx)
    if redis.call('ZREM', z, member) == 1 then
      if redis.call('ZCARD', z) == 0 then
        redis.call('DEL', z, s)
      else
        redis.call('SET', s, fmt(log_total(p) - cost), 'KEEPTTL')
      end
    end
  end,
}
