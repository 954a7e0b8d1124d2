# frozen_string_literal: true

module LockManager
  # The rate limiters' commands of `lock_manager`, beside the locks' in cli.rb.
  class CLI
    # The limiters in use whose names match `pattern`, a line each, and their count.
    def limiters(pattern = "*")
      listed("limiter", pattern, ->(limit) { admin.limiters(pattern, limit: limit) }) do |found|
        @print.limiters(found)
      end
    end

    # Forgets what the limiter `name` counted (of --kind's kind only, when given): FAILED when it had
    # counted nothing.
    def reset_limiter(name)
      kind = @options.kind
      what = "limiter #{Printer.key(name)}#{" (#{kind})" if kind}"
      return failed("no #{what} (it has counted nothing)") unless admin.reset_limiter(name, kind: kind)

      @out.puts "Reset #{what}: it admits its whole rule again"
      OK
    end
  end
end
