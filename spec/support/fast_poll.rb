# frozen_string_literal: true

# For the apps the specs' `sidekiq -r` loads: scheduled and rescheduled jobs come back within about a
# second (Sidekiq's default is 5 s per process, after 10 s to 15 s of initial wait). Sidekiq 6.4 keeps its
# settings in Sidekiq.options; 7 in the Sidekiq::Config it yields, which still reads poll_interval_average
# (average_scheduled_poll_interval would keep the initial wait).
Sidekiq.configure_server do |config|
  settings = config.respond_to?(:[]=) ? config : Sidekiq.options
  settings[:poll_interval_average] = 0.5
end
