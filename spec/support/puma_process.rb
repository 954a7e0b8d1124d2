# frozen_string_literal: true

require "rbconfig"

# What the suite's Puma servers (RailsAppServer, WebRailsAppServer) share: the command, with the config
# file that keeps a Ruby 3.3 bug out of their stop (puma_config.rb), and a stop by TERM that fails, rather
# than hangs, when Puma does not exit.
module PumaProcess
  CONFIG = File.expand_path("puma_config.rb", __dir__)

  module_function

  # `puma` on 127.0.0.1:`port`, with `args` (threads, workers, environment) and the rackup file last.
  def command(port, *args)
    [RbConfig.ruby, Gem.bin_path("puma", "puma"), "--bind", "tcp://127.0.0.1:#{port}", "--config", CONFIG, *args,
     "config.ru"]
  end

  # TERM, as a deploy does: Puma finishes its requests and stops its workers. After `timeout` seconds it
  # is killed, and the block's text (its log) goes into the error.
  def stop(pid, timeout: 15)
    Process.kill(:TERM, pid)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    until Process.wait(pid, Process::WNOHANG)
      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        Process.kill(:KILL, pid)
        Process.wait(pid)
        raise "puma did not stop within #{timeout}s:\n#{yield}"
      end
      sleep 0.05
    end
  end
end
