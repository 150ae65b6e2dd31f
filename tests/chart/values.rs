//! The chart's values: its schema (draft 7, every value in it and commented, typos and
//! wrong types refused), the checks the schema cannot express, and `helm lint --strict`.

use std::process::{Command, Output};

use serde_json::Value;

use crate::EVERYTHING_ON;
use crate::render::{chart_dir, rejected, render_chart};

#[test]
fn the_values_schema_rejects_typos_and_wrong_types() {
    let cases: &[(&str, &str)] = &[
        (
            "replica: 3\n",
            "additional properties 'replica' not allowed",
        ),
        (
            "image:\n  tagg: v1\n",
            "additional properties 'tagg' not allowed",
        ),
        ("image:\n  pullPolicy: Sometimes\n", "/image/pullPolicy"),
        ("replicas: \"2\"\n", "/replicas"),
        ("replicas: -1\n", "/replicas"),
        ("logFormat: xml\n", "/logFormat"),
        ("watchNamespaces: shop\n", "/watchNamespaces"),
        ("watchNamespaces: [Shop_1]\n", "/watchNamespaces/0"),
        ("watchNamespaces: [shop, shop]\n", "/watchNamespaces"),
        ("resyncInterval: five minutes\n", "/resyncInterval"),
        ("clusterName: Eu.West\n", "/clusterName"),
        (
            "leaderElection:\n  enable: false\n",
            "additional properties 'enable' not allowed",
        ),
        (
            "metrics:\n  serviceMonitor:\n    enable: true\n",
            "additional properties 'enable' not allowed",
        ),
        (
            "serviceAccount:\n  create: yes please\n",
            "/serviceAccount/create",
        ),
        ("service:\n  port: 70000\n", "/service/port"),
        (
            "resources:\n  request:\n    cpu: 1\n",
            "additional properties 'request' not allowed",
        ),
        (
            "resources:\n  limits:\n    memory: lots\n",
            "/resources/limits/memory",
        ),
        ("podAnnotations:\n  a: 1\n", "/podAnnotations/a"),
        ("imagePullSecrets: [regcred]\n", "/imagePullSecrets/0"),
    ];
    for (values, expected) in cases {
        let message = rejected(values);
        assert!(
            message.contains("values don't meet the specifications of the schema"),
            "{values}: {message}"
        );
        assert!(
            message.contains(expected),
            "{values}: expected {expected:?} in {message}"
        );
    }
}

#[test]
fn values_the_schema_cannot_check_fail_the_render_with_a_reason() {
    let message = rejected("replicas: 3\nleaderElection:\n  enabled: false\n");
    assert!(
        message.contains("replicas > 1 needs leaderElection.enabled"),
        "{message}"
    );
    let message = rejected("serviceAccount:\n  create: false\n");
    assert!(
        message.contains("serviceAccount.name must name an existing ServiceAccount"),
        "{message}"
    );
    // Typos inside Kubernetes objects passed through are caught by Kubernetes' schemas.
    let message = rejected("securityContext:\n  runAsNonRot: true\n");
    assert!(
        message.contains("'runAsNonRot' was unexpected"),
        "{message}"
    );
    let message = rejected("tolerations:\n  - key: a\n    efect: NoSchedule\n");
    assert!(message.contains("'efect' was unexpected"), "{message}");
}

#[test]
fn helm_lint_strict_passes() {
    for values in ["", "watchNamespaces: [shop]\nreplicas: 1\n", EVERYTHING_ON] {
        let output = render_chart(&["lint", "--values", "-"], values);
        assert!(
            output.status.success(),
            "helm lint --strict with {values:?}:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let output = render_chart(&["lint", "--values", "-"], "replica: 3\n");
    assert!(
        !output.status.success(),
        "lint checks values against the schema too"
    );
}

fn check_jsonschema(args: &[&str]) -> Output {
    Command::new("python3")
        .args(["-m", "check_jsonschema"])
        .args(args)
        .output()
        .expect("python3 -m check_jsonschema runs (pip install check-jsonschema)")
}

#[test]
fn values_yaml_meets_its_schema_and_the_schema_is_draft_7() {
    let dir = chart_dir();
    let schema_path = dir.join("values.schema.json");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).expect("values.schema.json"))
            .expect("the schema is JSON");
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    assert_eq!(schema["additionalProperties"], false);

    let schema_arg = schema_path.to_str().expect("UTF-8 path");
    let output = check_jsonschema(&["--check-metaschema", schema_arg]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let values = dir.join("values.yaml");
    let output = check_jsonschema(&["--schemafile", schema_arg, values.to_str().expect("UTF-8")]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );

    // And check-jsonschema, a second validator, rejects a typo as Helm does.
    let typo = std::env::temp_dir().join(format!("mailer-chart-typo-{}.yaml", std::process::id()));
    std::fs::write(&typo, "image:\n  repositry: mailer\n").expect("write");
    let output = check_jsonschema(&["--schemafile", schema_arg, typo.to_str().expect("UTF-8")]);
    let _ = std::fs::remove_file(&typo);
    assert!(!output.status.success(), "a typo passes check-jsonschema");
}

#[test]
fn every_value_in_values_yaml_is_in_the_schema_and_commented() {
    let values: Value = serde_yaml::from_str(
        &std::fs::read_to_string(chart_dir().join("values.yaml")).expect("values"),
    )
    .expect("values.yaml parses");
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).expect("schema"),
    )
    .expect("schema parses");
    let properties = schema["properties"].as_object().expect("properties");
    for key in values.as_object().expect("a map").keys() {
        assert!(
            properties.contains_key(key),
            "{key} is not in values.schema.json"
        );
    }
    for key in properties.keys().filter(|k| *k != "global") {
        assert!(
            values.get(key).is_some(),
            "{key} has no default in values.yaml"
        );
    }
}
