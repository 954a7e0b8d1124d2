-- Extends ARGV[1]'s slot of the semaphore KEYS[1] to ARGV[2] ms from now, only while it has not
-- expired. Returns 1, or 0 when the slot is gone.
local now = now_ms()
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
return 1
