-- A waiter's attempt on a plain lock. ARGV: token, lock TTL ms, heartbeat ms, the channel its
-- process listens on for hand-offs to it ('' for the lock's channel), and '1' when the waiter
-- is queued already; KEYS: the lock, its queue, its waiters, the fencing counter. Takes the lock
-- when it was handed to this token, or when it is free and no live waiter queued earlier;
-- otherwise joins the queue (or renews its place). Returns {1, fencing token} when held, {0, the
-- lock's PTTL} (-2: free, another's turn) when queued, or {-1, 0} when a waiter that was queued
-- is not any more (its place lapsed; or this is a late copy of an attempt, sent again after a
-- lost reply, arriving after the waiter left or released): then it changes nothing, so such an
-- attempt needs no undo and the waiter keeps its token and its place. Such an attempt takes the
-- lock only for the heartbeat (as a hand-off does): the waiter extends it to its TTL, and a copy
-- that Redis runs after the waiter gave up cannot hold the line for longer.
local token = ARGV[1]
local grant = ARGV[2]
if ARGV[5] == '1' then grant = int(math.min(tonumber(ARGV[2]), tonumber(ARGV[3]))) end
local current = redis.call('GET', KEYS[1])
if current == token then
  redis.call('PEXPIRE', KEYS[1], grant)
  dequeue(token)
  return {1, next_fencing_token()}
end
if ARGV[5] == '1' and not redis.call('ZSCORE', KEYS[2], token) then return {-1, 0} end
if not current then
  local head = live_head()
  if not head or head == token then
    redis.call('SET', KEYS[1], token, 'PX', grant)
    dequeue(token)
    return {1, next_fencing_token()}
  end
end
join_queue(token, ARGV[2], tonumber(ARGV[3]), ARGV[4])
return {0, redis.call('PTTL', KEYS[1])}
