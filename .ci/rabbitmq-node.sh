#!/usr/bin/env bash
# A throwaway RabbitMQ node for the fault suite (make faults), which stops, restarts and
# alarms it: never the shared brokers on 5672 (3.10) and 5673 (4.0).
#
#   .ci/rabbitmq-node.sh start VERSION     start a fresh node (its data from an earlier run is wiped), wait
#   .ci/rabbitmq-node.sh stop VERSION      stop it and remove its data
#   .ci/rabbitmq-node.sh ctl VERSION ARGS  rabbitmqctl ARGS against it (stop_app, start_app, ...)
#   .ci/rabbitmq-node.sh ports VERSION     print "AMQP_PORT MANAGEMENT_PORT"
#
# VERSION 3.10 runs the host's rabbitmq-server as node mailer-fault-310@localhost
# (AMQP 5682, management 15682, distribution 25682, CLI 35700-35709, the host's epmd);
# 4.0 runs the trixie root that .ci/rabbitmq4.sh made (/var/lib/mailer-ci/rabbitmq4/root)
# as node mailer-fault-40@localhost (AMQP 5683, management 15683, distribution 25683,
# CLI 35710-35719, the epmd of that root on 4370). Each keeps its data, logs, config and
# enabled plugins under a directory of its own (/tmp/mailer-fault-VERSION), and reads
# neither the host's nor rabbit4's configuration. guest/guest from localhost. Needs root.
set -euo pipefail

ROOT4=${RABBITMQ4_ROOT:-/var/lib/mailer-ci/rabbitmq4/root}
RABBITMQ4_UID=4372

log() { printf '[rabbitmq-node] %s\n' "$*" >&2; }

version=${2:-}
case "$version" in
  3.10) amqp=5682 management=15682 dist=25682 ctl_min=35700 name=mailer-fault-310 ;;
  4.0) amqp=5683 management=15683 dist=25683 ctl_min=35710 name=mailer-fault-40 ;;
  *)
    echo "usage: $0 start|stop|ctl|ports 3.10|4.0 [ARGS]" >&2
    exit 2
    ;;
esac
# Where the node's files are, as the node sees the path (inside the root for 4.0).
dir=/tmp/mailer-fault-$version

node_env=(
  LANG=C.UTF-8
  HOME="$dir"
  RABBITMQ_NODENAME="$name@localhost"
  RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  RABBITMQ_NODE_PORT="$amqp"
  RABBITMQ_DIST_PORT="$dist"
  RABBITMQ_CTL_DIST_PORT_MIN="$ctl_min"
  RABBITMQ_CTL_DIST_PORT_MAX=$((ctl_min + 9))
  RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf"
  RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf"
  RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config"
  RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins"
  RABBITMQ_MNESIA_BASE="$dir/mnesia"
  RABBITMQ_LOG_BASE="$dir/log"
  RABBITMQ_PID_FILE="$dir/node.pid"
  ERL_CRASH_DUMP="$dir/erl_crash.dump"
)

run() { # a rabbitmq command of this node's version, with its environment
  if [[ $version == 3.10 ]]; then
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin ERL_EPMD_ADDRESS=127.0.0.1 "${node_env[@]}" "$@"
  else
    mountpoint -q "$ROOT4/proc" || mount -t proc proc "$ROOT4/proc"
    chroot --userspec=$RABBITMQ4_UID:$RABBITMQ4_UID "$ROOT4" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
      ERL_EPMD_PORT=4370 "${node_env[@]}" "$@"
  fi
}

host_dir() { # the node's directory as this shell sees it
  if [[ $version == 3.10 ]]; then echo "$dir"; else echo "$ROOT4$dir"; fi
}

answers() {
  curl -fsS -m 5 -u guest:guest "http://127.0.0.1:$management/api/overview" >/dev/null 2>&1
}

stop() {
  run /usr/lib/rabbitmq/bin/rabbitmqctl stop >/dev/null 2>&1 || true
  local pid_file deadline=$((SECONDS + 30))
  pid_file="$(host_dir)/node.pid"
  if [[ -s $pid_file ]]; then
    local pid
    pid=$(cat "$pid_file")
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -rf "$(host_dir)"
}

start() {
  if [[ $version == 4.0 && ! -x $ROOT4/usr/lib/rabbitmq/bin/rabbitmq-server ]]; then
    log "no RabbitMQ 4.0 root at $ROOT4: run .ci/rabbitmq4.sh start first"
    exit 1
  fi
  stop
  local host
  host=$(host_dir)
  mkdir -p "$host/mnesia" "$host/log"
  : >"$host/rabbitmq-env.conf"
  cat >"$host/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$amqp
management.tcp.port = $management
management.tcp.ip = 127.0.0.1
CONF
  # A quorum queue's at-least-once dead-letter process publishes a dead letter again
  # only after this long without a confirm (3 min by default): the fault tally waits
  # 30 s for a request the broker dead-lettered itself, so a first hop left unconfirmed
  # (a busy node) made it count a request lost that the broker still held.
  echo '[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 5000}]}].' >"$host/advanced.config"
  echo '[rabbitmq_management].' >"$host/enabled_plugins"
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$host/.erlang.cookie"
  chmod 400 "$host/.erlang.cookie"
  if [[ $version == 4.0 ]]; then chown -R $RABBITMQ4_UID:$RABBITMQ4_UID "$host"; fi
  log "starting RabbitMQ $version as $name@localhost on AMQP $amqp, management $management"
  run /usr/lib/rabbitmq/bin/rabbitmq-server -detached
  local deadline=$((SECONDS + 120))
  until answers; do
    if ((SECONDS >= deadline)); then
      log "it does not answer after 120s; its log:"
      tail -n 40 "$host"/log/*.log >&2 || true
      exit 1
    fi
    sleep 1
  done
  log "RabbitMQ $version ($name@localhost) answers"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  ctl)
    shift 2
    run /usr/lib/rabbitmq/bin/rabbitmqctl "$@"
    ;;
  ports) echo "$amqp $management" ;;
  *)
    echo "usage: $0 start|stop|ctl|ports 3.10|4.0 [ARGS]" >&2
    exit 2
    ;;
esac
