//! Where a request goes: the API group prefix, the namespace, the resource, the name
//! and the subresource, parsed from the path the way kube-apiserver routes it.

/// A collection (no name) or one object (with a name) of a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// `/api/v1` or `/apis/<group>/<version>`.
    pub prefix: String,
    /// `None` for a cluster-scoped resource, or a list across every namespace.
    pub namespace: Option<String>,
    /// The plural resource name, e.g. `secrets`.
    pub resource: String,
    pub name: Option<String>,
    /// E.g. `status`.
    pub subresource: Option<String>,
}

impl Address {
    /// Parses `/api/v1/namespaces/prod/secrets/conn`, `/apis/apps/v1/deployments`, …;
    /// `None` for a path that names no resource (e.g. a discovery document).
    pub fn parse(path: &str) -> Option<Self> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (prefix, rest) = match segments.as_slice() {
            ["api", version, rest @ ..] => (format!("/api/{version}"), rest),
            ["apis", group, version, rest @ ..] => (format!("/apis/{group}/{version}"), rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", namespace, rest @ ..] if !rest.is_empty() => {
                (Some(namespace.to_string()), rest)
            }
            _ => (None, rest),
        };
        let (resource, name, subresource) = match rest {
            [resource] => (*resource, None, None),
            [resource, name] => (*resource, Some(name.to_string()), None),
            [resource, name, sub] => (*resource, Some(name.to_string()), Some(sub.to_string())),
            _ => return None,
        };
        if resource.is_empty() {
            return None;
        }
        Some(Self {
            prefix,
            namespace,
            resource: resource.to_string(),
            name,
            subresource,
        })
    }

    /// The path of the object (without subresource): the key it is stored under.
    pub fn key(&self) -> String {
        let mut key = self.collection_key();
        if let Some(name) = &self.name {
            key.push('/');
            key.push_str(name);
        }
        key
    }

    pub fn collection_key(&self) -> String {
        match &self.namespace {
            Some(namespace) => format!("{}/namespaces/{namespace}/{}", self.prefix, self.resource),
            None => format!("{}/{}", self.prefix, self.resource),
        }
    }

    /// This address with `name` and no subresource.
    pub fn with_name(&self, name: &str) -> Self {
        Self {
            name: Some(name.to_string()),
            subresource: None,
            ..self.clone()
        }
    }

    /// Whether the object stored at `other` belongs to this collection: the same
    /// resource, and the same namespace unless this spans all of them.
    pub fn contains(&self, other: &Address) -> bool {
        self.prefix == other.prefix
            && self.resource == other.resource
            && (self.namespace.is_none() || self.namespace == other.namespace)
    }

    /// Whether objects of this resource have a `status` subresource: writes to the
    /// object never change its status, and writes to `/status` change nothing else.
    pub fn has_status_subresource(&self) -> bool {
        self.tracks_generation() || self.resource == "namespaces"
    }

    /// Whether `metadata.generation` counts the changes of this resource's spec.
    pub fn tracks_generation(&self) -> bool {
        [
            "mailerpipelines",
            "deployments",
            "rabbitmqclusters",
            "customresourcedefinitions",
            "poddisruptionbudgets",
        ]
        .contains(&self.resource.as_str())
    }
}

/// The query of a request, decoded.
#[derive(Debug, Default, Clone)]
pub struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(query: &str) -> Self {
        Self(
            query
                .split('&')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    (decode(key), decode(value))
                })
                .collect(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn decode(text: &str) -> String {
    let text = text.replace('+', " ");
    percent_encoding::percent_decode_str(&text)
        .decode_utf8_lossy()
        .into_owned()
}
