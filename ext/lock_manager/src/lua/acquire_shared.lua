-- One attempt on a semaphore, ahead of any queue: admits ARGV[1] (token) as one of at most
-- ARGV[3] holders for ARGV[2] ms. A token already admitted is renewed (a re-sent acquire must
-- not fail because of itself). KEYS: the semaphore, its queue, its waiters, the fencing counter.
-- Returns {1, fencing token}, or {0, ms until the first holder expires}. Its first write is the
-- ZADD, which Redis refuses under maxmemory.
local now = now_ms()
if holds(ARGV[1], now) or holders(now) < tonumber(ARGV[3]) then
  admit(ARGV[1], now, tonumber(ARGV[2]))
  return {1, next_fencing_token()}
end
return {0, first_expiry(now)}
