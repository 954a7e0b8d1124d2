-- A waiter's attempt. ARGV: token, lock TTL ms, heartbeat ms, the channel its process listens
-- on for hand-offs to it ('' for the lock's channel); KEYS[4]: the fencing counter.
-- Takes the lock when it was handed to this token, or when it is free and no live waiter queued
-- earlier; otherwise joins the queue (or renews its place). Returns {1, fencing token} when
-- held, else {0, the lock's PTTL} (-2: free, another waiter's turn).
local token, ttl = ARGV[1], tonumber(ARGV[2])
local current = redis.call('GET', KEYS[1])
if current == token then
  redis.call('PEXPIRE', KEYS[1], ttl)
  dequeue(token)
  return {1, next_fencing_token()}
end
if not current then
  local head = live_head()
  if not head or head == token then
    redis.call('SET', KEYS[1], token, 'PX', ttl)
    dequeue(token)
    return {1, next_fencing_token()}
  end
end
local heartbeat = tonumber(ARGV[3])
local arrival = now_us()
local now = math.floor(arrival / 1000)
redis.call('ZADD', KEYS[2], 'NX', arrival, token)
redis.call('HSET', KEYS[3], token, string.format('%d', now + heartbeat) .. ':' .. ttl .. ':' .. ARGV[4])
redis.call('PEXPIRE', KEYS[2], heartbeat * 2)
redis.call('PEXPIRE', KEYS[3], heartbeat * 2)
return {0, redis.call('PTTL', KEYS[1])}
