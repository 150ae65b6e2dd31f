//! `mailer worker`: consume mail requests, send them, park what failed for now and
//! dead-letter what never will succeed.

pub mod attempt;
pub mod config;
pub mod consume;
pub mod delivery;
pub mod error;
mod in_flight;
pub mod links;
pub mod metrics;
pub mod outcome;
pub mod park;
pub mod serve;
pub mod signal;
pub mod standalone;

pub use consume::Worker;
pub use error::WorkerError;
pub use serve::serve;
