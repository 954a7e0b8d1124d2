# frozen_string_literal: true

# Run by spec/lock_manager/fork_spec.rb: ruby fork_in_block.rb REDIS_URL PREFIX HOW
# A block holding a lock forks; the child ends the block HOW (exit, raise, exit!, return). Prints
# what the parent saw, as JSON: whether the lock kept the parent's token while the child ended,
# and the Result after the parent's block.
require "json"
require "redis"
require "lock_manager"

url, prefix, how = ARGV
parent = Process.pid
admin = Redis.new(url: url)
locker = LockManager::Locker.new(redis_url: url, key_prefix: prefix)
key = "#{prefix}held"
kept = nil
result = locker.nonblocking_lock("held", timeout: 30) do |held|
  token = admin.get(key)
  pid = fork do
    $stderr.reopen(File::NULL) # the child's own exception is expected
    case how
    when "exit" then exit(0)
    when "raise" then raise "boom in the child"
    when "exit!" then exit!(0)
    end
  end
  Process.wait(pid) if pid
  next :child if Process.pid != parent # "return": the child leaves the block like the parent would

  sleep 0.05 # anything the child sent has reached Redis
  kept = admin.get(key) == token && !held.lost?
  :parent
end
exit!(0) if Process.pid != parent

puts JSON.generate(kept: kept, result: result.result, lost: result.lost?, left: admin.exists?(key))
