-- A unique job's enqueue lock claimed (shared/claim.lua) and, only when taken, the job pushed:
-- a job is pushed with its lock or not at all, in one round trip. The push is Sidekiq's own
-- commands for that job (SADD to its set of queues, LPUSH to its queue, or ZADD to its schedule).
-- KEYS: the lock, one key per push command, the fencing counter (last: shared/fencing.lua).
-- ARGV: the token, the TTL in ms, '1' when this is a send again after a reply was lost, then per
-- push command its name, its number of arguments and those arguments (after its key).
-- Returns the fencing token when claimed and pushed, or the holder's token; false when sent again
-- and the token holds the lock already: the first send may have pushed the job, so nothing is.
local lock_key = KEYS[1]
local token, ttl_ms, resent = ARGV[1], ARGV[2], ARGV[3] == '1'
local PUSHES = { SADD = true, LPUSH = true, ZADD = true }

local commands = {}
local at = 4
for index = 2, #KEYS - 1 do
  local name, count = ARGV[at], tonumber(ARGV[at + 1] or '')
  if not PUSHES[name] or not count then
    return redis.error_reply('ERR not a push command: ' .. tostring(name))
  end
  commands[#commands + 1] = { name, KEYS[index], at + 2, at + 1 + count }
  at = at + 2 + count
end
if resent and redis.call('GET', lock_key) == token then return false end

local claimed = claim(lock_key, token, ttl_ms)
if type(claimed) == 'string' then return claimed end
for _, command in ipairs(commands) do
  redis.call(command[1], command[2], unpack(ARGV, command[3], command[4]))
end
return claimed
