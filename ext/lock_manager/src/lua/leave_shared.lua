-- A semaphore's waiter gives up (deadline, interrupt): leaves the queue, and passes on a permit
-- handed to it meanwhile, or any free one, to the next live waiter. ARGV: token, hand-off ms,
-- limit; KEYS as `wait.lua`.
dequeue(ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
local now = now_ms()
if holders(now) < tonumber(ARGV[3]) then hand_permit(now, tonumber(ARGV[2])) end
return 0
