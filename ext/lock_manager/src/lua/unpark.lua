-- The fallback of a lock's parked jobs (LockManager::Sidekiq::Unpark), for when no release came:
-- a free lock goes to the first parked job; while the lock is held, that job's fallback is armed
-- again for when the lock would expire. KEYS: the lock, its parked jobs. Returns the token the
-- lock was handed to, or false.
local lock_key, parked_key = KEYS[1], KEYS[2]
local head = redis.call('LINDEX', parked_key, 0)
if not head then return false end
local ttl = redis.call('PTTL', lock_key)
if ttl == -2 then return unpark_head(lock_key, parked_key) end
local entry = parked_entry(head)
arm_fallback(entry, math.max(ttl, 0) + entry.grace)
return false
