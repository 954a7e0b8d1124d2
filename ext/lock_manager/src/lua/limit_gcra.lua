-- One decision of a smooth rate limit (GCRA, the generic cell rate algorithm): each unit admitted
-- moves the limiter's theoretical arrival time (TAT) one emission interval further; a call is
-- admitted while the TAT it would leave is at most `burst` intervals past now. So from idle
-- `burst` units go at once, then one per interval, and any span of time T admits at most
-- burst + T / interval. Only the TAT is stored, and the key expires when it is reached: an idle
-- limiter keeps nothing. Redis's clock, never the client's.
-- KEYS: the limiter. ARGV: the emission interval (µs, a decimal: per / rate), the burst, the cost,
-- and to give back units an admitted decision took (a job refused by a later rule), "give".
-- Returns {admitted (1 or 0), remaining, retry after (µs), reset after (µs), receipt, receipt}:
-- remaining, the units that could go now; retry after, until this call would be admitted (0 when
-- it was); reset after, until the limiter is idle again; the receipt, what a give-back needs (none
-- here: the TAT only moves back by what the units moved it).
local limiter = KEYS[1]
local interval, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local give = ARGV[4] == 'give'

local now = now_us()
if give then
  local stored = tonumber(redis.call('GET', limiter))
  local tat = stored and math.ceil(stored - cost * interval)
  if tat and tat > now then
    redis.call('SET', limiter, int(tat), 'PX', math.ceil((tat - now) / 1000))
  elseif tat then
    redis.call('DEL', limiter)
  end
  return {1, 0, 0, 0, 0, 0}
end
local tat = math.max(tonumber(redis.call('GET', limiter)) or now, now)
local capacity = burst * interval -- how far past now the TAT may go
-- A small tolerance against the decimals of `interval`: 5 of 5 must not come out as 4.999.
local function units(span)
  return math.max(math.floor(span / interval + 1e-9), 0)
end

local after = tat + cost * interval
if after - now > capacity + 1e-6 then
  return {0, units(capacity - (tat - now)), math.ceil(after - now - capacity), math.ceil(tat - now), 0, 0}
end
-- Stored rounded up: a TAT a fraction late admits less, never more.
after = math.ceil(after)
redis.call('SET', limiter, int(after), 'PX', math.ceil((after - now) / 1000))
return {1, units(capacity - (after - now)), 0, after - now, 0, 0}
