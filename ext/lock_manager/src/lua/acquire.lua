-- The uncontended acquire as one script: what a Locker uses until a script has run on its pool,
-- so that a Redis user who may not run scripts, and so could never release, is refused before it
-- takes anything. KEYS[1]: the lock, KEYS[2]: the fencing counter; ARGV: token, TTL ms. Returns
-- the fencing token, or 0 when held by another. The token is issued first: a counter that is
-- refused (ACL, not a number, OOM) fails the script before it writes the lock.
local fencing_token = next_fencing_token()
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return fencing_token end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return fencing_token
end
return 0
