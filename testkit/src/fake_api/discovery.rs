//! What kube-apiserver says it serves, for clients that look before they ask (kubectl,
//! Helm, kube's `Discovery`): `/version`, `/api`, `/apis` and each group version's
//! resource list, with kinds, scopes, verbs, short names, categories and subresources.
//!
//! The built-in kinds are the ones the operator, its chart and the README's commands
//! touch; a CustomResourceDefinition that is stored makes its resource served (and
//! listed) as kube-apiserver does once it is Established, and deleting it stops that.
//! Aggregated discovery (`Accept: …;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList`)
//! is not offered: the answer is the plain `application/json` lists, which is what a
//! server without it sends and what client-go then falls back to.

use serde_json::{Value, json};

/// The Kubernetes version this server claims (the OpenAPI schemas' version).
pub const GIT_VERSION: &str = "v1.37.0";

/// Every verb of a resource that can be listed, watched and written.
const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// One resource served, built in or from a CRD.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub subresources: Vec<String>,
    /// A CRD version's `additionalPrinterColumns` (empty for built-ins).
    pub printer_columns: Vec<Value>,
    /// A CRD version's `openAPIV3Schema` (built-ins' are in the OpenAPI definitions).
    pub schema: Option<Value>,
}

impl Served {
    /// `/api/v1` or `/apis/<group>/<version>`.
    pub fn prefix(&self) -> String {
        prefix_of(&self.group, &self.version)
    }

    pub fn group_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

pub fn prefix_of(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    }
}

/// (group, version, plural, singular, kind, namespaced, short names, categories,
/// subresources)
type BuiltIn = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static [&'static str],
    &'static [&'static str],
    &'static [&'static str],
);

#[rustfmt::skip]
const BUILT_INS: &[BuiltIn] = &[
    ("", "v1", "namespaces", "namespace", "Namespace", false, &["ns"], &[], &["status"]),
    ("", "v1", "secrets", "secret", "Secret", true, &[], &[], &[]),
    ("", "v1", "configmaps", "configmap", "ConfigMap", true, &["cm"], &[], &[]),
    ("", "v1", "services", "service", "Service", true, &["svc"], &["all"], &["status"]),
    ("", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", true, &["sa"], &[], &[]),
    ("", "v1", "events", "event", "Event", true, &["ev"], &[], &[]),
    ("apps", "v1", "deployments", "deployment", "Deployment", true, &["deploy"], &["all"], &["status", "scale"]),
    ("rbac.authorization.k8s.io", "v1", "roles", "role", "Role", true, &[], &[], &[]),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "rolebinding", "RoleBinding", true, &[], &[], &[]),
    ("rbac.authorization.k8s.io", "v1", "clusterroles", "clusterrole", "ClusterRole", false, &[], &[], &[]),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "clusterrolebinding", "ClusterRoleBinding", false, &[], &[], &[]),
    ("coordination.k8s.io", "v1", "leases", "lease", "Lease", true, &[], &[], &[]),
    ("events.k8s.io", "v1", "events", "event", "Event", true, &["ev"], &[], &[]),
    ("policy", "v1", "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget", true, &["pdb"], &[], &["status"]),
    ("networking.k8s.io", "v1", "networkpolicies", "networkpolicy", "NetworkPolicy", true, &["netpol"], &[], &[]),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions", "customresourcedefinition", "CustomResourceDefinition", false, &["crd", "crds"], &[], &["status"]),
];

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

fn built_ins() -> impl Iterator<Item = Served> {
    BUILT_INS.iter().map(
        |(group, version, plural, singular, kind, namespaced, short, categories, sub)| Served {
            group: (*group).into(),
            version: (*version).into(),
            plural: (*plural).into(),
            singular: (*singular).into(),
            kind: (*kind).into(),
            namespaced: *namespaced,
            short_names: strings(short),
            categories: strings(categories),
            subresources: strings(sub),
            printer_columns: Vec::new(),
            schema: None,
        },
    )
}

pub const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

/// The resources each of the stored `crds` serves: every version marked `served`.
pub fn from_crds(crds: &[Value]) -> Vec<Served> {
    let mut served = Vec::new();
    for crd in crds {
        let spec = &crd["spec"];
        let names = &spec["names"];
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let list = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        };
        for version in spec["versions"].as_array().into_iter().flatten() {
            if version["served"] == json!(false) {
                continue;
            }
            let mut subresources = Vec::new();
            for sub in ["status", "scale"] {
                if version["subresources"].get(sub).is_some() {
                    subresources.push(sub.to_string());
                }
            }
            let kind = text(&names["kind"]);
            served.push(Served {
                group: text(&spec["group"]),
                version: text(&version["name"]),
                plural: text(&names["plural"]),
                singular: names["singular"]
                    .as_str()
                    .map_or_else(|| kind.to_lowercase(), str::to_string),
                kind,
                namespaced: spec["scope"] != "Cluster",
                short_names: list(&names["shortNames"]),
                categories: list(&names["categories"]),
                subresources,
                printer_columns: version["additionalPrinterColumns"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
                schema: version["schema"].get("openAPIV3Schema").cloned(),
            });
        }
    }
    served
}

/// Everything served: the built-ins, then what the stored `crds` add.
pub fn all(crds: &[Value]) -> Vec<Served> {
    built_ins().chain(from_crds(crds)).collect()
}

/// The served resource at `prefix` named `plural`, given the stored `crds`.
pub fn find(crds: &[Value], prefix: &str, plural: &str) -> Option<Served> {
    all(crds)
        .into_iter()
        .find(|s| s.prefix() == prefix && s.plural == plural)
}

/// `GET /version`.
pub fn version() -> Value {
    let minor = GIT_VERSION.split('.').nth(1).unwrap_or_default();
    json!({"major": "1", "minor": minor, "gitVersion": GIT_VERSION,
           "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
           "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25.0", "compiler": "gc",
           "platform": "linux/amd64"})
}

/// `GET /api`.
pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]})
}

/// `GET /apis`: every group but the core one, with its versions.
pub fn groups(served: &[Served]) -> Value {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for s in served.iter().filter(|s| !s.group.is_empty()) {
        match groups.iter_mut().find(|(g, _)| *g == s.group) {
            Some((_, versions)) if !versions.contains(&s.version) => {
                versions.push(s.version.clone());
            }
            Some(_) => {}
            None => groups.push((s.group.clone(), vec![s.version.clone()])),
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(name, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
                .collect();
            json!({"name": name, "preferredVersion": versions[0].clone(), "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/<group>`.
pub fn group(served: &[Served], name: &str) -> Option<Value> {
    let all = groups(served);
    all["groups"]
        .as_array()?
        .iter()
        .find(|g| g["name"] == name)
        .map(|g| {
            let mut g = g.clone();
            g["kind"] = json!("APIGroup");
            g["apiVersion"] = json!("v1");
            g
        })
}

/// `GET /api/v1` or `/apis/<group>/<version>`: each resource and its subresources;
/// `extra` are resources served without a definition (installed by a test).
pub fn resource_list(served: &[Served], prefix: &str, extra: &[String]) -> Option<Value> {
    let mut resources = Vec::new();
    let mut group_version = None;
    for s in served.iter().filter(|s| s.prefix() == prefix) {
        group_version = Some(s.group_version());
        let mut resource = json!({"name": s.plural, "singularName": s.singular,
            "namespaced": s.namespaced, "kind": s.kind, "verbs": VERBS});
        if !s.short_names.is_empty() {
            resource["shortNames"] = json!(s.short_names);
        }
        if !s.categories.is_empty() {
            resource["categories"] = json!(s.categories);
        }
        resources.push(resource);
        for sub in &s.subresources {
            resources.push(json!({"name": format!("{}/{sub}", s.plural), "singularName": "",
                "namespaced": s.namespaced, "kind": if sub == "scale" { "Scale" } else { s.kind.as_str() },
                "group": if sub == "scale" { "autoscaling" } else { "" },
                "version": if sub == "scale" { "v1" } else { "" },
                "verbs": ["get", "patch", "update"]}));
        }
    }
    for name in extra {
        if !served
            .iter()
            .any(|s| s.prefix() == prefix && s.plural == *name)
        {
            resources.push(json!({"name": name, "singularName": "", "namespaced": true,
                "kind": "", "verbs": ["get", "list", "watch"]}));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = group_version.unwrap_or_else(|| {
        prefix
            .trim_start_matches("/apis/")
            .trim_start_matches("/api/")
            .to_string()
    });
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": group_version, "resources": resources}))
}
