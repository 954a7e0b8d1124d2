-- One decision of an exact sliding-window limit: at most `limit` units in any window of `length`
-- ending now. Each unit admitted is one member of a sorted set, scored by the time it was admitted
-- (members `time:n`: n counts the units in the window, so no two share a name), and members that
-- have left the window are removed first. One more member, scored 0, names the rule
-- ("=<length>:<limit>", for LockManager::Admin). The set expires when its newest unit leaves the
-- window: an idle limiter keeps nothing; a busy one keeps `limit` units at most.
-- KEYS: the limiter. ARGV: the window (µs), the limit, the cost, and a mode: "give" and the receipt
-- (the time and first number of the members the decision added, which it removes; it comes a
-- round trip after its decision, so no unit added later is named in the same microsecond) to give
-- back units, "peek" to say what one unit would meet, by the stored rule, changing nothing.
-- Returns {admitted (1 or 0), remaining, retry after (µs), reset after (µs), time, first number},
-- as limit_gcra.lua; a peek {used, remaining, retry after, reset after, length, limit}, or nil.
local limiter = KEYS[1]
local length, limit, cost, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

if mode == 'give' then
  for n = tonumber(ARGV[6]), tonumber(ARGV[6]) + cost - 1 do
    redis.call('ZREM', limiter, ARGV[5] .. ':' .. int(n))
  end
  return {1, 0, 0, 0, 0, 0}
end
local rules = redis.call('ZRANGEBYSCORE', limiter, 0, 0)
if mode == 'peek' then
  if not rules[1] then
    return nil
  end
  length, limit = string.match(rules[1], '^=([^:]+):(.+)$')
  cost = 1
end
local rule = '=' .. length .. ':' .. limit
local rule_length, rule_limit = length, limit
length, limit = tonumber(length), tonumber(limit)

local now = now_us()
-- Members before the units: the rule's, and in a peek (which removes nothing) units that have left.
local skip = #rules
if mode == 'peek' then
  skip = skip + redis.call('ZCOUNT', limiter, '(0', int(now - length))
else
  redis.call('ZREMRANGEBYSCORE', limiter, '(0', int(now - length))
end
local used = redis.call('ZCARD', limiter) - skip

-- Until the unit at `rank` (0: the oldest) leaves the window; a whole window when there is none
-- (a process that counts with a smaller limit than another's).
local function left_after(rank)
  local member = redis.call('ZRANGE', limiter, rank + skip, rank + skip, 'WITHSCORES')
  if member[2] == nil then
    return length
  end
  return math.max(tonumber(member[2]) + length - now, 0)
end

local refused = used + cost > limit
if mode == 'peek' then
  return {used, math.max(limit - used, 0), refused and left_after(used - limit) or 0,
    used > 0 and left_after(used - 1) or 0, rule_length, rule_limit}
end
if refused then
  -- Admitted once the oldest (used + cost - limit) units have left.
  return {0, math.max(limit - used, 0), left_after(used + cost - limit - 1), left_after(used - 1), 0, 0}
end
if rules[1] ~= rule or rules[2] then
  redis.call('ZREMRANGEBYSCORE', limiter, 0, 0)
  redis.call('ZADD', limiter, 0, rule)
end
for n = used + 1, used + cost do
  redis.call('ZADD', limiter, int(now), int(now) .. ':' .. int(n))
end
redis.call('PEXPIRE', limiter, int(math.ceil(length / 1000)))
return {1, limit - used - cost, 0, length, now, used + 1}
