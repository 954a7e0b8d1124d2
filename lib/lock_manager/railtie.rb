# frozen_string_literal: true

# The Railtie, as an app that loads Rails after this gem requires it (`require "lock_manager/railtie"`);
# it lives in rails/railtie.rb.
require_relative "rails/railtie"
