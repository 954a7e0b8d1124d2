-- Frees ARGV[1]'s permit of the semaphore KEYS[1] and hands a free permit to the first live
-- waiter (for at most ARGV[2] ms until it extends it), with ARGV[3] the limit. KEYS as
-- `wait.lua`. Returns 0 when ARGV[1] held no permit, 1 when freed, or the hand-off message.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
local now = now_ms()
if holders(now) < tonumber(ARGV[3]) then
  return hand_permit(now, tonumber(ARGV[2])) or 1
end
return 1
