# frozen_string_literal: true

require "spec_helper"
require "rbconfig"

RSpec.describe "Interrupts" do
  let(:locker) { new_locker(pool_size: 4) }

  before { elsewhere.try_lock("held", timeout: 30) } # another holder (another process, as far as Redis can tell)

  def waiter(&block)
    ready = Queue.new
    thread = Thread.new do
      ready << true
      block.call
    rescue Exception => e # rubocop:disable Lint/RescueException
      e
    end
    ready.pop
    sleep 0.2 # let it block in Redis / the backoff
    thread
  end

  # Thread#raise on `thread`: how long it took to end.
  def raised(thread)
    elapsed do
      thread.raise(RuntimeError, "stop") # returns nil: the join is a statement of its own
      thread.join
    end
  end

  it "Thread#raise stops a waiting thread within 300 ms" do
    thread = waiter { locker.blocking_lock("held", timeout: 20) { :never } }
    took = raised(thread)

    expect(thread.value).to be_a(RuntimeError)
    expect(took).to be < 0.3
  end

  it "Thread#kill stops a waiting thread within 300 ms" do
    thread = waiter { locker.lock("held", timeout: 20) }
    took = elapsed { thread.kill.join }

    expect(thread.alive?).to be(false)
    expect(took).to be < 0.3
  end

  it "Timeout.timeout stops a wait on time" do
    took = elapsed do
      expect { Timeout.timeout(0.3) { locker.blocking_lock("held", timeout: 20) {} } }.to raise_error(Timeout::Error)
    end
    expect(took).to be_between(0.3, 1.0)
  end

  it "Thread#raise stops a thread stuck on a Redis that stopped answering" do
    server = RedisServer.new.start
    stalled = LockManager::Locker.new(redis_url: server.url, read_timeout: 10)
    stalled.locked?("k")
    server.pause
    thread = waiter { stalled.locked?("k") }
    took = raised(thread)

    expect(thread.value).to be_a(RuntimeError)
    expect(took).to be < 0.3
  ensure
    server&.resume
    server&.shutdown
  end

  # The acquire is two pipelined commands: a read that went on to the second reply after the
  # first was interrupted would wait out read_timeout (10 s here; it takes about 1 ms).
  it "Thread#raise stops acquires stuck on a Redis that stopped answering at once, and they are undone" do
    server = RedisServer.new.start
    stalled = LockManager::Locker.new(redis_url: server.url, read_timeout: 10, key_prefix: "raise:")
    stalled.nonblocking_lock("warm") {} # a script ran: acquires are now the SET NX + INCR pipeline
    took = Array.new(5) do |i|
      server.pause
      thread = waiter { stalled.nonblocking_lock("k#{i}") { :never } }
      stopped_in = elapsed do
        thread.raise(RuntimeError, "stop")
        thread.join
      end
      server.resume
      expect(thread.value).to be_a(RuntimeError)
      stopped_in
    end

    expect(took.max).to be < 0.3
    sleep 0.2 # Redis runs what the dropped connections had sent: each acquire, then its undo
    expect(server.client.keys("raise:k*")).to eq([])
  ensure
    server&.resume
    server&.shutdown
  end

  it "Thread#wakeup does not abort a wait: it goes on and succeeds" do
    thread = waiter { locker.blocking_lock("held", timeout: 20) { :got_it } }
    3.times { thread.wakeup && sleep(0.02) }
    redis.del("#{prefix}held")

    expect(thread.value).to eq(:got_it)
  end

  it "an interrupt inside the block releases the lock" do
    thread = waiter { locker.blocking_lock("free", timeout: 20) { sleep 10 } }
    thread.raise(RuntimeError, "stop")
    thread.join

    expect(redis.exists?("#{prefix}free")).to be(false)
  end

  it "Ctrl-C (SIGINT) ends a process waiting in blocking_lock within 1 s, leaving nothing held" do
    script = <<~RUBY
      require "lock_manager"
      locker = LockManager::Locker.new(redis_url: #{redis_url.inspect}, key_prefix: #{prefix.inspect})
      $stdout.puts "waiting"; $stdout.flush
      locker.blocking_lock("held", timeout: 30) { sleep }
    RUBY
    IO.popen([RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), "-e", script], err: File::NULL) do |child|
      expect(child.gets).to eq("waiting\n")
      sleep 0.3
      status = nil
      took = elapsed do
        Process.kill(:INT, child.pid)
        status = Process.wait2(child.pid).last
      end

      expect(status.termsig || status.exitstatus).not_to eq(0)
      expect(took).to be < 1.0
    end
    expect(redis.get("#{prefix}held")).not_to be_nil # the holder's lock is intact
    expect(held_keys(redis, "#{prefix}*")).to eq(["#{prefix}held"])
  end

  it "leaves no lock and no connection behind under random Thread#raise (2,000 cycles, 8 threads)" do
    hits = Queue.new
    ready = Queue.new
    finished = Queue.new
    chaos_over = Queue.new
    shared = locker # an interrupt inside RSpec's `let` memoization would break its mutex, not the gem
    workers = Array.new(8) do |i|
      Thread.new do
        # Interrupts land only inside the :immediate block, so each one costs one cycle, not the thread.
        Thread.handle_interrupt(RuntimeError => :never) do
          ready << i
          250.times do |n|
            Thread.handle_interrupt(RuntimeError => :immediate) do
              key = "chaos#{(i + n) % 3}"
              if n.even?
                shared.nonblocking_lock(key, timeout: 5) do
                  Thread.pass
                end
              else
                shared.blocking_lock(key, timeout: 5) do
                  Thread.pass
                end
              end
            end
          rescue RuntimeError, LockManager::LockNotAcquired
            hits << n
          end
          finished << i
          chaos_over.pop
          # A raise that came after the last cycle waits here; taken now, it would not end the thread.
          while Thread.pending_interrupt?
            begin
              Thread.handle_interrupt(RuntimeError => :immediate) { Thread.pass }
            rescue RuntimeError
              nil
            end
          end
        end
      end
    end
    8.times { ready.pop }
    running = true
    chaos = Thread.new do
      while running
        workers.sample.raise(RuntimeError, "chaos") rescue nil # rubocop:disable Style/RescueModifier
        sleep rand * 0.002
      end
    end
    8.times { finished.pop }
    running = false
    chaos.join
    8.times { chaos_over << true }
    workers.each(&:join)

    expect(hits.size).to be > 20 # the chaos did reach the lock calls
    expect(redis.keys("#{prefix}chaos*")).to eq([])
    open, idle = locker.pool_state
    expect(idle).to eq(open)
    expect(locker.nonblocking_lock("after") { :usable }.result).to eq(:usable)
  end
end
