# frozen_string_literal: true

# TLS against plain TCP, in one run: the uncontended nonblocking_lock cycle of a Locker over TLS with a
# client certificate (Redis's defaults) and of one over TCP, on the same redis-server (it serves a
# tls-port and a port), in alternating rounds; throughput and client CPU per cycle at 1 and 8 threads.
# Then how soon each works again once its redis-server was killed and started again.
#
#   bundle exec ruby bench/tls.rb
#
# BENCH_SECONDS (default 3) is the measured time per workload and transport.

require_relative "support"

DURATION = Float(ENV.fetch("BENCH_SECONDS", "3"))
ROUNDS = 6
RESTARTS = 5

# `threads` threads cycle their own keys through `locker` for `seconds`.
# @return [Array(Integer, Float, Float)] cycles, wall seconds, process CPU seconds
def measure(locker, threads, seconds, name)
  GC.start
  cpu = Bench.now(Process::CLOCK_PROCESS_CPUTIME_ID)
  start = Bench.now
  cycles = Array.new(threads) do |i|
    Thread.new { Bench.lock_cycles(locker, "bench:tls:#{name}:#{i}", deadline: start + seconds) }
  end.sum(&:value)
  [cycles, Bench.now - start, Bench.now(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu]
end

# [ops/s, client CPU µs per cycle] of each transport, their rounds alternating.
def compare(lockers, threads)
  totals = lockers.transform_values { [0, 0.0, 0.0] }
  lockers.each { |name, locker| measure(locker, threads, 0.3, name) } # connections and scripts warmed up
  ROUNDS.times do
    lockers.each do |name, locker|
      totals[name] = totals[name].zip(measure(locker, threads, DURATION / ROUNDS, name)).map(&:sum)
    end
  end
  totals.transform_values { |cycles, wall, cpu| [cycles / wall, cpu / cycles * 1e6] }
end

# Seconds from a restarted server's first answer to the Locker's first lock taken on it (median, max).
def recovery(server, settings)
  locker = LockManager::Locker.new(redis_url: server.url, pool_size: 2, connect_timeout: 0.5, **settings)
  times = Array.new(RESTARTS) do
    Bench.lock_cycles(locker, "bench:tls:restart", count: 20)
    server.restart
    started = Bench.now
    begin
      locker.nonblocking_lock("bench:tls:restart") {}
    rescue LockManager::ConnectionError
      sleep 0.005
      retry
    end
    Bench.now - started
  end.sort
  [times[times.size / 2], times.last]
end

tls = RedisServer.new(tls: true, own_session: true).start
plain_port = FreePort.pick
tls.client.config(:set, "port", plain_port.to_s)
plain_url = "redis://127.0.0.1:#{plain_port}/0"
at_exit do
  tls.shutdown
  FreePort.release(plain_port)
end

Bench.header(plain_url)
puts "TLS:          mutual (a client certificate, Redis's default tls-auth-clients yes), #{
  OpenSSL::X509::Certificate.new(File.read(tls.ca_file)).public_key.class.name.split("::").last} keys"
puts
puts "uncontended nonblocking_lock, #{ROUNDS} alternating rounds of #{(DURATION / ROUNDS).round(2)} s each"
puts "threads | TCP ops/s | TLS ops/s | TLS/TCP | TCP CPU/cycle | TLS CPU/cycle | TLS/TCP"
[1, 8].each do |threads|
  lockers = { tcp: LockManager::Locker.new(redis_url: plain_url, pool_size: threads),
              tls: LockManager::Locker.new(redis_url: tls.url, pool_size: threads, **tls.tls_settings) }
  figures = compare(lockers, threads)
  (tcp_ops, tcp_cpu), (tls_ops, tls_cpu) = figures.values_at(:tcp, :tls)
  puts format("%<threads>7d | %<tcp_ops>9.0f | %<tls_ops>9.0f | %<ops>6.2fx | %<tcp_cpu>10.1f µs | " \
              "%<tls_cpu>10.1f µs | %<cpu>6.2fx", threads: threads, tcp_ops: tcp_ops, tls_ops: tls_ops,
                                                  ops: tls_ops / tcp_ops, tcp_cpu: tcp_cpu, tls_cpu: tls_cpu,
                                                  cpu: tls_cpu / tcp_cpu)
end

puts
puts "after a restart (SIGKILL, started again): first lock taken, #{RESTARTS} restarts, median / max"
plain = RedisServer.new(own_session: true).start
at_exit { plain.shutdown }
{ "TCP" => [plain, {}], "TLS" => [tls, tls.tls_settings] }.each do |name, (server, settings)|
  median, max = recovery(server, settings)
  puts "#{name.ljust(4)} #{Bench.ms(median)} / #{Bench.ms(max)}"
end
