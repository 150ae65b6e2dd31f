# The mailer image: one binary, `mailer`, that runs as the operator (`controller`) and as
# the workers (`worker`). Published as ghcr.io/mailer-operator/mailer:<crate version>.
#
# For users and their CI, a normal multi-stage build (compiles with --locked, then a
# distroless runtime with glibc and nothing else):
#
#   docker build -t registry.example/mailer:0.1.0 .
#   buildah bud --build-arg BINARY_FROM=build -t registry.example/mailer:0.1.0 .
# (buildah 1.28 skips the build stage unless BINARY_FROM is given explicitly.)
#
# `make image` (and CI) use the same runtime stage with build arguments: the binary
# cargo already built (BINARY_FROM=prebuilt, the build context holding only it), on a
# base assembled from this machine's Debian packages (RUNTIME_IMAGE, see
# deploy/image/runtime-base.sh), because no registry can be reached there.

# The Rust toolchain of the build stage: the one CI builds with (the locked
# rabbitmq_http_client needs 1.94 or newer).
ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
# The runtime base: glibc, libgcc, CA certificates, a user 65532, no shell.
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
# `build` compiles the binary here; `prebuilt` copies the file BINARY from the context.
ARG BINARY_FROM=build

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
# Symbols are no use in the image; they are most of an unstripped binary's size.
ENV CARGO_PROFILE_RELEASE_STRIP=symbols
RUN cargo build --release --locked --bin mailer \
    && mkdir -p /out && cp target/release/mailer /out/mailer

FROM scratch AS prebuilt
# The binary's path in the build context.
ARG BINARY=mailer
COPY ${BINARY} /out/mailer

FROM ${BINARY_FROM} AS binary
# (an instruction, so that buildah 1.28 removes this stage's container)
WORKDIR /out

FROM ${RUNTIME_IMAGE}
# The crate version; `make image` passes Cargo.toml's.
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="mailer" \
      org.opencontainers.image.description="Kubernetes operator and worker for a mail-sending pipeline on RabbitMQ" \
      org.opencontainers.image.source="https://github.com/mailer-operator/mailer" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=binary /out/mailer /usr/local/bin/mailer
# Numeric, so the kubelet can check runAsNonRoot; the chart and the worker pods set the
# same user.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/mailer"]
