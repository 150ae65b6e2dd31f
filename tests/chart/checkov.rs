//! checkov's Kubernetes checks on the rendered chart: the ones that concern a
//! Deployment's pods and its RBAC must pass; four are skipped, each for a reason.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

use crate::EVERYTHING_ON;
use crate::render::try_template;

/// Checks that must run and pass on every render: the pod's security context, its
/// resources and probes, its image reference, its service account, and the RBAC.
const REQUIRED: &[&str] = &[
    "CKV_K8S_8",   // liveness probe
    "CKV_K8S_9",   // readiness probe
    "CKV_K8S_10",  // CPU requests
    "CKV_K8S_12",  // memory requests
    "CKV_K8S_13",  // memory limits
    "CKV_K8S_14",  // a fixed image tag
    "CKV_K8S_16",  // not privileged
    "CKV_K8S_17",  // no host PID
    "CKV_K8S_18",  // no host IPC
    "CKV_K8S_19",  // no host network
    "CKV_K8S_20",  // no privilege escalation
    "CKV_K8S_21",  // not the default namespace
    "CKV_K8S_22",  // read-only root file system
    "CKV_K8S_23",  // not root
    "CKV_K8S_25",  // no added capability
    "CKV_K8S_26",  // no hostPort
    "CKV_K8S_28",  // no NET_RAW
    "CKV_K8S_29",  // a pod security context
    "CKV_K8S_30",  // a container security context
    "CKV_K8S_31",  // seccomp RuntimeDefault
    "CKV_K8S_37",  // capabilities dropped
    "CKV_K8S_40",  // a high UID
    "CKV_K8S_41",  // not the default service account
    "CKV_K8S_42",  // no binding to the default service account
    "CKV_K8S_43",  // the image by digest (rendered with image.digest)
    "CKV_K8S_49",  // no wildcards in roles
    "CKV_K8S_157", // no bind
    "CKV_K8S_158", // no escalate
    "CKV2_K8S_1",  // no escalation through RoleBindings
    "CKV2_K8S_2",  // no pods/exec, nodes/proxy
    "CKV2_K8S_3",  // no impersonate
    "CKV2_K8S_4",  // no services/status
    "CKV2_K8S_5",  // not every Secret
];

/// Checks skipped on purpose.
const SKIPPED: &[(&str, &str)] = &[
    (
        "CKV_K8S_11",
        "CPU limits: a limit throttles the reconcile loop and its probes under load; the \
         chart requests CPU and limits memory",
    ),
    (
        "CKV_K8S_15",
        "pull policy Always: the image is an immutable version tag or a digest, and Always \
         makes every restart depend on the registry (image.pullPolicy sets it)",
    ),
    (
        "CKV_K8S_38",
        "service account token: the controller talks to the API server; the workers, \
         which do not, run with automountServiceAccountToken: false",
    ),
];

/// checkov's results for the chart rendered with `values`: (passed, failed) check IDs.
fn checkov(values: &str) -> (BTreeSet<String>, Vec<String>) {
    let manifest = try_template(values).unwrap_or_else(|e| panic!("helm template: {e}"));
    let dir = std::env::temp_dir().join(format!("mailer-checkov-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join(format!("{:x}.yaml", values.len()));
    std::fs::write(&file, manifest).expect("write");
    let skipped: Vec<_> = SKIPPED.iter().map(|(id, _)| *id).collect();
    let output = Command::new("checkov")
        .args([
            "--framework",
            "kubernetes",
            "--skip-download",
            "--output",
            "json",
        ])
        .args(["--skip-check", &skipped.join(",")])
        .arg("--file")
        .arg(&file)
        .output()
        .expect("checkov runs (.ci/run installs it in /opt/checkov)");
    std::fs::remove_dir_all(&dir).ok();
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "checkov printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let ids = |key: &str| -> Vec<String> {
        report["results"][key]
            .as_array()
            .expect("results")
            .iter()
            .map(|check| {
                format!(
                    "{} ({}) on {}",
                    check["check_id"].as_str().expect("check_id"),
                    check["check_name"].as_str().unwrap_or_default(),
                    check["resource"].as_str().unwrap_or_default()
                )
            })
            .collect()
    };
    let passed = ids("passed_checks")
        .iter()
        .map(|line| line.split(' ').next().unwrap_or_default().to_string())
        .collect();
    (passed, ids("failed_checks"))
}

#[test]
fn the_chart_passes_checkovs_checks_for_its_pods_and_rbac() {
    let digest = format!("image:\n  digest: sha256:{}\n", "ab".repeat(32));
    // All namespaces (a ClusterRole), and watched namespaces with everything on (Roles,
    // NetworkPolicies, monitoring).
    for values in [digest.clone(), format!("{digest}{EVERYTHING_ON}")] {
        let (passed, failed) = checkov(&values);
        // Without networkPolicy.enabled no policy selects the pods (CKV2_K8S_6).
        let with_policies = values.contains("networkPolicy");
        let unexpected: Vec<_> = failed
            .iter()
            .filter(|f| with_policies || !f.starts_with("CKV2_K8S_6 "))
            .collect();
        assert!(unexpected.is_empty(), "with {values}:\n{unexpected:#?}");
        for id in REQUIRED {
            assert!(passed.contains(*id), "{id} did not run on {values}");
        }
        if values.contains("networkPolicy") {
            assert!(passed.contains("CKV2_K8S_6"), "the NetworkPolicy counts");
        }
    }
}
