# frozen_string_literal: true

require "mkmf"
require "rbconfig"

# With the rb_sys gem (the usual case for users) it writes the Makefile. Without it (offline
# machines such as Debian's packaged Ruby) a small Makefile drives cargo directly.
begin
  require "rb_sys/mkmf"
rescue LoadError
  rb_sys = false
else
  rb_sys = true
end

if rb_sys
  create_rust_makefile("lock_manager/lock_manager")
else
  find_executable("cargo") || abort(<<~MSG)
    lock_manager needs Rust's cargo to build its native extension (https://rustup.rs).
  MSG

  dlext = RbConfig::CONFIG["DLEXT"]
  cargo_lib = RbConfig::CONFIG["host_os"].match?(/darwin/) ? "liblock_manager.dylib" : "liblock_manager.so"
  crate_dir = __dir__
  File.write("Makefile", <<~MAKE)
    # Written by extconf.rb: builds the Rust crate with cargo (no rb_sys gem found).
    RUBY = #{RbConfig.ruby}
    CARGO = #{ENV.fetch("CARGO", "cargo")}
    CRATE_DIR = #{crate_dir}
    # CARGO_TARGET_DIR (to share compiled crates between builds) is kept; our own is removed
    # after install, so an installed gem does not carry hundreds of MB of build output.
    TARGET_DIR = #{ENV.fetch("CARGO_TARGET_DIR", "$(CURDIR)/target")}
    OWN_TARGET = #{ENV.key?("CARGO_TARGET_DIR") ? "" : "$(CURDIR)/target"}
    sitearchdir = #{RbConfig::CONFIG["sitearchdir"]}
    DLLIB = lock_manager.#{dlext}

    all: $(DLLIB)

    $(DLLIB):
    \tRUBY=$(RUBY) $(CARGO) build --release --manifest-path $(CRATE_DIR)/Cargo.toml --target-dir $(TARGET_DIR)
    \tcp $(TARGET_DIR)/release/#{cargo_lib} $(DLLIB)

    install: $(DLLIB)
    \tmkdir -p $(DESTDIR)$(sitearchdir)/lock_manager
    \tcp $(DLLIB) $(DESTDIR)$(sitearchdir)/lock_manager/$(DLLIB).tmp
    \tmv $(DESTDIR)$(sitearchdir)/lock_manager/$(DLLIB).tmp $(DESTDIR)$(sitearchdir)/lock_manager/$(DLLIB)
    \t$(if $(OWN_TARGET),rm -rf $(OWN_TARGET))

    clean:
    \trm -f $(DLLIB)

    distclean: clean
    \trm -rf $(TARGET_DIR) Makefile

    .PHONY: all install clean distclean $(DLLIB)
  MAKE
end
