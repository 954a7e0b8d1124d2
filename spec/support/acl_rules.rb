# frozen_string_literal: true

# The ACL rules docs/acl.md shows, read from where they are written once: docs/acl/<part>.acl, each one
# `ACL SETUSER` command as a user pastes it into redis-cli, its password ">CHANGE-ME".
module AclRules
  DIR = File.expand_path("../../docs/acl", __dir__)
  PLACEHOLDER = ">CHANGE-ME"

  module_function

  # The file's text, as docs/acl.md must show it.
  def text(part)
    File.read(File.join(DIR, "#{part}.acl")).strip
  end

  # The user the file names.
  def user(part)
    text(part).split[2]
  end

  # The words of the file after `ACL SETUSER <user>`, with `password`.
  def rule(part, password:)
    command, setuser, _user, *words = text(part).split
    raise "docs/acl/#{part}.acl is not one ACL SETUSER" unless [command, setuser] == %w[ACL SETUSER]

    words.map { |word| word == PLACEHOLDER ? ">#{password}" : word }
  end
end

# ACL users of a redis-server an example owns.
module AclUsers
  # Makes the user `name` anew (ACL SETUSER name reset on >password, then `rule`) through `client`,
  # a connection of the default user.
  # @return [String] a redis_url that logs in as that user
  def acl_user(client, *rule, name: "u", password: "pw")
    client.call("ACL", "SETUSER", name, "reset", "on", ">#{password}", *rule)
    "redis://#{name}:#{password}@#{client.connection[:location]}/0"
  end

  # What Redis's ACL LOG holds: [reason, context, object, username] of each entry, oldest first.
  def acl_refusals(client)
    client.call("ACL", "LOG").reverse.map do |entry|
      entry = entry.each_slice(2).to_h
      entry.values_at("reason", "context", "object", "username")
    end
  end
end
