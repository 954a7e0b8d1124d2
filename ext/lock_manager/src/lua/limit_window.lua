-- One decision of a fixed-window limit: at most `limit` units per window, the windows aligned to
-- Redis's clock (a window of 3600 s starts on the hour). A job refused may take a promise: its
-- units are counted in the first later window with room, and it is told when that window starts;
-- coming back then (a redeem), it is admitted on those units. So a window never counts more than
-- `limit`, and jobs refused together come back spread over the windows that have room for them.
-- One hash holds the rule ("<length>:<limit>", for LockManager::Admin), the count of each window
-- from the current one to the last promised (`low`, `high`) and expires when that one ends: an
-- idle limiter keeps nothing.
-- KEYS: the limiter. ARGV: the window (µs), the limit, the cost, and a mode: "" to decide;
-- "promise" to decide, a refusal taking a promise; "redeem" and the promised window, to decide
-- for a job holding one (a window that has passed is no promise); "give" and the receipt's window
-- to give back units (units of a window that has ended are gone with it); "peek" to say what one
-- unit would meet, by the stored rule, changing nothing.
-- Returns {admitted (1 or 0), remaining, retry after (µs), reset after (µs), window, 0}, as
-- limit_gcra.lua: an admitted decision's window is its receipt, a refusal's its promise (0: none).
-- A peek returns {used, remaining, retry after, reset after, length, limit}, or nil.
local limiter = KEYS[1]
local length, limit, cost, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

local stored = redis.call('HMGET', limiter, 'rule', 'low', 'high')
if mode == 'peek' then
  if not stored[1] then
    return nil
  end
  length, limit = string.match(stored[1], '^([^:]+):(.+)$')
  cost = 1
end
local rule, rule_length, rule_limit = length .. ':' .. limit, length, limit
length, limit = tonumber(length), tonumber(limit)

local now = now_us()
local window = math.floor(now / length)
local low, high = tonumber(stored[2]) or window, math.max(tonumber(stored[3]) or window, window)
local function used_in(w)
  return tonumber(redis.call('HGET', limiter, int(w))) or 0
end
local used = used_in(window)
local function starts(w)
  return w * length - now
end

-- The first window from `w` on with room for the cost (those past `high` are empty).
local function room_from(w)
  while w <= high and used_in(w) + cost > limit do
    w = w + 1
  end
  return w
end

if mode == 'give' then
  local receipt = tonumber(ARGV[5])
  local counted = receipt >= window and used_in(receipt) or 0
  if counted > 0 then -- else gone with its window, or reset: nothing to give, no key to make
    redis.call('HSET', limiter, int(receipt), int(math.max(counted - cost, 0)))
  end
  return {1, 0, 0, 0, 0, 0}
end
local refused = used + cost > limit
if mode == 'peek' then
  return {used, math.max(limit - used, 0), refused and starts(room_from(window + 1)) or 0,
    starts(high + 1), rule_length, rule_limit}
end
-- Counts of windows that have ended go (none is older than `low`).
for w = low, math.min(window - 1, high) do
  redis.call('HDEL', limiter, int(w))
end
-- Window `w` counts `total` units from now on.
local function count(w, total)
  redis.call('HSET', limiter, 'rule', rule, 'low', int(window), 'high', int(math.max(high, w)),
    int(w), int(total))
  redis.call('PEXPIREAT', limiter, int(math.ceil((math.max(high, w) + 1) * length / 1000)))
end

local promised = mode == 'redeem' and tonumber(ARGV[5]) or 0
if promised > window then
  return {0, math.max(limit - used, 0), starts(promised), starts(high + 1), promised, 0}
elseif promised == window then
  return {1, math.max(limit - used, 0), 0, starts(high + 1), window, 0}
elseif not refused then
  count(window, used + cost)
  return {1, limit - used - cost, 0, starts(high + 1), window, 0}
elseif mode == 'promise' or mode == 'redeem' then
  -- Windows up to `high` were filled in order: the promise goes to the last, or the one after.
  local target = math.max(high, window + 1)
  local held = used_in(target)
  if held + cost > limit then
    target, held = target + 1, 0 -- past `high`: empty
  end
  count(target, held + cost)
  return {0, math.max(limit - used, 0), starts(target), starts(target + 1), target, 0}
end
return {0, math.max(limit - used, 0), starts(room_from(window + 1)), starts(high + 1), 0, 0}
