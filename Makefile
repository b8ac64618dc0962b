# hostpath-provisioner: the two commands a newcomer needs are `make demo` and `make test`.
# Control-plane binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) are
# compiled from the Go module proxy on first use and cached outside the repository
# (~/.cache/hostpath-provisioner; override with HPP_CACHE_DIR).

CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: all build release control-plane test lint unit e2e demo bench fmt clean-cache

all: build

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --release -p hostpath-provisioner

# Builds the pinned control plane if it is not cached yet (first run: about 10-30 minutes).
control-plane:
	bash hack/build-control-plane.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) test --workspace --lib --bins

# End-to-end suite against the real control plane. With CI=true it never skips.
e2e: control-plane
	$(CARGO) test --workspace --tests -- --test-threads=$${E2E_THREADS:-4}

test: control-plane lint
	$(CARGO) test --workspace --all-targets -- --test-threads=$${E2E_THREADS:-4}

# A local control plane, two simulated nodes and the provisioner: a claim provisioned and deleted.
demo: control-plane
	$(CARGO) build -p hostpath-provisioner
	$(CARGO) run -q -p testbed --bin demo -- --provisioner target/debug/hostpath-provisioner

# Speed and footprint figures (never asserted in tests).
bench: control-plane
	$(CARGO) build --release -p hostpath-provisioner
	$(CARGO) run --release -q -p testbed --bin bench -- --provisioner target/release/hostpath-provisioner $(BENCH_ARGS)

fmt:
	$(CARGO) fmt --all

clean-cache:
	rm -rf "$${HPP_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/hostpath-provisioner}"
