-- A waiter gives up (deadline, interrupt): leaves the queue, passes on a lock handed to it
-- meanwhile, and wakes the others when the lock is free. ARGV: token, hand-off ms; KEYS[4]:
-- the fencing counter.
local current = redis.call('GET', KEYS[1])
local others = redis.call('ZCARD', KEYS[2]) - (redis.call('ZSCORE', KEYS[2], ARGV[1]) and 1 or 0)
dequeue(ARGV[1])
if current == ARGV[1] then
  if others > 0 then release_lock(tonumber(ARGV[2])) else redis.call('DEL', KEYS[1]) end
elseif not current and others > 0 then
  publish('')
end
return 0
