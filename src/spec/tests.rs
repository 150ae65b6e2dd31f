//! Tests of the spec: defaults, parsing and validation.

use super::*;

fn spec(yaml: &str) -> MailerPipelineSpec {
    serde_yaml::from_str(yaml).expect("spec parses")
}

fn problems(yaml: &str) -> Vec<String> {
    match spec(yaml).validate() {
        Ok(()) => vec![],
        Err(InvalidSpec(errors)) => errors.into_iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn a_spec_that_names_only_its_vhost_gets_the_designs_defaults() {
    let s = spec("rabbitmq: {vhost: shop}");
    assert_eq!(s.rabbitmq.vhost, "shop");
    assert_eq!(s.topology, TopologySpec::default());
    assert_eq!(s.topology.exchange, "mail");
    assert_eq!(s.topology.queue, "mail.send");
    assert_eq!(s.topology.retry_exchange, "mail.retry");
    assert_eq!(s.topology.retry_queue, "mail.send.retry");
    assert_eq!(s.topology.dead_exchange, "mail.dead");
    assert_eq!(s.topology.dead_queue, "mail.send.dead");
    assert_eq!(
        s.topology.retry_delays().unwrap(),
        [Duration::from_secs(300)]
    );
    assert_eq!(s.topology.retry_tier_queues(), ["mail.send.retry"]);
    assert_eq!(s.topology.delivery_limit, 5);
    assert_eq!(s.topology.deletion_policy, DeletionPolicy::Retain);
    assert_eq!(s.worker.max_attempts, 5);
    assert!(s.validate().is_ok());
}

#[test]
fn an_empty_spec_is_valid() {
    assert_eq!(spec("{}").rabbitmq.vhost, "/");
    assert!(problems("{}").is_empty());
}

#[test]
fn retry_delays_in_the_usual_forms_parse() {
    for (text, secs) in [
        ("5m", 300),
        ("300s", 300),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("1s", 1),
    ] {
        assert_eq!(
            parse_retry_delay(text),
            Ok(Duration::from_secs(secs)),
            "{text}"
        );
    }
    assert_eq!(parse_retry_delay("1500ms"), Ok(Duration::from_millis(1500)));
}

#[test]
fn bad_retry_delays_are_named() {
    for text in ["-5m", "banana", "", "500ms", "0s", "50d"] {
        let found = problems(&format!("topology: {{retryDelay: {text:?}}}"));
        assert_eq!(found.len(), 1, "{text}: {found:?}");
        assert!(
            found[0].starts_with("spec.topology.retryDelay: "),
            "{found:?}"
        );
    }
}

#[test]
fn delay_tiers_parse_in_order_with_their_queues() {
    let s = spec("topology: {retryDelays: [30s, 5m, 30m, 2h]}");
    assert_eq!(
        s.topology.retry_delays().unwrap(),
        [30, 300, 1800, 7200].map(Duration::from_secs)
    );
    assert_eq!(
        s.topology.retry_tier_queues(),
        [
            "mail.send.retry",
            "mail.send.retry.2",
            "mail.send.retry.3",
            "mail.send.retry.4"
        ]
    );
    assert!(s.validate().is_ok());
    let one = spec("topology: {retryDelays: [1m]}");
    assert_eq!(one.topology.retry_tier_queues(), ["mail.send.retry"]);
}

#[test]
fn bad_delay_tiers_are_named() {
    for (yaml, field, says) in [
        (
            "{retryDelay: 5m, retryDelays: [1m, 2m]}",
            "spec.topology.retryDelays",
            "not both",
        ),
        (
            "{retryDelays: []}",
            "spec.topology.retryDelays",
            "has 0 delays",
        ),
        (
            "{retryDelays: [1s, 2s, 3s, 4s, 5s, 6s, 7s, 8s, 9s, 10s, 11s]}",
            "spec.topology.retryDelays",
            "has 11 delays",
        ),
        (
            "{retryDelays: [1m, 1m]}",
            "spec.topology.retryDelays[1]",
            "strictly increasing",
        ),
        (
            "{retryDelays: [5m, 30s]}",
            "spec.topology.retryDelays[1]",
            "strictly increasing",
        ),
        (
            "{retryDelays: [1m, banana]}",
            "spec.topology.retryDelays[1]",
            "not a duration",
        ),
        (
            "{retryDelays: [1m, 2m], deadQueue: mail.send.retry.2}",
            "spec.topology.retryDelays",
            "mail.send.retry.2",
        ),
        (
            "{retryDelays: [1m, 2m], retryQueue: \"a,b\"}",
            "spec.topology.retryQueue",
            "has a comma",
        ),
    ] {
        let found = problems(&format!("topology: {yaml}"));
        assert_eq!(found.len(), 1, "{yaml}: {found:?}");
        assert!(found[0].starts_with(&format!("{field}: ")), "{found:?}");
        assert!(found[0].contains(says), "{found:?}");
    }
}

#[test]
fn zero_limits_are_refused_by_field() {
    let found = problems(
        "topology: {deliveryLimit: 0, retryQueueMaxLength: 0}\nworker: {maxAttempts: 0, prefetch: 0}",
    );
    let fields: Vec<&str> = found.iter().map(|p| p.split(':').next().unwrap()).collect();
    assert_eq!(
        fields,
        [
            "spec.topology.deliveryLimit",
            "spec.topology.retryQueueMaxLength",
            "spec.worker.maxAttempts",
            "spec.worker.prefetch"
        ]
    );
}

#[test]
fn names_must_be_present_short_unreserved_and_distinct() {
    let long = "q".repeat(256);
    let found = problems(&format!(
        "topology: {{exchange: '', queue: {long}, retryExchange: amq.direct, deadQueue: mail.dead}}"
    ));
    assert_eq!(found.len(), 4, "{found:?}");
    assert!(found[0].starts_with("spec.topology.exchange: must not be empty"));
    assert!(found[1].contains("256 bytes"));
    assert!(found[2].contains("reserves"));
    assert!(found[3].starts_with("spec.topology.deadQueue: \"mail.dead\" is also"));
}

#[test]
fn the_vhost_of_the_operators_claim_locks_is_not_a_pipelines() {
    let found = problems("rabbitmq: {vhost: mailer.claim-locks}");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with(
            "spec.rabbitmq.vhost: \"mailer.claim-locks\" holds the operator's claim locks"
        ),
        "{found:?}"
    );
    assert!(problems("rabbitmq: {vhost: mailer.claim-locks.2}").is_empty());
}

#[test]
fn an_unknown_field_is_an_error_that_names_it() {
    let err = serde_yaml::from_str::<MailerPipelineSpec>("topology: {retryDelya: 5m}").unwrap_err();
    assert!(err.to_string().contains("retryDelya"), "{err}");
}

#[test]
fn the_operator_needs_a_connection_that_the_cli_does_not() {
    let s = spec("rabbitmq: {vhost: shop}");
    assert!(s.validate().is_ok());
    let err = s.validate_for_operator().unwrap_err().to_string();
    assert!(err.contains("spec.rabbitmq: set connectionSecret"), "{err}");
    assert!(
        spec("rabbitmq: {connectionSecret: {name: a}}")
            .validate_for_operator()
            .is_ok()
    );
}

#[test]
fn worker_pod_fields_parse_as_kubernetes_types() {
    let s = spec(
        "worker: {image: 'reg/mailer:1', imagePullPolicy: Always, nodeSelector: {disk: ssd}, \
         tolerations: [{key: k, operator: Exists}], resources: {limits: {memory: 128Mi}}, \
         userSecret: {name: creds}, terminationGracePeriodSeconds: 0}",
    );
    assert_eq!(s.worker.image_pull_policy, Some(ImagePullPolicy::Always));
    assert_eq!(
        s.worker.tolerations.as_ref().unwrap()[0].key.as_deref(),
        Some("k")
    );
    assert_eq!(
        problems("worker: {terminationGracePeriodSeconds: 0, image: ''}"),
        [
            "spec.worker.terminationGracePeriodSeconds: must be at least 1",
            "spec.worker.image: must not be empty (leave it out for the operator's own image)"
        ]
    );
}

#[test]
fn the_request_size_limit_is_bytes_or_a_quantity_from_1ki_to_512mi() {
    for (yaml, bytes) in [
        ("{}", mailer_default()),
        ("worker: {maxRequestSize: 32Mi}", 32 << 20),
        ("worker: {maxRequestSize: 33554432}", 33_554_432),
        ("worker: {maxRequestSize: '25M'}", 25_000_000),
    ] {
        assert_eq!(spec(yaml).worker.max_request_bytes(), Ok(bytes), "{yaml}");
        assert!(problems(yaml).is_empty(), "{yaml}");
    }
    assert_eq!(
        problems("worker: {maxRequestSize: 1Gi}"),
        [
            "spec.worker.maxRequestSize: \"1Gi\" is 1073741824 bytes (1 GiB); the limit must be from 1Ki to 512Mi"
        ]
    );
    assert_eq!(
        problems("worker: {maxRequestSize: 'ten megs'}"),
        [
            "spec.worker.maxRequestSize: \"ten megs\" is not a size: give bytes (33554432) or a quantity (32Mi, 25M)"
        ]
    );
}

fn mailer_default() -> usize {
    crate::mail::DEFAULT_MAX_REQUEST_BYTES
}

#[test]
fn both_connection_kinds_at_once_are_refused() {
    let found = problems("rabbitmq: {connectionSecret: {name: a}, clusterRef: {name: b}}");
    assert_eq!(
        found,
        ["spec.rabbitmq: set connectionSecret or clusterRef, not both"]
    );
}
