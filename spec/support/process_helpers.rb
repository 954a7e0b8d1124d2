# frozen_string_literal: true

require "io/wait"
require "json"
require "rbconfig"
require "socket"
require "tempfile"

# Helpers of spec/faults/processes_spec.rb and refusals_spec.rb: child processes that talk to the
# example line by line (spawned `ruby -I lib -e` scripts, or forks), private redis-servers, and a
# raw MONITOR of a server. Children an example starts here are killed and reaped by #stop_all;
# servers are shut down by spec_helper.
module ProcessHelpers
  LIB = File.expand_path("../../lib", __dir__)

  # A child process: its stdout read line by line, its stdin written to.
  class Child
    attr_reader :pid

    # `ruby -I lib -e script`, with `env`; its stderr goes to a file (see #stderr).
    def self.ruby(script, env = {})
      err = Tempfile.new("lock_manager-child")
      child_in, input = IO.pipe
      output, child_out = IO.pipe
      pid = Process.spawn(env, RbConfig.ruby, "-I", LIB, "-e", script,
                          in: child_in, out: child_out, err: err.path)
      [child_in, child_out].each(&:close)
      new(pid, input, output, err)
    end

    # A fork that runs the block with the Child's own channel (#gets and #puts work both ways),
    # then exits with exit! (the parent's at_exit hooks never run in it). An exception in the
    # block is reported as a line "error Class: message" and exit status 1.
    def self.fork
      to_child, input = IO.pipe
      output, from_child = IO.pipe
      pid = Process.fork do
        [input, output].each(&:close)
        from_child.sync = true
        status = 0
        begin
          yield new(nil, from_child, to_child, nil)
        rescue Exception => e # rubocop:disable Lint/RescueException
          from_child.puts("error #{e.class}: #{e.message}") rescue nil # rubocop:disable Style/RescueModifier
          status = 1
        ensure
          exit!(status)
        end
      end
      [to_child, from_child].each(&:close)
      new(pid, input, output, nil)
    end

    def initialize(pid, input, output, err)
      @pid = pid
      @input = input
      @output = output
      @err = err
      @status = nil
    end

    # The next line from the other side, within `timeout` seconds.
    def gets(timeout: 10)
      raise "child #{pid}: nothing within #{timeout}s#{diagnostics}" unless @output.wait_readable(timeout)

      line = @output.gets or raise "child #{pid}: closed its output#{diagnostics}"
      line.chomp
    end

    def puts(line)
      @input.puts(line)
      @input.flush
    end

    def kill(signal)
      Process.kill(signal, pid)
    end

    # @return [Process::Status, nil] nil when the child is still running after `timeout` seconds
    def wait(timeout: 10)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      until @status
        @status = Process.wait2(pid, Process::WNOHANG)&.last
        break if @status || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

        sleep 0.002
      end
      @status
    end

    def stderr
      @err ? File.read(@err.path) : ""
    end

    # Kills (SIGKILL) and reaps the child if it still runs; closes everything.
    def stop
      unless @status
        begin
          Process.kill(:KILL, pid)
        rescue Errno::ESRCH
          nil
        end
        @status = Process.wait2(pid).last
      end
      [@input, @output].each { |io| io.close unless io.closed? }
      @err&.close!
    end

    private

    def diagnostics
      text = stderr
      text.empty? ? "" : "; stderr:\n#{text}"
    end
  end

  # Every command a redis-server runs while it is watched (MONITOR on a raw socket), as
  # [client address, command line]; the commands scripts run show as "lua".
  class Monitor
    LINE = /\A\+\d+\.\d+ \[\d+ ([^\]]+)\] (.*)\z/m

    def initialize(port)
      @port = port
      @socket = TCPSocket.new("127.0.0.1", port)
      @socket.write("MONITOR\r\n")
      raise "MONITOR refused" unless @socket.gets("\r\n") == "+OK\r\n"

      @lines = Queue.new
      @reader = Thread.new { read }
    end

    # Stops watching, once the feed has caught up: Redis sends it in the order it ran the commands,
    # after running each, so every command before a last one of our own (a marker) has been read when
    # the marker's line has. A loaded run closed the feed before the lines of a push's last commands.
    # @return [Array<Array(String, String)>]
    def stop
      @marker = "lock_manager-monitor-end-#{rand(1 << 62)}"
      begin
        TCPSocket.open("127.0.0.1", @port) { |redis| redis.write("ECHO #{@marker}\r\n") && redis.gets("\r\n") }
        @reader.join(10)
      rescue SystemCallError # the server is gone: its feed has ended with it
        nil
      end
      @socket.close
      @reader.join
      Array.new(@lines.size) { @lines.pop }.filter_map do |line|
        match = LINE.match(line.chomp("\r\n"))
        [match[1], match[2]] if match
      end
    end

    private

    def read
      while (line = @socket.gets("\r\n"))
        break if @marker && line.include?(@marker)

        @lines << line
      end
    rescue IOError, SystemCallError
      nil
    end
  end

  # A `ruby -I lib -e script` child, stopped after the example.
  def ruby_child(script, env = {})
    track(Child.ruby(script, env))
  end

  # A forked child running the block (see Child.fork), stopped after the example.
  def fork_child(&block)
    track(Child.fork(&block))
  end

  # A private redis-server, shut down after the example.
  def private_server(**options)
    own_server(**options)
  end

  # Kills and reaps every child (private servers are shut down by spec_helper: SIGKILL, which a
  # paused server obeys too).
  def stop_all
    (@children || []).each(&:stop)
  end

  # @return [Array<String>] the addresses of the server's clients (the gem's pooled connections
  #   among them), but the connection asking
  def client_addresses(admin)
    admin.client(:list).reject { |c| c["cmd"] == "client|list" }.map { |c| c["addr"] }
  end

  def total_connections(admin)
    admin.info("stats")["total_connections_received"].to_i
  end

  private

  def track(child)
    (@children ||= []) << child
    child
  end
end
