//! What the desired topology needs to know about the broker it is for: the few facts
//! of a RabbitMQ version that change what a policy must say.

use std::time::{Duration, Instant};

use super::TopologyError;
use super::management::Management;

/// The facts of a RabbitMQ version the topology depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerCapabilities {
    /// RabbitMQ 4.0 and later give every quorum queue a delivery limit of 20 unless a
    /// policy sets one, and take `delivery-limit: -1` for "no limit". Before 4.0 a quorum
    /// queue has no limit unless one is set, and -1 is refused as invalid.
    pub default_delivery_limit: bool,
}

impl BrokerCapabilities {
    /// RabbitMQ 3.x.
    pub const RABBITMQ_3: Self = Self {
        default_delivery_limit: false,
    };
    /// RabbitMQ 4.x and later.
    pub const RABBITMQ_4: Self = Self {
        default_delivery_limit: true,
    };

    /// The capabilities of the version the management API reports, e.g. `3.10.8`,
    /// `4.0.5` or `4.1.0-rc.1`.
    pub fn of_version(version: &str) -> Result<Self, String> {
        let major = version
            .split('.')
            .next()
            .and_then(|major| major.trim().parse::<u32>().ok())
            .ok_or_else(|| format!("cannot tell the RabbitMQ version from {version:?}"))?;
        Ok(if major >= 4 {
            Self::RABBITMQ_4
        } else {
            Self::RABBITMQ_3
        })
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_before_4_have_no_default_delivery_limit() {
        for (version, expected) in [
            ("3.10.8", BrokerCapabilities::RABBITMQ_3),
            ("3.13.7", BrokerCapabilities::RABBITMQ_3),
            ("4.0.5", BrokerCapabilities::RABBITMQ_4),
            ("4.1.0-rc.1", BrokerCapabilities::RABBITMQ_4),
            ("10.0.0", BrokerCapabilities::RABBITMQ_4),
        ] {
            assert_eq!(
                BrokerCapabilities::of_version(version),
                Ok(expected),
                "{version}"
            );
        }
        assert!(
            BrokerCapabilities::of_version("banana")
                .unwrap_err()
                .contains("\"banana\"")
        );
    }
}
