-- Force-release (LockManager::Admin#release): removes every holder of the lock KEYS[1], whoever
-- they are (a plain lock's token, every permit of a `limit: N` semaphore), and tells the key's
-- waiters in every process to look again at once, as `leave.lua` does. Each waiter then takes the
-- lock, or renews its place, by its own attempt: the first live one in the queue takes it (a
-- semaphore's waiters know their limit, Redis does not). The queue and its waiters stay. KEYS[2],
-- given on one Redis only (never a Cluster, where no job parks): the lock's parked jobs, the
-- first of which takes the lock at once (shared/park.lua). A holder finds out at its next
-- renewal, refresh or release, which its token no longer passes. Returns 1 when a lock was
-- removed, 0 when KEYS[1] held none (or is no lock).
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'string' and kind ~= 'zset' then return 0 end
redis.call('DEL', KEYS[1])
publish('')
if KEYS[2] then unpark_head(KEYS[1], KEYS[2]) end
return 1
