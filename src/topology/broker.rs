//! What the desired topology needs to know about the broker it is for: the few facts
//! of a RabbitMQ version that change what a policy must say.

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
