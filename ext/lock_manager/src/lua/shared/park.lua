-- Parked jobs: jobs that found their lock held and wait in Redis, in arrival order, for the
-- lock's release to push them to their queue. A lock's parked jobs are a list beside it. Each
-- entry is a JSON array (Admin reads it too): the job's token (its id), the TTL its lock is
-- handed over with, the grace of its fallback, Sidekiq's schedule (a sorted set) and its fallback
-- there (a member that runs LockManager::Sidekiq::Unpark), and its push (Sidekiq's own commands,
-- {name, key, args...}). The fallback is what moves the line when no release comes (the holder's
-- process died): it is due `grace` ms after the lock would expire, and re-armed at every
-- hand-over, so a line that moves never wakes it.
--
-- The pushes write Sidekiq's keys, which are not the script's KEYS: parking needs one Redis
-- (never a Cluster), as the claim in the push does.

local function parked_entry(raw)
  local entry = cjson.decode(raw)
  return { token = entry[1], ttl = entry[2], grace = entry[3], schedule = entry[4], fallback = entry[5],
           push = entry[6] }
end

-- Makes `entry`'s fallback due `after_ms` from now.
local function arm_fallback(entry, after_ms)
  local due = (now_ms() + after_ms) / 1000
  redis.call('ZADD', entry.schedule, string.format('%.3f', due), entry.fallback)
end

-- Hands the lock `lock_key` to the first job parked on it, for the TTL that job asked, and
-- pushes the job to its queue; arms the next one's fallback for when that TTL ends, or removes
-- the fallback when no job is left. The lock is overwritten, never deleted first (see
-- queue.lua). Returns the token the lock was handed to, or nil when no job was parked.
local function unpark_head(lock_key, parked_key)
  local raw = redis.call('LPOP', parked_key)
  if not raw then return nil end
  local entry = parked_entry(raw)
  redis.call('SET', lock_key, entry.token, 'PX', entry.ttl)
  for _, command in ipairs(entry.push) do redis.call(unpack(command)) end
  local following = redis.call('LINDEX', parked_key, 0)
  if following then
    arm_fallback(parked_entry(following), entry.ttl + entry.grace)
  else
    redis.call('ZREM', entry.schedule, entry.fallback)
  end
  return entry.token
end
