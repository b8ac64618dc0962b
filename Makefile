# hostpath-provisioner: the two commands a newcomer needs are `make demo` and `make test`.
# Control-plane binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) are
# compiled from the Go module proxy on first use and cached outside the repository
# (~/.cache/hostpath-provisioner; override with HPP_CACHE_DIR).

CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: all build release control-plane promtool deploy-tools manifests image test lane-tools test-more-arches test-kubevirt-migration test-upgrade test-oldest-k8s lint unit e2e demo demo-operator bench bench-vs-go fmt clean-cache

all: build

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --release -p hostpath-provisioner

# Builds the pinned control plane if it is not cached yet (first run: about 10-30 minutes).
control-plane:
	bash hack/build-control-plane.sh

# Builds the pinned promtool (checks and unit-tests the alert rules) if it is not cached yet.
promtool:
	bash hack/build-promtool.sh

# helm and kube-score, and the CRDs of the chart's optional kinds (ServiceMonitor, PrometheusRule,
# SecurityContextConstraints), from the Go module proxy, cached next to the control plane
# (first run: several minutes). tests/e2e_install.rs uses them. Also the OCI registry the publish
# test pushes to (hack/build-registry.sh).
deploy-tools:
	bash hack/build-deploy-tools.sh >/dev/null
	bash hack/build-registry.sh >/dev/null

# Regenerates the checked-in rendered manifests: deploy/install.yaml from deploy/legacy and
# deploy/monitoring/ from the Helm chart. A test fails when they are stale.
manifests: control-plane deploy-tools
	bash hack/render-manifests.sh

# The provisioner's image as an OCI archive, without any registry or docker: static binaries for
# linux/amd64 (installed toolchain, +crt-static) and linux/arm64 (cross-compiled with Debian sid's
# Rust from hack/fetch-cross-rust.sh and gcc-aarch64-linux-gnu), profile `image`, in one OCI image
# index named hostpath-provisioner:<deploy/legacy's tag>, written to
# target/image/hostpath-provisioner.oci.tar. Load it with `ctr -n k8s.io images import`.
# IMAGE_PLATFORMS=linux/amd64 skips the arm64 build; linux/ppc64le and linux/s390x can be added
# (gcc-powerpc64le-linux-gnu libc6-dev-ppc64el-cross, gcc-s390x-linux-gnu libc6-dev-s390x-cross).
# The Dockerfile (buildx) remains the way to build the image for a registry (see README and
# docs/development.md, "Releasing").
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
image:
	$(CARGO) run -q -p testbed --bin image -- --platform $(IMAGE_PLATFORMS)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) test --workspace --lib --bins

# End-to-end suite against the real control plane, including the real-node lane
# (tests/e2e_real_nodes.rs: containerd + kubelet, needs root). With CI=true nothing skips.
e2e: control-plane deploy-tools image
	$(CARGO) test --workspace --tests -- --test-threads=$${E2E_THREADS:-4}

# Everything the suite needs, then the suite (hack/test.sh says how): the Go tools, the image and
# the test binaries build at the same time, as do the suite and the real-node lane
# (tests/e2e_real_nodes.rs, which the suite's own run of it then leaves out:
# TESTBED_REAL_NODES_APART), and last test-oldest-k8s. Logs in target/make-test/.
test:
	CARGO="$(CARGO)" MAKE="$(MAKE)" IMAGE_PLATFORMS="$(IMAGE_PLATFORMS)" OLDEST_K8S_VERSION="$(OLDEST_K8S_VERSION)" bash hack/test.sh

# linux/ppc64le and linux/s390x, apart from `make test` (.ci/run runs this after it): the image
# for all four platforms (amd64 and arm64 are `make test`'s, already built), written to
# target/image/hostpath-provisioner-all-platforms.oci.tar, and tests/e2e_foreign_arches.rs's
# ppc64le and s390x tests, each running its binary under qemu-user (--help, doctor, one claim
# provisioned), which skip unless HPP_MORE_ARCHES=1. Why apart: cold, the two cross builds cost
# about 875 s of CPU (ppc64le 451 s, s390x 424 s; docs/development.md, "Releasing"), at least 7
# minutes more for a cold `make test` on 2 cores, which at about 55 minutes must stay under the
# hour. The four-platform archive is also pushed to a real registry by the documented command
# and read back with all four (tests/documented/registry.rs). Unoptimized (`dev`) as `make test`'s arm64: on this machine they only run under qemu, so
# the archive is a test artefact, not one to ship. Needs gcc-powerpc64le-linux-gnu
# libc6-dev-ppc64el-cross gcc-s390x-linux-gnu libc6-dev-s390x-cross qemu-user-static.
MORE_ARCHES_PLATFORMS ?= linux/amd64,linux/arm64,linux/ppc64le,linux/s390x
MORE_ARCHES_ENV := HPP_MORE_ARCHES=1 HPP_ARM64_PROFILE=$${HPP_ARM64_PROFILE:-dev} HPP_PPC64LE_PROFILE=$${HPP_PPC64LE_PROFILE:-dev} HPP_S390X_PROFILE=$${HPP_S390X_PROFILE:-dev}
test-more-arches: control-plane deploy-tools
	$(MORE_ARCHES_ENV) $(CARGO) run -q -p testbed --bin image -- --platform $(MORE_ARCHES_PLATFORMS) --out target/image/hostpath-provisioner-all-platforms.oci.tar
	$(MORE_ARCHES_ENV) $(CARGO) test --test e2e_foreign_arches -- ppc64le_ s390x_
	HPP_MORE_ARCHES=1 $(CARGO) test --test e2e_documented_commands -- the_image_and_the_chart_are_pushed_to_a_real_registry

# What the three lanes below build before they run, built ahead: .ci/run starts this at nice 19
# beside `make test` (hack/build-lane-tools.sh says why and how it keeps out of its way), so that
# on a cold machine those builds use the core the suite leaves idle.
lane-tools:
	EARLIER_COMMITS="$(EARLIER_COMMIT) $(EARLIER_SNAPSHOTS_COMMIT)" MORE_ARCHES_PLATFORMS="$(MORE_ARCHES_PLATFORMS)" \
	  $(MORE_ARCHES_ENV) bash hack/build-lane-tools.sh $(LANE_TOOLS_ARGS)

# A kubevirt hostpath-provisioner-operator cluster moved to this operator and back on the
# real-node lane (tests/real_nodes/kubevirt_migration.rs, kubevirt_pool_migration.rs), apart from `make test` like the
# arches above: building the kubevirt operator, its CSI driver and the CSI sidecars from source
# (hack/build-kubevirt-csi.sh, cached) costs about 13 minutes on 2 cores cold. Needs the kubevirt
# source archives (HPP_KUBEVIRT_OPERATOR_ARCHIVE, HPP_GO_LEGACY_ARCHIVE; .ci/run finds them) and
# the Go module proxy for csi-provisioner and the sidecar stand-ins.
test-kubevirt-migration: control-plane
	HPP_KUBEVIRT_MIGRATION=1 $(CARGO) test --test e2e_real_nodes -- kubevirt_operator_cluster

# The rollout's mixed window with real processes (tests/e2e_upgrade_mixed.rs): a node of a pinned
# earlier commit beside a node of this checkout, built from git history by
# hack/build-earlier-provisioner.sh (one compile of the top crate, about 12 min on 2 busy cores;
# the dependencies are shared with the image build); the test itself takes about 20 s. Then the
# same binary in an image on the real-node lane (tests/real_nodes/upgrade_helm.rs and
# upgrade_operator.rs): a Helm release and an operator of that commit upgraded under a burst of
# claims by docs/upgrading.md's commands, and rolled back (about 5 min with the lane's start).
# A second, later pin for what the first predates: snapshots, taken by a release whose CRD had
# no status.volumeMode, restored after the upgrade, and back (tests/e2e_upgrade_snapshots.rs;
# the same build, about 20 s of test).
EARLIER_COMMIT ?= 12b82d297bdf2511c5dcb4140a08407fe805fe2d
EARLIER_SNAPSHOTS_COMMIT ?= f97ac4e2008c69a35201a27d3fac850c02ba09fc
test-upgrade: control-plane deploy-tools
	earlier="$$(bash hack/build-earlier-provisioner.sh $(EARLIER_COMMIT))" && \
	  snapshots="$$(bash hack/build-earlier-provisioner.sh $(EARLIER_SNAPSHOTS_COMMIT))" && \
	  HPP_EARLIER_PROVISIONER="$$earlier" $(CARGO) test --test e2e_upgrade_mixed && \
	  HPP_EARLIER_SNAPSHOTS_PROVISIONER="$$snapshots" $(CARGO) test --test e2e_upgrade_snapshots && \
	  HPP_EARLIER_PROVISIONER="$$earlier" $(CARGO) test --test e2e_real_nodes -- an_earlier_

# The oldest Kubernetes the project supports (Chart.yaml's kubeVersion, README "Install"): the
# end-to-end tests whose APIs differ by version also run against its control plane, built on
# first use like the pinned one but without the kubelet (cold: about 17 min on 2 busy cores; a
# warm run about 3.5 min). 1.25 is the floor because the operator's CRD needs CEL validation on
# by default. Newer 1.25 patches are not all on the Go module proxy, hence .4
# (docs/development.md, "The oldest supported Kubernetes").
OLDEST_K8S_VERSION ?= v1.25.4
OLDEST_K8S := K8S_VERSION=$(OLDEST_K8S_VERSION) K8S_COMMANDS="kube-apiserver kube-controller-manager kube-scheduler kubectl"
test-oldest-k8s: deploy-tools
	$(OLDEST_K8S) bash hack/build-control-plane.sh >/dev/null
	$(OLDEST_K8S) $(CARGO) test --test e2e_provisioning --test e2e_wffc --test e2e_liveness -- --test-threads=$${E2E_THREADS:-4}
	$(OLDEST_K8S) $(CARGO) test --test e2e_capacity -- --test-threads=$${E2E_THREADS:-4} with_published_capacity published_capacity_is_quiet
	$(OLDEST_K8S) $(CARGO) test --test e2e_deploy -- --test-threads=$${E2E_THREADS:-4} deploy_manifests_render capacity_is_published provisioner_works_under
	$(OLDEST_K8S) $(CARGO) test --test e2e_install -- --test-threads=$${E2E_THREADS:-4} every_rendered_variant the_chart_defaults_match helm_install install_yaml_and
	$(OLDEST_K8S) $(CARGO) test --test e2e_operator -- --test-threads=$${E2E_THREADS:-4} crd_ the_operator_deploys the_one_file_install the_charts_crd the_chart_installs
	$(OLDEST_K8S) $(CARGO) test --test e2e_documented_commands -- a_kubevirt_resource_breaking

# A local control plane and the provisioner: a claim provisioned for a pod and deleted. As root
# with containerd installed, a real pod on a real kubelet writes into the volume; otherwise two
# simulated nodes stand in (the demo says why). DEMO_ARGS=--simulated forces the latter.
demo: control-plane
	$(CARGO) build -p hostpath-provisioner
	$(CARGO) run -q -p testbed --bin demo -- --provisioner target/debug/hostpath-provisioner $(DEMO_ARGS)

# The operator path: a HostPathProvisioner resource becomes the node DaemonSet (docs/operator.md).
demo-operator: control-plane
	$(CARGO) build -p hostpath-provisioner
	$(CARGO) run -q -p testbed --bin demo_operator -- --provisioner target/debug/hostpath-provisioner

# Speed and footprint figures (never asserted in tests), of the binary users run: the
# Dockerfile's (hack/build-static.sh, profile release, glibc linked in), built in a target dir of
# its own. BENCH_PROVISIONER=PATH measures another binary instead, e.g. `make image`'s
# (target/image/x86_64-unknown-linux-gnu/image/hostpath-provisioner).
BENCH_BUILD_DIR ?= target/dockerfile-build
bench: control-plane
	@provisioner="$${BENCH_PROVISIONER:-}"; \
	if [ -z "$$provisioner" ]; then \
	  echo "bench: building the Dockerfile's binary (hack/build-static.sh, release) in $(BENCH_BUILD_DIR)"; \
	  provisioner="$$(bash hack/build-static.sh x86_64-unknown-linux-gnu release $(BENCH_BUILD_DIR))" || exit 1; \
	fi; \
	echo "bench: measuring $$provisioner"; \
	$(CARGO) run --release -q -p testbed --bin bench -- --provisioner "$$provisioner" $(BENCH_ARGS)

# The same scenarios run by ours and by the Go provisioner this project replaces, in turn, and
# their ratios (docs/performance.md). The Go build comes from its source archive
# (hack/build-go-legacy.sh; HPP_GO_LEGACY_ARCHIVE, else looked for in ../shared/go-legacy and
# ../../shared/go-legacy, as .ci/run does). BENCH_ARGS as for bench.
GO_LEGACY_ARCHIVE_NAME := kubevirt-hostpath-provisioner-7c142255.tar.gz
bench-vs-go: control-plane
	@provisioner="$${BENCH_PROVISIONER:-}"; \
	[ -n "$$provisioner" ] || provisioner="$$(bash hack/build-static.sh x86_64-unknown-linux-gnu release $(BENCH_BUILD_DIR))" || exit 1; \
	archive="$${HPP_GO_LEGACY_ARCHIVE:-}"; \
	for dir in ../shared/go-legacy ../../shared/go-legacy; do \
	  [ -n "$$archive" ] || [ ! -f "$$dir/$(GO_LEGACY_ARCHIVE_NAME)" ] || archive="$$dir/$(GO_LEGACY_ARCHIVE_NAME)"; \
	done; \
	go="$$(HPP_GO_LEGACY_ARCHIVE="$$archive" bash hack/build-go-legacy.sh)" && \
	$(CARGO) run --release -q -p testbed --bin bench -- --provisioner "$$provisioner" \
	  --peer "$$go/kubevirt-legacy-provisioner" --out target/bench-vs-go.json $(BENCH_ARGS)

fmt:
	$(CARGO) fmt --all

clean-cache:
	rm -rf "$${HPP_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/hostpath-provisioner}"
