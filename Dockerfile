# syntax=docker/dockerfile:1
#
# Image of the hostpath-provisioner: one static binary on a minimal base.
#
# Build (BuildKit, the default builder of current Docker; podman/buildah work too):
#   docker build -t hostpath-provisioner:0.1.0 .
# The image is built for the architecture of the machine that builds it (x86_64 or aarch64);
# for another one use `docker buildx build --platform linux/arm64 ...` (emulated).
# Deploy with deploy/legacy (kustomize), which refers to hostpath-provisioner:0.1.0.

# ---- Build stage: a static (musl) binary, so the final image needs no libc at all. ----
FROM docker.io/library/rust:1-bookworm AS build

# musl-gcc compiles the C and assembly parts of dependencies (the `ring` crypto library
# behind rustls) for the musl target.
RUN apt-get update \
    && apt-get install -y --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/*

# Kept in its own layer so source changes do not download the target again.
RUN rustup target add "$(uname -m)-unknown-linux-musl"

WORKDIR /src
# The whole workspace (members "." and "tests/testbed": cargo needs every member's manifest
# even to build one package). .dockerignore keeps target/ and .git/ out of the context.
COPY . .

# The commit for the hostpath_provisioner_build_info metric and the start-up log line: .git is
# not in the context, so pass it in: --build-arg HPP_GIT_COMMIT=$(git rev-parse HEAD).
# Without it the commit reads "unknown".
ARG HPP_GIT_COMMIT=unknown

# The cache mounts keep downloaded crates and compiled dependencies between builds, so a
# source change recompiles only this crate. target/ lives in a cache mount, hence the copy
# of the binary to /out within the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    set -eu; \
    target="$(uname -m)-unknown-linux-musl"; \
    export "CC_$(echo "$target" | tr - _)=musl-gcc"; \
    cargo build --release --locked -p hostpath-provisioner --target "$target"; \
    install -D -m 0755 "target/$target/release/hostpath-provisioner" /out/hostpath-provisioner

# ---- Final stage ----
# distroless "static": no shell, no package manager, only CA certificates, /etc/passwd and
# time zone data. The `latest` variant runs as root, deliberately (not the `nonroot` one):
# the provisioner creates root-owned directories in the host's pool and removes files that
# workloads left there under any user id. The pod still drops all capabilities but
# DAC_OVERRIDE and FOWNER and gets a read-only root filesystem (deploy/legacy/daemonset.yaml).
FROM gcr.io/distroless/static-debian12:latest

LABEL org.opencontainers.image.title="hostpath-provisioner" \
      org.opencontainers.image.description="Dynamic hostPath PersistentVolume provisioner for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=build /out/hostpath-provisioner /hostpath-provisioner

# Explicit, so the uid does not depend on the base image's default.
USER 0:0
# Prometheus metrics (/metrics) and health (/healthz, /readyz).
EXPOSE 8080 8081
# Exec form: the provisioner is PID 1 and receives SIGTERM itself.
ENTRYPOINT ["/hostpath-provisioner"]
