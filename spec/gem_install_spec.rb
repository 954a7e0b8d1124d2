# frozen_string_literal: true

require "spec_helper"
require "open3"
require "rbconfig"
require "tmpdir"

# The gem must build and install on an offline machine without rb_sys (extconf.rb's cargo
# fallback), and work when required from outside this checkout.
RSpec.describe "The packaged gem" do
  root = File.expand_path("..", __dir__)

  def run!(env, *command, chdir:)
    output, status = Open3.capture2e(env, *command, chdir: chdir)
    raise "#{command.join(" ")} failed:\n#{output}" unless status.success?

    output
  end

  # On a clean clone this compiles every crate once more (in target/gem-install): minutes on 2 cores.
  it "builds, installs into a fresh GEM_HOME and takes a lock from outside the checkout", timeout: 400 do
    Dir.mktmpdir("lock_manager-gem") do |dir|
      gem_home = File.join(dir, "gems")
      # Reuses compiled dependencies between runs; the gem's own crate is still built from the package.
      env = { "GEM_HOME" => gem_home, "GEM_PATH" => gem_home, "REDIS_URL" => redis_url,
              "CARGO_TARGET_DIR" => File.join(ENV.fetch("CARGO_TARGET_DIR", File.join(root, "target")), "gem-install"),
              "RUBYOPT" => nil, "BUNDLE_GEMFILE" => nil, "BUNDLER_SETUP" => nil, "RUBYLIB" => nil }
      ruby = RbConfig.ruby
      gem = [ruby, "-S", "gem"]

      package = File.join(dir, "lm.gem")
      run!(env, *gem, "build", File.join(root, "lock_manager.gemspec"), "--output", package, chdir: root)
      # At a low priority: the servers of the specs running beside it (Sentinel's timers among them,
      # whose TILT a starved second sets off) keep their share of the 2 cores.
      run!(env, "nice", "-n", "10", *gem, "install", "--local", "--no-document", package, chdir: dir)
      script = <<~RUBY
        require "lock_manager"
        native = $LOADED_FEATURES.grep(%r{lock_manager/lock_manager[.]})
        result = LockManager::Locker.nonblocking_lock("installed-#{prefix}") { :from_the_gem }
        puts [native.first, result.run?, result.result].join(" ")
      RUBY
      output = run!(env, ruby, "-e", script, chdir: dir)

      native, ran, value = output.split
      expect(native).to start_with(gem_home)
      expect([ran, value]).to eq(%w[true from_the_gem])
      expect(Dir.glob(File.join(gem_home, "gems", "lock_manager-*", "ext", "lock_manager", "target"))).to eq([])
    end
  end
end
