-- Frees ARGV[1]'s slot of the semaphore KEYS[1], and tells waiting processes to look again.
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if removed == 1 then publish('') end
return removed
