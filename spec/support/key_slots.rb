# frozen_string_literal: true

# Redis Cluster's hash slots and the gem's internal key names, computed here independently of the
# extension (from the Cluster specification and docs/design.md), to check what it sends.
module KeySlots
  SLOTS = 16_384
  TAG_ALPHABET = [*"0".."9", *"a".."z", *"A".."Z"].join.b.freeze

  module_function

  # CRC16-CCITT (XModem), as Redis Cluster computes it.
  def crc16(bytes)
    bytes.each_byte.reduce(0) do |crc, byte|
      crc ^= byte << 8
      8.times { crc = crc.nobits?(0x8000) ? (crc << 1) & 0xFFFF : ((crc << 1) ^ 0x1021) & 0xFFFF }
      crc
    end
  end

  # The slot of `key`: the hash tag (between the first "{" and the next "}", when not empty), else the key.
  def slot(key)
    key = key.b
    open = key.index("{")
    close = open && key.index("}", open + 1)
    hashed = close && close > open + 1 ? key[(open + 1)...close] : key
    crc16(hashed) % SLOTS
  end

  # The first string of 1 to 3 characters of TAG_ALPHABET in the slot (the extension's rule).
  def tag(slot)
    (@tags ||= build_tags)[slot]
  end

  def build_tags
    tags = Array.new(SLOTS)
    left = SLOTS
    (1..3).each do |length|
      (TAG_ALPHABET.size**length).times do |n|
        candidate = Array.new(length) { |_| TAG_ALPHABET[n % TAG_ALPHABET.size].tap { n /= TAG_ALPHABET.size } }.join
        slot = crc16(candidate) % SLOTS
        next if tags[slot]

        tags[slot] = candidate
        left -= 1
        return tags if left.zero?
      end
    end
    tags
  end

  def internal(kind, lock_key)
    "lock_manager:{#{tag(slot(lock_key))}}:#{kind}:".b + lock_key.b
  end

  def queue_key(lock_key)
    internal("queue", lock_key)
  end

  def waiters_key(lock_key)
    internal("waiters", lock_key)
  end

  def fencing_counter_key(lock_key)
    "lock_manager:{#{tag(slot(lock_key))}}:fencing"
  end

  # Whether `key` is one of the fencing counters (which live on by design).
  def fencing_counter?(key)
    key.b.match?(/\Alock_manager:\{[^}]+\}:fencing\z/n)
  end
end
