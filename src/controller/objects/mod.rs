//! What the operator makes for a pipeline in Kubernetes, as pure functions: the worker
//! Deployment ([`deployment`]), the worker Secret and user ([`worker_secret`]), KEDA's
//! objects ([`autoscaling`]), the metadata all carry ([`meta`]), and the status
//! ([`status`]).

pub mod autoscaling;
pub mod deployment;
pub mod meta;
pub mod status;
pub mod worker_secret;
