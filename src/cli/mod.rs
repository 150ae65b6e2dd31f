//! What the `mailer` subcommands do; `main.rs` only parses arguments.

pub mod controller;
pub mod crd;
pub mod dead;
pub mod topology;
pub mod worker;
