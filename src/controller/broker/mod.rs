//! Finding a pipeline's broker and what it may use there: its connection Secret or
//! RabbitmqCluster ([`connection`]), which namespaces a cluster allows ([`tenancy`]), the
//! Secrets a pipeline reads ([`secrets`]), and the connection Secret held while the
//! pipeline needs it for its cleanup ([`in_use`]).

pub mod connection;
pub mod in_use;
pub mod secrets;
pub mod tenancy;
