//! What the `mailer` subcommands do; `main.rs` only parses arguments.

pub mod topology;
pub mod worker;
