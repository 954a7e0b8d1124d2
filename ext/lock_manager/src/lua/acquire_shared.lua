-- Admits ARGV[1] (token) as one of at most ARGV[3] holders of the semaphore KEYS[1] for ARGV[2]
-- ms. Holders are members of a sorted set scored by their expiry in Redis time, so an expired
-- holder frees its slot without touching the others; a token already admitted is renewed (a
-- re-sent acquire must not fail because of itself). The key itself expires with its last holder.
-- KEYS[2]: the fencing counter. Returns {1, fencing token}, or {0, ms until the first holder
-- expires}. Its first write is the ZADD, which Redis refuses under maxmemory.
local now = now_ms()
local mine = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
if mine > now or redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[1], last[2])
  return {1, next_fencing_token()}
end
local first = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
return {0, tonumber(first[2]) - now}
