# frozen_string_literal: true

require "spec_helper"
require "digest"
require "json"
require "open3"
require "rbconfig"
require "tmpdir"
require_relative "support/native_gem"

# The stack's Sidekiq (or the vendored one SIDEKIQ names) without this checkout's lib/ on its load
# path: what it runs must come from the installed gem.
class InstalledGemSidekiq < SidekiqProcess
  private

  def sidekiq_command
    Stack.sidekiq_command - ["-I#{File.join(Stack::ROOT, "lib")}"]
  end
end

# The precompiled gem (spec/support/native_gem.rb, what `rake native:gem` packs) as a user without
# a Rust toolchain gets it: `gem install --local` into a fresh GEM_HOME, with a PATH that holds
# `ruby` and `gem` and nothing else (no cargo, rustc, cc, make, llvm-config: nothing could compile),
# then the README's first example and a real `sidekiq` process on it. The gem carries this Ruby's
# build, and the other stack's where this checkout has it (after `rake native:gem`, or once both
# stacks of bin/test compiled). The source gem keeps its own spec: gem_install_spec.rb.
RSpec.describe "The precompiled gem" do
  readme = File.read(File.join(Stack::ROOT, "README.md"))
  first_example = readme[/^```ruby\n(.*?)^```/m, 1]
  job_class = first_example[/^class SyncUserJob\b.*?^end$/m]

  def gem_env(dir, redis_url)
    bin = File.join(dir, "bin")
    FileUtils.mkdir_p(bin)
    gem_script = File.join(RbConfig::CONFIG["bindir"], RbConfig::CONFIG["ruby_install_name"].sub("ruby", "gem"))
    File.symlink(RbConfig.ruby, File.join(bin, "ruby"))
    File.symlink(File.exist?(gem_script) ? gem_script : File.join(RbConfig::CONFIG["bindir"], "gem"),
                 File.join(bin, "gem"))
    gem_home = File.join(dir, "gems")
    # GEM_PATH unset: the system's gems (Sidekiq, redis) and the fresh GEM_HOME, where lock_manager is.
    { "PATH" => bin, "GEM_HOME" => gem_home, "GEM_PATH" => nil, "REDIS_URL" => redis_url,
      "RUBYOPT" => (Stack.libs.map { |lib| "-I#{lib}" }.join(" ") if Stack.libs.any?), "RUBYLIB" => nil,
      "BUNDLE_GEMFILE" => nil, "BUNDLER_SETUP" => nil, "BUNDLE_BIN_PATH" => nil, "BUNDLER_VERSION" => nil,
      "LIBCLANG_PATH" => nil, "CARGO" => nil, "RUSTC" => nil, "CARGO_TARGET_DIR" => nil }
  end

  # Packs quietly (`rake native:gem` shows RubyGems' summary and warnings).
  def build_platform(dir, rubies)
    Gem::DefaultUserInteraction.use_ui(Gem::SilentUI.new) { NativeGem.build_platform(dir, rubies: rubies) }
  end

  def run(env, *command, chdir:)
    started = monotonic
    output, status = Open3.capture2e(env, *command, chdir: chdir)
    [output, status, monotonic - started]
  end

  def run!(env, *command, chdir:)
    output, status, seconds = run(env, *command, chdir: chdir)
    raise "#{command.join(" ")} failed:\n#{output}" unless status.success?

    [output, seconds]
  end

  def gem_install(env, path, *options)
    run(env, RbConfig.ruby, "-S", "gem", "install", "--local", "--no-document", *options, path,
        chdir: File.dirname(path))
  end

  # What a process loaded: the library and the native build, as paths.
  loaded = <<~RUBY
    def loaded_from
      { "rb" => $LOADED_FEATURES.grep(%r{/lock_manager[.]rb\\z}),
        "native" => $LOADED_FEATURES.grep(%r{/lock_manager/[^/]+/lock_manager[.]#{NativeGem::DLEXT}\\z}) }
    end
  RUBY

  def installed
    File.join(@env["GEM_HOME"], "gems", "lock_manager-#{LockManager::VERSION}-x86_64-linux")
  end

  # What a process of the installed gem must load: its lib/, and this Ruby's build it carries.
  def loaded_from_the_gem
    { "rb" => ["#{installed}/lib/lock_manager.rb"],
      "native" => ["#{installed}/lib/lock_manager/#{Stack.ruby}/lock_manager.#{NativeGem::DLEXT}"] }
  end

  before(:all) do
    @dir = Dir.mktmpdir("lock_manager-native")
    @server = RedisServer.new.start
    @package = build_platform(@dir, NativeGem.built)
    @env = gem_env(@dir, @server.url).merge("LOCK_PREFIX" => "native:#{SecureRandom.hex(4)}:")
    @install = gem_install(@env, @package)
  end

  after(:all) do
    @server&.shutdown
    FileUtils.rm_rf(@dir) if @dir
  end

  it "installs with `gem install --local` in seconds, with no cargo nor compiler on PATH, compiling nothing" do
    expect(NativeGem.built).to include(Stack.ruby)
    tools = %w[cargo rustc cc gcc make clang llvm-config]
    expect(tools.select { |tool| File.exist?(File.join(@env["PATH"], tool)) }).to eq([])

    output, status, seconds = @install
    expect(status).to be_success, output
    puts format("\n    gem install --local %<gem>s (Ruby %<ruby>s): %<s>.1f s, %<kb>d kB",
                gem: File.basename(@package), ruby: RUBY_VERSION, s: seconds, kb: File.size(@package) / 1024)
    expect(output).to include("Successfully installed lock_manager-#{LockManager::VERSION}-x86_64-linux")
    expect(output).not_to include("Building native extensions")
    expect(seconds).to be < 30
    expect(Dir.glob(File.join(@env["GEM_HOME"], "extensions", "**", "*"))).to eq([])
    carried = Dir.glob("#{installed}/lib/lock_manager/*/lock_manager.#{NativeGem::DLEXT}")
    expect(carried.map { |path| path.split("/")[-2] }).to eq(NativeGem.built)
    expect(carried.map { |path| Digest::SHA256.file(path) })
      .to eq(NativeGem.built.map { |ruby| Digest::SHA256.file(NativeGem.binary(ruby)) })
    expect(Dir.children(installed)).not_to include("ext", "Cargo.toml")
  end

  it "runs the README's first example, as written, on this Ruby's build it carries" do
    example = <<~RUBY
      require "json"
      require "lock_manager"
      LockManager.configure { |c| c.redis_url = ENV["REDIS_URL"]; c.key_prefix = ENV["LOCK_PREFIX"] }
      def send_the_report = puts("report sent")
      #{first_example}
      #{loaded}
      puts JSON.generate(loaded_from.merge("job" => SyncUserJob.lock_manager_options))
    RUBY
    output, = run!(@env, RbConfig.ruby, "-e", example, chdir: @dir)
    expect(output.lines.first(2)).to eq(["report sent\n"] * 2)
    run = JSON.parse(output.lines.last)
    expect(run.slice("rb", "native")).to eq(loaded_from_the_gem)
    expect(run["job"]).to include("mode" => "until_executed", "unique_for" => 3600)
  end

  it "runs the README's job in a real `sidekiq`: one pending at most, pushed again once it ran" do
    log = "#{@env["LOCK_PREFIX"]}synced"
    app = File.join(@dir, "app.rb")
    File.write(app, <<~RUBY)
      require "json"
      require "sidekiq"
      require "lock_manager"
      LockManager.configure { |c| c.redis_url = ENV["REDIS_URL"]; c.key_prefix = ENV["LOCK_PREFIX"] }
      Sidekiq.configure_server { |config| config.redis = { url: ENV["REDIS_URL"] } }
      Sidekiq.configure_client { |config| config.redis = { url: ENV["REDIS_URL"] } }
      #{loaded}
      #{job_class}
      class SyncUserJob
        def perform(user_id)
          sleep 1
          Sidekiq.redis { |conn| conn.call("RPUSH", #{log.dump}, JSON.generate(loaded_from.merge("user" => user_id))) }
        end
      end
    RUBY
    sidekiq = InstalledGemSidekiq.new(app: app, env: @env).start
    pushes = <<~RUBY
      require #{app.dump}
      Sidekiq.logger.level = Logger::ERROR # a refused push is logged at WARN
      first = Array.new(3) { SyncUserJob.perform_async(1) }
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20
      until (again = SyncUserJob.perform_async(1)) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        sleep 0.1
      end
      puts JSON.generate(loaded_from.merge("first" => first, "again" => again))
    RUBY
    output, = run!(@env, RbConfig.ruby, "-e", pushes, chdir: @dir)
    client = JSON.parse(output.lines.last)
    expect(client["first"]).to match([kind_of(String), nil, nil])
    expect(client["again"]).to be_a(String)
    expect(client.slice("rb", "native")).to eq(loaded_from_the_gem)
    admin = @server.client
    runs = eventually(timeout: 20, interval: 0.1) { (entries = admin.lrange(log, 0, -1)).size == 2 && entries }
    expect(runs.map { |entry| JSON.parse(entry) }).to eq([loaded_from_the_gem.merge("user" => 1)] * 2)
  ensure
    admin&.close
    sidekiq&.stop
  end

  # On Ruby 3.2, between the two it carries, RubyGems installs the precompiled gem (>= 3.1, < 3.4.dev)
  # and only `require` can say it has no build for that Ruby. The same situation here: a gem carrying
  # the other stack's Ruby alone, which RubyGems refuses on this one; installed with --force anyway.
  it "on a Ruby it has no build for, says at require which Rubies it carries and how to get the source gem" do
    others = NativeGem.built - [Stack.ruby]
    skip "this checkout has no build for another Ruby than #{Stack.ruby} (bundle exec rake native:gem)" if others.empty?

    Dir.mktmpdir("lock_manager-native") do |dir|
      package = build_platform(dir, others)
      env = gem_env(dir, redis_url)
      output, status, = gem_install(env, package)
      expect(status).not_to be_success
      expect(output).to include("lock_manager-#{LockManager::VERSION}-x86_64-linux requires Ruby version " \
                                ">= #{others.first}, < #{others.last.succ}.dev")
      output, status, = gem_install(env, package, "--force")
      expect(status).to be_success, output

      output, status, = run(env, RbConfig.ruby, "-e", 'require "lock_manager"', chdir: dir)
      expect(status).not_to be_success
      expect(output).to include(<<~MESSAGE)
        lock_manager #{LockManager::VERSION} is precompiled for Ruby #{others.join(", ")}, not for this Ruby #{RUBY_VERSION} (LoadError)
        Install the source gem instead, which compiles the extension (it needs Rust's cargo 1.88 or newer, and libclang):
          gem install lock_manager --platform ruby
          or with Bundler: gem "lock_manager", force_ruby_platform: true (or: bundle config set force_ruby_platform true)
        In a checkout of lock_manager: bundle exec rake compile
      MESSAGE
    end
  end
end
