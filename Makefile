.PHONY: build test test-rabbitmq4 lint bench demo crd

build:
	cargo build --release

# The README's test command: unit tests, and integration tests against the real
# RabbitMQ 3.10 at 127.0.0.1 (5672, 15672 with guest/guest) and a real SMTP server
# (aiosmtpd); then the broker-facing tests again against RabbitMQ 4.0 (5673, 15673,
# started by .ci/rabbitmq4.sh).
test:
	cargo test --locked
	$(MAKE) test-rabbitmq4

# The integration tests whose subject is the broker's behaviour, on RabbitMQ 4.0.
test-rabbitmq4:
	MAILER_TEST_BROKER=4.0 cargo test --locked --test topology --test worker --test dead

lint:
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings

# The README's first command: the whole pipeline without Kubernetes, on this machine.
demo:
	examples/demo.sh

# Regenerate the CRD from the Rust types, for the repo and the chart (tests fail when
# either copy differs from `mailer crd`).
crd:
	cargo run --quiet -- crd > crds/mailerpipeline.yaml
	cp crds/mailerpipeline.yaml charts/mailer-operator/crds/mailerpipeline.yaml

# The worker's benchmark (issue 3) against the real RabbitMQ at 127.0.0.1 and a local
# aiosmtpd sink; prints rates, ratios and memory. See docs/benchmarks.md.
bench:
	cargo bench --bench worker
