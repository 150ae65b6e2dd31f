//! The RabbitMQ side of a pipeline: the desired objects as a pure function of the spec
//! and the broker's capabilities ([`desired`], [`broker`]), what the broker has of them
//! ([`management::observe`]), the comparison of the two ([`diff`]), and applying ([`apply`]) or
//! deleting ([`delete`]) through the management API, one pipeline or a pass over many;
//! a first apply of many may declare exchanges, queues and bindings over AMQP instead
//! ([`declare`]). What a pipeline owns there is in [`ownership`]. The standalone
//! commands remove the delay queues of tiers a spec no longer has by name ([`tiers`]).

pub mod apply;
pub mod broker;
pub mod claim_lock;
pub mod claims;
pub mod declare;
pub mod delete;
pub mod desired;
pub mod diff;
pub mod effective;
pub mod error;
pub mod import;
pub mod live;
pub mod management;
pub mod ownership;
pub mod tiers;
pub mod users;
pub mod version;

pub use apply::{
    SharedApplied, apply, apply_all, apply_all_declaring, apply_shared, plan, plan_all,
};
pub use broker::BrokerCapabilities;
pub use declare::AmqpDeclarer;
pub use delete::{DeleteReport, EmptinessCheck, Kept, Removal, Removed, delete, delete_named};
pub use desired::Topology;
pub use diff::{Change, Conflict};
pub use error::TopologyError;
pub use management::observe::READS_PER_PIPELINE;
pub use management::snapshot::DEFINITIONS_FROM;
pub use management::{
    Clients, MAX_IN_FLIGHT, Management, ManagementEndpoint, QueueDepth, Requests, counted,
};
pub use users::{Permissions, UserChange, UserGrant};
