# frozen_string_literal: true

require "logger"
require "stringio"
require "sidekiq"

# Where Sidekiq keeps its logger and chains: its default configuration on 7 and 8, the module on 6.4.
module SidekiqConfig
  def sidekiq_config
    Sidekiq.respond_to?(:default_configuration) ? Sidekiq.default_configuration : Sidekiq
  end
end

# Sidekiq 7 and 8's API (Queue, the job sets) follows Client.via; 6.4's uses the global pool, pointed at
# the spec's own pool (@pool) meanwhile.
module SidekiqApiPool
  def through_api_pool
    return yield unless Sidekiq::VERSION < "7"

    global = Sidekiq.redis_pool
    Sidekiq.redis = @pool
    yield
  ensure
    Sidekiq.redis = global if global
  end
end

# A spec that pushes from this process, as a web process does, to a redis-server of its own (@server,
# started by an earlier before(:all)): every push goes through a pool of its own (Sidekiq 7 and 8 keep
# the first pool any spec made), and Sidekiq's log, where refused pushes are told, is kept in
# @client_log. `admin` is a plain client of that server; `use_locks` points the shared Locker (what the client
# middleware claims with) at it.
RSpec.shared_context "a Sidekiq client of its own" do
  include SidekiqConfig

  let(:admin) { @server.client }
  after { admin.close }

  def use_locks(prefix, url: @server.url)
    configure_shared_locker!(url, key_prefix: prefix)
  end

  before(:all) do
    @pool = Sidekiq::RedisConnection.create(url: @server.url, size: 2)
    @client_log = StringIO.new
    @sidekiq_logger = sidekiq_config.logger
    sidekiq_config.logger = Logger.new(@client_log)
  end

  after(:all) do
    sidekiq_config.logger = @sidekiq_logger if @sidekiq_logger
    @pool&.shutdown(&:close)
  end

  around { |example| Sidekiq::Client.via(@pool) { example.run } }

  include SidekiqApiPool
end
