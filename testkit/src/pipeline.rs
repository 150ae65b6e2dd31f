//! MailerPipelines as the tests write them: a spec builder in place of inline JSON, and
//! the conditions of a status, read and asserted.

use serde_json::{Value, json};

/// The name of the connection Secret a [`PipelineSpec`] names unless told otherwise.
pub const CONNECTION_SECRET: &str = "conn";

/// A pipeline's `spec` in the making. [`PipelineSpec::new`] names the connection Secret
/// `conn` and nothing else, so every other field takes the CRD's default; each method
/// sets or merges what a test needs, e.g.
/// `PipelineSpec::new().vhost(&vhost.name).deletion_policy("Delete").build()`.
#[derive(Debug, Clone)]
pub struct PipelineSpec(Value);

impl Default for PipelineSpec {
    fn default() -> Self {
        Self::new()
    }
}

impl PipelineSpec {
    pub fn new() -> Self {
        Self(json!({"rabbitmq": {"connectionSecret": {"name": CONNECTION_SECRET}}}))
    }

    /// `spec.rabbitmq.vhost`.
    pub fn vhost(mut self, vhost: &str) -> Self {
        self.0["rabbitmq"]["vhost"] = json!(vhost);
        self
    }

    /// `spec.rabbitmq.connectionSecret.name`.
    pub fn connection_secret(mut self, name: &str) -> Self {
        self.0["rabbitmq"]["connectionSecret"] = json!({ "name": name });
        self
    }

    /// `spec.rabbitmq.clusterRef` in place of the connection Secret.
    pub fn cluster_ref(mut self, cluster_ref: Value) -> Self {
        let rabbitmq = &mut self.0["rabbitmq"];
        if let Some(fields) = rabbitmq.as_object_mut() {
            fields.remove("connectionSecret");
        }
        rabbitmq["clusterRef"] = cluster_ref;
        self
    }

    /// Merges `fields` into `spec.topology`.
    pub fn topology(self, fields: Value) -> Self {
        self.merged("topology", fields)
    }

    /// `spec.topology.deletionPolicy`.
    pub fn deletion_policy(self, policy: &str) -> Self {
        self.topology(json!({ "deletionPolicy": policy }))
    }

    /// Merges `fields` into `spec.worker`.
    pub fn worker(self, fields: Value) -> Self {
        self.merged("worker", fields)
    }

    pub fn build(self) -> Value {
        self.0
    }

    fn merged(mut self, section: &str, fields: Value) -> Self {
        let target = &mut self.0[section];
        if target.is_null() {
            *target = json!({});
        }
        if let (Some(target), Value::Object(fields)) = (target.as_object_mut(), fields) {
            target.extend(fields);
        }
        self
    }
}

impl From<PipelineSpec> for Value {
    fn from(spec: PipelineSpec) -> Value {
        spec.build()
    }
}

/// The condition `type_` of `status` (a pipeline's `.status`); panics naming the status
/// when it has none.
pub fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

/// Asserts that `status` has condition `type_` with `expected` status (`"True"`,
/// `"False"`) and, when given, `reason`; the message shows the condition's message.
pub fn assert_condition(status: &Value, type_: &str, expected: &str, reason: Option<&str>) {
    let found = condition(status, type_);
    assert_eq!(
        found["status"], expected,
        "{type_} is not {expected}: {found}"
    );
    if let Some(reason) = reason {
        assert_eq!(found["reason"], reason, "{type_}'s reason: {found}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_merges_what_it_is_given_over_the_defaults() {
        let spec = PipelineSpec::new()
            .vhost("v")
            .topology(json!({"queue": "q"}))
            .deletion_policy("Delete")
            .worker(json!({"replicas": 2}))
            .build();
        assert_eq!(
            spec,
            json!({"rabbitmq": {"vhost": "v", "connectionSecret": {"name": "conn"}},
                   "topology": {"queue": "q", "deletionPolicy": "Delete"},
                   "worker": {"replicas": 2}})
        );
        let spec = PipelineSpec::new()
            .cluster_ref(json!({"name": "r"}))
            .build();
        assert_eq!(spec, json!({"rabbitmq": {"clusterRef": {"name": "r"}}}));
    }
}
