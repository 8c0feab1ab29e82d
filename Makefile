# dcpi: build, install and uninstall.
#
#   make                      cargo build --release of the packages whose binaries are installed
#   make install              install under PREFIX (default /usr/local), into DESTDIR if set
#   make man                  generate the man pages (dcpid.toml.5 too) and completions only
#   make uninstall            remove what `make install` installed (not the config file)
#
# Variables: PREFIX, DESTDIR, SYSCONFDIR (default /etc: dcpid reads /etc/dcpi/dcpid.toml),
# UNITDIR, and BINDIR_SRC: where the built binaries are taken from. When BINDIR_SRC is left at
# its default (the release target dir), `make install` runs `cargo build --release` first;
# when it is given (e.g. BINDIR_SRC=target/debug) the binaries there are installed as they are.

PREFIX      ?= /usr/local
DESTDIR     ?=
BINDIR      ?= $(PREFIX)/bin
SYSCONFDIR  ?= /etc
DATADIR     ?= $(PREFIX)/share
MANDIR      ?= $(DATADIR)/man
LIBDIR_SD   ?= $(PREFIX)/lib
UNITDIR     ?= $(LIBDIR_SD)/systemd/system
SYSUSERSDIR ?= $(LIBDIR_SD)/sysusers.d
TMPFILESDIR ?= $(LIBDIR_SD)/tmpfiles.d

CARGO       ?= cargo
TARGET_DIR  := $(or $(CARGO_TARGET_DIR),target)
RELEASE_DIR := $(TARGET_DIR)/release
BINDIR_SRC  ?= $(RELEASE_DIR)
# Generated man pages and completions.
GENDIR      ?= $(BINDIR_SRC)/dcpi-generated

INSTALL     ?= install

# name:man-section
PROGRAMS    := dcpid:8 dcpictl:8 dcpiprof:1 dcpilist:1 dcpidiff:1 dcpistats:1 dcpiexport:1
NAMES       := $(foreach p,$(PROGRAMS),$(word 1,$(subst :, ,$(p))))

.PHONY: all build man install uninstall clean-generated

all: build

# The packages whose binaries are installed. Not `--workspace`: that would add the end-to-end
# test crate, and cargo's feature unification would then build dcpid with its fault-injection
# feature. (A release dcpid ignores that feature anyway, see daemon/src/faults.rs; this keeps
# the installed build identical to `cargo build --release` of the default members, and skips
# building a test crate nobody installs.)
BIN_PACKAGES := dcpi-daemon dcpi-client dcpi-export

# Build only when installing from the default release dir; an explicit BINDIR_SRC is trusted.
ifeq ($(BINDIR_SRC),$(RELEASE_DIR))
build:
	$(CARGO) build --release --bins $(addprefix -p ,$(BIN_PACKAGES))
else
build:
	@for n in $(NAMES); do \
	  test -x "$(BINDIR_SRC)/$$n" || { echo "$(BINDIR_SRC)/$$n: not built" >&2; exit 1; }; \
	done
endif

# Man pages come from each binary's clap definition (hidden `--generate` flag), so they always
# match the options of the binaries being installed.
man: build
	@mkdir -p "$(GENDIR)/man" "$(GENDIR)/bash" "$(GENDIR)/zsh" "$(GENDIR)/fish"
	@set -e; for p in $(PROGRAMS); do \
	  n=$${p%%:*}; s=$${p##*:}; \
	  "$(BINDIR_SRC)/$$n" --generate man > "$(GENDIR)/man/$$n.$$s"; \
	  "$(BINDIR_SRC)/$$n" --generate complete-bash > "$(GENDIR)/bash/$$n"; \
	  "$(BINDIR_SRC)/$$n" --generate complete-zsh > "$(GENDIR)/zsh/_$$n"; \
	  "$(BINDIR_SRC)/$$n" --generate complete-fish > "$(GENDIR)/fish/$$n.fish"; \
	  for f in "$(GENDIR)/man/$$n.$$s" "$(GENDIR)/bash/$$n" "$(GENDIR)/zsh/_$$n" "$(GENDIR)/fish/$$n.fish"; do \
	    test -s "$$f" || { echo "$$f: generated file is empty" >&2; exit 1; }; \
	  done; \
	done
	@"$(BINDIR_SRC)/dcpid" --generate man-config > "$(GENDIR)/man/dcpid.toml.5"
	@test -s "$(GENDIR)/man/dcpid.toml.5" || { echo "$(GENDIR)/man/dcpid.toml.5: generated file is empty" >&2; exit 1; }
	@echo "man pages in $(GENDIR)/man (read one with: man -l $(GENDIR)/man/dcpiprof.1);"
	@echo "shell completions in $(GENDIR)/bash, $(GENDIR)/zsh and $(GENDIR)/fish"

install: build man
	$(INSTALL) -d "$(DESTDIR)$(BINDIR)"
	@set -e; for n in $(NAMES); do \
	  $(INSTALL) -m 0755 "$(BINDIR_SRC)/$$n" "$(DESTDIR)$(BINDIR)/$$n"; \
	done
	$(INSTALL) -d "$(DESTDIR)$(UNITDIR)" "$(DESTDIR)$(SYSUSERSDIR)" "$(DESTDIR)$(TMPFILESDIR)"
	sed -e 's|/usr/bin/dcpid|$(BINDIR)/dcpid|g' -e 's|/etc/dcpi/|$(SYSCONFDIR)/dcpi/|g' \
	  systemd/dcpid.service > "$(DESTDIR)$(UNITDIR)/dcpid.service.tmp"
	chmod 0644 "$(DESTDIR)$(UNITDIR)/dcpid.service.tmp"
	mv -f "$(DESTDIR)$(UNITDIR)/dcpid.service.tmp" "$(DESTDIR)$(UNITDIR)/dcpid.service"
	$(INSTALL) -m 0644 systemd/dcpid.sysusers.conf "$(DESTDIR)$(SYSUSERSDIR)/dcpid.conf"
	$(INSTALL) -m 0644 systemd/dcpid.tmpfiles.conf "$(DESTDIR)$(TMPFILESDIR)/dcpid.conf"
	$(INSTALL) -d "$(DESTDIR)$(SYSCONFDIR)/dcpi"
	@# Never overwrite a configuration the administrator may have edited.
	@if [ -e "$(DESTDIR)$(SYSCONFDIR)/dcpi/dcpid.toml" ]; then \
	  echo "keeping existing $(DESTDIR)$(SYSCONFDIR)/dcpi/dcpid.toml"; \
	else \
	  $(INSTALL) -m 0644 systemd/dcpid.toml "$(DESTDIR)$(SYSCONFDIR)/dcpi/dcpid.toml"; \
	fi
	$(INSTALL) -d "$(DESTDIR)$(MANDIR)/man1" "$(DESTDIR)$(MANDIR)/man5" "$(DESTDIR)$(MANDIR)/man8" \
	  "$(DESTDIR)$(DATADIR)/bash-completion/completions" \
	  "$(DESTDIR)$(DATADIR)/zsh/site-functions" \
	  "$(DESTDIR)$(DATADIR)/fish/vendor_completions.d"
	@set -e; for p in $(PROGRAMS); do \
	  n=$${p%%:*}; s=$${p##*:}; \
	  $(INSTALL) -m 0644 "$(GENDIR)/man/$$n.$$s" "$(DESTDIR)$(MANDIR)/man$$s/$$n.$$s"; \
	  $(INSTALL) -m 0644 "$(GENDIR)/bash/$$n" "$(DESTDIR)$(DATADIR)/bash-completion/completions/$$n"; \
	  $(INSTALL) -m 0644 "$(GENDIR)/zsh/_$$n" "$(DESTDIR)$(DATADIR)/zsh/site-functions/_$$n"; \
	  $(INSTALL) -m 0644 "$(GENDIR)/fish/$$n.fish" "$(DESTDIR)$(DATADIR)/fish/vendor_completions.d/$$n.fish"; \
	done
	$(INSTALL) -m 0644 "$(GENDIR)/man/dcpid.toml.5" "$(DESTDIR)$(MANDIR)/man5/dcpid.toml.5"
	@echo "installed; as root: systemd-sysusers && systemd-tmpfiles --create dcpid.conf && systemctl daemon-reload && systemctl enable --now dcpid"

uninstall:
	@set -e; for p in $(PROGRAMS); do \
	  n=$${p%%:*}; s=$${p##*:}; \
	  rm -f "$(DESTDIR)$(BINDIR)/$$n" "$(DESTDIR)$(MANDIR)/man$$s/$$n.$$s" \
	    "$(DESTDIR)$(DATADIR)/bash-completion/completions/$$n" \
	    "$(DESTDIR)$(DATADIR)/zsh/site-functions/_$$n" \
	    "$(DESTDIR)$(DATADIR)/fish/vendor_completions.d/$$n.fish"; \
	done
	rm -f "$(DESTDIR)$(MANDIR)/man5/dcpid.toml.5"
	rm -f "$(DESTDIR)$(UNITDIR)/dcpid.service" "$(DESTDIR)$(SYSUSERSDIR)/dcpid.conf" \
	  "$(DESTDIR)$(TMPFILESDIR)/dcpid.conf"
	@echo "kept $(DESTDIR)$(SYSCONFDIR)/dcpi/dcpid.toml, the database and the spool"

clean-generated:
	rm -rf "$(GENDIR)"
