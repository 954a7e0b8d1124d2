-- One decision of a smooth rate limit (GCRA, the generic cell rate algorithm): each unit admitted
-- moves the limiter's theoretical arrival time (TAT) one emission interval further; a call is
-- admitted while the TAT it would leave is at most `burst` intervals past now. So from idle
-- `burst` units go at once, then one per interval, and any span of time T admits at most
-- burst + T / interval. The key holds "<TAT>:<interval>:<burst>" (the rule beside the time, for
-- LockManager::Admin) and expires when the TAT is reached: an idle limiter keeps nothing. Redis's
-- clock, never the client's.
-- KEYS: the limiter. ARGV: the emission interval (µs, a decimal: per / rate), the burst, the cost,
-- and a mode: "give" to give back units an admitted decision took (a job refused by a later rule),
-- "peek" to say what one unit would meet, by the stored rule, changing nothing.
-- Returns {admitted (1 or 0), remaining, retry after (µs), reset after (µs), receipt, receipt}:
-- remaining, the units that could go now; retry after, until this call would be admitted (0 when
-- it was); reset after, until the limiter is idle again; the receipt, what a give-back needs (none
-- here: the TAT only moves back by what the units moved it). A peek returns
-- {used, remaining, retry after, reset after, interval, burst}, or nil for an idle limiter.
local limiter = KEYS[1]
local interval, burst, cost, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

local now = now_us()
local stored = redis.call('GET', limiter)
local tat
if stored then
  local at, kept_interval, kept_burst = string.match(stored, '^(%d+):([^:]+):(%d+)$')
  tat = tonumber(at)
  if mode == 'peek' then
    interval, burst, cost = kept_interval, kept_burst, 1
  end
elseif mode == 'peek' then
  return nil
end
local rule = interval .. ':' .. burst
local rule_interval, rule_burst = interval, burst
interval, burst = tonumber(interval), tonumber(burst)
local function keep(at)
  redis.call('SET', limiter, int(at) .. ':' .. rule, 'PX', math.ceil((at - now) / 1000))
end

if mode == 'give' then
  tat = tat and math.ceil(tat - cost * interval)
  if tat and tat > now then
    keep(tat)
  elseif tat then
    redis.call('DEL', limiter)
  end
  return {1, 0, 0, 0, 0, 0}
end
tat = math.max(tat or now, now)
local capacity = burst * interval -- how far past now the TAT may go
-- A small tolerance against the decimals of `interval`: 5 of 5 must not come out as 4.999.
local function units(span)
  return math.max(math.floor(span / interval + 1e-9), 0)
end

local after = tat + cost * interval
local refused = after - now > capacity + 1e-6
if mode == 'peek' then
  local remaining = units(capacity - (tat - now))
  local retry = refused and math.ceil(after - now - capacity) or 0
  return {burst - remaining, remaining, retry, math.ceil(tat - now), rule_interval, rule_burst}
end
if refused then
  return {0, units(capacity - (tat - now)), math.ceil(after - now - capacity), math.ceil(tat - now), 0, 0}
end
-- Stored rounded up: a TAT a fraction late admits less, never more.
after = math.ceil(after)
keep(after)
return {1, units(capacity - (after - now)), 0, after - now, 0, 0}
