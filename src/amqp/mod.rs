//! What every AMQP client of the mailer shares: connecting with a deadline and publishing
//! with confirms (`mailer worker`, `mailer send`, `mailer dead replay`).

pub mod address;
pub mod connect;
pub mod pipelined;
pub mod publish;
pub mod server;

pub use connect::{ConnectError, connect};
pub use pipelined::PipelinedPublisher;
pub use publish::{PublishError, publish_confirmed, republished};
