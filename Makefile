# trainlet's entry points. `make test` is the README's test command and what CI runs:
# on a fresh machine it installs what is missing, builds the Go control plane once
# (cached in ~/.cache/trainlet), starts it, and runs every test against it.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all build release test deps control-plane down demo lint clean rootfs bench

all: build

build:
	$(CARGO) build

release:
	$(CARGO) build --release

## Debian packages the tests use, installed only when missing.
deps:
	@.ci/deps

## Build (first time only) and start kube-apiserver + etcd on 127.0.0.1.
control-plane:
	@tests/control-plane/up

down:
	@tests/control-plane/down

test: deps control-plane
	$(CARGO) test --no-fail-fast

## A minimal image rootfs without Docker (binary, its glibc libraries, nonroot user):
## target/rootfs/trainlet-rootfs.tar, for `docker import` or `podman import`.
rootfs:
	@docker/rootfs.sh

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings

## Benchmarks: trainlet against kubectl on a private control plane (release build).
## Prints a markdown table; writes target/bench/results.json and target/bench/resolve.svg.
bench: deps
	$(CARGO) bench --bench trainlet

demo: control-plane
	@scripts/demo

clean: down
	$(CARGO) clean
