# frozen_string_literal: true

require "spec_helper"
require "base64"
require "cgi"
require "json"
require "rbconfig"
require "lock_manager/admin"
require_relative "../support/browser"
require_relative "../support/web_server"

# The Locks tab of Sidekiq's Web UI, in a real headless Chromium against Sidekiq::Web served by Puma
# in a process of its own, over a redis-server of this file's own where another process holds real
# locks: a plain lock with a fair waiter queued, a semaphore, a job's claim, a key of odd bytes.
# Then its Limiters page, over limiters of each kind this process used. Runs on each stack's own Sidekiq, and
# on the vendored one SIDEKIQ names (7.3.9, 8.1.7). The examples run in order: the last of the locks' releases
# a lock, the parked jobs' delete and release follow their listing, and the limiters' resets follow theirs.
# Screenshots go to tmp/web/<sidekiq version>-<page>.png.
RSpec.describe "The Sidekiq Web Locks tab", order: :defined do
  odd_key = "odd:<b>bold</b> \"quoted\" & \xFF\n".b
  keys = ["odd:<b>bold</b> \"quoted\" & \\xFF\\x0A", "partner-api", "report:daily", "report:weekly", "sync:user:7"]

  before(:all) do
    missing = Browser.missing
    skip "spec/web skipped: #{missing}" if missing

    require "sidekiq"
    @version = Sidekiq::VERSION
    @key_prefix = "web:#{SecureRandom.hex(3)}:"
    @server = RedisServer.new.start
    @holders = IO.popen([RbConfig.ruby, "-I#{File.join(root_dir, "lib")}",
                         File.join(root_dir, "spec/support/web_holders.rb"), @server.url, @key_prefix], "r+")
    @web = WebServer.new(redis_url: @server.url, key_prefix: @key_prefix).start
    @ready = JSON.parse(@holders.gets || raise("the holders' process died")).fetch("ready")
    @browser = Browser.new.start
    eventually { admin.lock("report:daily")&.waiters&.size == 1 } # the fair waiter is queued
  end

  after(:all) do
    @browser&.quit
    @web&.stop
  ensure
    @holders&.close
    @server&.shutdown
  end

  def admin
    @admin ||= LockManager::Admin.new(LockManager::Locker.new(redis_url: @server.url, key_prefix: @key_prefix))
  end

  def screenshot(page)
    @browser.screenshot(File.join(root_dir, "tmp", "web", "#{@version}-#{page}.png"))
  end

  def root_dir
    File.expand_path("../..", __dir__)
  end

  # Types `pattern` into the search box of the page at `path` and submits it, as a user does.
  def search(path, pattern)
    @browser.visit(@web.url(path))
    @browser.find("#lock-manager-pattern").clear
    @browser.find("#lock-manager-pattern").send_keys(pattern)
    @browser.find("#lock-manager-search input[type=submit]").click
    eventually { @browser.driver.current_url.include?("pattern=#{pattern[/\A\w+/]}") }
  end

  def rows
    @browser.all("#lock-manager-locks tbody tr").map { |row| row.find_elements(css: "td").map(&:text) }
  end

  # Every lock key of this file's prefix (the locks' internal keys too) and its DUMP: what a release
  # must leave untouched.
  def dumps(except:)
    @server.client.then do |redis|
      redis.keys("*#{@key_prefix}*").reject { |key| key.include?(except) }.sort.to_h { |key| [key, redis.dump(key)] }
    ensure
      redis.close
    end
  end

  it "lists every lock in Sidekiq's layout, with its holder, since, TTL, holders and waiters" do
    @browser.visit(@web.url("/locks"))
    screenshot("list")

    expect(@browser.find("li.active a").text).to eq("Locks")
    expect(@browser.text).to include("Sidekiq v#{@version}").or include(@version)
    table = rows.to_h { |cells| [cells[0], cells[1..]] }
    expect(table.keys).to eq(keys)
    expect(table.fetch("report:daily")).to match([/pid #{@ready.fetch("pid")} · thread /, be_a(String),
                                                  /\A\d+(\.\d)? s\z|min/, "1", "1"])
    expect(table.fetch("partner-api")).to match([/\+1 more/, be_a(String), /s|min/, "2 / 3", "0"])
    expect(table.fetch("sync:user:7")[0]).to eq("jid #{@ready.fetch("jid")}")
    # The odd key is text: its markup is not markup, its bytes are shown, its link carries them.
    expect(@browser.all("#lock-manager-locks b")).to be_empty
    href = @browser.all("a.lock-manager-key").first.attribute("href")
    expect(href).to end_with("locks/show?key=odd%3A%3Cb%3Ebold%3C%2Fb%3E+%22quoted%22+%26+%FF%0A")
  end

  it "searches by pattern" do
    search("/locks", "report:*")
    screenshot("search")

    expect(rows.map(&:first)).to eq(%w[report:daily report:weekly])
    expect(@browser.find("#lock-manager-pattern").attribute("value")).to eq("report:*")

    @browser.visit(@web.url("/locks?pattern=nothing:*"))
    expect(@browser.find("#lock-manager-none").text).to eq("No lock matches nothing:*.")
  end

  it "opens a lock: its holder, its queued waiter, a semaphore's holders, a job's jid, an odd key" do
    @browser.visit(@web.url("/locks?pattern=report:*"))
    @browser.all("a.lock-manager-key").find { |link| link.text == "report:daily" }.click
    eventually { @browser.all("#lock-manager-holders").any? }
    screenshot("lock")

    expect(@browser.find("#lock-manager-key").text).to eq("report:daily")
    holders = @browser.all("#lock-manager-holders tbody tr")
    expect(holders.size).to eq(1)
    expect(holders.first.text).to include("pid #{@ready.fetch("pid")}", @ready.fetch("report"))
    waiters = @browser.all("#lock-manager-waiters tbody tr")
    expect(waiters.size).to eq(1)
    expect(waiters.first.text).to start_with("1 ").and include("pid #{@ready.fetch("pid")}")

    @browser.visit(@web.url("/locks/show?key=partner-api"))
    screenshot("semaphore")
    expect(@browser.find("#lock-manager-summary").text).to include("Semaphore (limit: 3)", "2 / 3")
    expect(@browser.all("#lock-manager-holders tbody tr").size).to eq(2)

    @browser.visit(@web.url("/locks/show?key=sync%3Auser%3A7"))
    expect(@browser.find("#lock-manager-holders").text).to include("jid #{@ready.fetch("jid")}")

    @browser.visit(@web.url("/locks"))
    @browser.all("a.lock-manager-key").first.click
    eventually { @browser.all("#lock-manager-key").any? }
    expect(@browser.find("#lock-manager-key").text).to eq(keys.first)
    expect(@browser.find("#lock-manager-holders").text).to include(@ready.fetch("odd"))
  end

  # Sidekiq's own CSRF protection: 6.4 and 7 want the form's token of the session, 8 the browser's
  # Sec-Fetch-Site: same-origin.
  it "refuses a release the tab's own page did not post" do
    before = admin.lock("report:daily").holders.map(&:token)
    # No browser's request: no token, no Sec-Fetch-Site.
    expect(@web.post("/locks/release?key=report%3Adaily", {}).code).to eq("403")

    # A page of another site whose form posts to the tab, in the browser that has the tab's session.
    @browser.visit(@web.url("/locks"))
    form = "<form method='post' action='#{@web.url("/locks/release?key=report%3Adaily")}'>" \
           "<input type='submit' id='attack'></form>"
    @browser.visit("data:text/html,#{CGI.escape(form).gsub("+", "%20")}")
    @browser.find("#attack").click
    eventually { @browser.driver.current_url.start_with?("http://") && !@browser.text.empty? }
    expect(@browser.text).to eq("Forbidden")

    if @version.to_i < 8
      # With the browser's own session cookie, and a token that is not the session's.
      cookie = "lock_manager.web.session=#{@browser.cookie("lock_manager.web.session")}"
      expect(@browser.cookie("lock_manager.web.session")).not_to be_nil
      expect(@web.post("/locks/release?key=report%3Adaily", {}, cookie: cookie).code).to eq("403")
      forged = { "authenticity_token" => Base64.strict_encode64(SecureRandom.bytes(64)) }
      expect(@web.post("/locks/release?key=report%3Adaily", forged, cookie: cookie).code).to eq("403")
    end
    expect(admin.lock("report:daily").holders.map(&:token)).to eq(before)
  end

  it "force-releases a lock through its form: exactly that lock goes, and its waiter takes it" do
    lock = admin.lock("report:daily")
    expect(lock.holders.map(&:token)).to eq([@ready.fetch("report")])
    waiter_token = lock.waiters.first.token
    others = admin.locks("*").reject { |info| info.key == "report:daily" }
                  .to_h { |info| [info.key, info.holders.map(&:token)] }
    untouched = dumps(except: "report:daily")

    @browser.visit(@web.url("/locks/show?key=report%3Adaily"))
    @browser.find("#lock-manager-release input[type=submit]").click
    @browser.accept_confirm
    eventually { @browser.all("#lock-manager-released").any? || @browser.text == "Forbidden" }
    expect(@browser.text).not_to eq("Forbidden") # Sidekiq's CsrfProtection took the form's token
    expect(@browser.find("#lock-manager-released").text).to start_with("Released")

    acquired = JSON.parse(@holders.gets || raise("the holders' process died"))
    expect(acquired).to include("acquired" => "report:daily", "report_owned" => false)
    # The waiter's attempt takes the freed lock for 2 s at most; it extends it to its own timeout
    # (60 s) before its block runs.
    eventually(timeout: 10) { admin.lock("report:daily").holders.first.ttl > 10 }
    @browser.driver.navigate.refresh # the page again (a GET: the POST redirected), once the waiter took it
    screenshot("released")
    expect(@browser.all("#lock-manager-holders tbody tr").map(&:text).join).to include(waiter_token)
    expect(@browser.all("#lock-manager-waiters")).to be_empty

    after = admin.lock("report:daily")
    expect(after.holders.map(&:token)).to eq([waiter_token])
    expect(acquired.fetch("fencing_token")).to be > @ready.fetch("report_fencing_token") # the counter lives on
    expect(after.waiters).to be_empty
    expect(admin.locks("*").reject { |info| info.key == "report:daily" }
                .to_h { |info| [info.key, info.holders.map(&:token)] }).to eq(others)
    expect(dumps(except: "report:daily")).to eq(untouched)
    expect(admin.lock(odd_key).holders.map(&:token)).to eq([@ready.fetch("odd")])
  end

  # Jobs parked on a lock (on_conflict: :park), after the locks' examples: parked through the real park path
  # (Locker#park, with this Sidekiq's own push commands for each job, as the Sidekiq middleware parks them)
  # behind a job's claim; one of them hostile, its class and arguments markup.
  describe "Parked jobs" do
    hostile_class = "<script>alert(1)</script>"
    hostile_args = ["<img src=x onerror=alert(2)>", "&amp; \"q\""]

    before(:all) do
      require "lock_manager/sidekiq"
      @parking = LockManager::Locker.new(redis_url: @server.url, key_prefix: @key_prefix)
      @jids = Array.new(3) { SecureRandom.hex(12) }
      @holder_jid = SecureRandom.hex(12)
      @parking.claim([parked_key], [@holder_jid], [600])
      pool = Sidekiq::RedisConnection.create(url: @server.url, size: 1)
      jobs = [["ReportJob", [1, "pdf"]], [hostile_class, hostile_args], ["ReportJob", [3, "csv"]]]
      @jids.zip(jobs).each do |jid, (klass, args)|
        payload = { "class" => klass, "args" => args, "queue" => "default", "jid" => jid, "retry" => true,
                    "created_at" => Time.now.to_f }
        push = Sidekiq::Client.via(pool) { LockManager::Sidekiq::OnePush.commands(Sidekiq::Client.new, payload) }
        fallback = LockManager::Sidekiq::Unpark.fallback(parked_key, "default")
        @parking.park(parked_key, jid, ttl: 600, grace: 1, most: nil, schedule: "schedule", fallback: fallback,
                                       push: push)
      end
      pool.shutdown(&:close)
    end

    def parked_key
      "parked:report"
    end

    def parked_rows
      @browser.all("#lock-manager-parked tbody tr").map { |row| row.find_elements(css: "td").map(&:text) }
    end

    def parked_path
      "/locks/show?key=#{CGI.escape(parked_key)}"
    end

    # The jids in Sidekiq's default queue.
    def pushed
      @server.client.then { |redis| redis.lrange("queue:default", 0, -1).tap { redis.close } }
             .map { |payload| JSON.parse(payload)["jid"] }
    end

    it "says how many jobs are parked on a lock in the list, and lists them first in line first on its page" do
      @browser.visit(@web.url("/locks"))
      screenshot("parked-list")
      expect(@browser.all(".lock-manager-parked").map(&:text)).to eq(["3 parked"]) # that lock's alone
      table = rows.to_h { |cells| [cells[0], cells[1..]] }
      expect(table.fetch(parked_key)).to match(["jid #{@holder_jid}", "–", /s|min/, "1", /\A0\s+3 parked\z/])
      expect(table.fetch("report:weekly").last).to eq("0")

      @browser.all("a.lock-manager-key").find { |link| link.text == parked_key }.click
      eventually { @browser.all("#lock-manager-parked").any? }
      screenshot("parked")

      expect(@browser.find("#lock-manager-summary").text).to include("Parked jobs 3")
      expect(parked_rows.map { |cells| cells[0..4] }).to eq(
        [["1", @jids[0], "ReportJob", '[1,"pdf"]', "default"],
         ["2", @jids[1], hostile_class, JSON.generate(hostile_args), "default"],
         ["3", @jids[2], "ReportJob", '[3,"csv"]', "default"]]
      )
      expect(parked_rows.map { |cells| cells[5] }).to all(satisfy { |since| !["", "–"].include?(since) }) # parked at
      expect(@browser.all("form.lock-manager-delete-parked input[type=submit]").size).to eq(3)
      expect(@browser.find("#lock-manager-release-help").text).to include("hands it to the first of them, #{@jids[0]}")
      expect(@browser.find("#lock-manager-release input[type=submit]").attribute("value"))
        .to eq("Force release to the first parked job")
    end

    it "shows a hostile class and arguments as text" do
      @browser.visit(@web.url(parked_path))
      expect(@browser.all("#lock-manager-parked script, #lock-manager-parked img")).to be_empty
      expect(@browser.all("#lock-manager-parked .lock-manager-job-class")[1].text).to eq(hostile_class)
      source = @browser.driver.page_source
      expect(source).to include("&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x onerror=alert(2)&gt;")
      expect(source).to include("&amp;amp; \\\"q\\\"") # the args' "&amp;" is text, its quote JSON's
      expect { @browser.driver.switch_to.alert }.to raise_error(Selenium::WebDriver::Error::NoSuchAlertError)
    end

    it "refuses a delete the page did not post" do
      path = "/locks/parked/delete?key=#{CGI.escape(parked_key)}&jid=#{@jids[1]}"
      expect(@web.post(path, {}).code).to eq("403")
      if @version.to_i < 8
        @browser.visit(@web.url(parked_path))
        cookie = "lock_manager.web.session=#{@browser.cookie("lock_manager.web.session")}"
        forged = { "authenticity_token" => Base64.strict_encode64(SecureRandom.bytes(64)) }
        expect(@web.post(path, forged, cookie: cookie).code).to eq("403")
      end
      expect(admin.parked(parked_key).map(&:jid)).to eq(@jids)
    end

    it "deletes exactly the job whose Delete button was clicked: the lock, its holder and the other jobs stay" do
      others = admin.locks("*").reject { |info| info.key == parked_key }
                    .to_h { |info| [info.key, info.holders.map(&:token)] }
      @browser.visit(@web.url(parked_path))
      @browser.all("form.lock-manager-delete-parked input[type=submit]")[1].click
      @browser.accept_confirm
      eventually { @browser.all("#lock-manager-deleted").any? || @browser.text == "Forbidden" }
      expect(@browser.text).not_to eq("Forbidden") # Sidekiq's CsrfProtection took the form's token
      screenshot("parked-deleted")

      expect(@browser.find("#lock-manager-deleted").text).to eq("Deleted the parked job #{@jids[1]}: it will not run.")
      expect(parked_rows.map { |cells| cells[1] }).to eq([@jids[0], @jids[2]])
      expect(admin.parked(parked_key).map { |job| [job.place, job.jid] }).to eq([[1, @jids[0]], [2, @jids[2]]])
      expect(admin.lock(parked_key).holders.map(&:jid)).to eq([@holder_jid])
      expect(pushed).to eq([]) # nothing ran
      expect(admin.locks("*").reject { |info| info.key == parked_key }
                  .to_h { |info| [info.key, info.holders.map(&:token)] }).to eq(others)
    end

    it "force-releases the lock to its first parked job, which is pushed to its queue" do
      @browser.visit(@web.url(parked_path))
      @browser.find("#lock-manager-release input[type=submit]").click
      @browser.accept_confirm
      eventually { @browser.all("#lock-manager-released").any? || @browser.text == "Forbidden" }
      expect(@browser.text).not_to eq("Forbidden")
      screenshot("parked-released")

      expect(admin.lock(parked_key).holders.map(&:jid)).to eq([@jids[0]])
      expect(pushed).to eq([@jids[0]])
      expect(@browser.find("#lock-manager-holders").text).to include("jid #{@jids[0]}")
      expect(parked_rows.map { |cells| [cells[0], cells[1]] }).to eq([["1", @jids[2]]])
    end
  end

  # The Limiters page (/locks/limiters), after the locks' examples: limiters of each kind used from this
  # process, one name used by two kinds, and a hostile name of markup and odd bytes.
  describe "Limiters" do
    hostile = "<script>alert(1)</script> & \"q\" \xFF\n".b
    shown = "<script>alert(1)</script> & \"q\" \\xFF\\x0A"

    before(:all) do
      locker = LockManager::Locker.new(redis_url: @server.url, key_prefix: @key_prefix)
      @limiters = {
        gcra: LockManager::Limiter.new("partner:gcra", rate: 10, per: 3600, burst: 3, locker: locker),
        window: LockManager::Limiter.window("exports:1", 10, per: 86_400, locker: locker),
        sliding: LockManager::Limiter.sliding_window("login:1.2.3.4", 5, per: 3600, locker: locker),
        shared_rate: LockManager::Limiter.new("shared", rate: 1, per: 3600, burst: 2, locker: locker),
        shared_window: LockManager::Limiter.window("shared", 2, per: 86_400, locker: locker),
        hostile: LockManager::Limiter.window(hostile, 3, per: 86_400, locker: locker)
      }
      uses = { gcra: 4, window: 4, sliding: 6, shared_rate: 2, shared_window: 2, hostile: 1 }
      uses.each { |name, times| times.times { @limiters.fetch(name).try_acquire } }
    end

    def limiter_rows
      @browser.all("#lock-manager-limiters tbody tr").map { |row| row.find_elements(css: "td").map(&:text) }
    end

    # The limiters' keys of this file's prefix and their DUMP (a lock's keys change as its waiters renew
    # their places in its queue).
    def limiter_dumps(except:)
      dumps(except: except).select { |key, _| key.b.include?(":limit:") }
    end

    def in_use
      admin.limiters.map { |limiter| [limiter.name, limiter.kind, limiter.used, limiter.remaining] }
    end

    # No window.alert or confirm is open (a script of a name that ran would have raised one).
    def no_dialog
      @browser.driver.switch_to.alert
      false
    rescue Selenium::WebDriver::Error::NoSuchAlertError
      true
    end

    def dialog_text
      @browser.driver.switch_to.alert.text
    rescue Selenium::WebDriver::Error::NoSuchAlertError
      nil
    end

    it "lists the limiters of each kind with their rule, used, remaining, next free and reset after" do
      @browser.visit(@web.url("/locks"))
      @browser.find("#lock-manager-to-limiters").click
      eventually { @browser.driver.current_url.end_with?("/locks/limiters") }
      eventually { @browser.all("#lock-manager-limiters").any? }
      screenshot("limiters")

      expect(@browser.find("li.active a").text).to eq("Locks")
      rows = limiter_rows
      expect(rows.map(&:first)).to eq([shown, "exports:1", "login:1.2.3.4", "partner:gcra", "shared", "shared"])
      expect(rows.map { |cells| cells[1..4] }).to eq(
        [["Fixed window", "3 per 86400s window", "1", "2"], ["Fixed window", "10 per 86400s window", "4", "6"],
         ["Sliding window", "5 in any 3600s", "5", "0"], ["Rate (GCRA)", "1 per 360s, burst 3", "3", "0"],
         ["Rate (GCRA)", "1 per 3600s, burst 2", "2", "0"], ["Fixed window", "2 per 86400s window", "2", "0"]]
      )
      # The numbers are Admin's.
      expect(rows.map { |cells| [cells[3].to_i, cells[4].to_i] }).to eq(in_use.map { |info| info.last(2) })
      expect(rows.map { |cells| cells[5] }).to match(
        ["now", "now", /\Ain (59 min \d\d s|1 h 00 min)\z/, /\Ain (5 min 5\d|6 min 00) s\z/,
         /\Ain (59 min \d\d s|1 h 00 min)\z/, /\Ain (\d+(\.\d)? s|\d+ min \d\d s|\d+ h \d\d min)\z/]
      )
      expect(rows[3][6]).to match(/\A1[78] min \d\d s\z/) # the GCRA's burst of 3 drains in 18 min
      expect(@browser.all("#lock-manager-limiters form.lock-manager-reset input[type=submit]").size).to eq(6)

      @browser.find("#lock-manager-to-locks").click
      eventually { @browser.all("#lock-manager-locks").any? }
      expect(rows.map(&:first)).not_to include(*self.rows.map(&:first)) # the locks' list has no limiter
    end

    it "filters the limiters by pattern" do
      search("/locks/limiters", "sha*")

      expect(limiter_rows.map { |cells| cells[0..1] }).to eq([["shared", "Rate (GCRA)"], ["shared", "Fixed window"]])
      expect(@browser.find("#lock-manager-pattern").attribute("value")).to eq("sha*")
      @browser.visit(@web.url("/locks/limiters?pattern=nothing:*"))
      expect(@browser.find("#lock-manager-none").text).to eq("No limiter in use matches nothing:*.")
    end

    it "refuses a reset the page did not post" do
      before = in_use
      expect(@web.post("/locks/limiters/reset?name=shared&kind=window", {}).code).to eq("403")
      expect(@web.post("/locks/limiters/reset?name=shared", {}).code).to eq("403")
      expect(in_use).to eq(before)
    end

    it "resets exactly the limiter whose button was clicked, one kind of a shared name, and stays on its pattern" do
      window_key = ":limit:window:#{@key_prefix}shared"
      untouched = limiter_dumps(except: window_key)
      expect(untouched.size).to eq(5) # the five other limiters
      holders = admin.locks.to_h { |info| [info.key, info.holders.map(&:token)] }
      expect(@server.client.then { |redis| redis.keys("*#{window_key}").tap { redis.close } }.size).to eq(1)
      before = in_use

      @browser.visit(@web.url("/locks/limiters?pattern=shared"))
      row = @browser.all("#lock-manager-limiters tbody tr").find { |tr| tr.text.include?("Fixed window") }
      row.find_element(css: "input[type=submit]").click
      @browser.accept_confirm
      eventually { @browser.all("#lock-manager-reset").any? || @browser.text == "Forbidden" }
      expect(@browser.text).not_to eq("Forbidden") # Sidekiq's CsrfProtection took the form's token
      screenshot("limiter-reset")

      expect(@browser.find("#lock-manager-reset").text)
        .to eq("Reset shared (Fixed window): it admits its whole rule again.")
      expect(limiter_rows.map { |cells| cells[0..1] }).to eq([["shared", "Rate (GCRA)"]])
      expect(@browser.find("#lock-manager-pattern").attribute("value")).to eq("shared")
      # In Redis: the window's key is gone, every other limiter's is as it was; the locks are as they were.
      expect(@server.client.then { |redis| redis.keys("*#{window_key}").tap { redis.close } }).to eq([])
      expect(limiter_dumps(except: window_key)).to eq(untouched)
      expect(admin.locks.to_h { |info| [info.key, info.holders.map(&:token)] }).to eq(holders)
      # Through Admin: only that limiter left the list; it admits its whole rule again.
      expect(in_use).to eq(before.reject { |name, kind| name == "shared" && kind == :window })
      expect(Array.new(3) { @limiters.fetch(:shared_window).try_acquire.admitted? }).to eq([true, true, false])
    end

    it "shows a hostile name as text, and resets that limiter by its exact bytes" do
      @browser.visit(@web.url("/locks/limiters"))
      expect(no_dialog).to be(true)
      expect(@browser.all("#lock-manager-limiters script, #lock-manager-limiters b")).to be_empty
      expect(@browser.all("code.lock-manager-name").first.text).to eq(shown)
      expect(@browser.driver.page_source).to include("&lt;script&gt;alert(1)&lt;/script&gt; &amp; ")
      action = @browser.all("form.lock-manager-reset").first.attribute("action")
      expect(action).to include("reset?name=%3Cscript%3Ealert%281%29%3C%2Fscript%3E+%26+%22q%22+%FF%0A&kind=window")

      @browser.all("form.lock-manager-reset input[type=submit]").first.click
      confirm = dialog_text # none where Debian's Sidekiq ships no application.js (6.4.1, 7.3.2)
      @browser.accept_confirm
      eventually { @browser.all("#lock-manager-reset").any? }
      expect(confirm).to include(shown.sub("\\x0A", "")) if confirm

      expect(@browser.find("#lock-manager-reset").text)
        .to eq("Reset #{shown} (Fixed window): it admits its whole rule again.")
      expect(@browser.all("#lock-manager-reset script")).to be_empty
      expect(no_dialog).to be(true)
      expect(admin.limiters.map(&:name)).not_to include(hostile)
      expect(limiter_rows.map(&:first)).not_to include(shown)
    end
  end
end
