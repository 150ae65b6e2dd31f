//! What runs the reconciles: the context they share ([`context`], [`metrics`]), the
//! watches that trigger them ([`watch`], [`index`]), and leader election ([`leader`]).

pub mod context;
pub mod index;
pub mod leader;
pub mod metrics;
pub mod watch;
