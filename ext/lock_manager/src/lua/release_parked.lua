-- Releases the lock as release.lua does (KEYS and ARGV as there, and KEYS[5]: its parked jobs),
-- but a lock no live waiter is queued for goes to the first parked job (shared/park.lua) instead
-- of being freed. Returns as release.lua does: 1 as well when a parked job took it.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return release_lock(tonumber(ARGV[2]), function() return unpark_head(KEYS[5]) end) or 1
