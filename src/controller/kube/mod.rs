//! How the operator uses the Kubernetes API: server-side apply that skips what is already
//! so ([`ssa`], quantities compared by value with [`crate::quantity`]), the caches of what
//! it made ([`owned`]), and every call it makes, for its RBAC ([`rbac`]).

pub mod keda;
pub mod owned;
pub mod rbac;
pub mod secrets;
pub mod ssa;
