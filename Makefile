# Baton: one Makefile for the whole tree.
#
# Conventions (no per-component Makefile to edit when a file is added):
#   <comp>/*.c              -> build/lib/libbaton_<comp>.a   (comp: a folder of COMPONENTS;
#                                                             engine/model -> libbaton_engine_model.a)
#   <comp>/main_<prog>.c    -> build/bin/<prog>              (linked with every library)
#   <comp>/*_test.c         -> build/test/<comp>_<name>      (run by `make test`; engine/model/kv_test.c
#                                                             -> engine_model_kv, and a test named
#                                                             as its folder drops the repeat:
#                                                             engine/model/model_test.c -> engine_model)
#   <comp>/*_fuzz.c         -> build/fuzz/<name>             (libFuzzer, `make fuzz`)
#   engine/backend/cuda/, *cuda*.c, *.cu  -> only with CUDA=1
# A component is one folder with one door header (docs/internals/layout.md);
# a folder inside another is a component of its own, with its own rule.
#
#   make                 build everything (CUDA=1 when nvcc is found)
#   make CUDA=0          build without the CUDA backend
#   make test            unit + integration tests, then again under ASan+UBSan
#   make fuzz            every fuzz target for FUZZ_SECONDS (default 60) each
#   make demo            broker + engines: handoffs, a peer-tier loan, two chat models
#   make man             the man pages (docs/man/*.scd, scdoc) into $(BUILD)/man
#   make deps            install the Debian packages for building (scripts/install-deps.sh build)
#   make deps-test       ... and those for testing and fuzzing (scripts/install-deps.sh all)

BUILD   ?= build
SAN     ?= 0
STATIC  ?= 0
NVCC    ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
ifeq ($(NVCC),)
CUDA    ?= 0
else
CUDA    ?= 1
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))

reverse = $(if $(1),$(call reverse,$(wordlist 2,$(words $(1)),$(1))) $(firstword $(1)))
# Bottom to top: a component may use only those before it (LINK_ORDER is
# the reverse, as a static link wants it).
COMPONENTS := proto/base proto arena text text/grammar http \
              engine/backend/host engine/backend/cuda engine/backend engine/cache \
              engine/model engine/serve \
              broker broker/api broker/door broker/cli
LINK_ORDER := $(call reverse,$(COMPONENTS))

CC      ?= cc
CFLAGS  ?= -O2 -g
WARN    := -Wall -Wextra -Werror -Wstrict-prototypes -Wmissing-prototypes \
           -Wshadow -Wpointer-arith -Wvla -Wformat=2 -Wno-format-nonliteral
# The release, from the VERSION file (baton_version(), --version, /metrics).
VERSION := $(shell cat VERSION 2>/dev/null || echo unknown)
CPPFLAGS_ALL := -std=c11 -D_GNU_SOURCE -I. $(WARN) -fno-strict-aliasing -pthread \
                -DBATON_VERSION='"$(VERSION)"'
ifeq ($(SAN),1)
CPPFLAGS_ALL += -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
LDSAN   := -fsanitize=address,undefined
endif
ifeq ($(CUDA),1)
CPPFLAGS_ALL += -DBATON_HAVE_CUDA=1 -isystem $(CUDA_HOME)/include
endif

EXT_LIBS := -lmicrohttpd -lnng -lmsgpackc -ljansson -linih -lxxhash -lpcre2-8 -lutf8proc
ifeq ($(STATIC),1)
# For machines where nothing can be installed (the GPU device): the
# field's libraries go inside the binary; libc, libdl and libsystemd stay dynamic,
# and GnuTLS (libmicrohttpd's, unused by Baton: Debian has no static
# libunistring/p11-kit for it; Ubuntu 24.04 has libgnutls.so.30).
LDLIBS_ALL := -Wl,-Bstatic $(EXT_LIBS) -lmbedtls -lmbedx509 -lmbedcrypto -Wl,-Bdynamic -lgnutls
else
LDLIBS_ALL := $(EXT_LIBS)
endif
LDLIBS_ALL += -lsystemd -ldl -lm -pthread

# ---- sources ---------------------------------------------------------------
is_cuda  = $(findstring cuda,$(1))
keep_src = $(if $(and $(filter 0,$(CUDA)),$(call is_cuda,$(1))),,$(1))
srcs_of  = $(foreach f,$(wildcard $(1)/*.c),$(call keep_src,$(f)))
lib_srcs = $(filter-out %_test.c %_fuzz.c $(1)/main_%.c,$(call srcs_of,$(1)))

LIB_SRCS  := $(foreach c,$(COMPONENTS),$(call lib_srcs,$(c)))
MAIN_SRCS := $(foreach c,$(COMPONENTS),$(call keep_src,$(wildcard $(c)/main_*.c)))
TEST_SRCS := $(foreach c,$(COMPONENTS) tests,$(filter %_test.c,$(call srcs_of,$(c))))
FUZZ_SRCS := $(foreach c,$(COMPONENTS),$(filter %_fuzz.c,$(call srcs_of,$(c))))
CU_SRCS   := $(if $(filter 1,$(CUDA)),$(foreach c,$(COMPONENTS),$(wildcard $(c)/*.cu)))

obj  = $(addprefix $(BUILD)/obj/,$(1:.c=.o))
LIBS := $(foreach c,$(LINK_ORDER),$(if $(call lib_srcs,$(c)),$(BUILD)/lib/libbaton_$(subst /,_,$(c)).a))
PROGS := $(foreach m,$(MAIN_SRCS),$(BUILD)/bin/$(patsubst main_%.c,%,$(notdir $(m))))
# engine/model/kv_test.c -> engine_model_kv; engine/model/model_test.c -> engine_model.
test_dir  = $(patsubst %/,%,$(dir $(1)))
test_base = $(patsubst %_test.c,%,$(notdir $(1)))
test_name = $(subst /,_,$(call test_dir,$(1)))$(if $(filter $(call test_base,$(1)),$(notdir $(call test_dir,$(1)))),,_$(call test_base,$(1)))
TESTS := $(foreach t,$(TEST_SRCS),$(BUILD)/test/$(call test_name,$(t)))

# CUDA kernels become a fatbin embedded as bytes (an assembler file that
# .incbin's it); the driver is loaded with dlopen at run time, so no binary
# needs libcuda.so.1 or libcudart to start.
CU_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
CU_GEN  := $(foreach f,$(CU_SRCS),$(BUILD)/gen/$(f:.cu=_fatbin.S))

.PHONY: all test test-unit test-san fuzz fuzz-build demo clean gpu-build gpu-test bench bench-gpu deps deps-test man
all: $(PROGS) $(TESTS)

# ---- set-up and flag tracking ----------------------------------------------
# make deps installs the Debian packages Baton builds with (sudo when not
# root), make deps-test also those the tests and fuzzing use. Each target
# checks the set it needs once per build directory (the stamps .deps: build,
# .deps-test, .deps-fuzz), and says so in one line before it installs
# anything: make and make demo install only the build set.
deps:
	@scripts/install-deps.sh build
deps-test:
	@scripts/install-deps.sh all

$(BUILD)/.deps: scripts/install-deps.sh
	@mkdir -p $(@D)
	@scripts/install-deps.sh --check build 2>/dev/null || { \
	    echo "make: Debian packages for building are missing; running scripts/install-deps.sh build first"; \
	    scripts/install-deps.sh build; }
	@touch $@
$(BUILD)/.deps-%: scripts/install-deps.sh | $(BUILD)/.deps
	@scripts/install-deps.sh --check $* 2>/dev/null || { \
	    echo "make: Debian packages for the $* set are missing; running scripts/install-deps.sh $* first"; \
	    scripts/install-deps.sh $*; }
	@touch $@

# A change of flags rebuilds everything: the flags live in a file that every
# object depends on, rewritten only when they differ.
FLAGS_NOW := $(CC) $(CFLAGS) $(CPPFLAGS_ALL) $(CPPFLAGS) CUDA=$(CUDA) STATIC=$(STATIC)
$(BUILD)/.flags: FORCE | $(BUILD)/.deps
	@mkdir -p $(@D)
	@echo '$(FLAGS_NOW)' | cmp -s - $@ || echo '$(FLAGS_NOW)' > $@
FORCE:

# ---- compile and link ------------------------------------------------------
$(BUILD)/obj/%.o: %.c $(BUILD)/.flags
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(CPPFLAGS_ALL) $(CPPFLAGS) -MMD -MP -c $< -o $@

# The generated fatbin and its assembler file are kept (not removed as
# intermediates); the object reads the fatbin, so it follows it.
.PRECIOUS: $(BUILD)/gen/%_fatbin.S $(BUILD)/gen/%.fatbin
$(BUILD)/gen/%_fatbin.S: %.cu $(BUILD)/.flags
	@mkdir -p $(@D) $(BUILD)/obj/gen/$(*D)
	$(NVCC) -O3 $(CU_ARCH) -fatbin -I. -MMD -MP -MF $(BUILD)/obj/gen/$*_fatbin.d -MT $@ \
	    -o $(@:.S=.fatbin) $<
	scripts/embed.sh $(@:.S=.fatbin) baton_$(subst /,_,$*)_fatbin > $@

$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.S
	@mkdir -p $(@D)
	$(CC) -c $< -o $@

define LIB_RULE
$(BUILD)/lib/libbaton_$(subst /,_,$(1)).a: $(call obj,$(call lib_srcs,$(1))) \
    $(if $(filter engine/backend/cuda,$(1)),$(CU_GEN:$(BUILD)/gen/%.S=$(BUILD)/obj/gen/%.o))
	@mkdir -p $$(@D)
	rm -f $$@ && ar rcs $$@ $$^
endef
$(foreach c,$(COMPONENTS),$(if $(call lib_srcs,$(c)),$(eval $(call LIB_RULE,$(c)))))

define MAIN_RULE
$(BUILD)/bin/$(patsubst main_%.c,%,$(notdir $(1))): $(call obj,$(1)) $(LIBS)
	@mkdir -p $$(@D)
	$(CC) $(LDSAN) $(LDFLAGS) -o $$@ $$< $(LIBS) $(LDLIBS_ALL)
endef
$(foreach m,$(MAIN_SRCS),$(eval $(call MAIN_RULE,$(m))))

define TEST_RULE
$(BUILD)/test/$(call test_name,$(1)): $(call obj,$(1)) $(LIBS)
	@mkdir -p $$(@D)
	$(CC) $(LDSAN) $(LDFLAGS) -o $$@ $$< $(LIBS) $(LDLIBS_ALL)
endef
$(foreach t,$(TEST_SRCS),$(eval $(call TEST_RULE,$(t))))

# ---- tests -----------------------------------------------------------------
# Every test binary and script runs in its own process with a timeout; the
# runner's last line is "N passed, N failed".
NPROC := $(shell nproc 2>/dev/null || echo 2)

# The timed process tests run shorter in `make test` (the 30 s stress case
# and the long soak are make test-reliability's and a direct run's), so the
# suite stays under 10 minutes on 2 cores (its CPU time, some 800 s, and
# the figures measured: docs/internals/testing.md). While the first pass runs, the sanitizer
# build is made beside it at low priority (the process tests spend much of
# their time waiting, and the tests keep the CPU first); the last lines
# give each phase's time and add both passes up.
SAN_BUILD := $(BUILD)/san
test: | $(BUILD)/.deps-test
	@date +%s >$(BUILD)/.test-t0
	@$(MAKE) --no-print-directory -j$(NPROC) $(PROGS) $(TESTS)
	@rm -f $(BUILD)/.test-totals $(SAN_BUILD).build.rc; t0=$$(cat $(BUILD)/.test-t0); t1=$$(date +%s); \
	( nice -n 15 $(MAKE) --no-print-directory -j$(NPROC) BUILD=$(SAN_BUILD) SAN=1 CUDA=0 all \
	    >$(SAN_BUILD).build.log 2>&1; echo $$? >$(SAN_BUILD).build.rc ) & \
	export BROKER_STRESS_S=$${BROKER_STRESS_S:-10} BATON_SOAK_SECONDS=$${BATON_SOAK_SECONDS:-5}; \
	BUILD=$(BUILD) TEST_TOTALS=$(BUILD)/.test-totals tests/run.sh $(TESTS); \
	t2=$$(date +%s); wait; t3=$$(date +%s); \
	if [ "$$(cat $(SAN_BUILD).build.rc)" != 0 ]; then \
	    cat $(SAN_BUILD).build.log; echo "make test: the sanitizer build failed"; exit 1; fi; \
	TEST_TOTALS=$(CURDIR)/$(BUILD)/.test-totals BROKER_STRESS_S=$${BROKER_STRESS_S_SAN:-5} \
	    $(MAKE) --no-print-directory BUILD=$(SAN_BUILD) SAN=1 CUDA=0 RUN_FLAGS=--skip-pure test-unit; \
	t4=$$(date +%s); \
	echo "make test: build $$((t1 - t0)) s, first pass $$((t2 - t1)) s, waited for the sanitizer build" \
	    "$$((t3 - t2)) s, sanitizer pass $$((t4 - t3)) s: $$(((t4 - t0) / 60)) min $$(((t4 - t0) % 60)) s in all"; \
	awk '{ p += $$1; f += $$2; n++ } END { \
	    printf "make test: both passes (%d runs): %d passed, %d failed\n", n, p, f; \
	    exit (f > 0 || n != 2) }' $(BUILD)/.test-totals

# Builds in parallel, then runs the suite: the test binaries (unit) and the
# process scripts (system) several at a time, a short list of timing-
# sensitive scripts alone after them (tests/run.sh; RUN_FLAGS go to it).
RUN_FLAGS ?=
test-unit: | $(BUILD)/.deps-test
	@$(MAKE) --no-print-directory -j$(NPROC) $(PROGS) $(TESTS)
	@BUILD=$(BUILD) tests/run.sh $(RUN_FLAGS) $(TESTS)

# The same suite under AddressSanitizer and UndefinedBehaviorSanitizer; the
# timed process tests run shorter there (the 30 s stress case and the soak
# have run at full length in the first pass), and the scripts that run no
# compiled program (marked "# test: pure") are left out: the sanitizers
# see nothing in them.
test-san: | $(BUILD)/.deps-test
	@BROKER_STRESS_S=$${BROKER_STRESS_S:-10} BATON_SOAK_SECONDS=$${BATON_SOAK_SECONDS:-5} \
	    $(MAKE) --no-print-directory BUILD=$(SAN_BUILD) SAN=1 CUDA=0 RUN_FLAGS=--skip-pure test-unit

# ---- reliability -------------------------------------------------------------
# make test-reliability: the long versions of the reliability scripts
# (tests/fault_test.py every injected fault, tests/kill_test.py 50 kills,
# tests/hostile_test.py, tests/soak_test.py for BATON_SOAK_SECONDS), the fuzz
# targets for FUZZ_SECONDS each, the whole suite under ASan+UBSan, then the
# process tests on a ThreadSanitizer build (TSAN_BUILD; its reports are
# printed and fail the target). tests/reliability.sh runs and counts them.
RELIABILITY_SCRIPTS := tests/fault_test.py tests/kill_test.py tests/hostile_test.py tests/soak_test.py
BATON_SOAK_SECONDS ?= 300
TSAN_BUILD ?= $(BUILD)/tsan
TSAN_PROGS := $(foreach p,baton-broker baton-engine baton-proto-tool baton-arena baton,$(TSAN_BUILD)/bin/$(p))
TSAN_SCRIPTS ?= broker/broker_test.py tests/kill_test.py tests/fault_test.py
# and the unit tests of code with threads of its own: http (its workers,
# reaper and streams against libmicrohttpd's thread), the scheduler, the
# transport (nng's threads), the broker link and the door's upstream.
# tests/tsan.supp holds the libraries' false positives, each with why.
TSAN_BINS ?= $(foreach t,http engine_serve_sched proto_transport engine_serve_broker_link broker_door_upstream,\
    $(TSAN_BUILD)/test/$(t))
TSAN_OPTS := halt_on_error=0 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp
.PHONY: test-reliability test-tsan
# Every part runs even when one before failed (each has its own figures);
# the last line names the parts that failed.
test-reliability: $(PROGS) | $(BUILD)/.deps-test $(BUILD)/.deps-fuzz
	@failed=""; \
	BUILD=$(BUILD) BATON_RELIABILITY=1 BATON_SOAK_SECONDS=$(BATON_SOAK_SECONDS) \
	    TEST_LIMIT=1800 tests/reliability.sh $(RELIABILITY_SCRIPTS) || failed="$$failed scripts"; \
	$(MAKE) --no-print-directory fuzz || failed="$$failed fuzz"; \
	$(MAKE) --no-print-directory test-san || failed="$$failed test-san"; \
	$(MAKE) --no-print-directory test-tsan || failed="$$failed test-tsan"; \
	if [ -n "$$failed" ]; then echo "test-reliability failed:$$failed"; exit 1; fi; \
	echo "test-reliability: all parts passed"

test-tsan: | $(BUILD)/.deps-test
	@$(MAKE) --no-print-directory -j$(NPROC) BUILD=$(TSAN_BUILD) CUDA=0 \
	    CFLAGS="-O1 -g -fsanitize=thread" LDFLAGS=-fsanitize=thread $(TSAN_PROGS) $(TSAN_BINS)
	@failed=""; export TSAN_OPTIONS="$(TSAN_OPTS)"; \
	BUILD=$(TSAN_BUILD) tests/run.sh --bins-only $(TSAN_BINS) || failed="$$failed bins"; \
	BUILD=$(TSAN_BUILD) TEST_LIMIT=1200 tests/reliability.sh $(TSAN_SCRIPTS) || failed="$$failed scripts"; \
	if [ -n "$$failed" ]; then echo "test-tsan failed:$$failed"; exit 1; fi

# ---- fuzzing ---------------------------------------------------------------
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_BUILD   := $(BUILD)/fuzzbuild
fuzz: $(PROGS) | $(BUILD)/.deps-fuzz
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) CUDA=0 \
	    CFLAGS="-O1 -g -fsanitize=fuzzer-no-link,address,undefined" fuzz-build
	@BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz.sh \
	    $(foreach f,$(FUZZ_SRCS),$(FUZZ_BUILD)/fuzz/$(patsubst %_fuzz.c,%,$(notdir $(f))))

FUZZ_BINS := $(foreach f,$(FUZZ_SRCS),$(BUILD)/fuzz/$(patsubst %_fuzz.c,%,$(notdir $(f))))
fuzz-build: $(FUZZ_BINS)
define FUZZ_RULE
$(BUILD)/fuzz/$(patsubst %_fuzz.c,%,$(notdir $(1))): $(call obj,$(1)) $(LIBS)
	@mkdir -p $$(@D)
	$(CC) -fsanitize=fuzzer,address,undefined -o $$@ $$< $(LIBS) $(LDLIBS_ALL)
endef
$(foreach f,$(FUZZ_SRCS),$(eval $(call FUZZ_RULE,$(f))))

# The engine benchmark on the host backend (figures, not a test).
bench: $(PROGS)
	@scripts/bench-host.sh $(BUILD)

# ---- broker ---------------------------------------------------------------
# The README's first command: a broker and four engines of a synthetic
# model hand devices around, then two trained chat models take turns
# (broker/demo.sh). Needs only the build set of Debian packages; builds the
# programs in parallel first (a fresh clone's first command may be this one).
demo: | $(BUILD)/.deps
	@$(MAKE) --no-print-directory -j$(NPROC) $(PROGS)
	@broker/demo.sh $(BUILD)

# The broker benchmark (figures, not a test): control round trip and the
# parts of each handoff, on the host backend (BENCH_BROKER_FLAGS for more).
.PHONY: bench-broker
bench-broker: $(PROGS)
	@$(BUILD)/bin/baton-broker-bench $(BENCH_BROKER_FLAGS)

# ---- GPU ------------------------------------------------------------------
# gpu-build makes binaries that need only the NVIDIA driver where they run
# (CUDA=1, the field's libraries linked statically), so they can be built
# here and copied to a GPU machine where nothing can be installed; there,
# scripts/gpu-test.sh and scripts/bench-gpu.sh run them.
GPU_BUILD ?= build-gpu
gpu-build: | $(BUILD)/.deps
	@$(MAKE) --no-print-directory BUILD=$(GPU_BUILD) CUDA=1 STATIC=1 all
gpu-test: gpu-build
	@scripts/gpu-test.sh $(GPU_BUILD)
bench-gpu: gpu-build
	@scripts/bench-gpu.sh $(GPU_BUILD)

# ---- man pages --------------------------------------------------------------
# docs/man/NAME.SECTION.scd -> $(BUILD)/man/NAME.SECTION (scdoc, Debian's);
# docs/man_test.py checks them against each program's --help.
MAN_SRCS := $(wildcard docs/man/*.scd)
MANS     := $(patsubst docs/man/%.scd,$(BUILD)/man/%,$(MAN_SRCS))
man: $(MANS)
$(BUILD)/man/%: docs/man/%.scd | $(BUILD)/.deps
	@mkdir -p $(@D)
	scdoc < $< > $@.tmp && mv $@.tmp $@

# ---- install ----------------------------------------------------------------
# make install [PREFIX=/usr/local] [DESTDIR=]: the programs (benchmarks
# left out) to $(PREFIX)/bin; the systemd units to
# $(PREFIX)/lib/systemd/system (a directory systemd searches; ExecStart= is
# rewritten to $(PREFIX)/bin); the sysusers.d file making the system user
# baton to $(PREFIX)/lib/sysusers.d; the example configuration to
# $(PREFIX)/share/baton/etc, and to /etc/baton only where a file is absent
# (an edited configuration is never overwritten; broker.ini is made 0640,
# group baton, as it may hold the HTTP token); the man pages to
# $(MANDIR)/man{1,5,8}. Then, without DESTDIR:
#   systemd-sysusers && systemctl daemon-reload
PREFIX      ?= /usr/local
BINDIR      ?= $(PREFIX)/bin
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
MANDIR      ?= $(PREFIX)/share/man
CONFDIR     ?= /etc/baton
INSTALL     ?= install
INSTALL_PROGS := $(filter-out %-bench,$(PROGS))
DEPLOY_UNITS  := $(wildcard deploy/systemd/*.service)
DEPLOY_CONF   := broker.ini arenas/example.conf engines/example.conf

.PHONY: install
install: $(INSTALL_PROGS) $(MANS)
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) \
	    $(DESTDIR)$(PREFIX)/share/baton/etc/arenas $(DESTDIR)$(PREFIX)/share/baton/etc/engines \
	    $(DESTDIR)$(CONFDIR)/arenas $(DESTDIR)$(CONFDIR)/engines
	$(INSTALL) -m 0755 $(INSTALL_PROGS) $(DESTDIR)$(BINDIR)/
	for u in $(DEPLOY_UNITS); do \
	    sed -e 's|/usr/local/bin/|$(BINDIR)/|g' -e 's|/etc/baton/|$(CONFDIR)/|g' $$u \
	        > $(DESTDIR)$(UNITDIR)/$$(basename $$u) && \
	    chmod 0644 $(DESTDIR)$(UNITDIR)/$$(basename $$u) || exit 1; \
	done
	$(INSTALL) -m 0644 deploy/systemd/baton.sysusers.conf $(DESTDIR)$(SYSUSERSDIR)/baton.conf
	for f in $(DEPLOY_CONF); do \
	    $(INSTALL) -m 0644 deploy/etc/$$f $(DESTDIR)$(PREFIX)/share/baton/etc/$$f || exit 1; \
	    [ -e $(DESTDIR)$(CONFDIR)/$$f ] || $(INSTALL) -m 0644 deploy/etc/$$f $(DESTDIR)$(CONFDIR)/$$f || exit 1; \
	done
	# broker.ini may hold http_token: readable by root and the group baton
	# only (the group exists once systemd-sysusers has run).
	chmod 0640 $(DESTDIR)$(CONFDIR)/broker.ini
	if [ -z "$(DESTDIR)" ] && getent group baton >/dev/null; then chgrp baton $(CONFDIR)/broker.ini; \
	else echo "make install: after systemd-sysusers, run: chgrp baton $(CONFDIR)/broker.ini"; fi
	for m in $(MANS); do \
	    sec=$${m##*.}; $(INSTALL) -d $(DESTDIR)$(MANDIR)/man$$sec && \
	    $(INSTALL) -m 0644 $$m $(DESTDIR)$(MANDIR)/man$$sec/ || exit 1; \
	done

clean:
	rm -rf $(BUILD) $(GPU_BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
