//! What runs the reconciles: the watches that trigger them ([`watch`], [`index`], and
//! [`ahead`] for pipelines made together) and leader election ([`leader`]). The context they share is [`super::context`], their
//! metrics [`super::metrics`].

pub mod ahead;
pub mod index;
pub mod leader;
pub mod watch;

use tokio::sync::watch as signal;

/// Resolves once `signal` is true; never when its sender is gone without saying so.
pub async fn signalled(signal: &mut signal::Receiver<bool>) {
    if signal.wait_for(|on| *on).await.is_err() {
        std::future::pending::<()>().await;
    }
}
