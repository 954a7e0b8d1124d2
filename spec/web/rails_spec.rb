# frozen_string_literal: true

require "spec_helper"
require_relative "../support/web_rails_app_server"

# The Locks tab in a real Rails app (spec/support/web_rails_app) that mounts Sidekiq::Web in
# config/routes.rb after `require "lock_manager/web"`, as docs/web.md says, served by Puma: in
# development (code reloading on: Rails 8 loads the routes at the first request, and every Rails loads
# them again once routes.rb changed), in production (routes loaded at boot), and as an API-only app with
# the session docs/web.md adds. On each stack's Rails and Sidekiq, and on those RAILS and SIDEKIQ name.
RSpec.describe "The Locks tab in a Rails app" do
  def serve(environment, api_only: nil)
    app = WebRailsAppServer.new(environment: environment, redis_url: redis_url, prefix: prefix, api_only: api_only)
    yield app.start
  ensure
    app&.shutdown
  end

  # A lock of the app's keys, held by another process as far as the app can tell.
  def hold(key)
    LockManager::Locker.new(redis_url: redis_url, key_prefix: prefix).lock(key, timeout: 60)
  end

  def failure(app, response)
    "#{response.code}\n#{response.body[0, 1000]}\n#{app.log[-4000..] || app.log}"
  end

  # The list: in Sidekiq's layout with the tab (once), listing the held lock.
  def expect_locks_page(app)
    response = app.get("/sidekiq/locks")
    expect(response.code).to eq("200"), failure(app, response)
    expect(response.body.scan(%r{<a href="/sidekiq/locks">Locks</a>}).size).to eq(1)
    expect(response.body).to include(">report:rails</a>")
  end

  # Another route of the app (a controller) answers.
  def expect_app_route(app, path = "/pages/1")
    response = app.get(path)
    expect(response.code).to eq("200"), failure(app, response)
    expect(response.body).to eq("page #{path.split("/").last}")
  end

  it "serves the tab and the app's routes in development, before and after the routes reload" do
    held = hold("report:rails")
    serve("development") do |app|
      expect_locks_page(app) # the first request: Rails 8 loads the routes now
      expect_app_route(app)
      app.edit_routes
      expect_app_route(app, "/edited/2") # routes.rb reloaded, after Sidekiq::Web was built
      expect_locks_page(app)
      expect_app_route(app, "/pages/3")
      expect(app.log).not_to include("deprecated")
    end
  ensure
    held&.release
  end

  it "boots in production and serves the tab and the app's routes" do
    held = hold("report:rails")
    serve("production") do |app|
      expect_locks_page(app)
      expect_app_route(app)
      expect(app.log).not_to include("deprecated")
    end
  ensure
    held&.release
  end

  describe "an API-only app" do
    # Releases through the lock page's form as a browser would: the session cookie, the form's CSRF token
    # (Sidekiq 6.4 and 7; 8 has none) and Sec-Fetch-Site (what Sidekiq 8 checks; the others ignore it).
    def release_through_form(app, key)
      page = app.get("/sidekiq/locks/show?key=#{key}")
      expect(page.code).to eq("200"), failure(app, page)
      cookie = page.get_fields("set-cookie").to_a.map { |field| field.split(";").first }.join("; ")
      token = page.body[/name=['"]authenticity_token['"] value=['"]([^'"]+)['"]/, 1]
      form = token ? { "authenticity_token" => token } : {}
      app.post("/sidekiq/locks/release?key=#{key}", form, "Cookie" => cookie, "Sec-Fetch-Site" => "same-origin")
    end

    it "with docs/web.md's session: the tab, a release behind Sidekiq's CSRF protection, the app's routes" do
      held = hold("report:rails")
      serve("production", api_only: "1") do |app|
        expect_locks_page(app)
        expect(app.post("/sidekiq/locks/release?key=report%3Arails", {}).code).to eq("403") # no token, no header
        expect(held.owned?).to be(true)

        released = release_through_form(app, "report%3Arails")
        expect(released.code).to eq("302"), failure(app, released)
        expect(released["location"]).to end_with("/sidekiq/locks/show?key=report%3Arails&released=1")
        expect(held.owned?).to be(false)
        expect_app_route(app)
      end
    ensure
      held&.release
    end

    it "without a session: Sidekiq::Web fails, saying it needs one (what docs/web.md's lines are for)" do
      serve("production", api_only: "bare") do |app|
        expect(app.get("/sidekiq/locks").code).to eq("500")
        expect(app.log).to include("needs a valid Rack session")
        expect_app_route(app)
      end
    end
  end
end
