-- The enqueue lock of a unique job, released later by whichever process runs the job: see
-- shared/claim.lua. KEYS: the lock, the fencing counter. ARGV: the token, the TTL in ms.
-- Returns the fencing token, or the holder's token.
local lock_key, counter = KEYS[1], KEYS[2]
local token, ttl_ms = ARGV[1], ARGV[2]
return claim(lock_key, token, ttl_ms, counter)
