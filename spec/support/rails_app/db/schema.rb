# frozen_string_literal: true

ActiveRecord::Schema.define do
  create_table :bookings do |t|
    t.string :slot, null: false # deliberately no unique index: the lock alone keeps one row per slot
    t.bigint :fencing_token
    t.timestamps
  end

  create_table :counters do |t|
    t.integer :value, null: false, default: 0
    t.bigint :fencing_token
    t.timestamps
  end
end
