#!/usr/bin/env bash
# Builds the mailer image with buildah from a binary cargo already built, through the
# Dockerfile's runtime stage (BINARY_FROM=prebuilt) on the base runtime-base.sh
# assembles from Debian packages, and prints its size. `make image` runs it with the
# release binary; tests/operations.rs with the one the tests built.
#
#   deploy/image/build.sh BINARY IMAGE [BASE_IMAGE]
#
# Needs buildah (Debian's works as root with vfs storage and chroot isolation) and
# binutils' strip. The images stay in buildah's vfs storage:
#   buildah --storage-driver vfs images
set -euo pipefail
cd "$(dirname "$0")/../.."
binary=${1:?usage: build.sh BINARY IMAGE [BASE_IMAGE]}
image=${2:?usage: build.sh BINARY IMAGE [BASE_IMAGE]}
base=${3:-localhost/mailer-runtime-base:bookworm}
buildah=(buildah --storage-driver vfs)

context=$(mktemp -d /tmp/mailer-image.XXXXXX)
trap 'rm -rf "$context"' EXIT
# The Dockerfile's build stage strips symbols too (CARGO_PROFILE_RELEASE_STRIP).
strip --strip-all -o "$context/mailer" "$binary"
version=$("$context/mailer" --version | awk '{print $2}')
revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)

deploy/image/runtime-base.sh "$context/mailer" "$base"
"${buildah[@]}" rmi "$image" >/dev/null 2>&1 || true
"${buildah[@]}" bud --quiet --isolation chroot --pull=never \
  --build-arg BINARY_FROM=prebuilt --build-arg BINARY=mailer \
  --build-arg RUNTIME_IMAGE="$base" \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" \
  -f Dockerfile -t "$image" "$context" >/dev/null
size=$("${buildah[@]}" images --format '{{.Size}}' "$image")
echo "image $image: $size (mailer $version, binary $(du -h "$context/mailer" | cut -f1))"
