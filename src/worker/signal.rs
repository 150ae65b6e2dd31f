//! Telling the operator, through the broker, that the provider refuses the workers' key.
//!
//! While it does, the worker holds one more connection open, as its own broker user,
//! named [`CREDENTIALS_REFUSED_CONNECTION`]; the operator reads the connections of the
//! workers' user when the workers are not ready, and says why in the pipeline's
//! `WorkerReady` condition. The broker is the one place both already reach: the operator
//! needs no access to the pods, and no network path to them.

use std::time::Duration;

use tokio::sync::oneshot;
use tracing::{debug, warn};

use crate::amqp::connect;
use crate::mail::CREDENTIALS_REFUSED_CONNECTION;

/// The connection, held open until this is dropped.
pub struct Signal {
    _held: oneshot::Sender<()>,
}

impl Signal {
    /// Opens the connection in the background (the loop does not wait for it); a broker
    /// that refuses it only costs the operator's condition its reason.
    pub fn raise(amqp_url: &str, timeout: Duration) -> Self {
        let (held, dropped) = oneshot::channel::<()>();
        let url = amqp_url.to_string();
        tokio::spawn(async move {
            match connect(&url, CREDENTIALS_REFUSED_CONNECTION, timeout).await {
                Ok(connection) => {
                    let _ = dropped.await;
                    let _ = connection
                        .close(200, "the provider takes the key".into())
                        .await;
                    debug!("closed the connection that said the provider refuses the key");
                }
                Err(e) => {
                    warn!(error = %e, "could not tell the operator that the provider refuses the key")
                }
            }
        });
        Self { _held: held }
    }
}
