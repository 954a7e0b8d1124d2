# frozen_string_literal: true

# Sidekiq's Web UI with the Locks tab, served by Puma in a process of its own for spec/web, as an app
# mounts it (`mount Sidekiq::Web => "/sidekiq"` behind a cookie session): run as
# `ruby -Ilib spec/support/web_app.rb PORT REDIS_URL KEY_PREFIX [FILE...]`, each FILE required after the
# configuration (an app's job classes). SIDEKIQ serves a vendored Sidekiq.
require_relative "stack"
Stack.select!
Stack.check!
require "sidekiq"

require "securerandom"
require "rack"
require "rack/session/cookie"
require "rack/handler/puma"
require "puma"
require_relative "puma_config" # the Rails apps' Puma config: it keeps a Ruby 3.3 bug out of the stop

port, redis_url, key_prefix, *requires = ARGV
Sidekiq.configure_client { |config| config.redis = { url: redis_url } }
require "lock_manager/web"
LockManager.configure do |config|
  config.redis_url = redis_url
  config.key_prefix = key_prefix
end
requires.each { |file| require file }

app = Rack::Builder.new do
  use Rack::Session::Cookie, secret: SecureRandom.hex(64), same_site: :lax, key: "lock_manager.web.session"
  map("/sidekiq") { run Sidekiq::Web }
end
$stdout.puts "serving Sidekiq #{Sidekiq::VERSION} on #{port}"
$stdout.flush
# shutdown_debug: each thread's backtrace in the log as Puma begins to stop (WebServer#stop shows it when
# the stop does not end).
Rack::Handler::Puma.run(app, Host: "127.0.0.1", Port: Integer(port), Threads: "1:4", Silent: true,
                             shutdown_debug: true)
