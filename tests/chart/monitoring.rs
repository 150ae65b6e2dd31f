//! The chart's monitoring: the ServiceMonitor and PodMonitor, the PrometheusRule
//! (`promtool check rules` and the unit tests in tests/chart/alerts.test.yaml), the
//! Grafana dashboard, and the NetworkPolicies for the metrics ports.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use mailer::controller::objects::deployment::{WorkerInputs, desired_deployment};
use mailer::spec::MailerPipeline;
use serde_json::{Value, json};

use crate::EVERYTHING_ON;
use crate::render::{NAMESPACE, all_of, chart_dir, named, one, rejected, template};
use mailer_testkit::metrics::{families, series_names};
use mailer_testkit::repo_root;

fn promtool(args: &[&str], dir: &Path) -> String {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool runs (Debian's prometheus package ships it; .ci/run installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?}:\n{text}");
    text
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mailer-chart-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// The rule groups of the PrometheusRule `values` make, as a Prometheus rule file.
fn rule_file(values: &str) -> Value {
    let objects = template(values);
    json!({"groups": one(&objects, "PrometheusRule")["spec"]["groups"]})
}

fn alerts(rules: &Value) -> Vec<&Value> {
    rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|group| group["rules"].as_array().expect("rules"))
        .collect()
}

/// A pipeline's worker Deployment as the operator makes it.
fn worker_deployment(pipeline: &str) -> Value {
    let mut pipeline = MailerPipeline::new(pipeline, serde_yaml::from_str("{}").unwrap());
    pipeline.metadata.namespace = Some("shop".into());
    pipeline.metadata.uid = Some("uid-1".into());
    let inputs = WorkerInputs {
        default_image: "reg/mailer:1",
        secrets_hash: "0",
    };
    serde_json::to_value(desired_deployment(&pipeline, inputs).expect("deployment")).unwrap()
}

/// The metric names a PromQL expression reads: its identifiers outside strings,
/// selectors, ranges and label lists, that are neither functions nor operators.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Strings, `{…}` and `[…]` blanked out.
    let mut plain = String::new();
    let mut closing = None;
    for c in expr.chars() {
        match (closing, c) {
            (None, '"') => closing = Some('"'),
            (None, '{') => closing = Some('}'),
            (None, '[') => closing = Some(']'),
            (None, c) => plain.push(c),
            (Some(end), c) if c == end => {
                closing = None;
                plain.push(' ');
            }
            _ => {}
        }
    }
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = BTreeSet::new();
    let mut rest = plain.as_str();
    let mut skip_list = false;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        let tail = &rest[start..];
        let end = tail.find(|c: char| !is_word(c)).unwrap_or(tail.len());
        let word = &tail[..end];
        let after = tail[end..].trim_start();
        let unit = rest[..start].ends_with(|c: char| c.is_ascii_digit() || c == '.');
        rest = &tail[end..];
        if unit {
            // The unit of a duration (30m) or a number's exponent.
            continue;
        }
        if skip_list {
            // The label names of `by (…)`, `on (…)`, …
            if let Some(close) = rest.find(')') {
                rest = &rest[close + 1..];
            }
            skip_list = false;
            continue;
        }
        match word {
            "by" | "on" | "without" | "ignoring" | "group_left" | "group_right" => {
                skip_list = after.starts_with('(');
            }
            "and" | "or" | "unless" | "offset" | "bool" => {}
            // Aggregations, whose `by (…)` may come before their argument.
            "sum" | "min" | "max" | "avg" | "count" | "group" | "stddev" | "stdvar" | "topk"
            | "bottomk" | "quantile" | "count_values" => {}
            _ if after.starts_with('(') => {}
            _ => {
                names.insert(word.to_string());
            }
        }
    }
    names
}

/// The series the alerts and the dashboard may read: the binary's, the controller's
/// pipeline gauge, kube-state-metrics' and Prometheus' own `up`.
fn known_series() -> BTreeSet<String> {
    let mut known: BTreeSet<String> = families()
        .iter()
        .flat_map(|family| series_names(family))
        .collect();
    known.extend(
        [
            // kube-state-metrics
            "kube_deployment_spec_replicas",
            "kube_deployment_status_replicas_ready",
            "kube_pod_container_status_restarts_total",
            // kube-state-metrics' custom resource state, from
            // examples/monitoring/kube-state-metrics.yaml
            "kube_mailerpipeline_retry_queue_max_length",
            "up",
        ]
        .map(String::from),
    );
    known
}

#[test]
fn the_service_monitor_is_made_only_when_asked_for() {
    assert!(all_of(&template(""), "ServiceMonitor").is_empty());
    let objects = template(
        "metrics:\n  serviceMonitor:\n    enabled: true\n    interval: 15s\n    labels: {release: prometheus}\n",
    );
    let monitor = one(&objects, "ServiceMonitor");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["metadata"]["namespace"], NAMESPACE);
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    // honorLabels: the controller's namespace label is the pipeline's, not the pod's.
    assert_eq!(
        monitor["spec"]["endpoints"],
        json!([{"port": "http", "path": "/metrics", "interval": "15s", "honorLabels": true}])
    );
    let service = one(&objects, "Service");
    let labels = &service["metadata"]["labels"];
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"],
        json!({
            "app.kubernetes.io/name": labels["app.kubernetes.io/name"],
            "app.kubernetes.io/instance": labels["app.kubernetes.io/instance"],
        })
    );
    assert_eq!(
        monitor["spec"]["namespaceSelector"],
        json!({"matchNames": [NAMESPACE]})
    );
}

#[test]
fn the_pod_monitor_scrapes_the_worker_pods_the_operator_makes() {
    assert!(all_of(&template(""), "PodMonitor").is_empty());
    let objects = template("metrics:\n  podMonitor: {enabled: true, labels: {release: prom}}\n");
    let monitor = one(&objects, "PodMonitor");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    assert_eq!(monitor["spec"]["namespaceSelector"], json!({"any": true}));

    // Held to what src/controller/objects/deployment.rs makes: the selector picks the worker
    // pods, the port is the worker container's, and the relabelling finds the
    // pipeline's name in a pod label.
    let deployment = worker_deployment("orders");
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels");
    assert!(!selector.is_empty());
    for (key, value) in selector {
        assert_eq!(&pod_labels[key], value, "worker pods carry {key}={value}");
    }
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(endpoint["interval"], "30s");
    assert_eq!(
        container["ports"][0]["name"], endpoint["port"],
        "the worker's port"
    );
    let relabeling = &endpoint["relabelings"][0];
    assert_eq!(relabeling["targetLabel"], "pipeline");
    let source = relabeling["sourceLabels"][0]
        .as_str()
        .expect("source label");
    let label = pod_labels
        .as_object()
        .expect("labels")
        .keys()
        .find(|key| {
            let sanitized: String = key
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            source == format!("__meta_kubernetes_pod_label_{sanitized}")
        })
        .unwrap_or_else(|| panic!("{source} is no label of the worker pods: {pod_labels}"));
    assert_eq!(pod_labels[label], "orders", "{label} names the pipeline");

    let objects = template(EVERYTHING_ON);
    assert_eq!(
        one(&objects, "PodMonitor")["spec"]["namespaceSelector"],
        json!({"matchNames": ["shop", "billing"]}),
        "only the watched namespaces"
    );
}

#[test]
fn the_alerts_pass_promtool_and_their_unit_tests() {
    assert!(all_of(&template(""), "PrometheusRule").is_empty());
    let dir = tempdir("alerts");
    let rules = rule_file("metrics:\n  prometheusRule: {enabled: true}\n");
    std::fs::write(
        dir.join("rules.yaml"),
        serde_yaml::to_string(&rules).unwrap(),
    )
    .unwrap();
    std::fs::copy(
        repo_root().join("tests/chart/alerts.test.yaml"),
        dir.join("alerts.test.yaml"),
    )
    .expect("the unit tests");
    let checked = promtool(&["check", "rules", "rules.yaml"], &dir);
    assert!(checked.contains("SUCCESS: 7 rules found"), "{checked}");
    promtool(&["test", "rules", "alerts.test.yaml"], &dir);

    // Every alert has a unit test, a severity and a runbook section that exists.
    let tests = std::fs::read_to_string(dir.join("alerts.test.yaml")).unwrap();
    let runbook = std::fs::read_to_string(repo_root().join("docs/operations.md")).expect("runbook");
    let known = known_series();
    for alert in alerts(&rules) {
        let name = alert["alert"].as_str().expect("an alerting rule");
        assert!(
            tests.contains(&format!("alertname: {name}\n")),
            "{name} has no unit test"
        );
        assert!(!alert["labels"]["severity"].is_null(), "{name}");
        let url = alert["annotations"]["runbook_url"]
            .as_str()
            .expect("runbook_url");
        let anchor = name.to_lowercase();
        assert!(
            url.ends_with(&format!("/docs/operations.md#{anchor}")),
            "{url}"
        );
        assert!(
            runbook.contains(&format!("### {name}\n")),
            "docs/operations.md has no section ### {name}"
        );
        let expr = alert["expr"].as_str().expect("expr");
        for metric in metric_names(expr) {
            assert!(
                known.contains(&metric),
                "{name} reads {metric}, which nothing exports"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();

    // Tuned: alert labels, a kube-state-metrics selector, an alert left out.
    let dir = tempdir("alerts-tuned");
    let rules = rule_file(
        "metrics:\n  prometheusRule:\n    enabled: true\n    alertLabels: {team: mail}\n\
         \x20   kubeStateMetricsSelector: 'job=\"kube-state-metrics\"'\n\
         \x20   alerts:\n      MailerDeadLettersGrowing: {enabled: false, for: 0s, severity: info, window: 1h}\n",
    );
    let names: Vec<_> = alerts(&rules).iter().map(|a| a["alert"].clone()).collect();
    assert_eq!(names.len(), 6, "{names:?}");
    assert!(!names.contains(&json!("MailerDeadLettersGrowing")));
    for alert in alerts(&rules) {
        assert_eq!(alert["labels"]["team"], "mail");
    }
    let crash = alerts(&rules)
        .into_iter()
        .find(|a| a["alert"] == "MailerWorkerCrashLooping")
        .expect("crash-loop alert");
    assert!(
        crash["expr"]
            .as_str()
            .unwrap()
            .contains(r#"kube_pod_container_status_restarts_total{job="kube-state-metrics", container="worker"}"#),
        "{}",
        crash["expr"]
    );
    std::fs::write(
        dir.join("rules.yaml"),
        serde_yaml::to_string(&rules).unwrap(),
    )
    .unwrap();
    promtool(&["check", "rules", "rules.yaml"], &dir);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn durations_prometheus_refuses_are_refused_by_the_schema() {
    for bad in ["30s1m", "1.5m", "5 m", "1m1m", "-5m", "5min"] {
        let message = rejected(&format!(
            "metrics:\n  serviceMonitor: {{enabled: true, interval: '{bad}'}}\n"
        ));
        assert!(
            message.contains("/metrics/serviceMonitor/interval"),
            "{bad}: {message}"
        );
        let message = rejected(&format!(
            "metrics:\n  prometheusRule:\n    alerts:\n      MailerPipelineNotReady: {{enabled: true, severity: warning, for: '{bad}'}}\n"
        ));
        assert!(
            message.contains("/metrics/prometheusRule/alerts/MailerPipelineNotReady/for"),
            "{bad}: {message}"
        );
    }
    let message = rejected(
        "metrics:\n  prometheusRule:\n    alerts:\n      MailerPipelineNotReady: {enabled: true, severity: warning, for: ''}\n",
    );
    assert!(
        message.contains("/for"),
        "an alert's for may not be empty: {message}"
    );
    let message = rejected(
        "metrics:\n  prometheusRule:\n    alerts:\n      MailerPipelineNotRedy: {enabled: true, severity: warning, for: 5m}\n",
    );
    assert!(
        message.contains("'MailerPipelineNotRedy' not allowed"),
        "{message}"
    );
    // What Prometheus reads passes.
    let objects = template(
        "metrics:\n  serviceMonitor: {enabled: true, interval: 1m30s, scrapeTimeout: 10s}\n  \
         podMonitor: {enabled: true, interval: 1h, scrapeTimeout: ''}\n",
    );
    assert_eq!(
        one(&objects, "ServiceMonitor")["spec"]["endpoints"][0]["interval"],
        "1m30s"
    );
}

#[test]
fn the_dashboard_shows_every_pipeline_metric_with_queries_prometheus_parses() {
    assert!(all_of(&template(""), "ConfigMap").is_empty());
    let file =
        std::fs::read_to_string(chart_dir().join("dashboards/mailer.json")).expect("dashboard");
    let objects = template(
        "metrics:\n  dashboard: {enabled: true, namespace: monitoring, annotations: {grafana_folder: Mail}}\n",
    );
    let config_map = one(&objects, "ConfigMap");
    assert_eq!(config_map["metadata"]["namespace"], "monitoring");
    assert_eq!(config_map["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        config_map["metadata"]["annotations"]["grafana_folder"],
        "Mail"
    );
    assert_eq!(
        config_map["data"]["mailer.json"].as_str(),
        Some(file.trim_end())
    );

    let dashboard: Value = serde_json::from_str(&file).expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "mailer-pipelines");
    let variables: Vec<_> = dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
        .iter()
        .map(|v| v["name"].as_str().expect("name"))
        .collect();
    assert_eq!(variables, ["datasource", "namespace", "pipeline"]);

    // Every query, with Grafana's variables replaced, as a recording rule promtool
    // parses; every metric it reads is exported by something.
    let known = known_series();
    let mut read = BTreeSet::new();
    let mut records = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            let expr = expr
                .replace("$__rate_interval", "5m")
                .replace("$namespace", ".*")
                .replace("$pipeline", ".*");
            for metric in metric_names(&expr) {
                assert!(
                    known.contains(&metric),
                    "panel {}: {metric} is exported by nothing",
                    panel["title"]
                );
                read.insert(metric);
            }
            records.push(json!({"record": format!("dashboard:panel{}:{}", panel["id"], target["refId"].as_str().unwrap()), "expr": expr}));
        }
    }
    let dir = tempdir("dashboard");
    std::fs::write(
        dir.join("queries.yaml"),
        serde_yaml::to_string(&json!({"groups": [{"name": "dashboard", "rules": records}]}))
            .unwrap(),
    )
    .unwrap();
    promtool(&["check", "rules", "queries.yaml"], &dir);
    std::fs::remove_dir_all(&dir).ok();

    // What the issue asks to see per pipeline.
    for metric in [
        "mailer_worker_deliveries_total",
        "mailer_worker_dead_letters_total",
        "mailer_controller_queue_messages",
        "mailer_worker_send_duration_seconds_bucket",
        "mailer_worker_provider_errors_total",
        "mailer_controller_pipeline_ready",
        "kube_deployment_status_replicas_ready",
    ] {
        assert!(
            read.contains(metric),
            "the dashboard does not show {metric}"
        );
    }
}

#[test]
fn network_policies_admit_only_the_metrics_port() {
    let objects = template("");
    assert!(all_of(&objects, "NetworkPolicy").is_empty());

    let objects = template(EVERYTHING_ON);
    let deployment = one(&objects, "Deployment");
    let controller = named(
        &objects,
        "NetworkPolicy",
        NAMESPACE,
        "mailer-mailer-operator",
    );
    assert_eq!(
        controller["spec"]["podSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let monitoring = json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]);
    let only_metrics =
        json!([{"ports": [{"port": "http", "protocol": "TCP"}], "from": monitoring}]);
    assert_eq!(controller["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(controller["spec"]["ingress"], only_metrics);
    let worker_labels = &worker_deployment("orders")["spec"]["template"]["metadata"]["labels"];
    for namespace in ["shop", "billing"] {
        let workers = named(
            &objects,
            "NetworkPolicy",
            namespace,
            "mailer-mailer-operator-workers",
        );
        for (key, value) in workers["spec"]["podSelector"]["matchLabels"]
            .as_object()
            .expect("matchLabels")
        {
            assert_eq!(&worker_labels[key], value, "worker pods carry {key}");
        }
        assert_eq!(workers["spec"]["ingress"], only_metrics);
    }
    assert_eq!(all_of(&objects, "NetworkPolicy").len(), 3);

    // Any source on the port when no peer is named.
    let objects = template("networkPolicy: {enabled: true}\n");
    assert_eq!(
        one(&objects, "NetworkPolicy")["spec"]["ingress"],
        json!([{"ports": [{"port": "http", "protocol": "TCP"}]}])
    );
}
