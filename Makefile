.PHONY: build test test-rabbitmq4 faults faults-cluster lint bench bench-cluster demo crd image manifests

# The crate's version: the image's tag and the chart's appVersion.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | sed -n 1p)
IMAGE ?= ghcr.io/mailer-operator/mailer:$(VERSION)

build:
	cargo build --release --locked --bin mailer

# The README's test command: unit tests, and integration tests against the real
# RabbitMQ 3.10 at 127.0.0.1 (5672, 15672 with guest/guest) and a real SMTP server
# (aiosmtpd); then the broker-facing tests again against RabbitMQ 4.0 (5673, 15673,
# started by .ci/rabbitmq4.sh).
test:
	cargo test --locked
	$(MAKE) test-rabbitmq4

# The integration tests whose subject is the broker's behaviour, on RabbitMQ 4.0.
test-rabbitmq4:
	MAILER_TEST_BROKER=4.0 cargo test --locked --test topology --test worker --test resilience --test dead --test controller

# The fault suite (docs/reliability.md): the worker, restarted as a kubelet would,
# against a private RabbitMQ node of each version (.ci/rabbitmq-node.sh: never the shared
# brokers) that it stops, alarms and strips of its queues, and an SMTP server that hangs,
# cuts sessions or is down for 3 minutes; then a private three-node RabbitMQ 4.0 cluster
# behind HAProxy (.ci/rabbitmq-cluster.sh, started once for all its faults) whose nodes it
# kills, stops one by one, cuts off and takes the quorum of, with a worker consuming from
# each node. One fault at a time, about 20 minutes. Prints the fault table (kept in
# target/faults.md). Needs root, the RabbitMQ 4.0 root of .ci/rabbitmq4.sh, and Debian's
# haproxy.
faults:
	cargo test --locked --no-run --test faults
	@printf '%s\n' '| broker | fault | published | delivered | twice | dead-lettered | waiting | lost | exit, recovery, probes (livez, readyz, metrics) |' \
	  '|---|---|---|---|---|---|---|---|---|' > target/faults.md
	@for v in 3.10 4.0; do \
	  .ci/rabbitmq-node.sh start $$v || exit 1; \
	  MAILER_FAULT_BROKER=$$v cargo test --locked --test faults -- --ignored --test-threads=1 --skip on_cluster::; s=$$?; \
	  .ci/rabbitmq-node.sh stop $$v; [ $$s -eq 0 ] || exit $$s; \
	done
	@$(MAKE) --no-print-directory faults-cluster
	@cat target/faults.md

# The cluster's faults alone (part of make faults; its lines are appended to
# target/faults.md), with the time the pass took.
faults-cluster:
	cargo test --locked --no-run --test faults
	@started=$$(date +%s); \
	.ci/rabbitmq-cluster.sh start || exit 1; \
	cargo test --locked --test faults -- --ignored --test-threads=1 on_cluster::; s=$$?; \
	.ci/rabbitmq-cluster.sh stop; \
	echo "the cluster pass took $$(( $$(date +%s) - started ))s"; [ $$s -eq 0 ] || exit $$s

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

# The benchmarks (docs/benchmarks.md): the worker's against bare lapin loops and a local
# SMTP sink (figures, ratios, memory); the topology's, N pipelines in one vhost, first and
# second apply against the broker's own bulk import; the controller's, 1,000 pipelines
# against the test API server and the broker, then its first pass of 200 pipelines in
# one vhost against the topology command's in 5 rounds (their median ratio: one pair
# moves by more than a tenth) and of 1,000 in one round (issue 25; at most 15 minutes
# each). On RabbitMQ 4.0 (.ci/rabbitmq4.sh start;
# BENCH_BROKER=3.10 for the host's broker, but the controller's 1,000 pipelines can wedge
# 3.10 when their vhosts are deleted). The SMTP sink is Postfix's smtp-sink when it is at
# SMTP_SINK (see docs/benchmarks.md: aiosmtpd cannot take 1,000 mails/s here), else aiosmtpd.
# The controller runs stripped, as the image ships it (the Dockerfile strips its symbols).
BENCH_BROKER ?= 4.0
SMTP_SINK ?= $(firstword $(wildcard /usr/sbin/smtp-sink /opt/postfix/usr/sbin/smtp-sink))
bench:
	MAILER_BENCH_BROKER=$(BENCH_BROKER) MAILER_BENCH_SMTP_SINK=$(SMTP_SINK) cargo bench --bench worker
	MAILER_BENCH_BROKER=$(BENCH_BROKER) cargo bench --bench topology
	cargo build --release --locked --bin mailer
	strip --strip-all -o target/release/mailer-stripped target/release/mailer
	MAILER_BENCH_BROKER=$(BENCH_BROKER) MAILER_BENCH_CONTROLLER_BIN=target/release/mailer-stripped \
	  cargo bench --bench controller
	for n in 200:5 1000:3; do \
	  MAILER_BENCH_BROKER=$(BENCH_BROKER) MAILER_BENCH_CONTROLLER_BIN=target/release/mailer-stripped \
	    MAILER_BENCH_VHOSTS=1 MAILER_BENCH_PIPELINES=$${n%:*} MAILER_BENCH_ROUNDS=$${n#*:} MAILER_BENCH_COMMAND=1 \
	    MAILER_BENCH_FIRST_PASS_ONLY=1 MAILER_BENCH_FIRST_PASS_LIMIT=900 \
	    cargo bench --bench controller || exit 1; \
	done

# The worker's ack and park paths on the three-node RabbitMQ 4.0 cluster, through its
# HAProxy front, each request replicated to three nodes (.ci/rabbitmq-cluster.sh, started
# and stopped here; not part of make bench).
bench-cluster:
	cargo bench --no-run --bench worker
	.ci/rabbitmq-cluster.sh start
	MAILER_BENCH_BROKER=cluster MAILER_BENCH_SCENARIOS=ack,park cargo bench --bench worker; \
	  s=$$?; .ci/rabbitmq-cluster.sh stop; exit $$s

# The release image, through the Dockerfile's runtime stage, from the binary `cargo build
# --release` made, on a base assembled from this machine's Debian packages; left in
# buildah's vfs storage (buildah --storage-driver vfs images) and its size printed. Needs
# buildah, as root. Users without buildah: docker build -t $(IMAGE) .
image:
	cargo build --release --locked --bin mailer
	deploy/image/build.sh target/release/mailer $(IMAGE)

# What is generated from another file and checked in (tests fail when they differ):
# deploy/operator.yaml from the chart, and the Argo CD health check's argocd-cm snippet.
manifests:
	python3 tests/render_chart.py deploy > deploy/operator.yaml
	@{ printf '%s\n' \
	    '# Generated from deploy/argocd/health.lua by `make manifests`: do not edit.' \
	    '# The MailerPipeline health check for Argo CD, merged into its argocd-cm:' \
	    '#   kubectl -n argocd patch configmap argocd-cm --type merge --patch-file examples/argocd/argocd-cm.yaml' \
	    '# With Argo CD'"'"'s Helm chart, put the key under configs.cm instead.' \
	    'apiVersion: v1' 'kind: ConfigMap' 'metadata:' '  name: argocd-cm' '  namespace: argocd' \
	    'data:' '  resource.customizations.health.mailer.dev_MailerPipeline: |'; \
	  sed '/^$$/!s/^/    /' deploy/argocd/health.lua; } > examples/argocd/argocd-cm.yaml
