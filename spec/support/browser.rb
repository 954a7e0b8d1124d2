# frozen_string_literal: true

require "fileutils"
require "tmpdir"

# A real headless Chromium driven through Debian's chromedriver (W3C WebDriver, by
# selenium-webdriver): what spec/web clicks through Sidekiq's Web UI with.
class Browser
  CHROMIUM = %w[chromium chromium-browser google-chrome].freeze

  # @return [String, nil] why no browser can run here (nil: one can)
  def self.missing
    return "chromium is not installed (bin/setup installs Debian's chromium)" unless executable(*CHROMIUM)
    return "chromedriver is not installed (bin/setup installs chromium-driver)" unless executable("chromedriver")

    nil
  end

  def self.executable(*names)
    names.each do |name|
      ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).each do |dir|
        path = File.join(dir, name)
        return path if File.file?(path) && File.executable?(path)
      end
    end
    nil
  end

  attr_reader :driver

  def start(width: 1280, height: 1000)
    require "selenium-webdriver"
    @profile = Dir.mktmpdir("lock_manager-chromium")
    options = Selenium::WebDriver::Chrome::Options.new(binary: self.class.executable(*CHROMIUM))
    ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
     "--window-size=#{width},#{height}", "--user-data-dir=#{@profile}", "--lang=en-US"].each do |argument|
      options.add_argument(argument)
    end
    service = Selenium::WebDriver::Service.chrome(path: self.class.executable("chromedriver"))
    @driver = Selenium::WebDriver.for(:chrome, service: service, capabilities: options)
    self
  end

  def visit(url)
    driver.navigate.to(url)
  end

  def find(css)
    driver.find_element(css: css)
  end

  def all(css)
    driver.find_elements(css: css)
  end

  # The page's text; "" while a navigation (a form's POST and its redirect) has no body yet, or replaces the
  # body it found (chromedriver then says "Node with given id does not belong to the document").
  def text
    find("body").text
  rescue Selenium::WebDriver::Error::NoSuchElementError, Selenium::WebDriver::Error::StaleElementReferenceError
    ""
  rescue Selenium::WebDriver::Error::UnknownError => e
    raise unless e.message.include?("does not belong to the document")

    ""
  end

  # Accepts a window.confirm if the page raised one (Sidekiq 7's data-confirm does; Debian's 6.4.1
  # ships no application.js, so there the form posts at once).
  def accept_confirm
    driver.switch_to.alert.accept
  rescue Selenium::WebDriver::Error::NoSuchAlertError
    nil
  end

  # The height of the page's content, and of a footer fixed at the bottom (Sidekiq's: 6.4 and 7's navbar,
  # 8's <footer>).
  CONTENT_HEIGHT = <<~JS
    const page = document.querySelector("#page .container") || document.body;
    const footer = document.querySelector(".navbar-fixed-bottom") || document.querySelector("body > footer");
    return page.getBoundingClientRect().bottom + window.scrollY + (footer ? footer.offsetHeight : 0) + 24;
  JS

  # A screenshot of the whole page, no more: the window is first resized to the content's height.
  def screenshot(path)
    FileUtils.mkdir_p(File.dirname(path))
    window = driver.manage.window
    chrome = window.size.height - driver.execute_script("return window.innerHeight")
    window.resize_to(window.size.width, [driver.execute_script(CONTENT_HEIGHT).ceil, 300].max + chrome)
    driver.save_screenshot(path)
  end

  def cookie(name)
    driver.manage.cookie_named(name)&.fetch(:value)
  rescue Selenium::WebDriver::Error::NoSuchCookieError
    nil
  end

  def quit
    @driver&.quit
    FileUtils.rm_rf(@profile) if @profile
  end
end
