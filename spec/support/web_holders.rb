# frozen_string_literal: true

# A process of its own holding real locks for spec/web (as an app's processes would), run as
# `ruby -Ilib spec/support/web_holders.rb REDIS_URL KEY_PREFIX`. It prints one JSON line per event on
# stdout: "ready" once every lock is held and the waiter queued (with their tokens), then "acquired"
# when the fair waiter takes the plain lock. It exits when its stdin closes.
require "json"
require "securerandom"
require "lock_manager"

$stdout.sync = true
redis_url, key_prefix = ARGV
say = ->(event) { puts JSON.generate(event) }
lockers = Array.new(5) { LockManager::Locker.new(redis_url: redis_url, key_prefix: key_prefix, pool_size: 2) }
ODD_KEY = "odd:<b>bold</b> \"quoted\" & \xFF\n".b

# A plain lock held by a handle, and a weekly one beside it.
report = lockers[0].lock("report:daily", timeout: 120)
weekly = lockers[0].lock("report:weekly", timeout: 120)
# A semaphore: two of its three places taken, each by a thread of its own.
semaphore_ready = Queue.new
finish = Queue.new
2.times do |index|
  Thread.new do
    lockers[1 + index].nonblocking_lock("partner-api", limit: 3, timeout: 120) do
      semaphore_ready << true
      finish.pop
    end
  end
end
2.times { semaphore_ready.pop }
# A job's claim (the token is its jid), and a key no HTML or UTF-8 expects.
jid = SecureRandom.hex(12)
lockers[3].claim(["sync:user:7"], [jid], [120])
odd = lockers[3].lock(ODD_KEY, timeout: 120)

# A fair waiter queued on the plain lock: it takes the lock once it is released.
waiter = Thread.new do
  lockers[4].blocking_lock("report:daily", timeout: 60, fair: true) do |result|
    say.call(acquired: "report:daily", fencing_token: result.fencing_token, report_owned: report.owned?)
    finish.pop
  end
end
sleep 0.05 until waiter.status == "sleep" || !waiter.alive?
sleep 0.2 # its place in the queue is written before it sleeps; a little more for its subscription
say.call(ready: { report: report.token, report_fencing_token: report.fencing_token, weekly: weekly.token,
                  odd: odd.token, jid: jid, pid: Process.pid })

$stdin.read # until the spec closes our stdin
