-- Unique jobs' enqueue locks claimed (shared/claim.lua) and, for each claim taken, its job pushed:
-- a job is pushed with its lock or not at all, a whole batch in one script. A job's push is
-- Sidekiq's own commands for it (SADD to its set of queues, LPUSH to its queue, or ZADD to its
-- schedule). A job that replaces (on_conflict: :replace) takes a lock another job holds when that
-- job is still pending: its own push is taken out of its queue or schedule (where the job that
-- pushed it is remembered, beside the lock), never a job that started.
-- KEYS, per job: its lock, where its push is remembered (a job that replaces only), one key per push
-- command, its fencing counter.
-- ARGV: '1' when this is a send again after a reply was lost, then per job its token, its TTL in
-- ms, its number of push commands and '1' when it replaces, each command then as its name, its
-- number of arguments and those arguments (after its key).
-- Returns per job: the fencing token when claimed and pushed, {the fencing token, the replaced
-- job's token} when it replaced a pending job, or the holder's token; false when sent again and
-- the token holds the lock already: the first send may have pushed the job, so nothing is pushed
-- again.
local resent = ARGV[1] == '1'
local PUSHES = { SADD = true, LPUSH = true, ZADD = true }

-- Every job read, and its commands checked, before anything is written.
local jobs = {}
local key_at, arg_at = 1, 2
while arg_at <= #ARGV do
  local job = { lock = KEYS[key_at], token = ARGV[arg_at], ttl_ms = ARGV[arg_at + 1], commands = {} }
  local count = tonumber(ARGV[arg_at + 2] or '')
  if not count then return redis.error_reply('ERR a job without its number of push commands') end
  job.replaces = ARGV[arg_at + 3] == '1'
  key_at, arg_at = key_at + 1, arg_at + 4
  if job.replaces then job.pending, key_at = KEYS[key_at], key_at + 1 end
  for _ = 1, count do
    local name, args = ARGV[arg_at], tonumber(ARGV[arg_at + 1] or '')
    if not PUSHES[name] or not args then
      return redis.error_reply('ERR not a push command: ' .. tostring(name))
    end
    job.commands[#job.commands + 1] = { name, KEYS[key_at], arg_at + 2, arg_at + 1 + args }
    key_at, arg_at = key_at + 1, arg_at + 2 + args
  end
  job.counter = KEYS[key_at]
  key_at = key_at + 1
  jobs[#jobs + 1] = job
end
if key_at - 1 ~= #KEYS or arg_at - 1 ~= #ARGV then
  return redis.error_reply('ERR the keys and arguments of the pushes do not match')
end

-- The pushes of the jobs taken, one command per name and key, its arguments in the jobs' order:
-- an LPUSH of several values pushes them in order, as one LPUSH each would.
local pushes, order = {}, {}
local function push(command)
  local id = command[1] .. ' ' .. command[2]
  local batch = pushes[id]
  if not batch then
    batch = { command[1], command[2] }
    pushes[id] = batch
    order[#order + 1] = batch
  end
  for at = command[3], command[4] do batch[#batch + 1] = ARGV[at] end
end

-- Whether the job `holder` is still pending, by the push remembered at `pending`: then that push
-- is taken out of its queue or schedule, and the job will not run.
local function unpushed(pending, holder)
  local remembered = redis.call('GET', pending)
  if not remembered then return false end
  local token, name, key, member = unpack(cjson.decode(remembered))
  if token ~= holder then return false end
  local removed = name == 'ZADD' and redis.call('ZREM', key, member) or redis.call('LREM', key, 1, member)
  return removed == 1
end

-- The lock a replaced job held, now `job`'s.
local function take_over(job)
  local fencing_token = next_fencing_token(job.counter)
  redis.call('SET', job.lock, job.token, 'PX', job.ttl_ms)
  return fencing_token
end

-- Remembers where `job` was pushed (its LPUSH or ZADD, whose last argument is the job), while its lock lives.
local function remember(job)
  for _, command in ipairs(job.commands) do
    if command[1] ~= 'SADD' then
      local pushed = cjson.encode({ job.token, command[1], command[2], ARGV[command[4]] })
      redis.call('SET', job.pending, pushed, 'PX', job.ttl_ms)
    end
  end
end

local replies = {}
for index, job in ipairs(jobs) do
  local reply = false
  if not (resent and redis.call('GET', job.lock) == job.token) then
    reply = claim(job.lock, job.token, job.ttl_ms, job.counter)
    if type(reply) == 'string' and job.replaces and unpushed(job.pending, reply) then
      reply = { take_over(job), reply }
    end
    if type(reply) ~= 'string' then
      for _, command in ipairs(job.commands) do push(command) end
      if job.replaces then remember(job) end
    end
  end
  replies[index] = reply
end
-- At most CHUNK arguments a call (Lua's unpack has a limit); even, so ZADD's pairs stay whole.
local CHUNK = 1000
for _, batch in ipairs(order) do
  for first = 3, #batch, CHUNK do
    redis.call(batch[1], batch[2], unpack(batch, first, math.min(first + CHUNK - 1, #batch)))
  end
end
return replies
