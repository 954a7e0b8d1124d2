-- A semaphore KEYS[1] (limit: N): a sorted set of its holders' tokens, each scored by when it
-- expires (Redis time, ms), so an expired holder frees its permit without touching the others.
-- The key itself expires with its last holder.

-- Admits `token` until `now + ttl_ms`, and drops expired holders. The ZADD comes first: under
-- maxmemory Redis refuses a script whose first write may grow memory.
local function admit(token, now, ttl_ms)
  redis.call('ZADD', KEYS[1], int(now + ttl_ms), token)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now))
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[1], last[2])
end

-- How many hold a permit that has not expired.
local function holders(now)
  return redis.call('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')
end

-- Whether `token` holds a permit that has not expired.
local function holds(token, now)
  local expiry = redis.call('ZSCORE', KEYS[1], token)
  return expiry and tonumber(expiry) > now
end

-- How long until the first live holder expires, in ms (-2: none).
local function first_expiry(now)
  local first = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. int(now), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  return first[2] and (tonumber(first[2]) - now) or -2
end

-- Hands a free permit to the first live waiter, for at most `handoff_ms` (as `release_lock`
-- does), and tells it. Returns the message, or nil with nobody queued.
local function hand_permit(now, handoff_ms)
  local head, ttl, channel = live_head()
  if not head then return nil end
  dequeue(head) -- first: a write that cannot grow memory (see `release_lock`)
  admit(head, now, math.min(ttl, handoff_ms))
  return tell_new_holder(head, channel)
end
