# repronet: `make demo` runs the whole network on this machine; `make test`
# runs the test suite. Both install what they need (scripts/setup.sh).
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(HOME)/go/bin:$(PATH)
export CGO_ENABLED := 0
GO ?= go
BIN := bin/repronet

.PHONY: all setup fixtures build demo test vet fmt proto bench clean dist

all: build

setup:
	@./scripts/setup.sh

# What the tests need from Debian's mirror, made once and kept in
# /var/lib/repronet/test-images: the tests themselves reach only loopback.
fixtures: setup
	$(GO) run ./internal/fixtures/prepare

build:
	$(GO) build -trimpath -o $(BIN) ./cmd/repronet
	$(GO) build -trimpath -o bin/repronet-agent ./cmd/repronet-agent

demo: setup build
	$(BIN) demo

test: setup fixtures
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'); exit 1; }
	$(GO) vet ./...
	$(GO) test -timeout 30m -count=1 ./...

# Debian packages in bin/dist: repronet (the static binary), repronet-node
# and repronet-coordinator (their systemd units and configuration files);
# nfpm does it, as a library (dist/, docs/operator.md).
dist:
	$(GO) run ./dist/mkdeb -out bin/dist

# Regenerates proto/repronet.pb.go (needs protoc: apt-get install protobuf-compiler).
proto:
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	protoc --go_out=. --go_opt=paths=source_relative proto/repronet.proto

bench: setup
	$(GO) run ./internal/fixtures/prepare -bench
	$(GO) test -run '^$$' -bench . -benchtime 1x ./...

clean:
	rm -rf bin
