-- Resets the TTL to ARGV[2] ms only while ARGV[1] (token) still holds the lock KEYS[1].
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
