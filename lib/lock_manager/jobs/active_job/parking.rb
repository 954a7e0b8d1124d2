# frozen_string_literal: true

module LockManager
  module ActiveJob
    # on_conflict: :park for an ActiveJob class on Sidekiq's adapter. The job parks through a push of
    # its own: the adapter pushes it as for any enqueue, through Sidekiq's client, and the lock_manager
    # client middleware parks that push (Sidekiq::Parking) instead of writing it. So the payload that
    # waits in the line is the adapter's own, whichever Rails and Sidekiq make it.
    module Parking
      def serialize
        data = super
        return data unless @lock_manager_parking

        data.instance_variable_set(LockManager::Sidekiq::Parking::PARK, @lock_manager_parking)
        @lock_manager_parked_data = data
      end

      private

      # Parks the job at `spot` (a Parkable::Spot).
      # @return [Array(Symbol, Integer), nil] Claims#park's reply, or nil where the job cannot park:
      #   another adapter than Sidekiq's, or Sidekiq's Redis not the locks'
      def lock_manager_park(spot)
        return unless lock_manager_parks_here?

        @lock_manager_parking = spot
        enqueue
        @lock_manager_parked_data&.instance_variable_get(LockManager::Sidekiq::Parking::PARKED)
      ensure
        @lock_manager_parking = @lock_manager_parked_data = nil
      end

      def lock_manager_parks_here?
        sidekiq = self.class.queue_adapter.class.name.to_s.end_with?("SidekiqAdapter")
        sidekiq && defined?(LockManager::Sidekiq::OnePush) &&
          LockManager::Sidekiq::OnePush.possible?(::Sidekiq::Client.new.redis_pool)
      end
    end
  end
end
