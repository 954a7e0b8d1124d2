-- Frees ARGV[1]'s permit of the semaphore KEYS[1] as release_shared.lua does (KEYS and ARGV as
-- there, and KEYS[5]: its parked jobs), but a free permit no live waiter is queued for goes to the
-- first parked job (shared/park.lua). Returns as release_shared.lua does: 1 as well when a parked
-- job took the permit.
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local now = now_ms()
local others = holders(now) - (holds(ARGV[1], now) and 1 or 0)
local message
if others < tonumber(ARGV[3]) then
  message = hand_permit(now, tonumber(ARGV[2]))
  if not message then unpark_head(KEYS[5]) end
end
redis.call('ZREM', KEYS[1], ARGV[1])
return message or 1
