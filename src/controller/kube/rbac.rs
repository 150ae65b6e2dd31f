//! Every call the controller makes to the Kubernetes API, by resource, verb and scope:
//! the one list the chart's RBAC (`charts/mailer-operator/templates/_helpers.tpl`,
//! `rbac.yaml`) and `deploy/operator.yaml` are held to, both ways, by
//! `tests/chart/rbac.rs`. A new call is added here first.
//!
//! Nothing deletes a Secret or a Deployment: the worker Secret and Deployment go with
//! their pipeline through owner references (the garbage collector deletes them).

/// Where the controller makes a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// In every namespace whose pipelines it reconciles: a Role in each watched
    /// namespace, or a ClusterRole when it watches all of them.
    Watched,
    /// In a namespace that only holds RabbitmqClusters that pipelines elsewhere name.
    RabbitmqClusters,
    /// The leader Lease in the operator's namespace; `named` when the rule is limited
    /// to that one Lease (creating cannot be).
    Lease { named: bool },
}

/// One resource and the verbs the controller uses on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    pub scope: Scope,
}

const fn call(
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    scope: Scope,
) -> Call {
    Call {
        group,
        resource,
        verbs,
        scope,
    }
}

/// Every call, with where in the code it is made.
pub const CALLS: &[Call] = &[
    // watch.rs: the controller's watch; finalizers added and removed by JSON patch
    // (reconcile.rs); unreadable.rs reads one it cannot deserialize.
    call(
        "mailer.dev",
        "mailerpipelines",
        &["get", "list", "watch", "patch"],
        Scope::Watched,
    ),
    // report.rs and unreadable.rs: the status, by merge patch.
    call(
        "mailer.dev",
        "mailerpipelines/status",
        &["patch"],
        Scope::Watched,
    ),
    // The owner references the operator sets block their owner's deletion, which the
    // API server allows only to who may update the owner's finalizers.
    call(
        "mailer.dev",
        "mailerpipelines/finalizers",
        &["update"],
        Scope::Watched,
    ),
    // The worker Deployment: read (reconcile.rs), watched (watch.rs), server-side
    // applied (ssa.rs), which creates it the first time.
    call(
        "apps",
        "deployments",
        &["get", "list", "watch", "create", "patch"],
        Scope::Watched,
    ),
    // The worker Secret is read and applied; every Secret of the namespace is watched
    // (metadata only) to tell which pipeline names it; the Secrets a pipeline names are
    // read.
    call(
        "",
        "secrets",
        &["get", "list", "watch", "create", "patch"],
        Scope::Watched,
    ),
    // connection.rs: a RabbitmqCluster, and its Service for the management port;
    // watch.rs watches RabbitmqClusters (as metadata) when their CRD is installed.
    call(
        "rabbitmq.com",
        "rabbitmqclusters",
        &["get", "list", "watch"],
        Scope::Watched,
    ),
    call("", "services", &["get"], Scope::Watched),
    // autoscaling.rs: KEDA's objects, applied, and removed when autoscaling is off.
    call(
        "keda.sh",
        "scaledobjects",
        &["get", "create", "patch", "delete"],
        Scope::Watched,
    ),
    call(
        "keda.sh",
        "triggerauthentications",
        &["get", "create", "patch", "delete"],
        Scope::Watched,
    ),
    // context.rs: events about pipelines, through kube's recorder (which patches an
    // event it has published before into a series).
    call(
        "events.k8s.io",
        "events",
        &["create", "patch"],
        Scope::Watched,
    ),
    // connection.rs, for a clusterRef into a namespace that is not watched.
    call(
        "rabbitmq.com",
        "rabbitmqclusters",
        &["get"],
        Scope::RabbitmqClusters,
    ),
    call("", "services", &["get"], Scope::RabbitmqClusters),
    call("", "secrets", &["get"], Scope::RabbitmqClusters),
    // leader.rs: the Lease is created once, then read and replaced (PUT).
    call(
        "coordination.k8s.io",
        "leases",
        &["create"],
        Scope::Lease { named: false },
    ),
    call(
        "coordination.k8s.io",
        "leases",
        &["get", "update"],
        Scope::Lease { named: true },
    ),
];

/// `(group, resource, verb, named)` of every call in `scope`'s kind of place, for
/// comparing with RBAC rules.
pub fn grants(matches: impl Fn(Scope) -> bool) -> Vec<(String, String, String, bool)> {
    let mut all: Vec<_> = CALLS
        .iter()
        .filter(|c| matches(c.scope))
        .flat_map(|c| {
            let named = matches!(c.scope, Scope::Lease { named: true });
            c.verbs.iter().map(move |verb| {
                (
                    c.group.to_string(),
                    c.resource.to_string(),
                    (*verb).to_string(),
                    named,
                )
            })
        })
        .collect();
    all.sort();
    all.dedup();
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_deletes_secrets_or_deployments_and_secrets_are_written_only_where_watched() {
        for call in CALLS {
            if matches!(call.resource, "secrets" | "deployments") {
                assert!(!call.verbs.contains(&"delete"), "{call:?}");
            }
            if call.resource == "secrets" && call.scope != Scope::Watched {
                assert_eq!(call.verbs, ["get"], "{call:?}");
            }
        }
        let watched = grants(|s| s == Scope::Watched);
        assert!(watched.contains(&("".into(), "secrets".into(), "patch".into(), false)));
    }
}
