-- Extends ARGV[1]'s permit of the semaphore KEYS[1] to ARGV[2] ms from now, only while it has
-- not expired. Returns 1, or 0 when the permit is gone.
local now = now_ms()
if not holds(ARGV[1], now) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', int(now + tonumber(ARGV[2])), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
return 1
