# frozen_string_literal: true

require_relative "admin"

module LockManager
  # The `lock_manager` command (exe/lock_manager): list, show, release and watch locks, list and delete the jobs
  # parked on a lock (cli/parked.rb), list and reset rate limiters (cli/limiters.rb), through LockManager::Admin.
  # Settings come from the environment variables LockManager::Configuration reads (Configuration::ENVIRONMENT),
  # or, from a Rails app's tasks (bin/rails lock_manager:list), from the app's configuration; flags override
  # them. Exit status: 0 done, 1 not found, refused or Redis failed, 2 usage.
  class CLI
    OK = 0
    FAILED = 1
    USAGE = 2

    # @param settings [Hash, nil] the Locker's settings (an app's LockManager.config.locker_options); nil: from `env`
    def initialize(argv, stdin: $stdin, stdout: $stdout, stderr: $stderr, env: ENV, settings: nil)
      @argv = argv
      @settings = settings || Configuration.environment(env)
      @stdin = stdin
      @out = stdout
      @err = stderr
      @print = Printer.new(stdout)
    end

    # @return [Integer] the exit status
    def run
      @options = Options.new(@settings, @out)
      command, args = @options.parse(@argv)
      return OK unless command

      public_send(command.tr("-", "_"), *args) # one of Options::COMMANDS, checked
    rescue OptionParser::ParseError, ArgumentError => e
      usage_error(e.message)
    rescue LockManager::Error => e
      failed(e.message)
    rescue Interrupt, Errno::EPIPE # Ctrl-C ends `watch`; a closed pipe (`| head`) ends the output
      OK
    end

    def list(pattern = "*")
      listed("lock", pattern, ->(limit) { admin.locks(pattern, limit: limit) }) { |locks| @print.table(locks) }
    end

    # The first --limit of what `find` finds (asked for one more, to know whether there is more), printed
    # by the block, and a line counting them.
    def listed(noun, pattern, find)
      limit = @options.limit
      found = find.call(limit + 1)
      yield found.first(limit)
      more = found.size > limit ? "; more not shown (--limit)" : ""
      @out.puts "#{Printer.count([found.size, limit].min, noun)} matching #{pattern.inspect}#{more}"
      OK
    end

    def show(key)
      lock = admin.lock(key) or return not_found(key)

      @print.lock(lock, lock.parked.positive? ? admin.parked(key, limit: @options.limit) : [])
      OK
    end

    def release(key)
      lock = admin.lock(key) or return not_found(key)
      refusal = release_refusal(lock)
      return failed(refusal) if refusal
      return failed("lock #{Printer.key(key)} was released meanwhile: nothing done") unless admin.release(key)

      @out.puts "Released lock #{Printer.key(key)}#{released_to(lock)}"
      OK
    end

    def watch(pattern = "*")
      loop do
        frame(pattern, admin.locks(pattern, limit: @options.limit))
        sleep @options.interval
      end
    end

    private

    def admin
      @admin ||= Admin.new(Locker.new(**@options.settings.merge(pool_size: 2)))
    end

    # Why `lock` is not to be released, or nil. A lock that expired with jobs parked on it is released to the
    # first of them.
    def release_refusal(lock)
      if lock.holders.empty? && lock.parked.zero?
        "lock #{Printer.key(lock.key)} is not held (#{Printer.waiters(lock)} queued)"
      elsif !(@options.yes || confirmed?("Release lock #{Printer.key(lock.key)} held by #{Printer.holders(lock)}?"))
        "lock #{Printer.key(lock.key)} not released"
      end
    end

    # Who was told to take the lock: its first parked job takes it at once, else its waiters are woken.
    def released_to(lock)
      return "; the first of #{Printer.count(lock.parked, "parked job")} took it" if lock.parked.positive?

      lock.waiters.empty? ? "" : "; #{Printer.waiters(lock)} told to take it"
    end

    def confirmed?(question)
      @err.print "#{question} [y/N] "
      @err.flush
      answer = @stdin.gets
      @err.puts if answer.nil?
      answer.to_s.strip.match?(/\Ay(es)?\z/i)
    end

    # One refresh of `watch`: the screen cleared on a terminal, a blank line between refreshes else.
    def frame(pattern, locks)
      @out.print "\e[H\e[2J" if @out.tty?
      @out.puts "lock_manager watch #{pattern.inspect}: #{Printer.count(locks.size, "lock")} at " \
                "#{Time.now.strftime("%H:%M:%S")} (every #{@options.interval}s; Ctrl-C to stop)"
      @print.table(locks)
      @out.puts
      @out.flush
    end

    def not_found(key)
      failed("no lock #{Printer.key(key)} (nobody holds it or waits for it)")
    end

    def failed(message)
      @err.puts "lock_manager: #{message}"
      FAILED
    end

    def usage_error(message)
      @err.puts "lock_manager: #{message}"
      @err.puts "Run lock_manager --help for usage."
      USAGE
    end
  end
end

# Its parts, which reopen the class defined above.
require_relative "cli/limiters"
require_relative "cli/parked"
require_relative "cli/options"
require_relative "cli/printer"
