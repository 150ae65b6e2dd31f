//! The chart's RBAC: exactly what the controller calls, cluster-wide or per watched
//! namespace, and the leader Lease in the release namespace.

use std::collections::BTreeSet;

use mailer::controller::kube::rbac::{self, Scope};
use serde_json::{Value, json};

use crate::render::{
    FULLNAME, NAMESPACE, all_of, env_value, kinds, named, one, rejected, strings, template,
};

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

/// What the controller calls in a namespace whose pipelines it reconciles: the code's
/// own list (src/controller/kube/rbac.rs).
fn expected_pipeline_grants() -> BTreeSet<(String, String, String, bool)> {
    rbac::grants(|scope| scope == Scope::Watched)
        .into_iter()
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
    let lease_grants: BTreeSet<_> = rbac::grants(|scope| matches!(scope, Scope::Lease { .. }))
        .into_iter()
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
fn watching_all_namespaces_grants_exactly_what_the_controller_calls() {
    let objects = template("");
    let cluster_role = one(&objects, "ClusterRole");
    assert_eq!(cluster_role["metadata"]["name"], FULLNAME);
    let rules = &cluster_role["rules"];
    for (group, resource, verb, _) in expected_pipeline_grants() {
        assert!(
            allows(rules, &group, &resource, &verb),
            "{verb} {group}/{resource}"
        );
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
    let read_only: BTreeSet<_> = rbac::grants(|scope| scope == Scope::RabbitmqClusters)
        .into_iter()
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
