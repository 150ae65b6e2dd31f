#!/usr/bin/env bash
# RabbitMQ 4.0 (Debian trixie's rabbitmq-server) beside the host's broker, without
# touching it: a minimal trixie root made by debootstrap holds the package, and the node
# runs chrooted there under its own name, Erlang cookie, data directory and ports.
#
#   .ci/rabbitmq4.sh start      install when missing (about 2 minutes, 500 MB), start, wait
#   .ci/rabbitmq4.sh stop       stop the node
#   .ci/rabbitmq4.sh ctl ARGS   rabbitmqctl ARGS against it (e.g. list_queues, stop_app)
#   .ci/rabbitmq4.sh status     exit 0 when it answers
#
# Ports: AMQP 5673, management 15673, epmd 4370, distribution 25673, CLI 35690-35699
# (the host's broker keeps 5672, 15672, 4369, 25672 and 35672-35682). guest/guest from
# localhost. Needs root. Safe to run again: what exists is kept, and a node already
# running is given the settings it can take live (max_message_size).
set -euo pipefail

ROOT=${RABBITMQ4_ROOT:-/var/lib/mailer-ci/rabbitmq4/root}
SUITE=trixie
# The Debian archive is the one this machine's apt uses (DEBIAN_MIRROR overrides it):
# no mirror's address is written here.
MIRROR=${DEBIAN_MIRROR:-}
# A uid and gid free on the host, so files in the root never belong to a host user.
RABBITMQ_UID=4372
AMQP_PORT=5673
MANAGEMENT_PORT=15673
# RabbitMQ 4 refuses messages over 16 MiB by default (3.x: 128 MiB); the tests publish
# requests of 25 MiB and more (tests/worker/size.rs), as users with large mail must allow.
MAX_MESSAGE_SIZE=$((64 * 1024 * 1024))

# The environment every rabbitmq command in the root runs with.
node_env=(
  HOME=/var/lib/rabbitmq
  LANG=C.UTF-8
  ERL_EPMD_PORT=4370
  RABBITMQ_NODENAME=rabbit4@localhost
  RABBITMQ_NODE_PORT="$AMQP_PORT"
  RABBITMQ_DIST_PORT=25673
  RABBITMQ_CTL_DIST_PORT_MIN=35690
  RABBITMQ_CTL_DIST_PORT_MAX=35699
)

log() { printf '[rabbitmq4] %s\n' "$*" >&2; }

# The Debian archive (not its security archive) of the machine's own apt sources, as
# apt-get uses them; asks apt to read its sources first when it has no lists yet.
# shellcheck disable=SC2016 # $(REPO_URI) and $(RELEASE) are apt's fields, not the shell's
debian_mirror() {
  local found
  found=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Created-By: Packages' 2>/dev/null |
    awk '$2 !~ /-security$/ {print $1; exit}')
  if [[ -z $found ]]; then
    apt-get update -qq
    found=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Created-By: Packages' 2>/dev/null |
      awk '$2 !~ /-security$/ {print $1; exit}')
  fi
  [[ -n $found ]] || {
    echo "no Debian archive in this machine's apt sources; set DEBIAN_MIRROR" >&2
    return 1
  }
  echo "${found%/}"
}

in_root() { # runs a command in the root as the rabbitmq user
  chroot --userspec=$RABBITMQ_UID:$RABBITMQ_UID "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "${node_env[@]}" "$@"
}

mount_proc() {
  mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
}

install_root() {
  if [[ -x "$ROOT/usr/lib/rabbitmq/bin/rabbitmq-server" ]]; then
    return
  fi
  command -v debootstrap >/dev/null || {
    apt-get update -qq
    apt-get install -y -qq debootstrap
  }
  log "bootstrapping a minimal $SUITE root in $ROOT"
  mkdir -p "$(dirname "$ROOT")"
  if [[ ! -x "$ROOT/usr/bin/apt-get" ]]; then
    rm -rf "$ROOT"
    [[ -n $MIRROR ]] || MIRROR=$(debian_mirror)
    log "from $MIRROR (this machine's apt sources)"
    debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >/dev/null
  fi
  # Packages must not start services in the root; the node is started below.
  printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
  chmod +x "$ROOT/usr/sbin/policy-rc.d"
  chroot "$ROOT" getent group rabbitmq >/dev/null || chroot "$ROOT" groupadd -g $RABBITMQ_UID rabbitmq
  chroot "$ROOT" getent passwd rabbitmq >/dev/null ||
    chroot "$ROOT" useradd -u $RABBITMQ_UID -g $RABBITMQ_UID -d /var/lib/rabbitmq -s /bin/false -M rabbitmq
  mount_proc
  log "installing rabbitmq-server"
  chroot "$ROOT" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends rabbitmq-server >/dev/null'
}

configure() {
  cat >"$ROOT/etc/rabbitmq/rabbitmq.conf" <<EOF
listeners.tcp.default = $AMQP_PORT
management.tcp.port = $MANAGEMENT_PORT
max_message_size = $MAX_MESSAGE_SIZE
EOF
  echo '[rabbitmq_management].' >"$ROOT/etc/rabbitmq/enabled_plugins"
  chown $RABBITMQ_UID:$RABBITMQ_UID "$ROOT/etc/rabbitmq/rabbitmq.conf" "$ROOT/etc/rabbitmq/enabled_plugins"
}

answers() {
  (exec 3<>/dev/tcp/127.0.0.1/$MANAGEMENT_PORT) 2>/dev/null &&
    curl -fsS -u guest:guest "http://127.0.0.1:$MANAGEMENT_PORT/api/overview" >/dev/null 2>&1
}

start() {
  install_root
  configure
  mount_proc
  if answers; then
    log "already running on $AMQP_PORT / $MANAGEMENT_PORT"
    # Channels opened from now on take it, no restart needed: RabbitMQ 4 reads it from
    # a persistent term it sets at boot from the application's environment.
    in_root /usr/lib/rabbitmq/bin/rabbitmqctl eval \
      "application:set_env(rabbit, max_message_size, $MAX_MESSAGE_SIZE),
       persistent_term:put(max_message_size, $MAX_MESSAGE_SIZE)." >/dev/null
    return
  fi
  log "starting node rabbit4@localhost"
  in_root /usr/lib/rabbitmq/bin/rabbitmq-server -detached
  local deadline=$((SECONDS + 180))
  until answers; do
    if ((SECONDS >= deadline)); then
      log "it does not answer after 180s; its log:"
      tail -n 40 "$ROOT"/var/log/rabbitmq/rabbit4@localhost.log >&2 || true
      exit 1
    fi
    sleep 1
  done
  log "RabbitMQ $(version) answers on AMQP $AMQP_PORT, management $MANAGEMENT_PORT"
}

version() {
  curl -fsS -u guest:guest "http://127.0.0.1:$MANAGEMENT_PORT/api/overview" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["rabbitmq_version"])'
}

case "${1:-}" in
  start) start ;;
  stop)
    mount_proc
    in_root /usr/lib/rabbitmq/bin/rabbitmqctl stop >/dev/null 2>&1 || true
    ;;
  ctl)
    shift
    mount_proc
    in_root /usr/lib/rabbitmq/bin/rabbitmqctl "$@"
    ;;
  status) answers ;;
  *)
    echo "usage: $0 start|stop|status|ctl ARGS" >&2
    exit 2
    ;;
esac
