-- Releases the lock only while ARGV[1] (token) holds it, handing it to the next live waiter
-- (for at most ARGV[2] ms until it extends it). Never touches another holder's lock. KEYS[4]:
-- the fencing counter, for the waiter handed the lock. Returns 0 when ARGV[1] did not hold it,
-- 1 when it is freed, or the hand-off message when handed over: the releasing process tells
-- its own waiter at once, ahead of the publication.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return release_lock(tonumber(ARGV[2])) or 1
