-- Issues the next fencing token from `counter` (by default KEYS[#KEYS]): one counter per hash
-- slot, in the lock's own slot, so the number only grows for every key (with gaps) and no per-key
-- counter outlives its lock. A missing counter (first use, or Redis restarted without persistence) starts
-- at Redis's clock in microseconds, above any number issued before it, since no Redis grants a
-- million locks a second: a holder from before the restart is still fenced off. (Lua numbers are
-- doubles: exact up to 2^53, about year 2255 in microseconds.)
local function next_fencing_token(counter)
  counter = counter or KEYS[#KEYS]
  local token = redis.call('INCR', counter)
  if token < FENCING_SEEDED then
    local now = now_us()
    if now > token then
      token = now
      redis.call('SET', counter, int(token))
    end
  end
  return token
end
