-- token_bucket.lua: whole-token bucket (algorithm/token_bucket.rs), state "tokens last".
-- Products: refill * T <= now - last, and (cap - tokens) * T, (cost - tokens) * T are at most
-- burst * T, which the Rust side keeps below 2^51: plain arithmetic is exact.

local function tb_step(st, now, cost, p)
  local t = p.T
  if t == 0 then return deny_forever(0), st end
  local cap = p.burst
  local tokens, last = cap, now
  if st ~= nil then tokens, last = st[1], st[2] end
  -- Clock stepped back: refill resumes from now (token_bucket.rs `clamp`).
  if last > now then last = now end
  if now > last then
    local refill = idiv(now - last, t)
    if tokens + refill >= cap then
      tokens = cap
      last = now
    else
      tokens = tokens + refill
      last = last + refill * t
    end
  end
  if tokens > cap then tokens = cap end
  local function full_in(tk, ls)
    if tk >= cap then return 0 end
    return sat_sub(ls + (cap - tk) * t, now)
  end
  local function keep(tk, ls)
    if tk < cap then return { tk, ls } end
    return nil
  end
  if cost > cap then
    return decision(false, p.limit, tokens, full_in(tokens, last), nil, 0), keep(tokens, last)
  end
  if cost <= tokens then
    tokens = tokens - cost
    return decision(true, p.limit, tokens, full_in(tokens, last), nil, 0), keep(tokens, last)
  end
  local retry = sat_sub(last + (cost - tokens) * t, now)
  return decision(false, p.limit, tokens, full_in(tokens, last), retry, 0), keep(tokens, last)
end

ALG[3] = {
  load = function(p) return load_string(p, pair_decode) end,
  step = tb_step,
  clamp = function(st, now, p)
    if st ~= nil and st[2] > now then return { st[1], now } end
    return nil
  end,
  save = function(p, old, new, ttl) save_string(p, pair_encode, old, new, ttl) end,
  -- Undo an admitted cost: tokens += cost, capped; a full bucket is deleted.
  refund = function(p, now, cost)
    local v = rcall('GET', p.keys[1])
    if not v then return end
    local s = pair_decode(v)
    s[1] = s[1] + cost
    if s[1] >= p.burst then
      rcall('DEL', p.keys[1])
    else
      rcall('SET', p.keys[1], pair_encode(s), 'KEEPTTL')
    end
  end,
}
