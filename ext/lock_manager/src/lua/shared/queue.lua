-- The queue of a lock: KEYS[2] holds the waiters in arrival order (a sorted set: token -> arrival
-- in microseconds), KEYS[3] their details (a hash: token -> "heartbeat deadline ms:lock ttl
-- ms:channel"). Both expire unless a waiter renews its place.
--
-- No script touches a key again after it may have deleted it: while its Cluster slot is
-- migrating, Redis takes a key missing mid-script for one that moved, and aborts the script
-- with what it wrote so far.

-- Whether the waiter `token` still renews its place; its TTL and channel when it does.
local function live_waiter(token, now)
  local entry = redis.call('HGET', KEYS[3], token)
  if entry then
    local deadline, ttl, channel = string.match(entry, '^(%d+):(%d+):(.*)$')
    if deadline and tonumber(deadline) > now then return true, tonumber(ttl), channel end
  end
  return false
end

local function dequeue(token)
  redis.call('ZREM', KEYS[2], token)
  redis.call('HDEL', KEYS[3], token)
end

-- The first queued waiter whose heartbeat is still running, the TTL it asked for and the channel
-- its process listens on ('' for none); waiters whose process stopped renewing their heartbeat
-- are dropped on the way.
local function live_head()
  local now -- read only when someone is queued: an uncontended release never asks for the time
  while true do
    local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if not head then return nil end
    now = now or now_ms()
    local live, ttl, channel = live_waiter(head, now)
    if live then return head, ttl, channel end
    local last = redis.call('ZCARD', KEYS[2]) == 1
    dequeue(head)
    if last then return nil end
  end
end

-- How many live waiters are queued ahead of `token`, counting up to `limit` at most; waiters
-- whose heartbeat ran out are dropped on the way.
local function live_ahead(token, limit)
  local now, ahead = nil, 0
  while ahead < limit do
    local waiter = redis.call('ZRANGE', KEYS[2], ahead, ahead)[1]
    if not waiter or waiter == token then return ahead end
    now = now or now_ms()
    if live_waiter(waiter, now) then
      ahead = ahead + 1
    else
      local last = redis.call('ZCARD', KEYS[2]) == 1
      dequeue(waiter)
      if last then return ahead end
    end
  end
  return ahead
end

-- Joins the queue, or renews this waiter's place. `ttl` and `channel` are kept as given (text).
local function join_queue(token, ttl, heartbeat, channel)
  local arrival = now_us()
  redis.call('ZADD', KEYS[2], 'NX', int(arrival), token)
  redis.call('HSET', KEYS[3], token, int(math.floor(arrival / 1000) + heartbeat) .. ':' .. ttl .. ':' .. channel)
  redis.call('PEXPIRE', KEYS[2], int(heartbeat * 2))
  redis.call('PEXPIRE', KEYS[3], int(heartbeat * 2))
end

-- Tells the waiter `head` that it now holds the lock, with its fencing token: the message is all
-- it needs to go ahead. It goes to the waiter's own process when it gave a channel, so no other
-- process wakes for it. A counter that refuses a token (not a number) leaves the waiter to
-- confirm with its own attempt, which reports the refusal. Returns the message.
local function tell_new_holder(head, channel)
  local issued, fencing_token = pcall(next_fencing_token)
  local message = head .. ' ' .. (issued and int(fencing_token) or '-')
  if channel == '' then
    publish(message)
  else
    publish(message .. ' ' .. KEYS[1], channel)
  end
  return message
end

-- Hands the plain lock to the first live waiter, for at most `handoff_ms` (a waiter that died
-- before noticing cannot hold the line for long: it extends the lock to its TTL while it holds
-- it), and tells it. With nobody queued, deletes the lock (every blocking waiter is queued: no
-- one to tell). The hand-off overwrites the lock rather than deleting it first (see the top),
-- after dequeue's writes: under maxmemory Redis refuses a script whose first write may grow
-- memory (the SET), not one that has written already.
-- `when_free`, when given, may take the lock instead of its being deleted (a parked job: see
-- park.lua): it returns true when it did.
-- Returns the message, or nil when the lock was freed.
local function release_lock(handoff_ms, when_free)
  local head, ttl, channel = live_head()
  if not head then
    if not (when_free and when_free()) then redis.call('DEL', KEYS[1]) end
    return nil
  end
  dequeue(head)
  redis.call('SET', KEYS[1], head, 'PX', int(math.min(ttl, handoff_ms)))
  return tell_new_holder(head, channel)
end
