//! Rendering the chart with Helm's engine (tests/render_chart.py), and reading what it
//! made.

use std::collections::BTreeSet;
use std::path::PathBuf;

use mailer_testkit::repo_root;
use serde::Deserialize;
use serde_json::Value;

pub const RELEASE: &str = "mailer";

pub const NAMESPACE: &str = "mailer-system";

/// Every rendered object is validated against the schemas of these Kubernetes
/// versions: the oldest the chart supports (Chart.yaml's kubeVersion; the CRD's CEL
/// rules need 1.28) and the newest kubernetes-validate knows.
pub const KUBE_VERSIONS: &[&str] = &["1.28.0", "newest"];
/// The Prometheus Operator's kinds, for which kubernetes-validate has no schema.
const PROMETHEUS_OPERATOR_KINDS: &[&str] = &["ServiceMonitor", "PodMonitor", "PrometheusRule"];

/// `<release>-<chart>`, as the chart names its objects.
pub const FULLNAME: &str = "mailer-mailer-operator";

pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/mailer-operator")
}

pub use mailer_testkit::chart::render_chart;

/// `helm template` with `values`, every object validated against Kubernetes' schemas.
/// Err holds Helm's message.
pub fn try_template(values: &str) -> Result<String, String> {
    let mut args = vec![
        "template",
        "--release",
        RELEASE,
        "--namespace",
        NAMESPACE,
        "--values",
        "-",
    ];
    for version in KUBE_VERSIONS {
        args.extend(["--kube-version", version]);
    }
    for kind in PROMETHEUS_OPERATOR_KINDS {
        args.extend(["--allow-unvalidated", kind]);
    }
    let output = render_chart(&args, values);
    if output.status.success() {
        Ok(String::from_utf8(output.stdout).expect("UTF-8 manifests"))
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

pub fn template(values: &str) -> Vec<Value> {
    let manifest = try_template(values).unwrap_or_else(|e| panic!("helm template: {e}"));
    parse_documents(&manifest)
}

pub fn parse_documents(manifest: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(manifest)
        .map(|document| Value::deserialize(document).expect("rendered YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

pub fn rejected(values: &str) -> String {
    match try_template(values) {
        Ok(_) => panic!("these values should be rejected:\n{values}"),
        Err(message) => message,
    }
}

pub fn kinds(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .map(|o| o["kind"].as_str().expect("kind").to_string())
        .collect()
}

pub fn all_of<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

pub fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    match all_of(objects, kind).as_slice() {
        [object] => object,
        found => panic!("expected one {kind}, found {}", found.len()),
    }
}

pub fn named<'a>(objects: &'a [Value], kind: &str, namespace: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| {
            o["kind"] == kind
                && o["metadata"]["name"] == name
                && o["metadata"]["namespace"] == namespace
        })
        .unwrap_or_else(|| panic!("no {kind} {namespace}/{name}"))
}

pub fn container(objects: &[Value]) -> &Value {
    let deployment = one(objects, "Deployment");
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

/// The container's env as name → value (or the valueFrom object).
pub fn env(objects: &[Value]) -> Vec<(String, Value)> {
    container(objects)["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            let name = e["name"].as_str().expect("env name").to_string();
            let value = e
                .get("value")
                .cloned()
                .unwrap_or_else(|| e["valueFrom"].clone());
            (name, value)
        })
        .collect()
}

pub fn env_value(objects: &[Value], name: &str) -> Option<Value> {
    env(objects)
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
}

pub fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|a| a.iter().map(|s| s.as_str().expect("a string")).collect())
        .unwrap_or_default()
}
