-- Parked jobs: jobs that found their lock held (or every permit of a `limit: N` semaphore taken)
-- and wait in Redis, in arrival order, for a release to push them to their queue. A lock's parked
-- jobs are a list beside it. Each entry is a JSON array (Admin reads it too): the job's token (its
-- id), the TTL its lock is handed over with, the grace of its fallback, Sidekiq's schedule (a
-- sorted set) and its fallback there (a member that runs LockManager::Sidekiq::Unpark), its push
-- (Sidekiq's own commands, {name, key, args...}), and the lock's limit (1: a plain lock). The
-- fallback is what moves the line when no release comes (the holder's process died): it is due
-- `grace` ms after the lock would have room, and re-armed at every hand-over, so a line that moves
-- never wakes it.
--
-- KEYS[1] is the lock in every script that includes this (the semaphore helpers read it). The
-- pushes write Sidekiq's keys, which are not the script's KEYS: parking needs one Redis (never a
-- Cluster), as the claim in the push does.

local function parked_entry(raw)
  local entry = cjson.decode(raw)
  return { token = entry[1], ttl = entry[2], grace = entry[3], schedule = entry[4], fallback = entry[5],
           push = entry[6], limit = entry[7] or 1 }
end

-- Whether the lock has room for one more holder: a plain lock is free, a semaphore has fewer live
-- holders than its limit.
local function has_room(limit)
  if limit > 1 then return holders(now_ms()) < limit end
  return redis.call('EXISTS', KEYS[1]) == 0
end

-- How long until the lock, which has no room, may have some, in ms: until the plain lock or the
-- semaphore's first live holder would expire.
local function room_after(limit)
  local ttl = limit > 1 and first_expiry(now_ms()) or redis.call('PTTL', KEYS[1])
  return math.max(ttl, 0)
end

-- Makes `entry`'s fallback due `after_ms` from now.
local function arm_fallback(entry, after_ms)
  local due = (now_ms() + after_ms) / 1000
  redis.call('ZADD', entry.schedule, string.format('%.3f', due), entry.fallback)
end

-- Hands the lock to the first job parked on it (a permit, for a semaphore), for the TTL that job
-- asked, and pushes the job to its queue; arms the next one's fallback for when that TTL ends, or
-- removes the fallback when no job is left. A plain lock is overwritten, never deleted first (see
-- queue.lua). Returns the token the lock was handed to, or nil when no job was parked.
local function unpark_head(parked_key)
  local raw = redis.call('LPOP', parked_key)
  if not raw then return nil end
  local entry = parked_entry(raw)
  if entry.limit > 1 then
    admit(entry.token, now_ms(), entry.ttl)
  else
    redis.call('SET', KEYS[1], entry.token, 'PX', entry.ttl)
  end
  for _, command in ipairs(entry.push) do redis.call(unpack(command)) end
  local following = redis.call('LINDEX', parked_key, 0)
  if following then
    arm_fallback(parked_entry(following), entry.ttl + entry.grace)
  else
    redis.call('ZREM', entry.schedule, entry.fallback)
  end
  return entry.token
end

-- Hands the lock to parked jobs while it has room: to one for a plain lock, to as many as there
-- are free permits for a semaphore. Returns the first token handed to, or nil.
local function unpark_while_room(parked_key)
  local first
  while true do
    local head = redis.call('LINDEX', parked_key, 0)
    if not (head and has_room(parked_entry(head).limit)) then return first end
    local token = unpark_head(parked_key)
    first = first or token
  end
end
