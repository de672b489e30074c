# Quro — build, run and test. `make run` and `make test` do all set-up on a
# fresh Debian machine (as root, or with sudo for apt-get).

GO      ?= go
BIN     := bin/quro
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/quro-dev/quro/internal/version.Version=$(VERSION)
ADDR    ?= 127.0.0.1:7070

# Debian packages the tests (and the engines) use. nodejs and npm run the
# official TypeScript MCP client against quro (test/mcp-ts).
TEST_PKGS := python3 bash bubblewrap debootstrap nodejs npm
# What `make run` needs: the sandbox refuses to run user code without bwrap.
RUN_PKGS := bubblewrap

.PHONY: all build run run-deps test deps test-deps vet fmt-check bench clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/quro

run: build run-deps
	./$(BIN) serve --addr $(ADDR)

# The TypeScript MCP client's packages, installed from package-lock.json
# when node_modules is missing or the lock file changed.
TS_STAMP := test/mcp-ts/node_modules/.quro-installed

# Install what is missing, then check formatting, vet and run every test.
test: test-deps $(TS_STAMP) fmt-check vet
	$(GO) test -count=1 -timeout 30m ./...
	# the slim build (no embedded Python) must answer through the rest of the chain
	$(GO) test -count=1 -tags slim ./internal/engine/python/ ./internal/app/ ./internal/api/mcp/

$(TS_STAMP): test/mcp-ts/package.json test/mcp-ts/package-lock.json | test-deps
	npm ci --prefix test/mcp-ts --no-audit --no-fund
	touch $@

run-deps:
	@$(MAKE) --no-print-directory test-deps TEST_PKGS="$(RUN_PKGS)"

# A package counts as there when dpkg has it or its command is on PATH (a
# node installed otherwise, e.g. a nodejs that bundles npm, is not replaced).
test-deps:
	@missing=""; for p in $(TEST_PKGS); do dpkg -s $$p >/dev/null 2>&1 || command -v $$p >/dev/null || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && $$SUDO DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

bench:
	$(GO) test -run '^$$' -bench . -benchtime 200x -count 5 ./internal/app/ | tee bench/last.txt

clean:
	rm -rf bin

# Python round trips beside a Jupyter kernel and an interpreter spawn (see bench/README.md).
.PHONY: bench-python
bench-python:
	$(GO) run ./bench/pyrt

# run_code over REST and MCP against in-process on one loopback server, and
# 16-client REST throughput (see bench/README.md).
.PHONY: bench-service
bench-service:
	$(GO) run ./bench/service
