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
set -euo pipefail
cd "$(dirname "$0")/.."

management=${RABBITMQ_MANAGEMENT_URL:-http://guest:guest@localhost:15672}
amqp=${MAIL_AMQP_URL:-amqp://guest:guest@localhost:5672}
vhost=mailer-demo
work=$(mktemp -d /tmp/mailer-demo.XXXXXX)
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
metric() { curl -fsS "http://$http/metrics" | grep -F "$1"; }

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
  cargo build --release --locked --quiet
fi

step "mailer run: apply the topology and start a worker (log: $work/worker.log)"
mkdir -p "$outbox"
"$mailer" run -f examples/demo-pipeline.yaml --management-url "$management" --amqp-url "$amqp" \
  --provider-url "file://$outbox" --http-addr "$http" >"$work/run.out" 2>"$work/worker.log" &
run_pid=$!
cleanup() {
  local status=$?
  kill -TERM "$run_pid" 2>/dev/null && wait "$run_pid" 2>/dev/null
  ((status == 0)) || rm -rf "$work"
  "$mailer" topology delete -f examples/demo-pipeline.yaml --management-url "$management" --force >/dev/null || true
  curl -fsS -X DELETE "${management%/}/api/vhosts/$vhost" >/dev/null 2>&1 || true
}
trap cleanup EXIT
# Ready, or the worker's own error when it stops first.
deadline=$((SECONDS + 30))
until curl -fsS "http://$http/readyz" >/dev/null 2>&1; do
  if ! kill -0 "$run_pid" 2>/dev/null; then
    echo "mailer run stopped before its worker was ready; its error:" >&2
    cat "$work/run.out" "$work/worker.log" >&2
    exit 1
  fi
  if ((SECONDS >= deadline)); then
    echo "the worker was not ready within 30s; its log ($work/worker.log):" >&2
    tail -20 "$work/worker.log" >&2
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
wait_for 10 grep -q 'parked' "$work/worker.log"
grep 'parked' "$work/worker.log" | tail -1
metric 'outcome="parked"'
mv "$outbox.away" "$outbox"
echo "the outbox is back; the retry delay is 3s"
wait_for 20 eml_for receipt-bob
echo "delivered on its second attempt: $(eml_for receipt-bob)"

step "3. a malformed request (a line break in its subject): dead-lettered to mail.send.dead"
printf '%s' '{"from":"shop@shop.example","to":["carol@example.com"],"subject":"Hi\r\nBcc: all@example.com","text":"x"}' >"$work/bad.json"
send --message-id sneaky-carol --json "$work/bad.json"
wait_for 10 grep -q 'dead-lettered' "$work/worker.log"
dead() { "$mailer" dead "$@" -f examples/demo-pipeline.yaml --amqp-url "$amqp" --management-url "$management"; }
dead list
dead show sneaky-carol
metric 'mailer_worker_dead_letters_total{'

step "4. what to do with it: mailer dead replay (a dry run here), purge (without --yes: nothing removed)"
dead replay --reason malformed --dry-run
dead purge --message-id sneaky-carol

step "done: the mails are in $outbox; stopping the worker and removing the demo vhost"
