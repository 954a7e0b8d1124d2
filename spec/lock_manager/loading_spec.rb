# frozen_string_literal: true

require "spec_helper"
require "open3"
require "rbconfig"

# What loading the gem's job support defines before any job runs. Digest defines Digest::SHA256 on its
# first use (const_missing, then require): two threads of a Sidekiq process using it first at once can
# get "Digest::Base cannot be directly inherited in Ruby" (Ruby bug 9494), which failed a park.
RSpec.describe "Loading the job support" do
  %w[LockManager::JobLock LockManager::Sidekiq::Parking].each do |constant|
    it "#{constant} defines Digest::SHA256 as it loads, not at a job's first use of it" do
      lib = File.expand_path("../../lib", __dir__)
      script = "require 'lock_manager'; #{constant}; print Digest.const_defined?(:SHA256, false)"
      output, status = Open3.capture2e(RbConfig.ruby, "-I", lib, "-e", script)
      expect([status.success?, output]).to eq([true, "true"])
    end
  end
end
