# frozen_string_literal: true

require "spec_helper"
require "fileutils"
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

  # A target directory of the gem's own (target/gem-install), so that its build never replaces what
  # `rake compile` built. Empty on a clean clone, it starts as a copy of `rake compile`'s release
  # directory: the package has the same workspace, profile, features, Cargo.lock and RUBY, so cargo
  # takes most crates.io dependencies as built (half the CPU time of compiling them all). Still
  # compiled: the workspace's own crates from the package's sources (`gem install` has just written
  # them, newer than anything copied), lock_manager and the patched parking_lot_core, and what depends
  # on them (parking_lot, r2d2, redis...); and ring and what depends on it, as `gem install` sets
  # SOURCE_DATE_EPOCH, which ring's build script reruns on.
  def seed_target(from, to)
    release = File.join(to, "release")
    return if File.directory?(release) || !File.directory?(File.join(from, "deps"))

    partial = "#{release}.partial"
    FileUtils.rm_rf(partial)
    FileUtils.mkdir_p(partial)
    # Times kept: cargo compares them to find what is stale.
    FileUtils.cp_r(%w[deps build .fingerprint].map { |name| File.join(from, name) }, partial, preserve: true)
    File.rename(partial, release)
  end

  it "builds, installs into a fresh GEM_HOME and takes a lock from outside the checkout", timeout: 400 do
    Dir.mktmpdir("lock_manager-gem") do |dir|
      gem_home = File.join(dir, "gems")
      target = ENV.fetch("CARGO_TARGET_DIR", File.join(root, "target"))
      seed_target(File.join(target, "release"), File.join(target, "gem-install"))
      env = { "GEM_HOME" => gem_home, "GEM_PATH" => gem_home, "REDIS_URL" => redis_url,
              "CARGO_TARGET_DIR" => File.join(target, "gem-install"),
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
