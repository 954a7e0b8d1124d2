# frozen_string_literal: true

class Booking < ApplicationRecord
end
