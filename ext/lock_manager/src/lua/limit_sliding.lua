-- One decision of an exact sliding-window limit: at most `limit` units in any window of `length`
-- ending now. Each unit admitted is one member of a sorted set, scored by the time it was admitted
-- (members `time:n`: n counts the units in the window, so no two share a name), and members that
-- have left the window are removed first. The set expires when its newest member leaves the
-- window: an idle limiter keeps nothing; a busy one keeps `limit` members at most.
-- KEYS: the limiter. ARGV: the window (µs), the limit, the cost, and to give back: "give" and the
-- receipt (the time and first number of the members the decision added, which it removes; it comes
-- a round trip after its decision, so no unit added later is named in the same microsecond).
-- Returns {admitted (1 or 0), remaining, retry after (µs), reset after (µs), time, first number},
-- as limit_gcra.lua.
local limiter = KEYS[1]
local length, limit, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local give, receipt_time, receipt_first = ARGV[4] == 'give', ARGV[5], tonumber(ARGV[6])

if give then
  for n = receipt_first, receipt_first + cost - 1 do
    redis.call('ZREM', limiter, receipt_time .. ':' .. int(n))
  end
  return {1, 0, 0, 0, 0, 0}
end
local now = now_us()
redis.call('ZREMRANGEBYSCORE', limiter, '-inf', int(now - length))
local used = redis.call('ZCARD', limiter)

-- Until the member at `rank` (0: the oldest) leaves the window; a whole window when there is
-- none (a process that counts with a smaller limit than another's).
local function left_after(rank)
  local member = redis.call('ZRANGE', limiter, rank, rank, 'WITHSCORES')
  if member[2] == nil then
    return length
  end
  return tonumber(member[2]) + length - now
end

if used + cost > limit then
  -- Admitted once the oldest (used + cost - limit) units have left.
  return {0, math.max(limit - used, 0), left_after(used + cost - limit - 1), left_after(used - 1), 0, 0}
end
for n = used + 1, used + cost do
  redis.call('ZADD', limiter, int(now), int(now) .. ':' .. int(n))
end
redis.call('PEXPIRE', limiter, int(math.ceil(length / 1000)))
return {1, limit - used - cost, 0, length, now, used + 1}
