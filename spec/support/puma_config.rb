# frozen_string_literal: true

# The Puma config file of the suite's Rails apps (their settings are on the command line: see PumaProcess),
# also required by spec/support/web_app.rb. It only keeps a Ruby bug out of the stop.
#
# From Ruby 3.3, IO#close waits for the threads it interrupts in an I/O call on that IO to leave it, and a
# thread that is running a signal handler never tells it: on its way out it raises "can't be called from
# trap context" instead, and the close waits forever (ruby/ruby#13684, fixed after 3.3.8). Puma's TERM
# handler writes its stop command to a pipe (Server#notify_safely) that the server thread closes once it has
# read it, so a server thread that got there before the write returned never stopped (puma/puma#3677; Puma's
# own change to `syswrite` still hangs on 3.3.8). `write_nonblock` keeps the GVL: no close can interrupt it.
if RUBY_VERSION >= "3.3"
  Puma::Server.prepend(Module.new do
    private

    def notify_safely(message)
      @notify.write_nonblock(message, exception: false)
    rescue IOError, NoMethodError, Errno::EPIPE, Errno::EBADF
      nil # the server thread has stopped already
    end
  end)
end
