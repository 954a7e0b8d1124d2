# frozen_string_literal: true

require "cgi"
require "erb"
require "rack/utils"
require "sidekiq/web"
require "lock_manager"
require "lock_manager/admin"

module LockManager
  # The "Locks" tab of Sidekiq's Web UI (Sidekiq 6.4, 7.x and 8.x): every lock with its holders, waiters
  # and the number of jobs parked on it, a search by pattern, a lock's page (its parked jobs, each with a
  # delete button), and a force-release button behind Sidekiq's own CSRF protection; and its Limiters
  # page: the rate limiters in use, each with a reset button behind the same.
  # `require "lock_manager/web"` registers it; mount Sidekiq::Web as usual. See docs/web.md.
  module Web
    ROOT = File.expand_path("web", __dir__)
    VIEWS = File.join(ROOT, "views")
    LOCALES = File.join(ROOT, "locales")
    # The lists show at most this many locks (limiters); a narrower pattern finds the others.
    LIST_LIMIT = 500
    # What Sidekiq 7 and 8 register: the tab, its route, and ROOT's locales.
    TAB = { name: "lock_manager", tab: "Locks", index: "locks", root_dir: ROOT }.freeze
    TEMPLATES = %w[locks lock limiters].to_h { |name| [name, File.read(File.join(VIEWS, "#{name}.erb")).freeze] }.freeze

    class << self
      # The Admin the tab reads and releases through; by default one over LockManager.locker (the
      # configured redis_url, topology and key_prefix), built per request so `configure` applies.
      # Set it to show the locks of another Locker (another key_prefix or Redis).
      attr_writer :admin

      def admin
        @admin || Admin.new
      end

      # The source of a view, rendered by Sidekiq's own `erb` (with its layout) on 6.4, 7.x and 8.x alike.
      def template(name)
        TEMPLATES.fetch(name.to_s)
      end

      # Called back by Sidekiq's register: the routes, on Sidekiq's own web application class.
      def registered(app)
        app.helpers Helpers
        app.get("/locks") do
          lock_manager_list
          erb(LockManager::Web.template(:locks))
        end
        app.get("/locks/show") do
          lock_manager_show
          erb(LockManager::Web.template(:lock))
        end
        app.post("/locks/release") { lock_manager_release }
        app.post("/locks/parked/delete") { lock_manager_delete_parked }
        limiter_routes(app)
      end

      def limiter_routes(app)
        app.get("/locks/limiters") do
          lock_manager_limiters
          erb(LockManager::Web.template(:limiters))
        end
        app.post("/locks/limiters/reset") { lock_manager_reset_limiter }
      end

      # Adds the tab through the API this Sidekiq has: `Web.configure { |config| config.register(...) }`
      # on 8 (its `Web.register` is deprecated) and on the 7.3 releases that have it; else 7's
      # `Web.register` with the tab and locales; else 6's, which takes the routes alone.
      def register
        web = ::Sidekiq::Web
        if web.respond_to?(:configure)
          web.configure { |config| config.register(self, **TAB) }
        elsif web.method(:register).parameters.any? { |_kind, name| name == :tab }
          web.register(self, **TAB)
        else
          web.register(self)
          web.tabs["Locks"] = "locks"
          web.locales << LOCALES unless web.locales.include?(LOCALES)
        end
      end
    end

    # View helpers, mixed into Sidekiq's actions (names prefixed: they share Sidekiq's namespace).
    module Helpers
      # Loads the list page's locks.
      def lock_manager_list
        @locks = lock_manager_found { |admin| admin.locks(@pattern, limit: LIST_LIMIT + 1) }
      end

      # Loads the Limiters page: the limiters in use, and what a reset just did (its redirect's query).
      def lock_manager_limiters
        @limiters = lock_manager_found { |admin| admin.limiters(@pattern, limit: LIST_LIMIT + 1) }
        @reset = lock_manager_param("reset")
        @reset_name = lock_manager_param("name")
        @reset_kind = lock_manager_kind(lock_manager_param("kind"))
      end

      # The query's pattern ("*" when none), and the first LIST_LIMIT of what the block finds with it
      # (asked for one more: @truncated says whether there was more).
      def lock_manager_found
        @pattern = lock_manager_param("pattern") || "*"
        @pattern = "*" if @pattern.strip.empty?
        found = lock_manager_reading { yield LockManager::Web.admin } || []
        @truncated = found.size > LIST_LIMIT
        found.first(LIST_LIMIT)
      end

      # Resets the limiter `name` of `kind` (the query string's; every kind of it when none is given),
      # then shows the Limiters page of `pattern` again, saying what it did.
      def lock_manager_reset_limiter
        name = lock_manager_param("name")
        kind = lock_manager_param("kind")
        back = "#{root_path}locks/limiters?pattern=#{CGI.escape(lock_manager_param("pattern") || "*")}"
        redirect(back) unless name && (kind.nil? || lock_manager_kind(kind))
        reset = LockManager::Web.admin.reset_limiter(name, kind: lock_manager_kind(kind))
        redirect("#{back}&reset=#{reset ? 1 : 0}&name=#{CGI.escape(name)}#{"&kind=#{kind}" if kind}")
      end

      # Loads a lock's page (`key` in the query string), with the first of its parked jobs; the list when it
      # names none.
      def lock_manager_show
        @lock_key = lock_manager_param("key") || redirect("#{root_path}locks")
        @lock = lock_manager_reading { LockManager::Web.admin.lock(@lock_key) }
        @parked = (@lock&.parked&.positive? && lock_manager_reading { lock_manager_parked }) || []
        @released = lock_manager_param("released")
        @deleted = lock_manager_param("deleted")
        @deleted_jid = lock_manager_param("jid")
      end

      # Force-releases the key, then shows its page (Sidekiq's CsrfProtection let the POST through).
      def lock_manager_release
        key = lock_manager_param("key") || redirect("#{root_path}locks")
        released = LockManager::Web.admin.release(key)
        redirect("#{lock_manager_path(key)}&released=#{released ? 1 : 0}")
      end

      # The block's value; nil, with the message for the page, when Redis cannot answer (the locks may
      # live on another Redis than Sidekiq's).
      def lock_manager_reading
        yield
      rescue LockManager::Error => e
        @lock_manager_error = e.message
        nil
      end

      # A query or form parameter, nil when absent or empty.
      def lock_manager_param(name)
        value = request.params[name]
        value.is_a?(String) && !value.empty? ? value : nil
      end

      # Whether this Sidekiq is `major` or newer: 7 and 8 each changed the layout's markup.
      def lock_manager_sidekiq?(major)
        ::Sidekiq::VERSION.to_i >= major
      end

      # A key (arbitrary bytes) as escaped HTML text: invalid UTF-8 and control bytes shown as \xNN.
      def lock_manager_key(key)
        text = key.to_s.dup.force_encoding(Encoding::UTF_8)
        text = text.scrub { |bytes| bytes.unpack("C*").map { |byte| format("\\x%02X", byte) }.join }
        ::Rack::Utils.escape_html(text.gsub(/[\x00-\x1F\x7F]/) { |char| format("\\x%02X", char.ord) })
      end

      # The URL of a lock's page (the key travels as bytes, %-escaped, whatever they are).
      def lock_manager_path(key)
        "#{root_path}locks/show?key=#{CGI.escape(key.to_s)}"
      end

      # Where a lock's release form posts (the key in the query string: a form field would lose bytes
      # that are not UTF-8).
      def lock_manager_release_path(key)
        "#{root_path}locks/release?key=#{CGI.escape(key.to_s)}"
      end

      # Where a limiter's reset form posts: its name (bytes, as a lock's key), its kind, and the pattern
      # of the page to come back to.
      def lock_manager_reset_path(limiter, pattern)
        "#{root_path}locks/limiters/reset?name=#{CGI.escape(limiter.name.to_s)}&kind=#{limiter.kind}" \
          "&pattern=#{CGI.escape(pattern.to_s)}"
      end

      # A limiter's kind from its name in a query string ("gcra", "window", "sliding"); nil for any other.
      def lock_manager_kind(name)
        LockManager::Limiter::KINDS.values.find { |kind| kind.to_s == name }
      end

      # A kind as the page names it.
      def lock_manager_kind_label(kind)
        t("LockManagerKind#{kind.to_s.capitalize}")
      end

      # When a limiter admits one more unit: "now" while any remain, else "in 3.2 s".
      def lock_manager_next_free(limiter)
        seconds = limiter.next_free_in or return t("LockManagerNow")

        t("LockManagerIn", duration: lock_manager_duration(seconds))
      end

      # Who holds (or waits): the job's jid, else host, pid and thread, else the token. (Waiters have no jid.)
      def lock_manager_holder(holder)
        jid = holder.jid if holder.respond_to?(:jid)
        return "jid <code>#{lock_manager_text(jid)}</code>" if jid

        parts = { "" => holder.host, "pid " => holder.pid, "thread " => holder.thread }
                .filter_map { |label, value| "#{label}#{lock_manager_text(value)}" unless value.nil? }
        parts.empty? ? "token <code>#{lock_manager_text(holder.token)}</code>" : parts.join(" · ")
      end

      def lock_manager_text(value)
        lock_manager_key(value.to_s)
      end

      def lock_manager_since(time)
        time ? relative_time(time) : "–"
      end

      # Seconds as "4.2 s", "3 min 05 s", "2 h 07 min"; "–" when unknown.
      def lock_manager_duration(seconds)
        return "–" unless seconds
        return format("%<s>.1f s", s: seconds) if seconds < 60

        seconds = seconds.to_i
        return format("%<m>d min %<s>02d s", m: seconds / 60, s: seconds % 60) if seconds < 3600

        format("%<h>d h %<m>02d min", h: seconds / 3600, m: (seconds % 3600) / 60)
      end

      # "2" for a plain lock's holders, "2 / 3" under a limit.
      def lock_manager_count(lock)
        count = number_with_delimiter(lock.holders.size)
        lock.limit ? "#{count} / #{number_with_delimiter(lock.limit)}" : count
      end
    end
  end
end

require_relative "web/parked"
LockManager::Web.register
