-- One decision of an exact sliding-window limit: at most `limit` units in any window of `length`
-- ending now. Each unit admitted is one member of a sorted set, scored by the time it was admitted
-- (members `time:n`: n counts the units in the window, so no two share a name), and members that
-- have left the window are removed first. One more member, scored 0, names the rule
-- ("=<length>:<limit>", for LockManager::Admin). The set expires when its newest unit leaves the
-- window: an idle limiter keeps nothing; a busy one keeps `limit` units at most.
-- A job refused may take a promise: its units join the set as future members, which every later
-- decision counts (so newcomers queue behind them), scored a tenth of a window after the moment
-- they would be admitted; it is told that moment. Coming back (a redeem) within that tenth, it is
-- admitted on those members, which count it for a whole window from when it runs and longer
-- (exact, never more); later, its members move to now if no window ending from then on would hold
-- more than `limit`, else it takes a promise again.
-- KEYS: the limiter. ARGV: the window (µs), the limit, the cost, and a mode: "" to decide;
-- "promise" to decide, a refusal taking a promise; "redeem" and the promise, to decide for a job
-- holding one; "give" and the receipt (the time and first number of the members the decision
-- added, which it removes; it comes a round trip after its decision, so no unit added later is
-- named in the same microsecond) to give back units; "peek" to say what one unit would meet, by
-- the stored rule, changing nothing.
-- Returns {admitted (1 or 0), remaining, retry after (µs), reset after (µs), time, first number}:
-- an admitted decision's receipt, or a refusal's promise ({0, 0}: none), as limit_gcra.lua. A peek
-- returns {used, remaining, retry after, reset after, length, limit}, or nil.
local limiter = KEYS[1]
local length, limit, cost, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

local function names(time, first)
  local list = {}
  for n = first, first + cost - 1 do
    list[#list + 1] = time .. ':' .. int(n)
  end
  return list
end

if mode == 'give' then
  redis.call('ZREM', limiter, unpack(names(ARGV[5], tonumber(ARGV[6]))))
  return {1, 0, 0, 0, 0, 0}
end
local rules = redis.call('ZRANGEBYSCORE', limiter, 0, 0)
if mode == 'peek' then
  if not rules[1] then
    return nil
  end
  length, limit = string.match(rules[1], '^=([^:]+):(.+)$')
  cost = 1
end
local rule = '=' .. length .. ':' .. limit
local rule_length, rule_limit = length, limit
length, limit = tonumber(length), tonumber(limit)

local now = now_us()
-- Members before the units: the rule's, and in a peek (which removes nothing) units that have left.
local skip = #rules
if mode == 'peek' then
  skip = skip + redis.call('ZCOUNT', limiter, '(0', int(now - length))
else
  redis.call('ZREMRANGEBYSCORE', limiter, '(0', int(now - length))
end
local used = redis.call('ZCARD', limiter) - skip

-- Until the unit at `rank` (0: the oldest) leaves the window; a whole window when there is none
-- (a process that counts with a smaller limit than another's).
local function left_after(rank)
  local member = redis.call('ZRANGE', limiter, rank + skip, rank + skip, 'WITHSCORES')
  if member[2] == nil then
    return length
  end
  return math.max(tonumber(member[2]) + length - now, 0)
end
local function newest()
  return used > 0 and left_after(used - 1) or 0
end

-- How long after its moment a promised unit is counted from: the lateness a job coming back may
-- have (a scheduler's poll) without losing its place.
local allowance = math.floor(length / 10)
-- A redeem: within its allowance, admitted on its members; later, they move to now if every
-- window ending from when they newly count (a whole window after their score, or now) holds room.
local promised = mode == 'redeem' and tonumber(ARGV[5]) or 0
if promised > 0 then
  local own = names(ARGV[5], tonumber(ARGV[6]))
  if redis.call('ZSCORE', limiter, own[1]) then
    if promised >= now then
      local early = math.max(promised - allowance - now, 0)
      return {early > 0 and 0 or 1, math.max(limit - used, 0), early, newest(), promised, tonumber(ARGV[6])}
    end
    local from = math.max(now, promised + length)
    local ends = {from}
    local later = redis.call('ZRANGEBYSCORE', limiter, '(' .. int(from), '(' .. int(now + length),
      'WITHSCORES')
    for i = 2, #later, 2 do
      ends[#ends + 1] = tonumber(later[i])
    end
    local fits = true
    for _, at in ipairs(ends) do
      if redis.call('ZCOUNT', limiter, '(' .. int(at - length), int(at)) + cost > limit then
        fits = false
        break
      end
    end
    if fits then
      for _, name in ipairs(own) do
        redis.call('ZADD', limiter, 'XX', int(now), name)
      end
      local reset = math.max(newest(), length)
      redis.call('PEXPIRE', limiter, int(math.ceil(reset / 1000)))
      return {1, math.max(limit - used, 0), 0, reset, promised, tonumber(ARGV[6])}
    end
    redis.call('ZREM', limiter, unpack(own))
    used = used - cost
  end
end

local refused = used + cost > limit
if mode == 'peek' then
  return {used, math.max(limit - used, 0), refused and left_after(used - limit) or 0, newest(),
    rule_length, rule_limit}
end
-- Admitted once the oldest (used + cost - limit) units have left (future members count too).
local wait = refused and left_after(used + cost - limit - 1) or 0
if refused and mode == '' then
  return {0, math.max(limit - used, 0), wait, newest(), 0, 0}
end
if rules[1] ~= rule or rules[2] then
  redis.call('ZREMRANGEBYSCORE', limiter, 0, 0)
  redis.call('ZADD', limiter, 0, rule)
end
local at = now + (refused and wait + allowance or 0)
local reset = math.max(at - now + length, newest())
for _, name in ipairs(names(int(at), used + 1)) do
  redis.call('ZADD', limiter, int(at), name)
end
redis.call('PEXPIRE', limiter, int(math.ceil(reset / 1000)))
if refused then
  return {0, math.max(limit - used, 0), wait, reset, at, used + 1}
end
return {1, limit - used - cost, 0, reset, at, used + 1}
