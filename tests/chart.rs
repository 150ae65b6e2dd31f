//! The Helm chart charts/mailer-operator, rendered by Helm's own engine (the Helm v4 Go
//! SDK in the PyPI package helm-python-sdk, driven by tests/render_chart.py): what it
//! makes for several value sets, that its values schema rejects typos, that
//! `helm lint --strict` passes, that every object is valid for Kubernetes 1.33 (the
//! schemas that kubernetes-validate ships, strictly), and that its CRD is the one
//! `mailer crd` generated.
//!
//! Needs python3 with helm-python-sdk, kubernetes-validate and check-jsonschema
//! (see .ci/run); no cluster and no network.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde::Deserialize;
use serde_json::{Value, json};

const RELEASE: &str = "mailer";
const NAMESPACE: &str = "mailer-system";
/// The Kubernetes version k8s-openapi is built for (its feature v1_33).
const KUBE_VERSION: &str = "1.33.0";
/// `<release>-<chart>`, as the chart names its objects.
const FULLNAME: &str = "mailer-mailer-operator";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart_dir() -> PathBuf {
    root().join("charts/mailer-operator")
}

/// Runs tests/render_chart.py with `args`, `values` (YAML) on its standard input.
fn render_chart(args: &[&str], values: &str) -> Output {
    let mut child = Command::new("python3")
        .arg(root().join("tests/render_chart.py"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs tests/render_chart.py");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(values.as_bytes())
        .expect("values written");
    let output = child.wait_with_output().expect("render_chart.py finished");
    assert_ne!(
        output.status.code(),
        Some(3),
        "a package is missing: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `helm template` with `values`, every object validated against Kubernetes' schemas.
/// Err holds Helm's message.
fn try_template(values: &str) -> Result<String, String> {
    let output = render_chart(
        &[
            "template",
            "--release",
            RELEASE,
            "--namespace",
            NAMESPACE,
            "--values",
            "-",
            "--kube-version",
            KUBE_VERSION,
            // The Prometheus Operator's CRD; kubernetes-validate has no schema for it.
            "--allow-unvalidated",
            "ServiceMonitor",
        ],
        values,
    );
    if output.status.success() {
        Ok(String::from_utf8(output.stdout).expect("UTF-8 manifests"))
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

fn template(values: &str) -> Vec<Value> {
    let manifest = try_template(values).unwrap_or_else(|e| panic!("helm template: {e}"));
    parse_documents(&manifest)
}

fn parse_documents(manifest: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(manifest)
        .map(|document| Value::deserialize(document).expect("rendered YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

fn rejected(values: &str) -> String {
    match try_template(values) {
        Ok(_) => panic!("these values should be rejected:\n{values}"),
        Err(message) => message,
    }
}

fn kinds(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .map(|o| o["kind"].as_str().expect("kind").to_string())
        .collect()
}

fn all_of<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    match all_of(objects, kind).as_slice() {
        [object] => object,
        found => panic!("expected one {kind}, found {}", found.len()),
    }
}

fn named<'a>(objects: &'a [Value], kind: &str, namespace: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| {
            o["kind"] == kind
                && o["metadata"]["name"] == name
                && o["metadata"]["namespace"] == namespace
        })
        .unwrap_or_else(|| panic!("no {kind} {namespace}/{name}"))
}

fn container(objects: &[Value]) -> &Value {
    let deployment = one(objects, "Deployment");
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

/// The container's env as name → value (or the valueFrom object).
fn env(objects: &[Value]) -> Vec<(String, Value)> {
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

fn env_value(objects: &[Value], name: &str) -> Option<Value> {
    env(objects)
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|a| a.iter().map(|s| s.as_str().expect("a string")).collect())
        .unwrap_or_default()
}

/// Whether `rules` allow `verb` on `group`/`resource` (and, with a name, that object).
fn allows(rules: &Value, group: &str, resource: &str, verb: &str) -> bool {
    rules.as_array().expect("rules").iter().any(|rule| {
        strings(&rule["apiGroups"]).contains(&group)
            && strings(&rule["resources"]).contains(&resource)
            && strings(&rule["verbs"]).contains(&verb)
    })
}

/// Every (group, resource, verb) that `rules` grant, and whether only for named objects.
fn grants(rules: &Value) -> BTreeSet<(String, String, String, bool)> {
    let mut all = BTreeSet::new();
    for rule in rules.as_array().expect("rules") {
        let named = rule.get("resourceNames").is_some();
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    all.insert((group.into(), resource.into(), verb.into(), named));
                }
            }
        }
    }
    all
}

/// What the controller does in a namespace whose pipelines it reconciles (see
/// src/controller: the pipeline controller's watches, finalizer, status patch,
/// server-side applies of the worker's Deployment and Secret, the broker lookup, and
/// the event recorder).
const PIPELINE_PERMISSIONS: &[(&str, &str, &[&str])] = &[
    (
        "mailer.dev",
        "mailerpipelines",
        &["get", "list", "watch", "patch", "update"],
    ),
    (
        "mailer.dev",
        "mailerpipelines/status",
        &["get", "patch", "update"],
    ),
    ("mailer.dev", "mailerpipelines/finalizers", &["update"]),
    (
        "apps",
        "deployments",
        &[
            "get", "list", "watch", "create", "patch", "update", "delete",
        ],
    ),
    (
        "",
        "secrets",
        &[
            "get", "list", "watch", "create", "patch", "update", "delete",
        ],
    ),
    ("", "services", &["get"]),
    (
        "rabbitmq.com",
        "rabbitmqclusters",
        &["get", "list", "watch"],
    ),
    ("events.k8s.io", "events", &["create", "patch"]),
    ("", "events", &["create", "patch"]),
];

fn expected_pipeline_grants() -> BTreeSet<(String, String, String, bool)> {
    PIPELINE_PERMISSIONS
        .iter()
        .flat_map(|(group, resource, verbs)| {
            verbs.iter().map(move |verb| {
                (
                    group.to_string(),
                    resource.to_string(),
                    verb.to_string(),
                    false,
                )
            })
        })
        .collect()
}

fn assert_binds_service_account(binding: &Value, role_kind: &str, role: &str) {
    assert_eq!(binding["roleRef"]["kind"], role_kind);
    assert_eq!(binding["roleRef"]["name"], role);
    assert_eq!(binding["roleRef"]["apiGroup"], "rbac.authorization.k8s.io");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}])
    );
}

fn assert_lease_role(objects: &[Value], lease: &str) {
    let name = format!("{FULLNAME}-leader-election");
    let role = named(objects, "Role", NAMESPACE, &name);
    let granted = grants(&role["rules"]);
    let lease_grants: BTreeSet<_> = [
        ("create", false),
        ("get", true),
        ("update", true),
        ("patch", true),
    ]
    .into_iter()
    .map(|(verb, named)| {
        (
            "coordination.k8s.io".into(),
            "leases".into(),
            verb.into(),
            named,
        )
    })
    .collect();
    assert_eq!(granted, lease_grants, "the Lease, and no more");
    for rule in role["rules"].as_array().expect("rules") {
        if let Some(names) = rule.get("resourceNames") {
            assert_eq!(names, &json!([lease]), "only this release's Lease");
        }
    }
    let binding = named(objects, "RoleBinding", NAMESPACE, &name);
    assert_binds_service_account(binding, "Role", &name);
}

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
        assert_eq!(labels["app.kubernetes.io/version"], "0.1.0", "{kind}");
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
    assert_eq!(container["image"], "mailer:0.1.0", "appVersion is the tag");
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
            ("MAILER_WORKER_IMAGE".into(), json!("mailer:0.1.0")),
            ("MAILER_RESYNC_INTERVAL".into(), json!("5m")),
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
fn watching_all_namespaces_grants_exactly_what_the_controller_calls() {
    let objects = template("");
    let cluster_role = one(&objects, "ClusterRole");
    assert_eq!(cluster_role["metadata"]["name"], FULLNAME);
    let rules = &cluster_role["rules"];
    for (group, resource, verbs) in PIPELINE_PERMISSIONS {
        for verb in *verbs {
            assert!(
                allows(rules, group, resource, verb),
                "{verb} {group}/{resource}"
            );
        }
    }
    assert_eq!(
        grants(rules),
        expected_pipeline_grants(),
        "nothing more: no wildcards, no pods, no Leases cluster-wide"
    );
    assert_binds_service_account(one(&objects, "ClusterRoleBinding"), "ClusterRole", FULLNAME);
    // The only Role is leader election's, in the release namespace.
    assert_eq!(all_of(&objects, "Role").len(), 1);
    assert_lease_role(&objects, FULLNAME);
}

#[test]
fn watched_namespaces_get_roles_and_nothing_cluster_wide() {
    let objects = template(
        "watchNamespaces: [shop, billing]\n\
         rbac:\n  rabbitmqClusterNamespaces: [rabbitmq, shop]\n",
    );
    let found = kinds(&objects);
    assert!(!found.contains("ClusterRole"), "{found:?}");
    assert!(!found.contains("ClusterRoleBinding"), "{found:?}");
    assert_eq!(
        env_value(&objects, "MAILER_NAMESPACES"),
        Some(json!("shop,billing"))
    );

    for namespace in ["shop", "billing"] {
        let role = named(&objects, "Role", namespace, FULLNAME);
        assert_eq!(
            grants(&role["rules"]),
            expected_pipeline_grants(),
            "{namespace}"
        );
        let binding = named(&objects, "RoleBinding", namespace, FULLNAME);
        assert_binds_service_account(binding, "Role", FULLNAME);
    }
    // A namespace holding only RabbitmqClusters is read, and nothing else.
    let rabbitmq_role = format!("{FULLNAME}-rabbitmq");
    let role = named(&objects, "Role", "rabbitmq", &rabbitmq_role);
    let read_only: BTreeSet<_> = [
        ("rabbitmq.com", "rabbitmqclusters", "get"),
        ("rabbitmq.com", "rabbitmqclusters", "list"),
        ("rabbitmq.com", "rabbitmqclusters", "watch"),
        ("", "services", "get"),
        ("", "secrets", "get"),
    ]
    .into_iter()
    .map(|(g, r, v)| (g.into(), r.into(), v.into(), false))
    .collect();
    assert_eq!(grants(&role["rules"]), read_only);
    assert_binds_service_account(
        named(&objects, "RoleBinding", "rabbitmq", &rabbitmq_role),
        "Role",
        &rabbitmq_role,
    );
    // "shop" is watched already: no second Role there.
    assert!(
        !objects.iter().any(|o| o["metadata"]["namespace"] == "shop"
            && o["metadata"]["name"] == rabbitmq_role.as_str())
    );
    assert_eq!(
        all_of(&objects, "Role").len(),
        4,
        "shop, billing, rabbitmq, the Lease"
    );
    assert_eq!(all_of(&objects, "RoleBinding").len(), 4);
    assert_lease_role(&objects, FULLNAME);

    let message = rejected("rbac:\n  rabbitmqClusterNamespaces: [rabbitmq]\n");
    assert!(
        message.contains("rabbitmqClusterNamespaces is only for watchNamespaces"),
        "{message}"
    );
}

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
    let pinned = format!("mailer:0.1.0@{digest}");
    assert_eq!(container(&objects)["image"], pinned.as_str());
    assert_eq!(container(&objects)["imagePullPolicy"], "Always");
    assert_eq!(
        env_value(&objects, "MAILER_WORKER_IMAGE"),
        Some(json!(pinned))
    );

    let objects = template("workerImage: registry.example/mailer-worker:0.1.0-debug\n");
    assert_eq!(container(&objects)["image"], "mailer:0.1.0");
    assert_eq!(
        env_value(&objects, "MAILER_WORKER_IMAGE"),
        Some(json!("registry.example/mailer-worker:0.1.0-debug"))
    );
}

#[test]
fn one_replica_without_leader_election_has_no_lease_and_no_budget() {
    let objects = template("replicas: 1\nleaderElection:\n  enabled: false\n");
    assert_eq!(one(&objects, "Deployment")["spec"]["replicas"], 1);
    assert!(all_of(&objects, "PodDisruptionBudget").is_empty());
    assert!(all_of(&objects, "Role").is_empty(), "no Lease Role");
    assert!(all_of(&objects, "RoleBinding").is_empty());
    assert_eq!(
        env_value(&objects, "MAILER_LEADER_ELECTION"),
        Some(json!("false"))
    );
    assert_eq!(env_value(&objects, "MAILER_LEASE_NAME"), None);
    assert!(env_value(&objects, "POD_NAME").is_some());

    // One replica with an election: still no budget (it would block every drain).
    let objects = template("replicas: 1\n");
    assert!(all_of(&objects, "PodDisruptionBudget").is_empty());
    assert_lease_role(&objects, FULLNAME);

    let objects = template(
        "replicas: 3\nleaderElection:\n  leaseName: mailer-leader\n  leaseDuration: 30s\n  retryPeriod: 10s\n\
         podDisruptionBudget:\n  maxUnavailable: 50%\n",
    );
    assert_eq!(
        one(&objects, "PodDisruptionBudget")["spec"]["maxUnavailable"],
        "50%"
    );
    assert_eq!(
        env_value(&objects, "MAILER_LEASE_NAME"),
        Some(json!("mailer-leader"))
    );
    assert_eq!(
        env_value(&objects, "MAILER_LEASE_DURATION"),
        Some(json!("30s"))
    );
    assert_eq!(
        env_value(&objects, "MAILER_LEASE_RETRY"),
        Some(json!("10s"))
    );
    assert_lease_role(&objects, "mailer-leader");
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
fn the_service_monitor_is_made_only_when_asked_for() {
    let objects = template(
        "metrics:\n  serviceMonitor:\n    enabled: true\n    interval: 15s\n    labels: {release: prometheus}\n",
    );
    let monitor = one(&objects, "ServiceMonitor");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["metadata"]["namespace"], NAMESPACE);
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(
        monitor["spec"]["endpoints"],
        json!([{"port": "http", "path": "/metrics", "interval": "15s"}])
    );
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"],
        one(&objects, "Service")["metadata"]["labels"]
            .as_object()
            .map(|labels| {
                json!({
                    "app.kubernetes.io/name": labels["app.kubernetes.io/name"],
                    "app.kubernetes.io/instance": labels["app.kubernetes.io/instance"],
                })
            })
            .expect("Service labels")
    );
    assert_eq!(
        monitor["spec"]["namespaceSelector"],
        json!({"matchNames": [NAMESPACE]})
    );
}

#[test]
fn without_rbac_or_service_account_creation_neither_is_made() {
    let objects = template(
        "rbac:\n  create: false\nserviceAccount:\n  create: false\n  name: platform-mailer\n",
    );
    let found = kinds(&objects);
    for kind in [
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ] {
        assert!(!found.contains(kind), "{kind} in {found:?}");
    }
    assert_eq!(
        one(&objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"],
        "platform-mailer"
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

#[test]
fn the_render_is_deterministic_for_argo_cd() {
    let values = "watchNamespaces: [shop]\nmetrics:\n  serviceMonitor:\n    enabled: true\n";
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
        for action in text
            .split("{{")
            .skip(1)
            .map(|s| s.split("}}").next().unwrap_or_default())
        {
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
fn helm_lint_strict_passes() {
    for values in ["", "watchNamespaces: [shop]\nreplicas: 1\n"] {
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
    assert!(notes.contains("Workers run mailer:0.1.0"), "{notes}");
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

#[test]
fn the_charts_crd_is_the_one_mailer_crd_generated() {
    let root_crd = root().join("crds/mailerpipeline.yaml");
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
