# frozen_string_literal: true

require "spec_helper"
require "fileutils"
require "open3"
require "rbconfig"
require "tmpdir"

# The gem must build and install on an offline machine without rb_sys (extconf.rb's cargo
# fallback), and work when required from outside this checkout.
#
# Building and installing it compiles the crate (a minute or two on 2 cores): that starts with the
# suite (before(:suite), when this example is to run), in the background at a low priority, and the
# example waits for it. The rest of the suite mostly waits on its servers and processes: its CPU goes
# to the compile instead of idling, and the suite does not wait the compile's length once more.
class PackagedGem
  ROOT = File.expand_path("..", __dir__)

  class << self
    attr_reader :current

    def start
      return @current if @current

      @current = new.start
    end
  end

  attr_reader :dir, :env

  def initialize
    @dir = Dir.mktmpdir("lock_manager-gem")
    @owner = Process.pid
    @log = File.join(@dir, "build.log")
    gem_home = File.join(@dir, "gems")
    @target = ENV.fetch("CARGO_TARGET_DIR", File.join(ROOT, "target"))
    @env = { "GEM_HOME" => gem_home, "GEM_PATH" => gem_home, "CARGO_TARGET_DIR" => File.join(@target, "gem-install"),
             "RUBYOPT" => nil, "BUNDLE_GEMFILE" => nil, "BUNDLER_SETUP" => nil, "RUBYLIB" => nil }
  end

  def gem_home
    @env.fetch("GEM_HOME")
  end

  # Seeds the target directory here (no example runs yet: GC.stress, which one sets, would slow a
  # copy made in Ruby beside it), then builds and installs in a thread that only waits on them.
  def start
    seed_target(File.join(@target, "release"), File.join(@target, "gem-install"))
    package = File.join(@dir, "lm.gem")
    gem = [RbConfig.ruby, "-S", "gem"]
    @thread = Thread.new do
      run(*gem, "build", File.join(ROOT, "lock_manager.gemspec"), "--output", package, chdir: ROOT)
      # At a low priority: the servers of the specs running beside it (Sentinel's timers among them,
      # whose TILT a starved second sets off) keep their share of the 2 cores.
      run("nice", "-n", "10", *gem, "install", "--local", "--no-document", package, chdir: @dir)
    end
    @thread.report_on_exception = false
    at_exit { stop }
    self
  end

  # Waits for the build and the install; raises with their output if one failed.
  def wait
    @thread.join
  end

  # Stops a build still running (the suite ends without the example, or is stopped) and removes
  # what it made; a forked child of the suite leaves both alone.
  def stop
    return unless Process.pid == @owner

    if @pid
      Process.kill(:TERM, -@pid)
      @thread.join(10)
    end
    FileUtils.rm_rf(@dir)
  rescue Errno::ESRCH
    FileUtils.rm_rf(@dir)
  end

  private

  def run(*command, chdir:)
    @pid = Process.spawn(@env, *command, chdir: chdir, out: [@log, "a"], err: %i[child out], pgroup: true)
    _, status = Process.wait2(@pid)
    @pid = nil
    raise "#{command.join(" ")} failed:\n#{File.read(@log)}" unless status.success?
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
    # Under cargo's own lock of that directory, so that nothing a cargo builds there meanwhile (the
    # example bench/instructions.rb runs, beside the specs) is copied half written. Times kept: cargo
    # compares them to find what is stale.
    File.open(File.join(from, ".cargo-lock"), File::RDWR | File::CREAT) do |lock|
      lock.flock(File::LOCK_EX)
      FileUtils.cp_r(%w[deps build .fingerprint].map { |name| File.join(from, name) }, partial, preserve: true)
    end
    File.rename(partial, release)
  end
end

RSpec.describe "The packaged gem", :packaged_gem do
  def run!(env, *command, chdir:)
    output, status = Open3.capture2e(env, *command, chdir: chdir)
    raise "#{command.join(" ")} failed:\n#{output}" unless status.success?

    output
  end

  it "builds, installs into a fresh GEM_HOME and takes a lock from outside the checkout", timeout: 400 do
    install = PackagedGem.start # started with the suite, unless a hook of this file's did not run
    install.wait
    script = <<~RUBY
      require "lock_manager"
      native = $LOADED_FEATURES.grep(%r{lock_manager/lock_manager[.]})
      result = LockManager::Locker.nonblocking_lock("installed-#{prefix}") { :from_the_gem }
      puts [native.first, result.run?, result.result].join(" ")
    RUBY
    output = run!(install.env.merge("REDIS_URL" => redis_url), RbConfig.ruby, "-e", script, chdir: install.dir)

    native, ran, value = output.split
    expect(native).to start_with(install.gem_home)
    expect([ran, value]).to eq(%w[true from_the_gem])
    expect(Dir.glob(File.join(install.gem_home, "gems", "lock_manager-*", "ext", "lock_manager", "target"))).to eq([])
  end
end

RSpec.configure do |config|
  # The suite's random order, but this file's group last: its example waits for the build, which by then
  # has long ended beside the other examples (drawn early, it waited 78 s of a Debian 13 run). The other
  # groups keep their order under the seed, so `--seed N` (which keeps plain random order) still repeats
  # a run's order around it.
  random = config.ordering_registry.fetch(:random)
  config.register_ordering(:global) do |items|
    rest, last = random.order(items).partition { |item| !item.metadata[:packaged_gem] }
    rest + last
  end

  config.before(:suite) do
    group = RSpec.world.example_groups.find { |example_group| example_group.metadata[:packaged_gem] }
    PackagedGem.start if group && RSpec.world.filtered_examples[group].any?
  end
end
