//! Who owns a pipeline's objects in a broker: a marker per owned thing, kept in the
//! broker itself as a global runtime parameter (`/api/global-parameters`), so every
//! operator that shares the broker sees it, whatever cluster it runs in.
//!
//! A marker's value names the pipeline: the operator's cluster name, the pipeline's
//! namespace, name and UID. RabbitMQ keeps global parameters in its schema database, so
//! they survive restarts and are part of a definitions export.

use std::fmt;

use rabbitmq_http_client::requests::GlobalRuntimeParameterDefinition;
use serde::{Deserialize, Serialize};

use super::TopologyError;
use super::management::Management;

/// The pipeline that owns something in a broker.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The operator's `--cluster-name`.
    pub cluster: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MailerPipeline {}/{} of cluster {:?} (uid {})",
            self.namespace, self.name, self.cluster, self.uid
        )
    }
}

/// The marker of a pipeline's topology: its send queue in its vhost names it (the
/// other exchanges and queues hang off it).
pub fn topology_marker(vhost: &str, queue: &str) -> String {
    format!("mailer-owner|topology|{vhost}|{queue}")
}

/// The marker of a workers' user the operator made.
pub fn user_marker(username: &str) -> String {
    format!("mailer-owner|user|{username}")
}

impl Management {
    /// The owner `marker` names, if it exists. A marker that does not read as an owner
    /// (written by hand) is someone else's.
    pub async fn owner(&self, marker: &str) -> Result<Option<Owner>, TopologyError> {
        match self
            .read(self.api.get_global_runtime_parameter(marker))
            .await
        {
            Ok(parameter) => {
                let value: serde_json::Value = parameter.value.into();
                Ok(Some(serde_json::from_value(value).unwrap_or_else(|_| {
                    Owner {
                        cluster: "?".into(),
                        namespace: "?".into(),
                        name: format!("(global parameter {marker:?}, written by someone else)"),
                        uid: "?".into(),
                    }
                })))
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(self.error(&format!("read global parameter {marker:?}"), e)),
        }
    }

    /// Writes `marker` naming `owner`.
    pub async fn set_owner(&self, marker: &str, owner: &Owner) -> Result<(), TopologyError> {
        let value = match serde_json::to_value(owner) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        let parameter = GlobalRuntimeParameterDefinition {
            name: marker,
            value,
        };
        self.bounded_write(self.api.upsert_global_runtime_parameter(&parameter))
            .await
            .map_err(|e| self.error(&format!("write global parameter {marker:?}"), e))
    }

    /// Removes `marker`; `false` when it was not there.
    pub async fn clear_owner(&self, marker: &str) -> Result<bool, TopologyError> {
        match self
            .bounded_write(self.api.clear_global_runtime_parameter(marker))
            .await
        {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(self.error(&format!("remove global parameter {marker:?}"), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_name_what_they_mark_and_owners_read_well() {
        assert_eq!(
            topology_marker("shop", "mail.send"),
            "mailer-owner|topology|shop|mail.send"
        );
        assert_eq!(user_marker("u"), "mailer-owner|user|u");
        let owner = Owner {
            cluster: "eu".into(),
            namespace: "prod".into(),
            name: "shop".into(),
            uid: "1".into(),
        };
        assert_eq!(
            owner.to_string(),
            "MailerPipeline prod/shop of cluster \"eu\" (uid 1)"
        );
    }
}
