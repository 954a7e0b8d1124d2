# frozen_string_literal: true

require "spec_helper"
require "open3"
require "rbconfig"

# Every file of lib/ loaded with `ruby -w` in a child process (with Rails, Sidekiq and its Web UI, RSpec and
# Minitest loaded first, as an app loads them): not one warning may name a file of the gem.
RSpec.describe "lib/ under ruby -w" do
  lib = File.expand_path("../../lib", __dir__)
  # As an app loads them: a file before the parts it requires (lock_manager/sidekiq.rb before lock_manager/sidekiq/*).
  files = Dir[File.join(lib, "**", "*.rb")].sort_by { |file| file.delete_suffix(".rb") }

  it "loads every file without a warning" do
    script = <<~RUBY
      require "rails"
      require "active_record/railtie"
      require "action_controller/railtie"
      require "active_job/railtie"
      require "sidekiq"
      require "sidekiq/web"
      require "sidekiq/testing"
      require "rspec/core"
      require "rspec/expectations"
      require "minitest"
      require "lock_manager"
      require "lock_manager/cli"
      #{files.map { |file| "require #{file.inspect}" }.join("\n")}
      puts $LOADED_FEATURES.grep(%r{\\A#{Regexp.escape(lib)}/.*\\.rb\\z}).size
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-w", "-I", lib, "-e", script)

    expect(status).to be_success, err
    expect(out.to_i).to eq(files.size)
    expect(err.lines.grep(/#{Regexp.escape(lib)}/).join).to eq("")
  end

  it "has frozen string literals in every file" do
    expect(files.reject { |file| File.foreach(file).first(2).include?("# frozen_string_literal: true\n") }).to eq([])
  end
end
