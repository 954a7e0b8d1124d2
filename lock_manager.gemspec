# frozen_string_literal: true

require_relative "lib/lock_manager/version"

Gem::Specification.new do |spec|
  spec.name = "lock_manager"
  spec.version = LockManager::VERSION
  spec.authors = ["lock_manager developers"]
  spec.summary = "Distributed locks on Redis for Rails and Sidekiq, with a Rust core"
  spec.description = "Blocking and non-blocking Redis locks (SET NX PX + compare-and-delete) " \
                     "with an r2d2 connection pool in Rust, the GVL released for every wait."
  spec.license = "MIT"
  spec.required_ruby_version = ">= 3.0"

  spec.files = Dir[
    "lib/**/*.rb", "sig/**/*.rbs", "exe/*", "ext/lock_manager/extconf.rb", "ext/lock_manager/Cargo.toml",
    "ext/lock_manager/src/**/*.rs", "ext/lock_manager/src/**/*.lua", "lib/lock_manager/web/**/*.{erb,yml}",
    "ext/patched/**/{*.rs,*.md,Cargo.toml,LICENSE-*}", "Cargo.toml", "Cargo.lock", "README.md", "LICENSE"
  ]
  spec.require_paths = ["lib"]
  spec.bindir = "exe"
  spec.executables = ["lock_manager"]
  spec.extensions = ["ext/lock_manager/extconf.rb"]
  spec.metadata["rubygems_mfa_required"] = "true"
  # rb_sys is used when installed (see extconf.rb) but not required: the fallback runs cargo.
end
