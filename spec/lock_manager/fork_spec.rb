# frozen_string_literal: true

require "spec_helper"
require "json"
require "open3"

RSpec.describe "fork" do
  # A private server: every client it lists is this example's.
  let(:server) { RedisServer.new.start }
  let(:admin) { server.client }
  let(:locker) { LockManager::Locker.new(redis_url: server.url, key_prefix: prefix, pool_size: 2) }

  after do
    admin.close
    server.shutdown
  end

  def gem_client_ids
    admin.client(:list).reject { |c| c["cmd"] == "client|list" }.map { |c| c["id"] }
  end

  it "gives the child its own pool: parent and child lock side by side, undisturbed" do
    locker.nonblocking_lock("warm") {}
    parent_ids = gem_client_ids
    reader, writer = IO.pipe
    go_reader, go_writer = IO.pipe
    pid = fork do
      reader.close
      go_writer.close
      ran = Array.new(1_000) { |i| locker.nonblocking_lock("child#{i % 5}") { i } }
      outcome = ran.each_with_index.all? { |r, i| r.run? && r.result == i }
      writer.puts(outcome && locker.pool_state.first.positive? ? "ok" : "bad")
      writer.close
      go_reader.read # exit (and SIGCHLD the parent) only after the parent's checks
      exit!(0)
    end
    writer.close
    go_reader.close
    parent_ok = Array.new(1_000) { |i| locker.nonblocking_lock("parent#{i % 5}") { i } }
                     .each_with_index.all? { |r, i| r.run? && r.result == i }
    child_says = reader.read.strip
    surviving = gem_client_ids & parent_ids
    go_writer.close
    Process.wait(pid)

    expect(child_says).to eq("ok")
    expect(parent_ok).to be(true)
    # the parent's connections survived the child (which never touched them)
    expect(surviving).to eq(parent_ids)
    expect(locker.nonblocking_lock("after") { :parent }.result).to eq(:parent)
  end

  it "lets a child that never used the Locker exit and be collected without touching the parent's pool" do
    locker.nonblocking_lock("warm") {}
    pid = fork do
      GC.start
      exit!(0)
    end
    Process.wait(pid)
    expect(locker.nonblocking_lock("k") { :fine }.result).to eq(:fine)
  end

  it "uses the shared class-level Locker in a forked child" do
    configure_shared_locker!
    LockManager::Locker.nonblocking_lock("warm") {}
    pid = fork { exit!(LockManager::Locker.nonblocking_lock("child") { 7 }.result == 7 ? 0 : 1) }
    expect(Process.wait2(pid).last).to be_success
  end

  # A child forked inside a held block (fork without exec) runs the rest of the block and ends it
  # its own way: the parent's lock stays held with the parent's token, and only the parent
  # releases it. (A script of its own: a child of the spec process would go on running the suite.)
  %w[exit raise exit! return].each do |how|
    it "leaves the parent's lock held when a child forked inside its block ends it with #{how}" do
      script = File.expand_path("../support/fork_in_block.rb", __dir__)
      lib = File.expand_path("../../lib", __dir__)
      output, status = Open3.capture2(RbConfig.ruby, "-I", lib, script, server.url, prefix, how)
      expect(status).to be_success
      expect(JSON.parse(output)).to eq("kept" => true, "result" => "parent", "lost" => false, "left" => false)
    end
  end

  it "a handle in a child: owned? is false and release returns false, without touching Redis" do
    lock = locker.try_lock("handle", timeout: 30)
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      commands_before = admin.info("stats")["total_commands_processed"].to_i
      answers = [lock.owned?, lock.release, lock.refresh(10)]
      commands = admin.info("stats")["total_commands_processed"].to_i - commands_before
      writer.puts(Marshal.dump([answers, commands]).unpack1("H*"))
      writer.close
      exit!(0)
    end
    writer.close
    answers, commands = Marshal.load([reader.read.strip].pack("H*")) # rubocop:disable Security/MarshalLoad
    Process.wait(pid)
    expect(answers).to eq([false, false, false])
    expect(commands).to eq(1) # the INFO of the child's own check, nothing of the gem's
    expect(lock.owned?).to be(true)
    expect(lock.release).to be(true)
  end
end
