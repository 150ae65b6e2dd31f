//! The connections a broker user has open, by the names their clients gave them: how a
//! worker tells the operator what it cannot show otherwise
//! ([`crate::mail::CREDENTIALS_REFUSED_CONNECTION`]).

use serde::Deserialize;

use super::Management;
use crate::topology::error::TopologyError;

/// What is read of one connection.
#[derive(Debug, Deserialize)]
struct Seen {
    #[serde(default)]
    user: String,
    #[serde(default)]
    client_properties: ClientProperties,
}

#[derive(Debug, Default, Deserialize)]
struct ClientProperties {
    #[serde(default)]
    connection_name: Option<String>,
}

impl Management {
    /// The names of the connections `user` has open in `vhost`, as their clients named
    /// them (unnamed ones left out): one request for the vhost's connections, with only
    /// the two fields read (RabbitMQ lists a user's connections without their names). A
    /// vhost that does not exist has none.
    pub async fn connection_names(
        &self,
        vhost: &str,
        user: &str,
    ) -> Result<Vec<String>, TopologyError> {
        let action = format!("list the connections of vhost {vhost:?}");
        let seen: Option<Vec<Seen>> = self
            .get_json_with(
                &["vhosts", vhost, "connections"],
                &[("columns", "user,client_properties")],
                &action,
            )
            .await?;
        Ok(seen
            .unwrap_or_default()
            .into_iter()
            .filter(|connection| connection.user == user)
            .filter_map(|connection| connection.client_properties.connection_name)
            .collect())
    }
}
