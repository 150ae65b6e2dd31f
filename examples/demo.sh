#!/usr/bin/env bash
# The whole pipeline without Kubernetes, on this machine: `mailer run` applies the
# topology of examples/demo-pipeline.yaml to RabbitMQ and runs a worker that writes each
# mail as an .eml file. Then three mails: one delivered, one parked while the outbox is
# away and delivered by its retry, one malformed and dead-lettered with why, which
# `mailer dead` lists, shows, would replay and would purge.
#
# Needs RabbitMQ with the management plugin: RABBITMQ_MANAGEMENT_URL and MAIL_AMQP_URL
# default to guest/guest on localhost. A local broker that is stopped is started, and
# its management plugin enabled (as root); without one, the demo says how to install it.
# MAILER names a mailer binary to use instead of building target/release/mailer.
# Each step waits for what a user sees (the outbox, the worker's metrics, `mailer dead`),
# never for a log line: RUST_LOG can hide any of those.
#
# DEMO_VHOST runs it in another vhost than the pipeline file's (mailer-demo), e.g. beside
# another demo on the same broker; DEMO_WORK_DIR names the work directory to create
# (it must not exist yet) instead of a new one under /tmp; DEMO_HTTP_ADDR is where the
# worker serves /metrics and /readyz.
set -euo pipefail
cd "$(dirname "$0")/.."

management=${RABBITMQ_MANAGEMENT_URL:-http://guest:guest@localhost:15672}
amqp=${MAIL_AMQP_URL:-amqp://guest:guest@localhost:5672}
# The vhost is the pipeline file's unless DEMO_VHOST names another; then the demo runs a
# copy of the file that names it, in its work directory.
pipeline=examples/demo-pipeline.yaml
vhost=$(sed -n 's/^    vhost: *//p' "$pipeline")
[[ -n $vhost ]] || { echo "$pipeline: no line '    vhost: <name>' (spec.rabbitmq.vhost)" >&2; exit 1; }
if [[ -n ${DEMO_VHOST:-} && $DEMO_VHOST != "$vhost" ]]; then
  vhost=$DEMO_VHOST
  # It goes into a URL and a sed replacement as it is.
  [[ $vhost =~ ^[A-Za-z0-9._-]+$ ]] || {
    echo "DEMO_VHOST=$vhost: use letters, digits, '.', '_' and '-'" >&2
    exit 1
  }
  pipeline=
fi
if [[ -n ${DEMO_WORK_DIR:-} ]]; then
  work=$DEMO_WORK_DIR
  # A directory of its own: it is removed when the demo fails.
  mkdir -- "$work" || { echo "DEMO_WORK_DIR=$work: names a directory to create" >&2; exit 1; }
else
  work=$(mktemp -d /tmp/mailer-demo.XXXXXX)
fi
outbox=$work/outbox
mailer=${MAILER:-target/release/mailer}
http=${DEMO_HTTP_ADDR:-127.0.0.1:18089}
# How long to wait for a broker the demo started, or a plugin it enabled.
broker_wait=${DEMO_BROKER_WAIT:-60}
# The work directory stays after a run that worked (its outbox holds the mails).
trap 'status=$?; ((status == 0)) || rm -rf "$work"' EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
wait_for() { # seconds, then a command that must succeed
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { echo "timed out waiting for: $*" >&2; return 1; }
    sleep 0.2
  done
}
eml_for() { grep -l "Message-ID: <$1@" "$outbox"/*.eml; }
# Prints the worker's series that contain $1, e.g. 'mailer_worker_deliveries_total{'.
metric() { curl -fsS "http://$http/metrics" | grep -F "$1"; }
# Whether the worker's series named exactly $1 has reached $2.
metric_reaches() {
  local value
  value=$(curl -fsS "http://$http/metrics" | awk -v series="$1" '$1 == series { print $2 }') || return 1
  [[ -n $value ]] && ((${value%.*} >= $2))
}
parked='mailer_worker_deliveries_total{outcome="parked"}'
sent='mailer_worker_deliveries_total{outcome="sent"}'
dead_malformed='mailer_worker_dead_letters_total{reason="malformed"}'

# host and port of a URL such as amqp://user:pass@host:5672/vhost
host_of() { local rest=${1#*://}; rest=${rest%%/*}; rest=${rest##*@}; echo "${rest%:*}"; }
port_of() { local rest=${1#*://}; rest=${rest%%/*}; rest=${rest##*@}; [[ $rest == *:* ]] && echo "${rest##*:}" || echo "$2"; }
is_local() { [[ $1 == localhost || $1 == 127.0.0.1 || $1 == ::1 || $1 == "[::1]" ]]; }
answers() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
management_answers() { curl -fsS -o /dev/null --max-time 5 "${management%/}/api/overview"; }

# Prints how to get a broker with the management plugin on this machine, and stops.
no_broker() {
  echo "RabbitMQ is not installed here. Install it with its management plugin, then run make demo again:" >&2
  if command -v apt-get >/dev/null; then
    echo "  sudo apt-get install -y rabbitmq-server && sudo rabbitmq-plugins enable rabbitmq_management" >&2
  elif command -v brew >/dev/null; then
    echo "  brew install rabbitmq && brew services start rabbitmq" >&2
  elif command -v dnf >/dev/null; then
    echo "  sudo dnf install -y rabbitmq-server && sudo systemctl start rabbitmq-server && sudo rabbitmq-plugins enable rabbitmq_management" >&2
  fi
  echo "  or in a container: docker run -d --name rabbitmq -p 5672:5672 -p 15672:15672 rabbitmq:3-management" >&2
  echo "(another broker: set RABBITMQ_MANAGEMENT_URL and MAIL_AMQP_URL)" >&2
  exit 1
}

# As root, runs "$@"; otherwise prints it with sudo for the user to run, and stops.
as_root() {
  if ((EUID == 0)); then
    echo "+ $*"
    "$@"
  else
    echo "run this, then make demo again: sudo $*" >&2
    exit 1
  fi
}

# Makes sure RabbitMQ answers over AMQP and its management API: starts a local broker
# that is installed but stopped, enables the management plugin when it is off.
ensure_broker() {
  management_answers && return 0
  local amqp_host amqp_port management_host
  amqp_host=$(host_of "$amqp")
  amqp_port=$(port_of "$amqp" 5672)
  management_host=$(host_of "$management")
  if ! is_local "$amqp_host" || ! is_local "$management_host"; then
    echo "RabbitMQ's management API does not answer at $(host_of "$management"):$(port_of "$management" 15672)." >&2
    echo "Start the broker there and enable its management plugin (rabbitmq-plugins enable rabbitmq_management)." >&2
    exit 1
  fi
  if ! answers 127.0.0.1 "$amqp_port"; then
    command -v rabbitmq-server >/dev/null || no_broker
    echo "RabbitMQ is installed but not running: starting it"
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
      as_root systemctl start rabbitmq-server
    else
      as_root rabbitmq-server -detached
    fi
    wait_for "$broker_wait" answers 127.0.0.1 "$amqp_port" || {
      echo "RabbitMQ did not start within ${broker_wait}s; its log is under /var/log/rabbitmq/" >&2
      exit 1
    }
    management_answers && return 0
  fi
  echo "RabbitMQ runs without its management plugin (nothing answers at port $(port_of "$management" 15672)): enabling it"
  as_root rabbitmq-plugins enable rabbitmq_management
  wait_for "$broker_wait" management_answers || {
    echo "RabbitMQ's management API still does not answer at port $(port_of "$management" 15672) after ${broker_wait}s" >&2
    exit 1
  }
}

step "RabbitMQ"
ensure_broker
echo "the management API answers at $(host_of "$management"):$(port_of "$management" 15672)"

step "build"
if [[ -n ${MAILER:-} ]]; then
  echo "using $mailer"
else
  cargo build --release --locked --quiet --bin mailer
fi

if [[ -z $pipeline ]]; then
  pipeline=$work/demo-pipeline.yaml
  sed "s/^\(    vhost:\) .*/\1 $vhost/" examples/demo-pipeline.yaml >"$pipeline"
  grep -qx "    vhost: $vhost" "$pipeline" || { echo "$pipeline: the vhost is not $vhost" >&2; exit 1; }
fi

step "mailer run: apply the topology of $pipeline and start a worker (log: $work/worker.log)"
mkdir -p "$outbox"
"$mailer" run -f "$pipeline" --management-url "$management" --amqp-url "$amqp" \
  --provider-url "file://$outbox" --http-addr "$http" >"$work/run.out" 2>"$work/worker.log" &
run_pid=$!
log_shown=
cleanup() {
  local status=$?
  kill -TERM "$run_pid" 2>/dev/null && wait "$run_pid" 2>/dev/null
  "$mailer" topology delete -f "$pipeline" --management-url "$management" --force >/dev/null || true
  curl -fsS -X DELETE "${management%/}/api/vhosts/$vhost" >/dev/null 2>&1 || true
  if ((status != 0)); then
    # The work directory goes: show the worker's log first.
    if [[ -z $log_shown && -s $work/worker.log ]]; then
      echo "the end of the worker's log:" >&2
      tail -20 "$work/worker.log" >&2
    fi
    rm -rf "$work"
  fi
}
trap cleanup EXIT
# Ready, or the worker's own error when it stops first.
deadline=$((SECONDS + 30))
until curl -fsS "http://$http/readyz" >/dev/null 2>&1; do
  if ! kill -0 "$run_pid" 2>/dev/null; then
    echo "mailer run stopped before its worker was ready; its error:" >&2
    cat "$work/run.out" "$work/worker.log" >&2
    log_shown=1
    exit 1
  fi
  if ((SECONDS >= deadline)); then
    echo "the worker was not ready within 30s; its log ($work/worker.log):" >&2
    tail -20 "$work/worker.log" >&2
    log_shown=1
    exit 1
  fi
  sleep 0.2
done
cat "$work/run.out"

send() { "$mailer" send --amqp-url "${amqp%/}/$vhost" "$@"; }

step "1. a mail that is delivered"
send --message-id welcome-alice --from 'Shop <noreply@shop.example>' --to alice@example.com \
  --subject 'Welcome, Alice' --text 'Thanks for signing up.'
wait_for 10 eml_for welcome-alice
echo "delivered: $(eml_for welcome-alice)"

step "2. a mail that fails for now: the outbox is away, so it is parked in mail.send.retry"
mv "$outbox" "$outbox.away"
send --message-id receipt-bob --from 'Shop <noreply@shop.example>' --to bob@example.com \
  --subject 'Your receipt' --text 'Order 42: paid.'
wait_for 10 metric_reaches "$parked" 1
echo "parked, as the worker's metrics count it:"
metric "$parked"
mv "$outbox.away" "$outbox"
echo "the outbox is back; the retry delay is 3s"
wait_for 20 eml_for receipt-bob
wait_for 10 metric_reaches "$sent" 2
echo "delivered by its retry: $(eml_for receipt-bob)"
metric 'mailer_worker_deliveries_total{'

step "3. a malformed request (a line break in its subject): dead-lettered to mail.send.dead"
printf '%s' '{"from":"shop@shop.example","to":["carol@example.com"],"subject":"Hi\r\nBcc: all@example.com","text":"x"}' >"$work/bad.json"
send --message-id sneaky-carol --json "$work/bad.json"
wait_for 10 metric_reaches "$dead_malformed" 1
metric 'mailer_worker_dead_letters_total{'
dead() { "$mailer" dead "$@" -f "$pipeline" --amqp-url "$amqp" --management-url "$management"; }
dead list
dead show sneaky-carol

step "4. what to do with it: mailer dead replay (a dry run here), purge (without --yes: nothing removed)"
dead replay --reason malformed --dry-run
dead purge --message-id sneaky-carol

step "done: the mails are in $outbox; stopping the worker and removing the demo vhost $vhost"
