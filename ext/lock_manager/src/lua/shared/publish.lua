-- Tells waiting processes, on `channel` or else the lock's own; a user whose ACL forbids the
-- channel only loses the wake-up (its waiters fall back to their backoff), never the release.
local function publish(message, channel)
  redis.pcall('PUBLISH', channel or (CHANNEL_PREFIX .. KEYS[1]), message)
end
