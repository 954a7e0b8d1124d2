-- Takes the lock `lock_key` for `token` (a job's id) for `ttl_ms` ms unless another token holds
-- it; a lock the token holds already gets the new TTL (a retry, a job pushed again by its own
-- process). `counter`: the lock's fencing counter. Returns the fencing token, or the holder's
-- token. The fencing token is issued first, as in acquire.lua: a refused counter fails before the
-- lock is set.
local function claim(lock_key, token, ttl_ms, counter)
  local holder = redis.call('GET', lock_key)
  if holder and holder ~= token then return holder end
  local fencing_token = next_fencing_token(counter)
  redis.call('SET', lock_key, token, 'PX', ttl_ms)
  return fencing_token
end
