//! mailer: a Kubernetes operator and worker for a mail-sending pipeline on RabbitMQ.
//!
//! The core (`mail`, `spec`, `topology`, `worker`, `provider`, `dead`) has no Kubernetes in it;
//! `controller` is the kube-runtime glue around it.

pub mod amqp;
pub mod cli;
pub mod controller;
pub mod dead;
pub mod mail;
pub mod manifest;
pub mod message;
pub mod provider;
pub mod quantity;
pub mod redact;
pub mod spec;
pub mod telemetry;
pub mod text;
pub mod topology;
pub mod worker;

/// Makes ring the process's rustls crypto provider (the one TLS stack every client here
/// shares); later calls do nothing.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
