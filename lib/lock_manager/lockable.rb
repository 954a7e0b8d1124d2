# frozen_string_literal: true

# The Rails helper, as apps require it (`require "lock_manager/lockable"`); it lives in rails/lockable.rb.
require_relative "rails/lockable"
