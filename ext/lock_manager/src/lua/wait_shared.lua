-- A waiter's attempt on a semaphore. ARGV: token, TTL ms, heartbeat ms, channel, queued already
-- (as `wait.lua`), limit; KEYS as `wait.lua`. Takes a permit handed to this token, or a free one
-- when fewer live waiters are queued ahead than there are free permits; otherwise joins the
-- queue. Returns {1, fencing token} when admitted, {0, ms until the first holder expires} (-2:
-- none) when queued, or {-1, 0} as `wait.lua` does.
local token, ttl = ARGV[1], tonumber(ARGV[2])
if ARGV[5] == '1' then ttl = math.min(ttl, tonumber(ARGV[3])) end -- as `wait.lua` grants
local now = now_ms()
if holds(token, now) then
  admit(token, now, ttl)
  dequeue(token)
  return {1, next_fencing_token()}
end
if ARGV[5] == '1' and not redis.call('ZSCORE', KEYS[2], token) then return {-1, 0} end
local free = tonumber(ARGV[6]) - holders(now)
if free > 0 and live_ahead(token, free) < free then
  admit(token, now, ttl)
  dequeue(token)
  return {1, next_fencing_token()}
end
join_queue(token, ARGV[2], tonumber(ARGV[3]), ARGV[4])
return {0, first_expiry(now)}
