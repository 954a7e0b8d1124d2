# frozen_string_literal: true

require "optparse"
require_relative "admin"

module LockManager
  # The `lock_manager` command (exe/lock_manager): list, show, release and watch locks through
  # LockManager::Admin. Settings come from the environment variables LockManager::Configuration reads
  # (Configuration::ENVIRONMENT), or, from a Rails app's tasks (bin/rails lock_manager:list), from the app's
  # configuration; flags override them. Exit status: 0 done, 1 not found, refused or Redis failed, 2 usage.
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

      public_send("#{command}_command", *args)
    rescue OptionParser::ParseError, ArgumentError => e
      usage_error(e.message)
    rescue LockManager::Error => e
      failed(e.message)
    rescue Interrupt, Errno::EPIPE # Ctrl-C ends `watch`; a closed pipe (`| head`) ends the output
      OK
    end

    def list_command(pattern = "*")
      limit = @options.limit
      locks = admin.locks(pattern, limit: limit + 1)
      @print.table(locks.first(limit))
      more = locks.size > limit ? "; more not shown (--limit)" : ""
      @out.puts "#{Printer.count([locks.size, limit].min, "lock")} matching #{pattern.inspect}#{more}"
      OK
    end

    def show_command(key)
      lock = admin.lock(key) or return not_found(key)

      @print.lock(lock)
      OK
    end

    def release_command(key)
      lock = admin.lock(key) or return not_found(key)
      refusal = release_refusal(lock)
      return failed(refusal) if refusal
      return failed("lock #{Printer.key(key)} was released meanwhile: nothing done") unless admin.release(key)

      told = lock.waiters.empty? ? "" : "; #{Printer.waiters(lock)} told to take it"
      @out.puts "Released lock #{Printer.key(key)}#{told}"
      OK
    end

    def watch_command(pattern = "*")
      loop do
        frame(pattern, admin.locks(pattern, limit: @options.limit))
        sleep @options.interval
      end
    end

    private

    def admin
      @admin ||= Admin.new(Locker.new(**@options.settings.merge(pool_size: 2)))
    end

    # Why `lock` is not to be released, or nil.
    def release_refusal(lock)
      if lock.holders.empty?
        "lock #{Printer.key(lock.key)} is not held (#{Printer.waiters(lock)} queued)"
      elsif !(@options.yes || confirmed?(lock))
        "lock #{Printer.key(lock.key)} not released"
      end
    end

    def confirmed?(lock)
      @err.print "Release lock #{Printer.key(lock.key)} held by #{Printer.holders(lock)}? [y/N] "
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

    # The command line over the settings: the Locker's settings, the command's options.
    class Options
      ENVIRONMENT = Configuration::ENVIRONMENT
      # The flag of each setting, over its environment variables.
      FLAGS = [
        [:redis_url, ["-u", "--redis-url URL"], "Redis URL "], [:key_prefix, ["-p", "--prefix PREFIX"], "key prefix "],
        [:cluster, ["--cluster URLS"], "Redis Cluster seed nodes "], [:sentinels, ["--sentinels URLS"], "sentinels "],
        [:sentinel_master, ["--sentinel-master NAME"], ""]
      ].freeze
      COMMANDS = { "list" => 0..1, "show" => 1..1, "release" => 1..1, "watch" => 0..1 }.freeze

      BANNER = <<~TEXT.freeze
        Usage: lock_manager [options] COMMAND [ARGS]

        Commands:
          list [PATTERN]     locks whose keys match PATTERN (a Redis glob; default "*"), sorted by key
          show KEY           one lock: its holders and queued waiters
          release KEY        force-release KEY: its holders lose it, its waiters take it (asks first)
          watch [PATTERN]    the list, refreshed every --interval seconds until Ctrl-C

        Keys and patterns are given without the key prefix. Settings not given as options come from
        the environment, as LockManager's configuration reads it where the app does not set them:
        #{ENVIRONMENT.map { |name, variables| "  #{name.to_s.ljust(16)} #{variables.join(", else ")}" }.join("\n")}
        (lists: comma-separated URLs; key_prefix defaults to "lock:"). An app that sets them itself
        (config.lock_manager) runs the same commands as tasks, which take its settings:
          bin/rails "lock_manager:list[report:*]"   bin/rails "lock_manager:release[report:1,--yes]"
        Exit status: 0 done, 1 not found, refused or Redis failed, 2 usage.

        Options:
      TEXT

      attr_reader :settings, :limit, :interval, :yes

      def initialize(settings, out)
        @out = out
        @settings = settings.dup
        @limit = Admin::DEFAULT_LIMIT
        @interval = 1.0
        @yes = false
      end

      # @return [Array(String, Array<String>), nil] the command and its arguments; nil after
      #   --help or --version
      def parse(argv)
        parser = option_parser
        args = parser.parse(argv)
        return @out.puts("lock_manager #{VERSION}") if @done == :version
        return @out.puts(parser.help) if @done

        command = args.shift
        check_command(command, args)
        [command, args]
      end

      private

      def check_command(command, args)
        raise OptionParser::ParseError, "a command is needed: #{COMMANDS.keys.join(", ")}" unless command
        raise OptionParser::ParseError, "unknown command #{command.inspect}" unless COMMANDS.key?(command)
        return if COMMANDS[command].cover?(args.size)

        raise OptionParser::ParseError, "#{command}: wrong number of arguments"
      end

      def option_parser
        OptionParser.new do |o|
          o.banner = BANNER
          settings_options(o)
          o.on("-l", "--limit N", Integer, "list at most N locks (default #{Admin::DEFAULT_LIMIT})") do |n|
            @limit = Arguments.positive_integer(n, :limit)
          end
          o.on("-i", "--interval SECONDS", Float, "watch: seconds between refreshes (default 1)") do |s|
            @interval = Arguments.seconds(s, :interval)
          end
          o.on("-y", "--yes", "release without asking") { @yes = true }
          o.on("-h", "--help", "this help") { @done = :help }
          o.on("-v", "--version", "the gem's version") { @done = :version }
        end
      end

      def settings_options(parser)
        FLAGS.each do |name, switches, what|
          parser.on(*switches, "#{what}(#{ENVIRONMENT.fetch(name).join(", ")})") do |value|
            @settings[name] = Configuration::LISTS.include?(name) ? Configuration.split(value) : value
          end
        end
      end
    end

    # What the commands print.
    class Printer
      HEADER = ["KEY", "HELD BY", "SINCE", "TTL", "WAITERS"].freeze
      UNITS = [[86_400, "d"], [3600, "h"], [60, "m"], [1, "s"]].freeze

      def initialize(out)
        @out = out
      end

      # One line per lock, columns aligned.
      def table(locks)
        rows = [HEADER] + locks.map { |lock| row(lock) }
        widths = rows.transpose.map { |column| column.map(&:length).max }
        rows.each { |cells| @out.puts cells.zip(widths).map { |cell, width| cell.ljust(width) }.join("  ").rstrip }
      end

      # Every holder and waiter of one lock.
      def lock(lock)
        @out.puts "Lock #{Printer.key(lock.key)} (#{Printer.kind(lock)})"
        list("Holders:", lock.holders) { |holder, n| holder_lines(holder, n) }
        list("Waiters, in queue order:", lock.waiters) { |waiter, n| waiter_line(waiter, n) }
      end

      class << self
        def holders(lock)
          return "nobody (#{waiters(lock)})" if lock.holders.empty?

          first = who(lock.holders.first)
          return first unless lock.limit

          more = lock.holders.size > 1 ? " and #{lock.holders.size - 1} more" : ""
          "#{lock.holders.size}/#{lock.limit}: #{first}#{more}"
        end

        def waiters(lock)
          count(lock.waiters.size, "waiter")
        end

        def kind(lock)
          lock.limit ? "semaphore, limit #{lock.limit}, #{count(lock.holders.size, "holder")}" : "plain lock"
        end

        # A holder or waiter: its job, its thread, or its token when it names neither.
        def who(holder)
          return "job #{holder.jid}" if holder.respond_to?(:jid) && holder.jid
          return "token #{holder.token}" unless holder.host

          "#{holder.host} pid #{holder.pid} thread #{holder.thread}"
        end

        def time(at)
          at ? "#{at.utc.strftime("%F %T UTC")} (#{age(at)})" : "unknown"
        end

        def age(at)
          at ? "#{duration(Time.now - at)} ago" : "-"
        end

        def ttl(seconds)
          seconds ? duration(seconds) : "-"
        end

        # "4.2s", "3m07s", "2h05m", "1d04h"
        def duration(seconds)
          seconds = [seconds, 0].max
          return format("%.1fs", seconds) if seconds < 60

          whole = seconds.to_i
          at = UNITS.index { |size, _| whole >= size }
          (big, big_unit), (small, small_unit) = UNITS[at, 2]
          "#{whole / big}#{big_unit}#{((whole % big) / small).to_s.rjust(2, "0")}#{small_unit}"
        end

        def count(number, noun)
          "#{number} #{noun}#{"s" unless number == 1}"
        end

        # A key as it is when printable; quoted when binary or holding control characters or spaces.
        def key(key)
          printable = key.encoding != Encoding::BINARY && key.valid_encoding? && !key.match?(/[[:cntrl:] ]/)
          printable ? key : key.inspect
        end
      end

      private

      def row(lock)
        holder = lock.holders.first
        [Printer.key(lock.key), Printer.holders(lock), Printer.age(holder&.since), Printer.ttl(holder&.ttl),
         lock.waiters.size.to_s]
      end

      def holder_lines(holder, number)
        @out.puts "  #{number}. #{Printer.who(holder)}, since #{Printer.time(holder.since)}, " \
                  "ttl #{Printer.ttl(holder.ttl)}"
        @out.puts "     token #{holder.token}"
      end

      def list(title, items, &block)
        @out.puts "#{title}#{" none" if items.empty?}"
        items.each.with_index(1, &block)
      end

      def waiter_line(waiter, number)
        @out.puts "  #{number}. #{Printer.who(waiter)}, queued since #{Printer.time(waiter.since)}"
      end
    end
  end
end
