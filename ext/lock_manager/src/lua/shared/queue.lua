-- The queue of a plain lock: KEYS[2] holds the waiters in arrival order (a sorted set: token ->
-- arrival in microseconds), KEYS[3] their details (a hash: token -> "heartbeat deadline ms:lock
-- ttl ms:channel").

-- The first queued waiter whose heartbeat is still running, the TTL it asked for and the channel
-- its process listens on ('' for none); waiters whose process stopped renewing their heartbeat
-- are dropped on the way.
local function live_head()
  local now
  while true do
    local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if not head then return nil end
    now = now or now_ms()
    local entry = redis.call('HGET', KEYS[3], head)
    if entry then
      local deadline, ttl, channel = string.match(entry, '^(%d+):(%d+):(.*)$')
      if deadline and tonumber(deadline) > now then return head, tonumber(ttl), channel end
    end
    redis.call('ZREM', KEYS[2], head)
    redis.call('HDEL', KEYS[3], head)
  end
end

local function dequeue(token)
  redis.call('ZREM', KEYS[2], token)
  redis.call('HDEL', KEYS[3], token)
end

-- Hands the lock to the first live waiter, for at most `handoff_ms` (a waiter that died before
-- noticing cannot hold the line for long: it extends the lock to its TTL while it holds it), with
-- its fencing token, and tells it both: the message is all it needs to go ahead. It goes to the
-- waiter's own process when it gave a channel, so no other process wakes for it. With nobody
-- queued, deletes the lock (every blocking waiter is queued: no one to tell).
-- DEL comes first: under maxmemory Redis refuses a script whose first write may grow memory
-- (the hand-off's SET), not one that already freed some. A counter that refuses a token (not a
-- number) leaves the waiter to confirm with its own attempt, which reports the refusal.
-- Returns the message, or nil when the lock was freed.
local function release_lock(handoff_ms)
  redis.call('DEL', KEYS[1])
  local head, ttl, channel = live_head()
  if head then
    redis.call('SET', KEYS[1], head, 'PX', math.min(ttl, handoff_ms))
    dequeue(head)
    local issued, fencing_token = pcall(next_fencing_token)
    local message = head .. ' ' .. (issued and string.format('%d', fencing_token) or '-')
    if channel == '' then
      publish(message)
    else
      publish(message .. ' ' .. KEYS[1], channel)
    end
    return message
  end
end
