-- Force-release (LockManager::Admin#release): removes every holder of the lock KEYS[1], whoever
-- they are (a plain lock's token, every permit of a `limit: N` semaphore), and tells the key's
-- waiters in every process to look again at once, as `leave.lua` does. Each waiter then takes the
-- lock, or renews its place, by its own attempt: the first live one in the queue takes it (a
-- semaphore's waiters know their limit, Redis does not). The queue and its waiters stay. KEYS[2],
-- given on one Redis only (never a Cluster, where no job parks): the lock's parked jobs, the
-- first of which takes the lock at once (as many as a semaphore has permits; shared/park.lua), as
-- they do a lock that expired under them. A holder finds out at its next renewal, refresh or
-- release, which its token no longer passes. Returns 1 when a lock was removed (or handed to a parked job), 0 when KEYS[1] held none
-- (or is no lock).
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'string' and kind ~= 'zset' then
  -- A lock that expired with jobs parked on it (its holder died): the first of them takes it now.
  if kind == 'none' and KEYS[2] and unpark_while_room(KEYS[2]) then return 1 end
  return 0
end
redis.call('DEL', KEYS[1])
publish('')
if KEYS[2] then unpark_while_room(KEYS[2]) end
return 1
