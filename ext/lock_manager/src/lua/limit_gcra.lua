-- One decision of a smooth rate limit (GCRA, the generic cell rate algorithm): each unit admitted
-- moves the limiter's theoretical arrival time (TAT) one emission interval further; a call is
-- admitted while the TAT it would leave is at most `burst` intervals past now. So from idle
-- `burst` units go at once, then one per interval, and any span of time T admits at most
-- burst + T / interval. Redis's clock, never the client's.
-- A job refused may take a promise: its units join a second line, the TAT plus the units promised
-- to refused jobs, and it is told when that line reaches them. Newcomers queue behind the line, so
-- the job is admitted when it comes back (a redeem, checked against the TAT alone: exact whatever
-- the line says) instead of meeting every other job refused with it.
-- The key holds "<TAT>:<interval>:<burst>[:<line>]" (the rule beside the time, for
-- LockManager::Admin; the line while it is ahead) and expires when both are reached: an idle
-- limiter keeps nothing.
-- KEYS: the limiter. ARGV: the emission interval (µs, a decimal: per / rate), the burst, the cost,
-- and a mode: "" to decide; "promise" to decide, a refusal taking a promise; "redeem" to decide
-- for a job holding one; "give" and the receipt to give back the units of an admitted decision (a
-- job refused by a later rule): the TAT and the line move back by what of their span is still
-- ahead, none once it has passed (later units may stand where it was); "peek" to say what one
-- unit would meet, by the stored rule, changing nothing.
-- Returns {admitted (1 or 0), remaining, retry after (µs), reset after (µs), receipt, receipt}:
-- remaining, the units that could go now; retry after, until this call would be admitted (0 when
-- it was); reset after, until the limiter is idle again; the receipt: of an admitted decision, the
-- TAT it left and 0; of a refusal, {1, 0} when it holds a promise, else {0, 0}. A peek returns
-- {used, remaining, retry after, reset after, interval, burst}, or nil for an idle limiter.
local limiter = KEYS[1]
local interval, burst, cost, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

local now = now_us()
local stored = redis.call('GET', limiter)
local tat, line
if stored then
  local at, kept_interval, kept_burst, promised = string.match(stored, '^(%d+):([^:]+):(%d+):?(%d*)$')
  tat, line = tonumber(at), tonumber(promised)
  if mode == 'peek' then
    interval, burst, cost = kept_interval, kept_burst, 1
  end
elseif mode == 'peek' then
  return nil
end
local rule = interval .. ':' .. burst
local rule_interval, rule_burst = interval, burst
interval, burst = tonumber(interval), tonumber(burst)
local function keep(at, promised)
  local value, until_ = int(at) .. ':' .. rule, at
  if promised > at then
    value, until_ = value .. ':' .. int(promised), promised
  end
  redis.call('SET', limiter, value, 'PX', math.ceil((until_ - now) / 1000))
end

if mode == 'give' then
  local back = math.min(math.max(tonumber(ARGV[5]) - now, 0), cost * interval)
  if tat and back > 0 then
    tat, line = math.ceil(tat - back), math.ceil(math.max(line or tat, tat) - back)
    if math.max(tat, line) > now then
      keep(tat, line)
    else
      redis.call('DEL', limiter)
    end
  end
  return {1, 0, 0, 0, 0, 0}
end
tat = math.max(tat or now, now)
line = math.max(line or tat, tat)
local capacity = burst * interval -- how far past now the TAT may go
-- A small tolerance against the decimals of `interval`: 5 of 5 must not come out as 4.999.
local function units(span)
  return math.max(math.floor(span / interval + 1e-9), 0)
end
local function over(at)
  return at + cost * interval - now > capacity + 1e-6
end
local function retry(at)
  return math.ceil(at + cost * interval - now - capacity)
end

-- A redeem meets the TAT alone; everyone else queues behind the line.
local base = mode == 'redeem' and tat or line
local remaining = units(capacity - (line - now))
if mode == 'peek' then
  return {burst - remaining, remaining, over(line) and retry(line) or 0, math.ceil(line - now),
    rule_interval, rule_burst}
end
if over(base) then
  if mode == 'redeem' then
    return {0, remaining, retry(tat), math.ceil(line - now), 1, 0}
  elseif mode == 'promise' then
    line = math.ceil(line + cost * interval)
    keep(tat, line)
    return {0, remaining, retry(line - cost * interval), line - now, 1, 0}
  end
  return {0, remaining, retry(line), math.ceil(line - now), 0, 0}
end
-- Stored rounded up: a TAT a fraction late admits less, never more. A redeemed unit is on the
-- line already.
tat = math.ceil(tat + cost * interval)
line = mode == 'redeem' and math.max(line, tat) or math.ceil(line + cost * interval)
keep(tat, line)
return {1, units(capacity - (line - now)), 0, line - now, tat, 0}
