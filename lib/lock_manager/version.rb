# frozen_string_literal: true

module LockManager
  VERSION = "0.1.0"
end
