# trainlet's entry points. `make test` is the README's test command and what CI runs:
# on a fresh machine it installs what is missing, builds the Go control plane once
# (cached in ~/.cache/trainlet), starts it, and runs every test against it.
SHELL := /bin/bash
CARGO ?= cargo

# The tests' output goes to target/$(2) too; each test skipped for a missing
# prerequisite (TRAINLET_TEST_SKIP, docs/development.md) printed one SKIPPED line, and
# `skipped: N` ends the output. On a failure, each panic's place and first lines are
# repeated last, where a log cut to its tail still shows why (a backtrace or a long
# description of pods can push them out of view). The status is the tests' (pipefail).
tested = set -o pipefail; mkdir -p target; $(1) 2>&1 | tee target/$(2); rc=$$?; \
	grep '^SKIPPED ' target/$(2); echo "skipped: $$(grep -c '^SKIPPED ' target/$(2))"; \
	if [ $$rc -ne 0 ]; then echo "why each test failed:"; grep -A3 '^thread .* panicked at' target/$(2) | cut -c1-400; fi; exit $$rc

.PHONY: docs all build release portable portable-arm64 test-arm64 monitoring test test-newest test-k8s-previous test-stress deps control-plane down demo lint clean rootfs image node node-down node-smoke node-examples bench bench-docs

# The control plane of the node that tests/it/node_examples.rs starts: its own, since
# on the shared one the node's scheduler and kubelet would take the other tests' pods.
NODE_CONTROL_PLANE := $(CURDIR)/target/control-plane-node

# The portable binary: linked against glibc 2.17 (the manylinux2014 baseline) by
# cargo-zigbuild, so that it starts in any glibc training image, where
# `trainlet init --install-to` copies it. The image ships it (docker/Dockerfile says why).
# The aarch64 one is built the same way, for Grace (GH200, GB200) and other arm64 nodes.
# Both are built in a target directory of their own outside the clone, kept between
# clones like the Go control plane (a cold fat-LTO build takes about 9 minutes on 2
# cores, and a fresh clone then rebuilds only trainlet itself), and copied to the usual
# place below target/.
PORTABLE_TARGET := x86_64-unknown-linux-gnu
PORTABLE_ARM64_TARGET := aarch64-unknown-linux-gnu
PORTABLE_BUILD_DIR ?= $(HOME)/.cache/trainlet/cargo-portable
PORTABLE := $(or $(CARGO_TARGET_DIR),target)/$(PORTABLE_TARGET)/release/trainlet
PORTABLE_ARM64 := $(or $(CARGO_TARGET_DIR),target)/$(PORTABLE_ARM64_TARGET)/release/trainlet
# How the QEMU tests run the aarch64 binary: user-mode emulation, its loader and glibc
# from Debian's cross packages (.ci/deps installs qemu-user and libc6-arm64-cross).
QEMU_ARM64 := qemu-aarch64 -L /usr/aarch64-linux-gnu

all: build

build:
	$(CARGO) build

## target/release-artifacts/: both binaries as tarballs, one OCI image index of
## linux/amd64 and linux/arm64 (an OCI archive, and a docker-archive per platform),
## install.yaml pinned by the index's digest, a CycloneDX SBOM, SHA256SUMS; reproducible
## (docker/release.sh says what each is for).
release: portable portable-arm64
	@docker/release.sh $(PORTABLE) $(PORTABLE_ARM64)

## target/x86_64-unknown-linux-gnu/release/trainlet, needing glibc 2.17 at most (cold: about
## 9 minutes on 2 cores; then only what changed). cargo-zigbuild and Zig come from PyPI
## (.ci/deps installs the versions in docker/zigbuild-requirements.txt).
portable:
	@$(call portable_build,$(PORTABLE_TARGET),$(PORTABLE))

## target/aarch64-unknown-linux-gnu/release/trainlet, the same for arm64 nodes. (Each is
## copied only when it changed: a test's `make release` leaves alone the binary that
## other tests run.)
portable-arm64:
	@$(call portable_build,$(PORTABLE_ARM64_TARGET),$(PORTABLE_ARM64))

portable_build = command -v cargo-zigbuild >/dev/null || { echo "portable: no cargo-zigbuild on PATH; run .ci/deps (pip install --require-hashes -r docker/zigbuild-requirements.txt)" >&2; exit 1; }; \
	CARGO_TARGET_DIR=$(PORTABLE_BUILD_DIR) $(CARGO) zigbuild --release --locked --bin trainlet --target $(1).2.17 && \
	{ cmp -s $(PORTABLE_BUILD_DIR)/$(1)/release/trainlet $(2) || install -D -m 0755 $(PORTABLE_BUILD_DIR)/$(1)/release/trainlet $(2); }

## manifests/monitoring/prometheusrule.yaml from manifests/monitoring/rules/trainlet.rules.yaml
## (a test fails while the committed file differs).
monitoring:
	scripts/prometheusrule >manifests/monitoring/prometheusrule.yaml

## Debian packages the tests use, installed only when missing.
deps:
	@.ci/deps

## Build (first time only) and start kube-apiserver + etcd on 127.0.0.1.
control-plane:
	@tests/control-plane/up

## Stops the control plane, the node tests' node and control plane, and the cgroup v2
## machine.
down:
	@tests/control-plane/down
	@TRAINLET_CONTROL_PLANE_DIR=$(NODE_CONTROL_PLANE) tests/control-plane/down
	@tests/node/cgroup2/down

## One real node on the control plane: containerd, runc, CNI bridge, kubelet,
## kube-scheduler and kube-proxy (tests/node/up; root, Linux). Prints the kubeconfig.
node:
	@tests/node/up

node-down:
	@tests/node/down

## Proves the node: scheduling, pod addresses, pod-to-pod TCP, the API server through
## the `kubernetes` Service, no default route in pods.
node-smoke:
	@tests/node/smoke

## Every test, on the newest Kubernetes (tests/control-plane/versions); then the tests
## whose outcome depends on the version again on the previous one (test-k8s-previous).
## The image archive and the release first: the node tests (tests/it/node_examples.rs)
## run trainlet's containers from the archive, as shipped; it holds the portable binary,
## which tests/it/glibc.rs checks, and tests/it/release.rs checks the release. Each run
## ends with the count of skipped tests.
test: test-newest test-k8s-previous

# Two lanes side by side, each run whatever the other's outcome, after one build of
# every test: the launcher corpus on the real node (node_launchers, eight jobs of three
# to five minutes each, node_where's hanging DDP job, and the examples), the longest;
# and, one pass after the other, the unit tests and the played tests (no node),
# PLAYED_THREADS at a time, since they mostly wait on the API server and on timers
# (the release's tests among them: `make release` comes first), the aarch64 binary's
# subset under QEMU, the cgroup v2 machine's (slow: it is emulated) and the other node
# tests (the admission policy's among them). The node tests run one at a time in each
# lane, since their pods' frameworks start on the same cores; two lanes keep two corpus
# jobs from starting at once and leave no core idle at the end. The corpus lane's output
# follows the other's, whole, and where each failed test panicked ends the output.
PLAYED_THREADS ?= 4
NODE_CORPUS := node_launchers:: node_where:: node_examples::
NODE_OTHERS := node_ --skip node_launchers:: --skip node_where:: --skip node_examples:: --skip node_two:: --skip node_cgroup2::

# The aarch64 binary's subset, run under QEMU (TRAINLET_TEST_BINARY, docs/development.md):
# init resolving a job, exec's stall watch restarting a stalled rank's pods, exec's
# Kubeflow endpoint, and the sidecar's /metrics scraped by Prometheus.
ARM64_TESTS := init::tensorflow_parity_name_order_selector_order_and_not_running \
	stall::a_stalled_rank_restarts_every_pods_command_once \
	kubeflow::the_kubeflow_sdks_report_is_progress_and_published \
	report_oom::sidecar_counts_an_oomkilled_restart_and_prometheus_sees_it

test-newest: deps control-plane image release
	@$(CARGO) test --no-run 2>&1 | tail -n 1; \
	( $(call tested,$(CARGO) test --test it --no-fail-fast -- $(NODE_CORPUS) --test-threads 1,test-launchers.log) ) >target/test-launchers.out 2>&1 & lane=$$!; \
	( $(call tested,$(CARGO) test --no-fail-fast -- --skip node_ --test-threads $(PLAYED_THREADS),test.log) ); played=$$?; \
	( $(call tested,$(ARM64_TEST_COMMAND),test-arm64.log) ); arm64=$$?; \
	( $(call tested,$(CARGO) test --test it --no-fail-fast -- node_two:: node_cgroup2:: --test-threads 1,test-vm.log) ); vm=$$?; \
	( $(call tested,$(CARGO) test --test it --no-fail-fast -- $(NODE_OTHERS) --test-threads 1,test-node.log) ); node=$$?; \
	wait $$lane; launchers=$$?; cat target/test-launchers.out; \
	rc=$$(( played | arm64 | vm | node | launchers )); if [ $$rc -ne 0 ]; then echo "why each test failed, in every pass:"; \
	grep -h -A3 '^thread .* panicked at' target/test.log target/test-arm64.log target/test-vm.log target/test-node.log target/test-launchers.log | cut -c1-400; fi; \
	exit $$rc

ARM64_TEST_COMMAND = TRAINLET_TEST_BINARY="$(QEMU_ARM64) $(PORTABLE_ARM64)" $(CARGO) test --test it --no-fail-fast -- $(ARM64_TESTS)

## The aarch64 binary's subset of the integration tests, under QEMU's user-mode emulation.
test-arm64: deps control-plane portable-arm64
	@$(call tested,$(ARM64_TEST_COMMAND),test-arm64.log)

# What changed between the two versions: native sidecars (on by default since 1.29),
# the guard policy (ValidatingAdmissionPolicy), WatchList (sendInitialEvents) and the
# Job controller's index labels, each on a real control plane and node of that version.
K8S_SENSITIVE := guard:: lifecycle::a_replaced_pod_restarts_every_peers_command_once_with_its_new_address \
	init::the_api_server_streams_the_initial_pods \
	node_pods::the_native_sidecar_starts_before_the_training_container_and_stops_after_it \
	node_quickstart::

## The version-sensitive tests on the previous Kubernetes (1.34): the control plane and
## the node restart on that version (built once, cached like the newest); the cgroup v2
## machine, which they do not use, stops first.
test-k8s-previous: deps image
	@tests/node/cgroup2/down
	@TRAINLET_K8S_VERSION=previous tests/control-plane/up >/dev/null
	@$(call tested,TRAINLET_K8S_VERSION=previous $(CARGO) test --test it --no-fail-fast -- $(K8S_SENSITIVE),test-k8s-previous.log)

## The integration tests (tests/it/, without the real node's) while stress-ng keeps
## every core busy, to show that no test depends on a quiet machine. stress-ng stops
## with the tests, whatever happens (and after an hour at the latest).
test-stress: deps control-plane portable
	@$(CARGO) test --test it --no-run
	@stress-ng --cpu $$(nproc) --timeout 3600s --quiet & stress=$$!; \
	trap 'kill $$stress 2>/dev/null; wait $$stress 2>/dev/null' EXIT INT TERM; \
	$(call tested,$(CARGO) test --test it --no-fail-fast -- --skip node_,test.log)

## The shipped examples on a real node (root): tests/it/node_examples.rs.
node-examples: deps image
	$(CARGO) test --test it node_examples

## A minimal image rootfs without Docker (the portable binary, the glibc libraries it and
## NVML link, nonroot user): target/rootfs/trainlet-rootfs.tar, for `docker import` or
## `podman import`.
rootfs: portable
	@docker/rootfs.sh $(PORTABLE)

## The image without a Docker daemon (umoci + skopeo): target/image/trainlet-0.1.0.tar,
## a reproducible docker-archive tagged ghcr.io/trainlet/trainlet:0.1.0 for docker load,
## podman load, kind load image-archive or ctr images import. It ships the portable
## binary, as docker/Dockerfile does.
image: portable
	@docker/image.sh $(PORTABLE)

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings

## Benchmarks: trainlet against kubectl on a private control plane (release build), and
## on the real node (root; tests/node/up). Prints markdown tables; writes
## target/bench/results.json, target/bench/resolve.svg and target/bench/results-node.json.
## `TRAINLET_BENCH_ONLY=floor make bench`: trainlet init against the floor, a bare kube-rs
## watch built like it (target/bench/results-floor.json; docs/benchmarks.md, "The floor").
bench: deps
	$(CARGO) bench --bench trainlet

## docs/benchmarks.md's figures rendered from the runs kept in docs/bench/ (copy a run's
## target/bench/*.json there first); tests/it/bench_docs.rs checks they agree.
bench-docs:
	TRAINLET_WRITE_DOCS=1 $(CARGO) test --test it bench_docs::

## docs/flags.md from the command-line definitions, and manifests/admission/policy.yaml
## from `trainlet inject --admission-policy` (tests check that both are current).
docs:
	TRAINLET_WRITE_DOCS=1 $(CARGO) test --lib reference
	TRAINLET_WRITE_DOCS=1 $(CARGO) test --test it admission::the_shipped_policy_is_what_inject_prints

demo: control-plane
	@scripts/demo

clean: down
	$(CARGO) clean
