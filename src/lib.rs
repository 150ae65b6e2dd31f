//! mailer: a Kubernetes operator and worker for a mail-sending pipeline on RabbitMQ.
//!
//! The core (`mail`, `spec`, `topology`, `worker`, `provider`) has no Kubernetes in it;
//! `controller` is the kube-runtime glue around it.

pub mod mail;
pub mod provider;
pub mod spec;
pub mod worker;
