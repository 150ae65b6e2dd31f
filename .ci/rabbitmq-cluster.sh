#!/usr/bin/env bash
# A three-node RabbitMQ 4.0 cluster for the fault suite (make faults), with HAProxy in
# front as a Kubernetes Service would be: never the shared brokers.
#
#   .ci/rabbitmq-cluster.sh start          three fresh nodes, clustered, and the front; wait
#   .ci/rabbitmq-cluster.sh stop           stop it all; remove its namespaces, links and data
#   .ci/rabbitmq-cluster.sh ports          print "AMQP_PORT MANAGEMENT_PORT STATS_PORT" of the front
#   .ci/rabbitmq-cluster.sh ctl N ARGS     rabbitmqctl ARGS against node N (1, 2 or 3)
#   .ci/rabbitmq-cluster.sh queues N ARGS  rabbitmq-queues ARGS against node N
#   .ci/rabbitmq-cluster.sh kill N         SIGKILL node N's Erlang VM (its data is kept)
#   .ci/rabbitmq-cluster.sh stop-node N    stop node N (rabbitmqctl stop); wait until its VM is gone
#   .ci/rabbitmq-cluster.sh start-node N   start node N again on its data, without waiting
#   .ci/rabbitmq-cluster.sh wait-node N    wait until node N runs again (at most 180s); print how
#                                          many times it was started again after a crash at boot
#   .ci/rabbitmq-cluster.sh cut N          cut node N off from the other two (clients still reach it)
#   .ci/rabbitmq-cluster.sh heal N         undo cut N
#   .ci/rabbitmq-cluster.sh address N      print node N's IP address
#
# Each node runs the trixie root of .ci/rabbitmq4.sh (/var/lib/mailer-ci/rabbitmq4/root)
# in a network namespace of its own, as a pod has: mailer-c1, -c2, -c3 at 10.231.0.1-3
# (MAILER_CLUSTER_NET overrides 10.231.0), each linked by a veth pair to a bridge
# (mailer-cbr, 10.231.0.254) on the host. So the three use RabbitMQ's own ports (AMQP
# 5672, management 15672, epmd 4369, distribution 25672) without meeting anything else on
# the machine, and each has its own epmd. Node N is rabbit@mailer-cN; the names resolve
# through an Erlang inetrc file of the cluster (ERL_INETRC), not /etc/hosts. Its data,
# logs, configuration and cookie are in /tmp/mailer-cluster/nN of the root.
#
# The nodes run with cluster_partition_handling = pause_minority; quorum queues get
# RabbitMQ's default initial group size (quorum_cluster_size, 3). guest/guest is allowed
# from the bridge (loopback_users = none), since clients come through the front.
#
# The front is Debian's haproxy (installed by .ci/run), run with a configuration of its
# own (haproxy.cfg, its log haproxy.log, in /tmp/mailer-cluster) on three free ports of
# 127.0.0.1: AMQP and the management API, each spread
# round-robin over the nodes that pass a TCP check every second (a Service's ready
# endpoints), and HAProxy's statistics (CSV at /;csv). `cut` drops every packet between
# the node and the other two where it arrives, with the iptables of the nodes' own
# namespaces: nothing on the host changes, and deleting the namespaces undoes it. Needs
# root.
set -euo pipefail

ROOT4=${RABBITMQ4_ROOT:-/var/lib/mailer-ci/rabbitmq4/root}
RABBITMQ4_UID=4372
NET=${MAILER_CLUSTER_NET:-10.231.0}
BRIDGE=mailer-cbr
NODES=(1 2 3)
# The cluster's directory, as the nodes see it (inside the root), and as this shell does.
DIR=/tmp/mailer-cluster
HOST_DIR=$ROOT4$DIR

log() { printf '[rabbitmq-cluster] %s\n' "$*" >&2; }

usage() {
  echo "usage: $0 start|stop|ports|ctl N ARGS|queues N ARGS|kill N|stop-node N|start-node N|wait-node N|cut N|heal N|address N" >&2
  exit 2
}

node_arg() { # checks a node number
  case "${1:-}" in
    1 | 2 | 3) ;;
    *) usage ;;
  esac
}

netns() { echo "mailer-c$1"; }
address() { echo "$NET.$1"; }
node_name() { echo "rabbit@mailer-c$1"; }
node_dir() { echo "$DIR/n$1"; }

run() { # N COMMAND...: a command of the root in node N's namespace, with its environment
  local n=$1 dir
  shift
  dir=$(node_dir "$n")
  mountpoint -q "$ROOT4/proc" || mount -t proc proc "$ROOT4/proc"
  ip netns exec "$(netns "$n")" chroot --userspec=$RABBITMQ4_UID:$RABBITMQ4_UID "$ROOT4" \
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME="$dir" \
    ERL_INETRC="$DIR/inetrc" \
    RABBITMQ_NODENAME="$(node_name "$n")" \
    RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
    RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
    RABBITMQ_MNESIA_BASE="$dir/mnesia" \
    RABBITMQ_LOG_BASE="$dir/log" \
    RABBITMQ_PID_FILE="$dir/node.pid" \
    ERL_CRASH_DUMP="$dir/erl_crash.dump" \
    "$@"
}

ctl() { # N ARGS: rabbitmqctl against node N
  local n=$1
  shift
  run "$n" /usr/lib/rabbitmq/bin/rabbitmqctl "$@"
}

# The management API of node N, straight (not through the front).
api() { # N PATH
  curl -fsS -m 5 -u guest:guest "http://$(address "$1"):15672/api/$2"
}

answers() { api "$1" overview >/dev/null 2>&1; }

pid_file() { echo "$ROOT4$(node_dir "$1")/node.pid"; }

vm_pid() { # the Erlang VM of node N, if it runs
  local file
  file=$(pid_file "$1")
  [[ -s $file ]] && kill -0 "$(cat "$file")" 2>/dev/null && cat "$file"
}


# ---- the network ---------------------------------------------------------------------

net_up() {
  ip link add "$BRIDGE" type bridge
  ip addr add "$NET.254/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local n ns
  for n in "${NODES[@]}"; do
    ns=$(netns "$n")
    ip netns add "$ns"
    ip link add "${ns}h" type veth peer name eth0 netns "$ns"
    ip link set "${ns}h" master "$BRIDGE" up
    ip -n "$ns" addr add "$(address "$n")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
}

net_down() {
  local n ns pids
  for n in "${NODES[@]}"; do
    ns=$(netns "$n")
    if ip netns list | grep -w "^$ns" >/dev/null; then
      # Whatever still runs there is this cluster's: a node, its epmd, a CLI.
      pids=$(ip netns pids "$ns" || true)
      if [[ -n $pids ]]; then
        # shellcheck disable=SC2086 # one pid a word
        kill -9 $pids 2>/dev/null || true
      fi
      ip netns del "$ns"
    fi
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
}

# ---- the nodes -----------------------------------------------------------------------

configure() {
  mkdir -p "$HOST_DIR"
  local n dir cookie
  {
    for n in "${NODES[@]}"; do
      echo "{host, {${NET//./,},$n}, [\"mailer-c$n\"]}."
    done
    echo '{lookup, [file, native]}.'
  } >"$HOST_DIR/inetrc"
  cookie=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
  for n in "${NODES[@]}"; do
    dir=$ROOT4$(node_dir "$n")
    mkdir -p "$dir/mnesia" "$dir/log"
    : >"$dir/rabbitmq-env.conf"
    cat >"$dir/rabbitmq.conf" <<CONF
listeners.tcp.default = 5672
management.tcp.port = 15672
loopback_users = none
cluster_partition_handling = pause_minority
CONF
    echo '[rabbitmq_management].' >"$dir/enabled_plugins"
    printf '%s' "$cookie" >"$dir/.erlang.cookie"
    chmod 400 "$dir/.erlang.cookie"
  done
  chown -R $RABBITMQ4_UID:$RABBITMQ4_UID "$HOST_DIR"
}

start_node() {
  if vm_pid "$1" >/dev/null; then
    log "node $1 runs already"
    return
  fi
  rm -f "$(pid_file "$1")"
  run "$1" /usr/lib/rabbitmq/bin/rabbitmq-server -detached
}

# Waits until node N's rabbit application runs (at most SECONDS, 180 by default). A
# node whose VM exits while it boots is started again, as a kubelet restarts a crashed
# container, at most 3 times: RabbitMQ 4.0.5 can crash at boot when a peer resumes
# from pause_minority meanwhile (mnesia, started before its directory is set, fails
# with "Cannot create Mnesia dir"). Prints how many times it started it again.
wait_node() {
  local n=$1 deadline=$((SECONDS + ${2:-180})) again=0 dir seen='' started=$SECONDS
  dir=$ROOT4$(node_dir "$n")
  until answers "$n"; do
    # The VM writes its pid file within a second or two of its start, and removes it
    # when it halts.
    if vm_pid "$n" >/dev/null; then
      seen=1
    elif [[ -n $seen ]] || ((SECONDS - started > 30)) && ((again < 3)); then
      again=$((again + 1))
      seen=''
      started=$SECONDS
      log "node $n is gone before it answered (the last reason in its log: $(tail -n 3000 "$dir"/log/*.log | grep -o 'Cannot create Mnesia dir\|exited with reason: .*' | tail -n 1 | cut -c1-160)); starting it again"
      start_node "$n"
    fi
    if ((SECONDS >= deadline)); then
      log "node $n does not answer after ${2:-180}s; its log:"
      tail -n 40 "$dir"/log/*.log >&2 || true
      return 1
    fi
    sleep 1
  done
  echo "$again"
}

stop_node() {
  ctl "$1" stop >/dev/null 2>&1 || true
  local pid deadline=$((SECONDS + 60))
  while pid=$(vm_pid "$1"); do
    if ((SECONDS >= deadline)); then
      kill -9 "$pid" 2>/dev/null || true
    fi
    sleep 0.2
  done
}

kill_node() {
  local pid
  pid=$(vm_pid "$1") || {
    log "node $1 does not run"
    return 1
  }
  kill -9 "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}

# Every packet between node N and the other two is dropped where it arrives, silently
# (each namespace's own iptables), as a network that fails drops them: no side is told.
cut_off() { partition "$1" -A; }
heal_cut() { partition "$1" -D 2>/dev/null || true; }
partition() { # N -A|-D
  local n=$1 op=$2 other status=0
  for other in "${NODES[@]}"; do
    [[ $other == "$n" ]] && continue
    ip netns exec "$(netns "$n")" iptables "$op" INPUT -s "$(address "$other")" -j DROP || status=1
    ip netns exec "$(netns "$other")" iptables "$op" INPUT -s "$(address "$n")" -j DROP || status=1
  done
  return $status
}

running_nodes() { # how many nodes the cluster has running, as node N sees it
  api "$1" nodes | python3 -c 'import json, sys; print(sum(1 for n in json.load(sys.stdin) if n["running"]))'
}

# ---- the front -----------------------------------------------------------------------

free_ports() { # three ports of 127.0.0.1 free now
  python3 - <<'PY'
import socket
held = []
for _ in range(3):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    held.append(s)
print(" ".join(str(s.getsockname()[1]) for s in held))
PY
}

front_up() {
  command -v haproxy >/dev/null || {
    log "no haproxy: .ci/run installs Debian's (apt-get install haproxy)"
    return 1
  }
  local amqp management stats n
  read -r amqp management stats <<<"$(free_ports)"
  {
    cat <<CFG
global
  maxconn 4096
  log stdout format raw local0

defaults
  mode tcp
  timeout connect 3s
  # AMQP connections live long; their heartbeats, not the front, tell them apart.
  timeout client 1h
  timeout server 1h
  timeout check 2s
  # A Service's ready endpoints: a node is taken out after 2 failed TCP checks 1s
  # apart, and back in after 2 good ones.
  default-server inter 1s fall 2 rise 2

# One line a connection: which node it went to, how long, how it ended.
frontend amqp
  bind 127.0.0.1:$amqp
  log global
  option tcplog
  default_backend amqp

backend amqp
  balance roundrobin
CFG
    for n in "${NODES[@]}"; do echo "  server mailer-c$n $(address "$n"):5672 check"; done
    cat <<CFG

frontend management
  bind 127.0.0.1:$management
  log global
  option tcplog
  default_backend management

backend management
  balance roundrobin
CFG
    for n in "${NODES[@]}"; do echo "  server mailer-c$n $(address "$n"):15672 check"; done
    cat <<CFG

listen stats
  mode http
  bind 127.0.0.1:$stats
  timeout client 10s
  stats enable
  stats uri /
CFG
  } >"$HOST_DIR/haproxy.cfg"
  haproxy -c -q -f "$HOST_DIR/haproxy.cfg"
  # In the foreground of a session of its own, its log (one line a connection, and the
  # nodes going DOWN and UP) in haproxy.log beside its configuration.
  setsid haproxy -db -f "$HOST_DIR/haproxy.cfg" >>"$HOST_DIR/haproxy.log" 2>&1 </dev/null &
  echo $! >"$HOST_DIR/haproxy.pid"
  echo "$amqp $management $stats" >"$HOST_DIR/ports"
  # Ready when every node is UP in both backends.
  local deadline=$((SECONDS + 30)) up
  until up=$(curl -fsS -m 2 "http://127.0.0.1:$stats/;csv" 2>/dev/null |
    awk -F, '$2 ~ /^mailer-c/ && $18 == "UP"' | wc -l) && ((up == 6)); do
    if ((SECONDS >= deadline)); then
      log "HAProxy does not see the nodes up after 30s"
      return 1
    fi
    sleep 0.5
  done
  log "front: AMQP 127.0.0.1:$amqp, management 127.0.0.1:$management, stats 127.0.0.1:$stats"
}

front_down() {
  local file=$HOST_DIR/haproxy.pid pid
  if [[ -s $file ]]; then
    pid=$(cat "$file")
    # Only the HAProxy this script started, by its pid.
    if [[ $(cat "/proc/$pid/comm" 2>/dev/null) == haproxy ]]; then
      kill "$pid" 2>/dev/null || true
      local deadline=$((SECONDS + 10))
      while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
}

# ---- the whole -----------------------------------------------------------------------

stop() {
  front_down
  local n
  if [[ -d $HOST_DIR ]]; then
    for n in "${NODES[@]}"; do stop_node "$n" & done
    wait
  fi
  net_down
  rm -rf "$HOST_DIR"
}

start() {
  if [[ ! -x $ROOT4/usr/lib/rabbitmq/bin/rabbitmq-server ]]; then
    log "no RabbitMQ 4.0 root at $ROOT4: run .ci/rabbitmq4.sh start first"
    exit 1
  fi
  stop
  # A failed start leaves nothing behind.
  trap stop EXIT
  net_up
  configure
  local n
  log "starting rabbit@mailer-c1..3 at $NET.1-3"
  for n in "${NODES[@]}"; do start_node "$n"; done
  for n in "${NODES[@]}"; do wait_node "$n" 120 >/dev/null; done
  for n in 2 3; do
    ctl "$n" stop_app >/dev/null
    ctl "$n" join_cluster "$(node_name 1)" >/dev/null
    ctl "$n" start_app >/dev/null
  done
  local deadline=$((SECONDS + 60))
  until [[ $(running_nodes 1 2>/dev/null) == 3 ]]; do
    if ((SECONDS >= deadline)); then
      log "the cluster does not have 3 running nodes after 60s"
      ctl 1 cluster_status >&2 || true
      return 1
    fi
    sleep 1
  done
  front_up
  trap - EXIT
  log "RabbitMQ $(api 1 overview | python3 -c 'import json, sys; print(json.load(sys.stdin)["rabbitmq_version"])'), 3 nodes running"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  ports) cat "$HOST_DIR/ports" ;;
  ctl)
    node_arg "${2:-}"
    n=$2
    shift 2
    ctl "$n" "$@"
    ;;
  queues)
    node_arg "${2:-}"
    n=$2
    shift 2
    run "$n" /usr/lib/rabbitmq/bin/rabbitmq-queues "$@"
    ;;
  kill)
    node_arg "${2:-}"
    kill_node "$2"
    ;;
  stop-node)
    node_arg "${2:-}"
    stop_node "$2"
    ;;
  start-node)
    node_arg "${2:-}"
    start_node "$2"
    ;;
  wait-node)
    node_arg "${2:-}"
    wait_node "$2"
    ;;
  cut)
    node_arg "${2:-}"
    cut_off "$2"
    ;;
  heal)
    node_arg "${2:-}"
    heal_cut "$2"
    ;;
  address)
    node_arg "${2:-}"
    address "$2"
    ;;
  *) usage ;;
esac
