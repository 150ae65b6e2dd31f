#!/usr/bin/env bash
# Assembles the image's runtime base from this machine's Debian packages, for buildah,
# where no registry can be reached: the shared libraries BINARY links (as `ldd` finds
# them: glibc, libgcc), the CA certificates, a user and group 65532 (nonroot), and the
# copyright files of the packages they come from. The same things the Dockerfile's
# default base, gcr.io/distroless/cc-debian12, holds, without the rest.
#
#   deploy/image/runtime-base.sh BINARY IMAGE
#
# Commits IMAGE (e.g. localhost/mailer-runtime-base:bookworm) in buildah's vfs storage;
# use it as the Dockerfile's RUNTIME_IMAGE. Needs buildah, dpkg and ldd; runs as root.
set -euo pipefail
binary=${1:?usage: runtime-base.sh BINARY IMAGE}
image=${2:?usage: runtime-base.sh BINARY IMAGE}
buildah=(buildah --storage-driver vfs)

rootfs=$(mktemp -d /tmp/mailer-runtime-base.XXXXXX)
container=""
cleanup() {
  [[ -z $container ]] || "${buildah[@]}" rm "$container" >/dev/null 2>&1 || true
  rm -rf "$rootfs"
}
trap cleanup EXIT

# The libraries, at the paths the binary's loader looks for them.
libraries=$(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
[[ -n $libraries ]] || { echo "ldd found no shared library in $binary" >&2; exit 1; }
packages=(ca-certificates)
for library in $libraries; do
  install -D -m 0755 "$(readlink -f "$library")" "$rootfs$library"
  packages+=("$(dpkg -S "$library" | cut -d: -f1 | sed -n 1p)")
done
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)

install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
for package in "${packages[@]}"; do
  install -D -m 0644 "/usr/share/doc/$package/copyright" "$rootfs/usr/share/doc/$package/copyright"
done
cat >"$rootfs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
cat >"$rootfs/etc/group" <<'GROUP'
root:x:0:
nonroot:x:65532:
GROUP
printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
install -d -m 0755 "$rootfs/home/nonroot"
install -d -m 1777 "$rootfs/tmp"

versions=$(for package in "${packages[@]}"; do
  printf '%s=%s ' "$package" "$(dpkg-query -W -f '${Version}' "$package")"
done)

"${buildah[@]}" rmi "$image" >/dev/null 2>&1 || true
container=$("${buildah[@]}" from scratch)
"${buildah[@]}" copy --quiet "$container" "$rootfs" / >/dev/null
# buildah copies as root:root; the home is the user's.
"${buildah[@]}" copy --quiet --chown 65532:65532 "$container" "$rootfs/home/nonroot" /home/nonroot >/dev/null
"${buildah[@]}" config \
  --env PATH=/usr/local/bin:/usr/bin:/bin \
  --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  --user 65532:65532 --workingdir /home/nonroot \
  --label "dev.mailer.runtime-packages=${versions% }" \
  "$container"
"${buildah[@]}" commit --quiet --rm "$container" "$image" >/dev/null
container=""
echo "runtime base $image: ${packages[*]}"
