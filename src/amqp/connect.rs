//! Connecting to the broker within a deadline: a peer that accepts TCP and never speaks
//! AMQP (a half-started broker, a wrong port) would otherwise hold the caller forever.

use std::time::Duration;

use lapin::uri::AMQPUri;
use lapin::{Connection, ConnectionProperties};

use crate::redact::redact_url;

/// How long connecting may take by default (`MAIL_CONNECT_TIMEOUT`).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why connecting failed. Its message names the broker without the password.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(
        "cannot connect to the broker at {url}: {source}; check that RabbitMQ is running and the URL and credentials are right"
    )]
    Failed { url: String, source: lapin::Error },
    #[error(
        "the broker at {url} did not complete the AMQP handshake within {}: is it starting, or is this not an AMQP port?",
        humantime::format_duration(*after)
    )]
    Timeout { url: String, after: Duration },
}

/// The largest frame our connections ask for, unless the URL names one (`?frame_max=`).
///
/// lapin keeps a receive and a send buffer of 32 frames per connection, filled with zeros
/// up front: at RabbitMQ's default of 128 KiB that is 8 MiB per connection, more than the
/// rest of an idle worker. At 32 KiB it is 2 MiB; a mail request of a few KiB still
/// travels in one frame, and a larger one in more frames of 8 bytes' overhead each.
pub const DEFAULT_FRAME_MAX: u32 = 32 * 1024;

/// Opens a connection named `name` (as the management UI shows it), or fails after
/// `timeout`. Frames are at most [`DEFAULT_FRAME_MAX`] unless the URL says otherwise.
pub async fn connect(url: &str, name: &str, timeout: Duration) -> Result<Connection, ConnectError> {
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    let connecting = async {
        match url.parse::<AMQPUri>() {
            Ok(mut uri) => {
                uri.query.frame_max.get_or_insert(DEFAULT_FRAME_MAX);
                Connection::connect_uri(uri, properties).await
            }
            // lapin says what is wrong with it, as before.
            Err(_) => Connection::connect(url, properties).await,
        }
    };
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(source)) => Err(ConnectError::Failed {
            url: redact_url(url),
            source,
        }),
        Err(_) => Err(ConnectError::Timeout {
            url: redact_url(url),
            after: timeout,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_peer_that_never_speaks_amqp_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = format!("amqp://u:hunter2@127.0.0.1:{port}/%2f");
        let error = connect(&url, "test", Duration::from_millis(300))
            .await
            .expect_err("no connection");
        assert!(matches!(error, ConnectError::Timeout { .. }), "{error}");
        let message = error.to_string();
        assert!(message.contains("within 300ms"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        drop(listener);
    }
}
