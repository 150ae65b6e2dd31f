//! Shared by the integration test binaries; each uses only part of it.

pub mod broker;
pub mod inproc;
pub mod metrics;
pub mod process;
pub mod provider;
pub mod smtp;
pub mod tls;
