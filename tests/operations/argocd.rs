//! The Argo CD health check, deploy/argocd/health.lua, run by Lua 5.1 (the dialect Argo
//! CD embeds) on a MailerPipeline for every condition reason: the classification it
//! makes is the one docs/operations.md documents, and every reason the operator can set
//! (controller::reasons) is classified there.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use mailer::controller::reasons::condition_reasons;
use mailer::topology::TopologyError;
use serde_json::{Value, json};

use crate::runbook::{reason_rows, runbook};
use mailer_testkit::repo_root;

/// Reasons the next version of the operator sets (tenancy and autoscaling); the check
/// classifies them already, so adding them to controller::reasons is all it takes.
const COMING_REASONS: &[&str] = &["NotAllowed", "AutoscalingUnavailable"];

/// A JSON value as a Lua table constructor.
fn lua(value: &Value) -> String {
    match value {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => {
            let mut quoted = String::from("\"");
            for byte in s.bytes() {
                match byte {
                    b'"' => quoted.push_str("\\\""),
                    b'\\' => quoted.push_str("\\\\"),
                    b' '..=b'~' => quoted.push(byte as char),
                    other => quoted.push_str(&format!("\\{other:03}")),
                }
            }
            quoted.push('"');
            quoted
        }
        Value::Array(items) => format!(
            "{{{}}}",
            items.iter().map(lua).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(fields) => format!(
            "{{{}}}",
            fields
                .iter()
                .map(|(k, v)| format!("[{}] = {}", lua(&Value::String(k.clone())), lua(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Runs the health check on each object as Argo CD does (the object as the global
/// `obj`, the chunk returning a table); (status, message) of each.
fn health(objects: &[Value]) -> Vec<(String, String)> {
    let check = repo_root().join("deploy/argocd/health.lua");
    let mut script = format!(
        "local check = assert(loadfile({}))\nlocal objects = {}\n",
        lua(&json!(check.to_str().expect("UTF-8 path"))),
        lua(&Value::Array(objects.to_vec()))
    );
    script.push_str(
        "for _, o in ipairs(objects) do\n\
         \x20 obj = o\n\
         \x20 local hs = check()\n\
         \x20 io.write(hs.status, \"\\t\", (string.gsub(hs.message or \"\", \"\\n\", \" \")), \"\\n\")\n\
         end\n",
    );
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let file = std::env::temp_dir().join(format!("mailer-health-{}-{run}.lua", std::process::id()));
    std::fs::write(&file, script).expect("write the harness");
    let output = Command::new("lua5.1")
        .arg(&file)
        .output()
        .expect("lua5.1 runs (apt-get install lua5.1; .ci/run installs it)");
    std::fs::remove_file(&file).ok();
    assert!(
        output.status.success(),
        "lua5.1: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Vec<_> = String::from_utf8(output.stdout)
        .expect("UTF-8")
        .lines()
        .map(|line| {
            let (status, message) = line.split_once('\t').expect("status and message");
            (status.to_string(), message.to_string())
        })
        .collect();
    assert_eq!(results.len(), objects.len(), "one result per object");
    results
}

/// A pipeline of generation 3 whose status is of `observed`, with a Ready condition.
fn pipeline(observed: i64, ready: &str, reason: &str, message: &str) -> Value {
    json!({
        "apiVersion": "mailer.dev/v1alpha1",
        "kind": "MailerPipeline",
        "metadata": {"name": "orders", "namespace": "shop", "generation": 3},
        "status": {
            "observedGeneration": observed,
            "conditions": [{
                "type": "Ready",
                "status": ready,
                "reason": reason,
                "message": message,
                "observedGeneration": observed,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }],
        },
    })
}

fn refused(status: u16) -> String {
    let error = TopologyError::Refused {
        action: "declare queue mail.send".into(),
        status,
        reason: "PRECONDITION_FAILED".into(),
    };
    format!("topology: {error}")
}

#[test]
fn every_reason_is_classified_as_the_runbook_says() {
    let rows = reason_rows(&runbook());
    let documented: BTreeMap<_, _> = rows.iter().cloned().collect();
    let mut reasons = condition_reasons();
    reasons.extend(COMING_REASONS.iter().map(|r| r.to_string()));
    for reason in &reasons {
        assert!(
            documented.contains_key(reason),
            "docs/operations.md does not classify the reason {reason} for Argo CD"
        );
    }

    let mut objects = Vec::new();
    let mut expected = Vec::new();
    for (reason, argo) in &rows {
        let message = format!("topology: what {reason} says to do");
        match argo.as_str() {
            "Healthy" => {
                objects.push(pipeline(3, "True", reason, "the pipeline sends mail"));
                expected.push((reason.clone(), "Healthy"));
            }
            "Progressing" | "Degraded" => {
                objects.push(pipeline(3, "False", reason, &message));
                expected.push((
                    reason.clone(),
                    if argo == "Progressing" {
                        "Progressing"
                    } else {
                        "Degraded"
                    },
                ));
            }
            mixed
                if reason == "Refused"
                    && mixed.contains("Progressing")
                    && mixed.contains("Degraded") =>
            {
                // The HTTP status in the operator's own message decides.
                for (status, health) in [
                    (503, "Progressing"),
                    (500, "Progressing"),
                    (0, "Progressing"),
                    (400, "Degraded"),
                    (404, "Degraded"),
                ] {
                    objects.push(pipeline(3, "False", reason, &refused(status)));
                    expected.push((format!("{reason} {status}"), health));
                }
            }
            other => panic!("docs/operations.md: {reason} has no Argo CD health but {other:?}"),
        }
    }
    let results = health(&objects);
    for ((case, want), (got, message)) in expected.iter().zip(&results) {
        assert_eq!(got, want, "{case}: {message}");
        assert!(
            !message.contains("does not know"),
            "{case} falls through to the unknown reasons: {message}"
        );
        if *want != "Healthy" {
            let reason = case.split(' ').next().unwrap_or_default();
            assert!(
                message.starts_with(&format!("{reason}: topology: ")),
                "the condition's reason and message are shown: {message}"
            );
        }
    }
}

#[test]
fn generations_and_missing_status_are_progressing_and_unknown_reasons_degraded() {
    let no_status = json!({"metadata": {"name": "orders", "generation": 1}});
    let no_conditions = json!({"metadata": {"generation": 1}, "status": {"observedGeneration": 1}});
    let mut older = pipeline(2, "True", "Ready", "the pipeline sends mail");
    let mut only_status_generation = pipeline(3, "True", "Ready", "the pipeline sends mail");
    only_status_generation["status"]["conditions"][0]
        .as_object_mut()
        .unwrap()
        .remove("observedGeneration");
    older["status"]["observedGeneration"] = json!(3);
    let results = health(&[
        no_status,
        no_conditions,
        older,
        pipeline(
            3,
            "False",
            "MissingSecretKey",
            "topology: Secret shop/smtp has no key \"url\"; add the provider URL under that key",
        ),
        pipeline(3, "False", "SomethingNew", "from a newer operator"),
        only_status_generation,
        pipeline(3, "True", "Ready", "the pipeline sends mail"),
    ]);
    assert_eq!(results[0].0, "Progressing", "{:?}", results[0]);
    assert_eq!(results[1].0, "Progressing", "{:?}", results[1]);
    // The condition's own generation counts, not the status'.
    assert_eq!(results[2].0, "Progressing", "{:?}", results[2]);
    assert!(results[2].1.contains("generation 3"), "{:?}", results[2]);
    assert_eq!(
        results[3],
        (
            "Degraded".to_string(),
            "MissingSecretKey: topology: Secret shop/smtp has no key \"url\"; add the provider URL under that key".to_string()
        )
    );
    assert_eq!(results[4].0, "Degraded");
    assert!(results[4].1.contains("does not know"), "{:?}", results[4]);
    assert_eq!(
        results[5].0, "Healthy",
        "status.observedGeneration when the condition has none"
    );
    assert_eq!(
        results[6],
        ("Healthy".to_string(), "the pipeline sends mail".to_string())
    );
}

#[test]
fn the_argocd_examples_install_this_check_and_point_at_what_exists() {
    let check =
        std::fs::read_to_string(repo_root().join("deploy/argocd/health.lua")).expect("health.lua");
    let config_map: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("examples/argocd/argocd-cm.yaml"))
            .expect("argocd-cm"),
    )
    .expect("argocd-cm.yaml parses");
    assert_eq!(config_map["metadata"]["name"], "argocd-cm");
    assert!(
        config_map["data"]["resource.customizations.health.mailer.dev_MailerPipeline"]
            == json!(check),
        "examples/argocd/argocd-cm.yaml is not deploy/argocd/health.lua: run `make manifests`"
    );

    let application = |file: &str| -> Value {
        serde_yaml::from_str(
            &std::fs::read_to_string(repo_root().join("examples/argocd").join(file)).expect(file),
        )
        .expect("an Application")
    };
    let operator = application("mailer-operator.yaml");
    assert_eq!(operator["kind"], "Application");
    let source = &operator["spec"]["source"];
    assert_eq!(source["path"], "charts/mailer-operator");
    assert!(
        repo_root()
            .join("charts/mailer-operator/Chart.yaml")
            .exists()
    );
    let sync_options = operator["spec"]["syncPolicy"]["syncOptions"].to_string();
    assert!(
        sync_options.contains("ServerSideApply=true"),
        "{sync_options}"
    );
    // Its values are the chart's.
    let values = serde_yaml::to_string(&source["helm"]["valuesObject"]).unwrap();
    let output = mailer_testkit::chart::render_chart(&["template", "--values", "-"], &values);
    assert!(
        output.status.success(),
        "the Application's values: {}",
        String::from_utf8_lossy(&output.stderr)
    );

    let pipelines = application("mailer-pipelines.yaml");
    let source = &pipelines["spec"]["source"];
    let dir = repo_root().join(source["path"].as_str().expect("path"));
    let include = source["directory"]["include"].as_str().expect("include");
    for file in include.trim_matches(['{', '}']).split(',') {
        assert!(
            dir.join(file).exists(),
            "{} does not exist",
            dir.join(file).display()
        );
    }
}
