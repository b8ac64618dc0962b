# syntax=docker/dockerfile:1
#
# Image of the hostpath-provisioner: one static binary, nothing else.
#
# Build (BuildKit, the default builder of current Docker; podman/buildah work too):
#   docker build --build-arg HPP_GIT_COMMIT="$(git rev-parse HEAD)" -t hostpath-provisioner:0.1.0 .
# The image is built for the architecture of the machine that builds it; for others use
# `docker buildx build --platform linux/amd64,linux/arm64,linux/ppc64le,linux/s390x ...` (the
# foreign ones emulated with QEMU; the rust:*-bookworm base is published for all four).
#
# `make image` builds the same image without Docker: the same script (hack/build-static.sh), the
# same files (it copies this build context, .dockerignore applied, and compiles from the copy, so
# a file the build needs but the context lacks fails `make test`), the same glibc, the same single
# layer. It uses the `image` profile (release without LTO, quicker on small machines); this file
# uses `release`.

# ---- Build stage ----
# A fixed Rust release, not a floating tag, so a rebuild of the same commit compiles with the same
# compiler. For a reproducible release, also pin the digest (`rust:1.95.0-bookworm@sha256:...`, as
# `docker buildx imagetools inspect` prints it).
FROM docker.io/library/rust:1.95.0-bookworm AS build

WORKDIR /src
COPY . .

# The commit for the hostpath_provisioner_build_info metric and the start-up log line: .git is
# not in the context, so pass it in. Without it the commit reads "unknown".
ARG HPP_GIT_COMMIT=unknown

# glibc linked in statically (+crt-static): the provisioner tunes glibc's malloc, and the memory
# figures in the docs are measured on this build. The target is the build stage's own: rustc's
# host triple (`uname -m` would say ppc64le, whose Rust target is powerpc64le-unknown-linux-gnu).
# The cache mounts keep downloaded crates and compiled dependencies between builds; target/ lives
# in a cache mount, hence the copy of the binary to /out within the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    binary="$(bash hack/build-static.sh "$(rustc -vV | sed -n 's/^host: //p')" release /src/target)" \
    && install -D -m 0755 "$binary" /out/hostpath-provisioner

# ---- Final stage ----
# No base image: the binary needs no shell, no libc, no CA bundle (the API server's CA comes with
# the ServiceAccount token) and no /etc/passwd (users are given by number).
FROM scratch

LABEL org.opencontainers.image.title="hostpath-provisioner" \
      org.opencontainers.image.description="Dynamic hostPath PersistentVolume provisioner for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=build /out/hostpath-provisioner /hostpath-provisioner

# Root by default, as the Go build's image: a DaemonSet taken over in place (`kubectl set image`
# on the Go build's manifests, which set no user) must still create directories in the pool. The
# shipped manifests set the user themselves: uid 0 for the node pods, with every capability
# dropped but CHOWN, DAC_OVERRIDE, FOWNER and FSETID (deploy/legacy/daemonset.yaml); a non-root
# uid for the operator (deploy/operator/deployment.yaml).
USER 0:0
# Prometheus metrics (/metrics) and health (/healthz, /readyz).
EXPOSE 8080 8081
# Exec form: the provisioner is PID 1 and receives SIGTERM itself.
ENTRYPOINT ["/hostpath-provisioner"]
