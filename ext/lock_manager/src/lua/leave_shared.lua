-- A semaphore's waiter gives up (deadline, interrupt): leaves the queue, and passes on a permit
-- handed to it meanwhile, or any free one, to the next live waiter. ARGV: token, hand-off ms,
-- limit; KEYS as `wait.lua`.
local now = now_ms()
local others = redis.call('ZCARD', KEYS[2]) - (redis.call('ZSCORE', KEYS[2], ARGV[1]) and 1 or 0)
local holding = redis.call('ZSCORE', KEYS[1], ARGV[1])
dequeue(ARGV[1])
if others > 0 and holders(now) - (holds(ARGV[1], now) and 1 or 0) < tonumber(ARGV[3]) then
  hand_permit(now, tonumber(ARGV[2]))
end
if holding then redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
