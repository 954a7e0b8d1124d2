-- The fallback of a lock's parked jobs (LockManager::Sidekiq::Unpark), for when no release came:
-- a lock with room goes to the first parked jobs (as many as a semaphore has free permits); while
-- it has none, the first one's fallback is armed again for when it may. KEYS: the lock, its
-- parked jobs. Returns the first token the lock was handed to, or false.
local parked_key = KEYS[2]
local head = redis.call('LINDEX', parked_key, 0)
if not head then return false end
local handed = unpark_while_room(parked_key)
if handed then return handed end
local entry = parked_entry(head)
arm_fallback(entry, room_after(entry.limit) + entry.grace)
return false
