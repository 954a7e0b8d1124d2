-- A job that found its lock held (every permit taken, for a semaphore) parks: it waits in Redis,
-- behind the jobs parked before it, for a release to hand the lock to it and push it to its queue
-- (shared/park.lua).
-- KEYS: the lock, its parked jobs, Sidekiq's schedule, then the key of each push command.
-- ARGV: '1' when this is a send again after a reply was lost, the job's token, the TTL in ms its
-- lock is handed over with, the grace in ms of its fallback, how many jobs may be parked at most
-- (0: no limit), its fallback (a member of the schedule), the lock's limit (1: a plain lock), its
-- number of push commands, then each command as its name, its number of arguments and those
-- arguments (after its key).
-- Returns {1, its place in line} when parked; {0, how many are parked} when as many as allowed
-- are, and nothing is written; {2, 0} when the lock had room: it is handed to the first parked
-- job at once (this one, when it parked alone), which is pushed to its queue.
local parked_key, schedule = KEYS[2], KEYS[3]
local resent, token, ttl_ms, grace_ms = ARGV[1] == '1', ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local most, fallback, limit, commands = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local PUSHES = { SADD = true, LPUSH = true }

local push, key_at, arg_at = {}, 4, 9
for _ = 1, commands do
  local name, count = ARGV[arg_at], tonumber(ARGV[arg_at + 1] or '')
  if not PUSHES[name] or not count then
    return redis.error_reply('ERR not a push command: ' .. tostring(name))
  end
  local command = { name, KEYS[key_at] }
  for at = arg_at + 2, arg_at + 1 + count do command[#command + 1] = ARGV[at] end
  push[#push + 1] = command
  key_at, arg_at = key_at + 1, arg_at + 2 + count
end
if key_at - 1 ~= #KEYS or arg_at - 1 ~= #ARGV then
  return redis.error_reply('ERR the keys and arguments of the push do not match')
end

local raw = cjson.encode({ token, ttl_ms, grace_ms, schedule, fallback, push, limit })
-- A first send that ran parked the job already: it keeps its place.
if resent then
  local place = redis.call('LPOS', parked_key, raw)
  if place then return { 1, place + 1 } end
end
local parked = redis.call('LLEN', parked_key)
if most > 0 and parked >= most then return { 0, parked } end
redis.call('RPUSH', parked_key, raw)
if unpark_while_room(parked_key) then return { 2, 0 } end
if parked == 0 then arm_fallback(parked_entry(raw), room_after(limit) + grace_ms) end
return { 1, parked + 1 }
