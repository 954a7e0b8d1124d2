# frozen_string_literal: true

# What a run of the suite (or of the demo, or a bench) loads, and which runs each Ruby makes.
#
# By default the stack's own gems (Debian's, through Bundler) and its redis-server. SIDEKIQ and RAILS
# name a version from ../shared/vendor instead (unmodified upstream sources beside the repository,
# never copied into it), and REDIS_SERVER another server binary (valkey-server):
#
#   SIDEKIQ=7.3.9 (Ruby 3.1+) or 8.1.7 (Ruby 3.2+), with the redis-client, connection_pool and rack
#   each needs; RAILS=8.1.3 (Ruby 3.2+), Rails' seven lib trees.
#
# Plain Ruby, no gem: the Rakefile loads it as well.
module Stack
  ROOT = File.expand_path("../..", __dir__)
  VENDOR = File.expand_path("../shared/vendor", ROOT)

  SIDEKIQ = {
    "7.3.9" => { "sidekiq" => "7.3.9", "redis-client" => "0.30.0", "connection_pool" => "2.5.5" },
    "8.1.7" => { "sidekiq" => "8.1.7", "redis-client" => "0.31.0", "connection_pool" => "3.0.2", "rack" => "3.2.7" }
  }.freeze
  RAILS = {
    "8.1.3" => %w[activesupport activejob activemodel activerecord actionpack actionview railties]
  }.freeze

  # The specs of the lock itself, run once per Ruby and once more per other server.
  CORE_SPECS = %w[spec/lock_manager spec/faults spec/topologies].freeze
  # The specs that load Sidekiq or Rails, run once per Sidekiq and Rails version.
  INTEGRATION_SPECS = %w[spec/sidekiq spec/active_job spec/rails spec/web spec/admin spec/testing].freeze

  # What `rake` runs on each Ruby after the whole suite on the stack's own gems and redis-server.
  Run = Struct.new(:title, :env, :specs, keyword_init: true)
  RUNS = {
    "3.1" => [Run.new(title: "Sidekiq 7.3.9", env: { "SIDEKIQ" => "7.3.9" }, specs: INTEGRATION_SPECS)],
    "3.3" => [Run.new(title: "Sidekiq 8.1.7 and Rails 8.1.3", env: { "SIDEKIQ" => "8.1.7", "RAILS" => "8.1.3" },
                      specs: INTEGRATION_SPECS),
              Run.new(title: "Valkey", env: { "REDIS_SERVER" => "valkey-server" }, specs: CORE_SPECS)]
  }.freeze

  module_function

  def ruby
    RUBY_VERSION[/\A\d+\.\d+/]
  end

  def runs
    RUNS.fetch(ruby, [])
  end

  # The vendored Sidekiq asked for (SIDEKIQ=7.3.9 or 8.1.7), nil for the stack's own.
  def sidekiq
    vendored("SIDEKIQ", SIDEKIQ)
  end

  # The vendored Rails asked for (RAILS=8.1.3), nil for the stack's own.
  def rails
    vendored("RAILS", RAILS)
  end

  def redis_server
    ENV.fetch("REDIS_SERVER", "redis-server")
  end

  # The lib directories of what SIDEKIQ and RAILS ask for.
  def libs
    sidekiq_libs = SIDEKIQ.fetch(sidekiq, {}).map { |name, version| File.join(VENDOR, "#{name}-#{version}", "lib") }
    rails_libs = RAILS.fetch(rails, []).map { |name| File.join(VENDOR, "rails-#{rails}", name, "lib") }
    sidekiq_libs + rails_libs
  end

  # Why this machine cannot make a run with `env`, or nil when it can.
  def missing(env)
    return "#{VENDOR} is absent" if (env.key?("SIDEKIQ") || env.key?("RAILS")) && !File.directory?(VENDOR)

    server = env["REDIS_SERVER"]
    "#{server} is not installed" if server && !system("command -v #{server} >/dev/null 2>&1")
  end

  # Puts the vendored libraries first on this process's load path, and on its children's (RUBYOPT).
  # Call it before anything requires sidekiq, rack, connection_pool or Rails.
  def select!
    return if libs.empty?

    absent = libs.reject { |dir| File.directory?(dir) }
    raise "SIDEKIQ=#{sidekiq} RAILS=#{rails} need #{absent.join(", ")}" if absent.any?

    $LOAD_PATH.unshift(*(libs - $LOAD_PATH))
    flags = libs.map { |dir| "-I#{dir}" }
    return if ENV["RUBYOPT"].to_s.include?(flags.first)

    ENV["RUBYOPT"] = [*flags, ENV.fetch("RUBYOPT", nil)].compact.join(" ")
  end

  # Fails loudly when a vendored version was asked for and another one got loaded, even in part.
  def check!
    wanted = { "sidekiq" => sidekiq, "activesupport" => rails }.compact
    loaded = wanted.keys.to_h { |name| [name, loaded_version(name)] }
    foreign = $LOADED_FEATURES.grep(%r{/(?:#{Regexp.union(foreign_names)})-[\d.]+/lib/})
                              .reject { |path| vendor_dirs.any? { |dir| path.start_with?("#{dir}/") } }
    return if loaded == wanted && foreign.empty?

    raise "wanted #{wanted} from #{VENDOR}; loaded #{loaded}#{", and #{foreign.first(3).join(", ")}" if foreign.any?}"
  end

  # VENDOR as given and as the files loaded from it are named: ../shared may be a symlink.
  def vendor_dirs
    [VENDOR, File.directory?(VENDOR) ? File.realpath(VENDOR) : VENDOR].uniq
  end

  def loaded_version(name)
    case name
    when "sidekiq"
      require "sidekiq/version"
      ::Sidekiq::VERSION
    when "activesupport"
      require "active_support/version"
      ::ActiveSupport::VERSION::STRING
    end
  end

  # The names of what SIDEKIQ and RAILS replace: none of them may load from anywhere else.
  def foreign_names
    SIDEKIQ.fetch(sidekiq, {}).keys + RAILS.fetch(rails, [])
  end

  # The stack's Sidekiq command: the vendored one when SIDEKIQ asks for it.
  def sidekiq_command
    return [RbConfig.ruby, Gem.bin_path("sidekiq", "sidekiq")] unless sidekiq

    [RbConfig.ruby, *libs.map { |dir| "-I#{dir}" }, "-I#{File.join(ROOT, "lib")}",
     File.join(VENDOR, "sidekiq-#{sidekiq}", "bin", "sidekiq")]
  end

  def vendored(variable, known)
    value = ENV.fetch(variable, "")
    return if value.empty?
    return value if known.key?(value)

    raise ArgumentError,
          "#{variable}=#{value}: the vendored versions are #{known.keys.join(", ")}; unset for the stack's own"
  end
end
