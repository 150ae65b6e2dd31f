#!/bin/sh
# What a container runtime does for a pod's container, as far as tests/controller/
# operator_pod.rs needs it; run as root in a mount and UTS namespace of its own
# (`unshare --mount --uts --propagation private`), so nothing here is seen outside:
#
#   pod_sandbox.sh SERVICE_ACCOUNT_DIR WORKDIR OWNER HOSTNAME ROOT COMMAND...
#
# - SERVICE_ACCOUNT_DIR (token, ca.crt, namespace) is mounted read-only at
#   /var/run/secrets/kubernetes.io/serviceaccount, where the kubelet mounts a pod's
#   ServiceAccount token (on a tmpfs over /run: /var/run is a link to it);
# - WORKDIR, the image's working directory (under /home, on a tmpfs), owned by OWNER
#   (uid:gid), as the image has it;
# - the hostname is the pod's name, HOSTNAME;
# - ROOT `ro` (securityContext.readOnlyRootFilesystem) makes every mount read-only but
#   /proc, /sys and /dev: the process can write nowhere; `rw` leaves them;
# - then it execs COMMAND (which drops to the pod's user) with the environment it was
#   given, which is the container's.
set -eu

sa_dir=$1 workdir=$2 owner=$3 pod_hostname=$4 root=$5
shift 5

fail() {
  echo "pod_sandbox.sh: $*" >&2
  exit 97
}

mount -t tmpfs -o mode=0755,size=1m tmpfs /run
mkdir -p /run/secrets/kubernetes.io/serviceaccount
mount --bind "$sa_dir" /run/secrets/kubernetes.io/serviceaccount
mount -o remount,bind,ro /run/secrets/kubernetes.io/serviceaccount

case $workdir in
/home/*) ;;
*) fail "the working directory $workdir is not under /home" ;;
esac
mount -t tmpfs -o mode=0755,size=1m tmpfs /home
mkdir -p "$workdir"
chown "$owner" "$workdir"
[ -x "$1" ] || [ -x "$(command -v "$1")" ] || fail "cannot run $1 (hidden by a tmpfs?)"

echo "$pod_hostname" >/proc/sys/kernel/hostname

case $root in
ro)
  # Field 5 of mountinfo is the mount point, the field after " - " the file system.
  while read -r _ _ _ _ point _ _ rest; do
    fstype=${rest#*- }
    fstype=${fstype%% *}
    case $point in /proc | /proc/* | /sys | /sys/* | /dev | /dev/*) continue ;; esac
    case $fstype in proc | sysfs | cgroup | cgroup2) continue ;; esac
    # A mount under the /run or /home the tmpfs above now covers (a network namespace's
    # under /run/netns, say) is out of reach, and out of the container's sight.
    case $point in /run/secrets/*) ;; /run/* | /home/*) continue ;; esac
    [ -e "$point" ] || continue
    mount -o remount,bind,ro "$point"
  done </proc/self/mountinfo
  # Even root cannot write now; the pod's user far less.
  if touch /.pod-sandbox-writable 2>/dev/null; then
    rm -f /.pod-sandbox-writable
    fail "the root file system is still writable"
  fi
  if touch /tmp/.pod-sandbox-writable 2>/dev/null; then
    rm -f /tmp/.pod-sandbox-writable
    fail "/tmp is still writable"
  fi
  ;;
rw) ;;
*) fail "ROOT is ro or rw, not $root" ;;
esac

cd "$workdir"
exec "$@"
