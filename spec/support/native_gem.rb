# frozen_string_literal: true

require "fileutils"
require "rbconfig"
require "rubygems/package"

# The two gems `rake native:gem` builds: the source gem (lock_manager.gemspec as it is: RubyGems
# compiles the extension at install) and the precompiled one, laid out as rake-compiler and rb-sys
# lay out cross gems: platform x86_64-linux, one build per Ruby in lib/lock_manager/<major.minor>/,
# no `extensions`, no Rust sources, and a required_ruby_version from the oldest Ruby it carries to
# the newest (`>= 3.1`, `< 3.4.dev`). Plain Ruby, no gem: the Rakefile and spec/native_gem_spec.rb
# load it.
module NativeGem
  ROOT = File.expand_path("../..", __dir__)
  PLATFORM = "x86_64-linux"
  # The Rubies the precompiled gem carries, and the stack (bin/stack) that builds each.
  RUBIES = { "3.1" => "debian12", "3.3" => "debian13" }.freeze
  DLEXT = RbConfig::CONFIG["DLEXT"]

  module_function

  def binary(ruby)
    File.join(ROOT, "lib", "lock_manager", ruby, "lock_manager.#{DLEXT}")
  end

  # The Rubies this checkout has a build for.
  def built
    RUBIES.keys.select { |ruby| File.file?(binary(ruby)) }
  end

  def source_spec
    # Gem::Specification.load caches what it returns: the platform gem changes a copy.
    Gem::Specification.load(File.join(ROOT, "lock_manager.gemspec")).dup
  end

  def platform_spec(rubies)
    check!(rubies)
    sorted = rubies.sort_by { |ruby| ruby.split(".").map(&:to_i) }
    spec = source_spec
    spec.platform = PLATFORM
    spec.extensions = []
    spec.files = spec.files.reject { |file| file.start_with?("ext/", "Cargo.") } +
                 sorted.map { |ruby| "lib/lock_manager/#{ruby}/lock_manager.#{DLEXT}" }
    spec.required_ruby_version = [">= #{sorted.first}", "< #{sorted.last.succ}.dev"]
    spec
  end

  def check!(rubies)
    raise ArgumentError, "a precompiled gem carries one Ruby at least" if rubies.empty?

    missing = rubies.map { |ruby| binary(ruby) }.reject { |path| File.file?(path) }
    raise ArgumentError, "no build at #{missing.join(", ")} (bundle exec rake native:gem)" if missing.any?
  end

  # Writes the source gem into `dir`; returns its path.
  def build_source(dir)
    package(source_spec, dir)
  end

  # Writes a precompiled gem carrying `rubies` (all of RUBIES by default) into `dir`; returns its path.
  def build_platform(dir, rubies: RUBIES.keys)
    package(platform_spec(rubies), dir)
  end

  def package(spec, dir)
    FileUtils.mkdir_p(dir)
    path = File.join(File.expand_path(dir), spec.file_name)
    # Gem::Package reads spec.files relative to the working directory.
    Dir.chdir(ROOT) { Gem::Package.build(spec, false, false, path) }
    path
  end
end
