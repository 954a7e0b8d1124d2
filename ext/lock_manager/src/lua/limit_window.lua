-- One decision of a fixed-window limit: at most `limit` units per window, the windows aligned to
-- Redis's clock (a window of 3600 s starts on the hour). The window's number, its count and the
-- rule ("<length>:<limit>", for LockManager::Admin) are stored in one hash that expires when the
-- window ends: an idle limiter keeps nothing.
-- KEYS: the limiter. ARGV: the window (µs), the limit, the cost, and a mode: "give" (and the
-- receipt's window: units of a window that has ended are gone with it) to give back units, "peek"
-- to say what one unit would meet, by the stored rule, changing nothing.
-- Returns {admitted (1 or 0), remaining, retry after (µs), reset after (µs), the window, 0}, as
-- limit_gcra.lua; a peek {used, remaining, retry after, reset after, length, limit}, or nil.
local limiter = KEYS[1]
local length, limit, cost, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

local stored = redis.call('HMGET', limiter, 'window', 'used', 'rule')
if mode == 'peek' then
  if not stored[3] then
    return nil
  end
  length, limit = string.match(stored[3], '^([^:]+):(.+)$')
  cost = 1
end
local rule = length .. ':' .. limit
local rule_length, rule_limit = length, limit
length, limit = tonumber(length), tonumber(limit)

local now = now_us()
local window = math.floor(now / length)
local ends = (window + 1) * length
local used = 0
if tonumber(stored[1]) == window then
  used = tonumber(stored[2])
end
if mode == 'give' then
  if tonumber(ARGV[5]) == window then
    redis.call('HSET', limiter, 'used', int(math.max(used - cost, 0)))
  end
  return {1, 0, 0, 0, 0, 0}
end

local refused = used + cost > limit
if mode == 'peek' then
  return {used, math.max(limit - used, 0), refused and ends - now or 0, used > 0 and ends - now or 0,
    rule_length, rule_limit}
end
if refused then
  return {0, math.max(limit - used, 0), ends - now, ends - now, window, 0}
end
used = used + cost
redis.call('HSET', limiter, 'window', int(window), 'used', int(used), 'rule', rule)
redis.call('PEXPIREAT', limiter, int(math.ceil(ends / 1000)))
return {1, limit - used, 0, ends - now, window, 0}
