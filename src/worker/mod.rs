//! The worker: consumes mail requests and sends them.

pub mod request;
