-- Frees ARGV[1]'s permit of the semaphore KEYS[1] and hands a free permit to the first live
-- waiter (for at most ARGV[2] ms until it extends it), with ARGV[3] the limit. KEYS as
-- `wait.lua`. Returns 0 when ARGV[1] held no permit, 1 when freed, or the hand-off message.
-- The permit is handed on before this token's is removed: the set is never empty in between (see
-- `queue.lua`).
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local now = now_ms()
local others = holders(now) - (holds(ARGV[1], now) and 1 or 0)
local message
if others < tonumber(ARGV[3]) then message = hand_permit(now, tonumber(ARGV[2])) end
redis.call('ZREM', KEYS[1], ARGV[1])
return message or 1
