-- A waiter gives up (deadline, interrupt): leaves the queue, passes on a lock handed to it
-- meanwhile, and wakes the others when the lock is free. ARGV: token, hand-off ms; KEYS[4]:
-- the fencing counter.
dequeue(ARGV[1])
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  release_lock(tonumber(ARGV[2]))
elseif not current and redis.call('EXISTS', KEYS[2]) == 1 then
  publish('')
end
return 0
