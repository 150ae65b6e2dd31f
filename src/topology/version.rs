//! The broker's version, read through the management API, as the capabilities the
//! desired topology depends on ([`BrokerCapabilities`]).

use std::time::{Duration, Instant};

use super::broker::BrokerCapabilities;
use super::error::TopologyError;
use super::management::Management;

impl Management {
    /// The capabilities of the broker behind this API, from the version it reports. It is
    /// read on every call, so a broker upgraded from 3.x to 4.x gets the 4.x topology at
    /// the next apply.
    pub async fn capabilities(&self) -> Result<BrokerCapabilities, TopologyError> {
        let version = self
            .read(self.api.server_version())
            .await
            .map_err(|e| self.error("read the RabbitMQ version", e))?;
        BrokerCapabilities::of_version(&version).map_err(|reason| TopologyError::Refused {
            action: "read the RabbitMQ version".into(),
            status: 0,
            reason,
        })
    }

    /// The capabilities as read at most `max_age` ago, else read now: what a client
    /// shared by many pipelines reads instead of the version on every call. A broker
    /// upgraded from 3.x to 4.x gets the 4.x topology at the first apply after `max_age`.
    /// (Callers that find nothing fresh at the same moment each read it: no one waits
    /// behind another's read of a broker that does not answer.)
    pub async fn capabilities_within(
        &self,
        max_age: Duration,
    ) -> Result<BrokerCapabilities, TopologyError> {
        let fresh = *self
            .capabilities
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((read_at, capabilities)) = fresh
            && read_at.elapsed() < max_age
        {
            return Ok(capabilities);
        }
        let capabilities = self.capabilities().await?;
        *self
            .capabilities
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((Instant::now(), capabilities));
        Ok(capabilities)
    }
}
