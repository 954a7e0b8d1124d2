-- Takes the lock KEYS[1] for the token ARGV[1] (a job's id) for ARGV[2] ms, unless another token
-- holds it: the enqueue lock of a unique job, released later by whichever process runs the job.
-- A lock the token holds already gets the new TTL (a retry, a job pushed again by its own
-- process). KEYS[2]: the fencing counter. Returns the fencing token, or the holder's token.
-- The token is issued first, as in acquire.lua: a refused counter fails before the lock is set.
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return holder end
local fencing_token = next_fencing_token()
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return fencing_token
