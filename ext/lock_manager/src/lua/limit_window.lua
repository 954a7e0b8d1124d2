-- One decision of a fixed-window limit: at most `limit` units per window, the windows aligned to
-- Redis's clock (a window of 3600 s starts on the hour). The window's number and its count are
-- stored in one hash that expires when the window ends: an idle limiter keeps nothing.
-- KEYS: the limiter. ARGV: the window (µs), the limit, the cost, and to give back: "give" and the
-- receipt's window (units of a window that has ended are gone with it).
-- Returns {admitted (1 or 0), remaining, retry after (µs), reset after (µs), the window, 0}, as
-- limit_gcra.lua.
local limiter = KEYS[1]
local length, limit, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local give, receipt_window = ARGV[4] == 'give', tonumber(ARGV[5])

local now = now_us()
local window = math.floor(now / length)
local ends = (window + 1) * length
local stored = redis.call('HMGET', limiter, 'window', 'used')
local used = 0
if tonumber(stored[1]) == window then
  used = tonumber(stored[2])
end
if give then
  if receipt_window == window then
    redis.call('HSET', limiter, 'used', int(math.max(used - cost, 0)))
  end
  return {1, 0, 0, 0, 0, 0}
end

if used + cost > limit then
  return {0, math.max(limit - used, 0), ends - now, ends - now, window, 0}
end
used = used + cost
redis.call('HSET', limiter, 'window', int(window), 'used', int(used))
redis.call('PEXPIREAT', limiter, int(math.ceil(ends / 1000)))
return {1, limit - used, 0, ends - now, window, 0}
