//! The Helm chart charts/mailer-operator, rendered by Helm's own engine (the Helm v4 Go
//! SDK in the PyPI package helm-python-sdk, driven by tests/render_chart.py): what it
//! makes for several value sets, that its values schema rejects typos, that
//! `helm lint --strict` passes, that every object is valid for Kubernetes 1.28 and the
//! newest version kubernetes-validate knows (strictly), that it passes checkov's
//! checks for a Deployment and its RBAC, that its CRD is the one `mailer crd`
//! generated, that its alerts pass `promtool check rules` and their unit tests, that
//! `deploy/operator.yaml` is its render, and what a release rests on: the crate, the
//! chart and the image at one version, the CHANGELOG, and the release workflow (checked
//! by jactionlint).
//!
//! Needs python3 with helm-python-sdk, kubernetes-validate and check-jsonschema,
//! promtool, checkov, jactionlint and shellcheck (see .ci/run); no cluster and no
//! network.

mod checkov;
mod manifests;
mod monitoring;
mod rbac;
mod release;
mod render;
mod values;

use std::collections::BTreeSet;
use std::path::Path;

use mailer::cli::controller::DEFAULT_WORKER_IMAGE;
use serde_json::{Value, json};

use mailer_testkit::repo_root;
use render::{
    FULLNAME, NAMESPACE, RELEASE, chart_dir, container, env, env_value, kinds, one,
    parse_documents, rejected, render_chart, template, try_template,
};

/// Values that turn on every optional object, in watched namespaces.
const EVERYTHING_ON: &str = "\
commonLabels: {team: mail}
watchNamespaces: [shop, billing]
metrics:
  serviceMonitor: {enabled: true}
  podMonitor: {enabled: true}
  prometheusRule: {enabled: true}
  dashboard: {enabled: true}
networkPolicy:
  enabled: true
  metricsFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]
";

#[test]
fn the_defaults_make_the_operator_with_a_cluster_role() {
    let objects = template("");
    assert_eq!(
        kinds(&objects),
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
        .map(String::from)
        .into_iter()
        .collect::<BTreeSet<_>>(),
        "no ServiceMonitor by default"
    );
    for object in &objects {
        let kind = object["kind"].as_str().unwrap_or_default();
        let labels = &object["metadata"]["labels"];
        assert_eq!(
            labels["app.kubernetes.io/name"], "mailer-operator",
            "{kind}"
        );
        assert_eq!(labels["app.kubernetes.io/instance"], RELEASE, "{kind}");
        assert_eq!(
            labels["app.kubernetes.io/version"],
            env!("CARGO_PKG_VERSION"),
            "{kind}"
        );
        assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm", "{kind}");
        if !kind.starts_with("Cluster") {
            assert_eq!(object["metadata"]["namespace"], NAMESPACE, "{kind}");
        }
    }

    let deployment = one(&objects, "Deployment");
    assert_eq!(deployment["metadata"]["name"], FULLNAME);
    assert_eq!(deployment["spec"]["replicas"], 2);
    let selector = &deployment["spec"]["selector"]["matchLabels"];
    assert_eq!(
        selector,
        &json!({"app.kubernetes.io/name": "mailer-operator", "app.kubernetes.io/instance": RELEASE}),
        "the selector holds only labels that never change"
    );
    let pod = &deployment["spec"]["template"];
    for (key, value) in selector.as_object().expect("selector") {
        assert_eq!(&pod["metadata"]["labels"][key], value);
    }
    assert_eq!(pod["spec"]["serviceAccountName"], FULLNAME);

    let container = container(&objects);
    assert_eq!(
        container["image"], DEFAULT_WORKER_IMAGE,
        "the release image, appVersion as the tag, as the controller's default worker image"
    );
    assert_eq!(container["args"], json!(["controller"]));
    assert_eq!(
        container["ports"],
        json!([{"name": "http", "containerPort": 8080, "protocol": "TCP"}])
    );
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], "http");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "http");
    assert_eq!(
        container["resources"],
        json!({"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}})
    );

    // The "restricted" Pod Security Standard.
    let security = &container["securityContext"];
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"], json!({"drop": ["ALL"]}));
    assert_eq!(
        security["seccompProfile"],
        json!({"type": "RuntimeDefault"})
    );
    let pod_security = &pod["spec"]["securityContext"];
    assert_eq!(pod_security["runAsNonRoot"], true);
    assert_eq!(
        pod_security["seccompProfile"],
        json!({"type": "RuntimeDefault"})
    );

    // No MAILER_NAMESPACES: all namespaces. (An empty value would keep Argo CD's diff
    // out of sync.)
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    assert_eq!(
        env(&objects),
        vec![
            ("MAILER_WORKER_IMAGE".into(), json!(DEFAULT_WORKER_IMAGE)),
            ("MAILER_RESYNC_INTERVAL".into(), json!("5m")),
            ("MAILER_CONCURRENCY".into(), json!("16")),
            ("MAILER_CLUSTER_NAME".into(), json!("default")),
            ("MAILER_METRICS_ADDR".into(), json!("0.0.0.0:8080")),
            ("MAILER_LEADER_ELECTION".into(), json!("true")),
            ("MAILER_LEASE_NAME".into(), json!(FULLNAME)),
            ("MAILER_LEASE_DURATION".into(), json!("15s")),
            ("MAILER_LEASE_RETRY".into(), json!("4s")),
            ("MAILER_LEASE_NAMESPACE".into(), field("metadata.namespace")),
            ("POD_NAME".into(), field("metadata.name")),
            ("MAIL_LOG_FORMAT".into(), json!("json")),
        ]
    );

    let service = one(&objects, "Service");
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}])
    );
    assert_eq!(service["spec"]["selector"], *selector);

    let pdb = one(&objects, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], *selector);

    assert_eq!(
        one(&objects, "ServiceAccount")["metadata"]["name"],
        FULLNAME
    );
}

#[test]
fn images_follow_the_tag_digest_and_worker_image() {
    let objects = template("image:\n  repository: registry.example:5000/team/mailer\n  tag: v2\n");
    assert_eq!(
        container(&objects)["image"],
        "registry.example:5000/team/mailer:v2"
    );
    assert_eq!(
        env_value(&objects, "MAILER_WORKER_IMAGE"),
        Some(json!("registry.example:5000/team/mailer:v2")),
        "workers run the controller's image by default"
    );

    let digest = format!("sha256:{}", "ab".repeat(32));
    let objects = template(&format!(
        "image:\n  digest: {digest}\n  pullPolicy: Always\n"
    ));
    let pinned = format!("{DEFAULT_WORKER_IMAGE}@{digest}");
    assert_eq!(container(&objects)["image"], pinned.as_str());
    assert_eq!(container(&objects)["imagePullPolicy"], "Always");
    assert_eq!(
        env_value(&objects, "MAILER_WORKER_IMAGE"),
        Some(json!(pinned))
    );

    let objects = template("workerImage: registry.example/mailer-worker:0.1.0-debug\n");
    assert_eq!(container(&objects)["image"], DEFAULT_WORKER_IMAGE);
    assert_eq!(
        env_value(&objects, "MAILER_WORKER_IMAGE"),
        Some(json!("registry.example/mailer-worker:0.1.0-debug"))
    );
}

#[test]
fn pod_placement_and_extras_pass_through() {
    let objects = template(
        r#"
imagePullSecrets: [{name: regcred}]
podAnnotations: {example.com/team: mail}
podLabels: {team: mail}
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Equal, value: ops, effect: NoSchedule}]
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector: {matchLabels: {app.kubernetes.io/name: mailer-operator}}
priorityClassName: system-cluster-critical
resyncInterval: 30s
concurrency: 4
clusterName: eu-west
logFormat: text
logLevel: mailer=debug,info
extraEnv: [{name: EXTRA, value: "1"}]
resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {cpu: 1, memory: 512Mi}}
serviceAccount: {annotations: {example.com/role: mailer}}
service: {annotations: {example.com/scrape: "true"}}
"#,
    );
    let deployment = one(&objects, "Deployment");
    let pod = &deployment["spec"]["template"];
    assert_eq!(
        pod["metadata"]["annotations"],
        json!({"example.com/team": "mail"})
    );
    assert_eq!(pod["metadata"]["labels"]["team"], "mail");
    let spec = &pod["spec"];
    assert_eq!(spec["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(spec["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(
        spec["tolerations"],
        json!([{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}])
    );
    assert_eq!(
        spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"],
        100
    );
    assert_eq!(spec["priorityClassName"], "system-cluster-critical");
    assert_eq!(
        env_value(&objects, "MAILER_RESYNC_INTERVAL"),
        Some(json!("30s"))
    );
    assert_eq!(env_value(&objects, "MAILER_CONCURRENCY"), Some(json!("4")));
    assert_eq!(
        env_value(&objects, "MAILER_CLUSTER_NAME"),
        Some(json!("eu-west"))
    );
    assert_eq!(env_value(&objects, "MAIL_LOG_FORMAT"), Some(json!("text")));
    assert_eq!(
        env_value(&objects, "RUST_LOG"),
        Some(json!("mailer=debug,info"))
    );
    assert_eq!(env_value(&objects, "EXTRA"), Some(json!("1")));
    assert_eq!(container(&objects)["resources"]["limits"]["cpu"], 1);
    assert_eq!(
        one(&objects, "ServiceAccount")["metadata"]["annotations"],
        json!({"example.com/role": "mailer"})
    );
    assert_eq!(
        one(&objects, "Service")["metadata"]["annotations"],
        json!({"example.com/scrape": "true"})
    );
    // The selector stays put whatever labels the pods get.
    assert_eq!(
        deployment["spec"]["selector"]["matchLabels"],
        json!({"app.kubernetes.io/name": "mailer-operator", "app.kubernetes.io/instance": RELEASE})
    );
}

#[test]
fn names_follow_the_release_and_the_overrides() {
    let manifest = |release: &str, values: &str| {
        let output = render_chart(
            &[
                "template",
                "--release",
                release,
                "--namespace",
                NAMESPACE,
                "--values",
                "-",
            ],
            values,
        );
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        parse_documents(&String::from_utf8(output.stdout).expect("UTF-8"))
    };
    let name = |objects: &[Value]| one(objects, "Deployment")["metadata"]["name"].clone();
    assert_eq!(name(&manifest("mailer-operator", "")), "mailer-operator");
    assert_eq!(name(&manifest("prod", "")), "prod-mailer-operator");
    assert_eq!(name(&manifest("prod", "fullnameOverride: mail\n")), "mail");
    let objects = manifest("prod", "nameOverride: mta\n");
    assert_eq!(name(&objects), "prod-mta");
    assert_eq!(
        one(&objects, "Deployment")["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "mta"
    );
}

/// The code of every `{{ … }}` action in a template, with its string literals ("…" and
/// `…`, which may hold `{{` themselves) left out.
fn template_actions(text: &str) -> Vec<String> {
    let mut actions = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        rest = &rest[start + 2..];
        let mut code = String::new();
        let mut literal = None;
        let mut chars = rest.char_indices();
        let mut end = rest.len();
        while let Some((i, c)) = chars.next() {
            match (literal, c) {
                (None, '"' | '`') => literal = Some(c),
                (Some(quote), c) if c == quote => literal = None,
                (Some('"'), '\\') => {
                    chars.next();
                }
                (None, '}') if rest[i..].starts_with("}}") => {
                    end = i + 2;
                    break;
                }
                (None, c) => code.push(c),
                _ => {}
            }
        }
        actions.push(code);
        rest = &rest[end.min(rest.len())..];
    }
    actions
}

#[test]
fn the_render_is_deterministic_for_argo_cd() {
    let values = EVERYTHING_ON;
    let first = try_template(values).expect("render");
    let second = try_template(values).expect("render");
    assert_eq!(first, second, "two renders of the same values differ");
    // Nothing that differs between renders or needs a cluster.
    let forbidden = [
        "rand",
        "now",
        "uuidv4",
        "genCA",
        "genPrivateKey",
        "genSelfSignedCert",
        "genSignedCert",
        "lookup",
        "htpasswd",
        "randBytes",
        "date",
    ];
    for entry in std::fs::read_dir(chart_dir().join("templates")).expect("templates") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("template");
        for action in template_actions(&text) {
            for word in action.split(|c: char| !c.is_ascii_alphanumeric()) {
                assert!(
                    !forbidden
                        .iter()
                        .any(|f| word.eq_ignore_ascii_case(f)
                            || (f.len() > 3 && word.starts_with(f))),
                    "{}: `{word}` in {{{{{action}}}}}",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn the_notes_say_what_was_installed() {
    let output = render_chart(
        &[
            "notes",
            "--release",
            RELEASE,
            "--namespace",
            NAMESPACE,
            "--values",
            "-",
        ],
        "watchNamespaces: [shop, billing]\n",
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let notes = String::from_utf8(output.stdout).expect("UTF-8");
    assert!(
        notes.contains(&format!("{FULLNAME} in {NAMESPACE}")),
        "{notes}"
    );
    assert!(notes.contains("the namespaces shop, billing"), "{notes}");
    assert!(
        notes.contains(&format!("Workers run {DEFAULT_WORKER_IMAGE}")),
        "{notes}"
    );
}

#[test]
fn the_charts_crd_is_the_one_mailer_crd_generated() {
    let root_crd = repo_root().join("crds/mailerpipeline.yaml");
    let chart_crd = chart_dir().join("crds/mailerpipeline.yaml");
    let generated = std::fs::read(&root_crd).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; it is generated by `mailer crd` and checked in with the controller",
            root_crd.display()
        )
    });
    let copied =
        std::fs::read(&chart_crd).unwrap_or_else(|e| panic!("{}: {e}", chart_crd.display()));
    assert!(
        generated == copied,
        "the chart's CRD differs from the generated one: cp {} {}",
        root_crd.display(),
        chart_crd.display()
    );
}

#[test]
fn helm_loads_the_crd_from_the_crds_folder() {
    let output = render_chart(&["crds"], "");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let loaded = String::from_utf8(output.stdout).expect("UTF-8");
    let documents = parse_documents(&loaded);
    assert_eq!(documents.len(), 1, "one CRD");
    let crd = &documents[0];
    assert_eq!(crd["kind"], "CustomResourceDefinition");
    assert_eq!(crd["apiVersion"], "apiextensions.k8s.io/v1");
    assert_eq!(crd["metadata"]["name"], "mailerpipelines.mailer.dev");
    assert_eq!(crd["spec"]["group"], "mailer.dev");
    assert_eq!(crd["spec"]["names"]["kind"], "MailerPipeline");
    // Not among the templates: Helm installs crds/ first and never deletes it.
    assert!(!Path::new(&chart_dir().join("templates/mailerpipeline.yaml")).exists());
    for object in template("") {
        assert_ne!(object["kind"], "CustomResourceDefinition");
    }
}

#[test]
fn common_labels_are_on_every_object_and_cannot_replace_the_charts() {
    let objects = template(EVERYTHING_ON);
    assert!(objects.len() > 15, "{}", objects.len());
    for object in &objects {
        assert_eq!(
            object["metadata"]["labels"]["team"], "mail",
            "{} {}",
            object["kind"], object["metadata"]["name"]
        );
    }
    let deployment = one(&objects, "Deployment");
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["labels"]["team"],
        "mail"
    );
    assert!(
        deployment["spec"]["selector"]["matchLabels"]
            .get("team")
            .is_none(),
        "a selector never changes"
    );
    let message = rejected("commonLabels: {app.kubernetes.io/name: other}\n");
    assert!(
        message.contains("app.kubernetes.io/name is one of the chart's own labels"),
        "{message}"
    );
}

#[test]
fn the_chart_needs_kubernetes_1_28_and_keeps_its_crd() {
    let chart: Value = serde_yaml::from_str(
        &std::fs::read_to_string(chart_dir().join("Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("Chart.yaml parses");
    // The CRD's validation rules carry `reason`, which Kubernetes knows from 1.28.
    assert_eq!(chart["kubeVersion"], ">=1.28.0-0");
    let crd = std::fs::read_to_string(chart_dir().join("crds/mailerpipeline.yaml")).expect("CRD");
    assert!(crd.contains("reason: FieldValue"), "the CEL rules' reason");

    // Deleting the release (or an Argo CD Application with cascade) leaves the CRD, and
    // with it every pipeline.
    let output = render_chart(&["crds"], "");
    let crd = &parse_documents(&String::from_utf8(output.stdout).expect("UTF-8"))[0];
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );

    // The CRD upgrade that works on a CRD Helm installed (its field manager is Helm's).
    let upgrade = "kubectl apply --server-side --force-conflicts";
    for document in [
        chart_dir().join("templates/NOTES.txt"),
        chart_dir().join("README.md"),
        repo_root().join("README.md"),
        repo_root().join("docs/operations.md"),
    ] {
        let text = std::fs::read_to_string(&document).expect("document");
        assert!(
            text.contains(upgrade),
            "{} lacks {upgrade:?}",
            document.display()
        );
        assert!(
            !text.contains("kubectl apply --server-side -f"),
            "{} still shows the CRD upgrade without --force-conflicts",
            document.display()
        );
    }
}
