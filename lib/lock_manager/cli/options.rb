# frozen_string_literal: true

require "optparse"

module LockManager
  class CLI
    # The command line over the settings: the Locker's settings, the command's options.
    class Options
      ENVIRONMENT = Configuration::ENVIRONMENT
      # The flag of each setting, over its environment variables.
      FLAGS = [
        [:redis_url, ["-u", "--redis-url URL"], "Redis URL "], [:key_prefix, ["-p", "--prefix PREFIX"], "key prefix "],
        [:cluster, ["--cluster URLS"], "Redis Cluster seed nodes "], [:sentinels, ["--sentinels URLS"], "sentinels "],
        [:sentinel_master, ["--sentinel-master NAME"], ""], [:tls_ca_file, ["--tls-ca-file FILE"], "CA of rediss:// "],
        [:tls_cert_file, ["--tls-cert-file FILE"], "client certificate "],
        [:tls_key_file, ["--tls-key-file FILE"], "its key "]
      ].freeze
      COMMANDS = { "list" => 0..1, "show" => 1..1, "release" => 1..1, "watch" => 0..1, "parked" => 1..1,
                   "delete-parked" => 2..2, "limiters" => 0..1, "reset-limiter" => 1..1 }.freeze
      # --kind's values: a limiter's kind as Admin names it.
      KINDS = Limiter::KINDS.values.map(&:to_s).freeze

      BANNER = <<~TEXT.freeze
        Usage: lock_manager [options] COMMAND [ARGS]

        Commands:
          list [PATTERN]     locks whose keys match PATTERN (a Redis glob; default "*"), sorted by key
          show KEY           one lock: its holders, queued waiters and parked jobs
          release KEY        force-release KEY: its holders lose it, its first parked job or its waiters
                             take it (asks first)
          watch [PATTERN]    the list, refreshed every --interval seconds until Ctrl-C
          parked KEY         the jobs parked on KEY (on_conflict: :park), first in line first
          delete-parked KEY JID
                             take job JID out of KEY's line: it will not run (asks first)
          limiters [PATTERN] rate limiters in use whose names match PATTERN: rule, used, remaining, next free
          reset-limiter NAME forget what limiter NAME counted (every kind of that name, or --kind's)

        Keys, names and patterns are given without the key prefix. Settings not given as options come from
        the environment, as LockManager's configuration reads it where the app does not set them:
        #{ENVIRONMENT.map { |name, variables| "  #{name.to_s.ljust(16)} #{variables.join(", else ")}" }.join("\n")}
        (lists: comma-separated URLs; key_prefix defaults to "lock:"). An app that sets them itself
        (config.lock_manager) runs the same commands as tasks, which take its settings:
          bin/rails "lock_manager:list[report:*]"   bin/rails "lock_manager:release[report:1,--yes]"
          bin/rails "lock_manager:delete-parked[report:1,JID,--yes]"
        Exit status: 0 done, 1 not found, refused or Redis failed, 2 usage.

        Options:
      TEXT

      attr_reader :settings, :limit, :interval, :yes, :kind

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
          command_options(o)
          o.on("-h", "--help", "this help") { @done = :help }
          o.on("-v", "--version", "the gem's version") { @done = :version }
        end
      end

      def command_options(parser)
        limit = "list, show's parked jobs, parked or limiters: at most N (default #{Admin::DEFAULT_LIMIT})"
        parser.on("-l", "--limit N", Integer, limit) { |n| @limit = Arguments.positive_integer(n, :limit) }
        parser.on("-i", "--interval SECONDS", Float, "watch: seconds between refreshes (default 1)") do |s|
          @interval = Arguments.seconds(s, :interval)
        end
        parser.on("-y", "--yes", "release or delete-parked without asking") { @yes = true }
        kinds = "reset-limiter: only its limiter of this kind (#{KINDS.join(", ")})"
        parser.on("-k", "--kind KIND", KINDS, kinds) { |kind| @kind = kind.to_sym }
      end

      def settings_options(parser)
        FLAGS.each do |name, switches, what|
          parser.on(*switches, "#{what}(#{ENVIRONMENT.fetch(name).join(", ")})") do |value|
            @settings[name] = Configuration::LISTS.include?(name) ? Configuration.split(value) : value
          end
        end
      end
    end
  end
end
