# frozen_string_literal: true

# Waiting on what jobs recorded (spec/active_job, spec/sidekiq): the including spec says where the
# events of a job class are, as `recorded(klass)`: hashes with "event", "jid" and more.
module JobEvents
  def events(klass, event = nil)
    list = recorded(klass)
    event ? list.select { |e| event === e["event"] } : list # rubocop:disable Style/CaseEquality -- String or Regexp
  end

  def wait_for(klass, event, count = 1, timeout: 20)
    eventually(timeout: timeout, interval: 0.02) { events(klass, event).size >= count }
    events(klass, event)
  end

  def wait_for_job(job, event, timeout: 20)
    eventually(timeout: timeout, interval: 0.02) { events(job.class, event).find { |e| e["jid"] == job.job_id } }
  end
end
