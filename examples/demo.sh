#!/usr/bin/env bash
# The whole pipeline without Kubernetes, on this machine: `mailer run` applies the
# topology of examples/demo-pipeline.yaml to RabbitMQ and runs a worker that writes each
# mail as an .eml file. Then three mails: one delivered, one parked while the outbox is
# away and delivered by its retry, one malformed and dead-lettered with why, which
# `mailer dead` lists, shows, would replay and would purge.
#
# Needs RabbitMQ with the management plugin: RABBITMQ_MANAGEMENT_URL and MAIL_AMQP_URL
# default to guest/guest on localhost.
set -euo pipefail
cd "$(dirname "$0")/.."

management=${RABBITMQ_MANAGEMENT_URL:-http://guest:guest@localhost:15672}
amqp=${MAIL_AMQP_URL:-amqp://guest:guest@localhost:5672}
vhost=mailer-demo
work=$(mktemp -d /tmp/mailer-demo.XXXXXX)
outbox=$work/outbox
mailer=target/release/mailer
http=127.0.0.1:18089

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

step "build"
cargo build --release --locked --quiet

step "mailer run: apply the topology and start a worker (log: $work/worker.log)"
mkdir -p "$outbox"
"$mailer" run -f examples/demo-pipeline.yaml --management-url "$management" --amqp-url "$amqp" \
  --provider-url "file://$outbox" --http-addr "$http" >"$work/run.out" 2>"$work/worker.log" &
run_pid=$!
cleanup() {
  kill -TERM "$run_pid" 2>/dev/null && wait "$run_pid" 2>/dev/null
  "$mailer" topology delete -f examples/demo-pipeline.yaml --management-url "$management" --force >/dev/null || true
  curl -fsS -X DELETE "${management%/}/api/vhosts/$vhost" >/dev/null 2>&1 || true
}
trap cleanup EXIT
wait_for 30 curl -fsS "http://$http/readyz"
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
dead() { "$mailer" dead "$@" -f examples/demo-pipeline.yaml --amqp-url "$amqp"; }
dead list
dead show sneaky-carol
metric 'mailer_worker_dead_letters_total{'

step "4. what to do with it: mailer dead replay (a dry run here), purge (without --yes: nothing removed)"
dead replay --reason malformed --dry-run
dead purge --message-id sneaky-carol

step "done: the mails are in $outbox; stopping the worker and removing the demo vhost"
