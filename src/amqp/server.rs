//! Which RabbitMQ version is behind an AMQP URL, from the server properties the broker
//! sends in `connection.start`.
//!
//! lapin 4.12 reads those properties during its handshake and keeps none of them, so this
//! opens a connection of its own, through the same TCP and TLS code lapin uses
//! (`lapin::tcp`, default TLS settings, as [`connect`](super::connect) has them), sends
//! the protocol header and reads the first frame. The broker sends `connection.start`
//! before any authentication, so no credentials are sent; the connection is dropped
//! once the frame is read (the broker logs it as closed during the handshake).

use std::time::Duration;

use futures::io::{AsyncReadExt, AsyncWriteExt};
use lapin::protocol::{AMQPClass, connection::AMQPMethod};
use lapin::tcp::{AMQPUriTcpExt, TLSConfig};
use lapin::types::AMQPValue;
use lapin::uri::AMQPUri;

use crate::redact::redact_url;

/// AMQP 0-9-1's protocol header.
const PROTOCOL_HEADER: &[u8; 8] = b"AMQP\x00\x00\x09\x01";
const METHOD_FRAME: u8 = 1;
const FRAME_END: u8 = 0xCE;
/// `connection.start` with RabbitMQ's properties is under 1 KiB; anything much larger is
/// not what a broker sends first.
const MAX_START_FRAME: u32 = 64 * 1024;

/// Why the version could not be read. Messages name the broker without the password.
#[derive(Debug, thiserror::Error)]
pub enum ServerVersionError {
    #[error("{url} is not an AMQP URL: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("cannot reach the broker at {url}: {source}")]
    Io { url: String, source: std::io::Error },
    #[error("the broker at {url} did not send its properties within {}", humantime::format_duration(*after))]
    Timeout { url: String, after: Duration },
    #[error("the broker at {url} did not answer as an AMQP 0-9-1 broker: {reason}")]
    NotAmqp { url: String, reason: String },
}

/// The `version` server property of the broker at `amqp_url`, e.g. `4.0.5`; `None` when
/// the broker sends none.
pub async fn server_version(
    amqp_url: &str,
    timeout: Duration,
) -> Result<Option<String>, ServerVersionError> {
    let url = redact_url(amqp_url);
    let uri: AMQPUri = amqp_url
        .parse()
        .map_err(|reason: String| ServerVersionError::BadUrl {
            url: url.clone(),
            reason,
        })?;
    let properties = match tokio::time::timeout(timeout, read_start(&uri)).await {
        Ok(Ok(start)) => start,
        Ok(Err(Failure::Io(source))) => return Err(ServerVersionError::Io { url, source }),
        Ok(Err(Failure::NotAmqp(reason))) => {
            return Err(ServerVersionError::NotAmqp { url, reason });
        }
        Err(_) => {
            return Err(ServerVersionError::Timeout {
                url,
                after: timeout,
            });
        }
    };
    Ok(properties
        .inner()
        .get("version")
        .and_then(|version| match version {
            AMQPValue::LongString(text) => Some(text.to_string()),
            AMQPValue::ShortString(text) => Some(text.to_string()),
            _ => None,
        }))
}

enum Failure {
    Io(std::io::Error),
    NotAmqp(String),
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// Connects, sends the protocol header and returns the server properties of the
/// `connection.start` that comes back.
async fn read_start(uri: &AMQPUri) -> Result<lapin::types::FieldTable, Failure> {
    let runtime = lapin::runtime::default_runtime()
        .map_err(|e| Failure::Io(std::io::Error::other(e.to_string())))?;
    let mut stream = uri
        .connect_with_config_async(TLSConfig::default(), &runtime)
        .await?;
    stream.write_all(PROTOCOL_HEADER).await?;
    stream.flush().await?;
    // A frame: type (1 byte), channel (2), payload size (4), payload, frame end (1).
    let mut header = [0u8; 7];
    stream.read_exact(&mut header).await?;
    if header.starts_with(b"AMQP") {
        return Err(Failure::NotAmqp(
            "it asks for another protocol version".into(),
        ));
    }
    let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]);
    if header[0] != METHOD_FRAME || size > MAX_START_FRAME {
        return Err(Failure::NotAmqp(format!(
            "its first frame is of type {} and {size} bytes",
            header[0]
        )));
    }
    let mut payload = vec![0u8; size as usize + 1];
    stream.read_exact(&mut payload).await?;
    if payload.pop() != Some(FRAME_END) {
        return Err(Failure::NotAmqp(
            "its first frame does not end as one".into(),
        ));
    }
    let _ = stream.close().await;
    start_properties(&payload)
}

/// The server properties of a `connection.start` method frame's payload.
fn start_properties(payload: &[u8]) -> Result<lapin::types::FieldTable, Failure> {
    match lapin::protocol::parse_class(payload) {
        Ok((_, AMQPClass::Connection(AMQPMethod::Start(start)))) => Ok(start.server_properties),
        Ok((_, other)) => Err(Failure::NotAmqp(format!(
            "it sent {other:?} instead of connection.start"
        ))),
        Err(e) => Err(Failure::NotAmqp(format!(
            "its connection.start does not parse: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_peer_that_is_not_a_broker_is_told_apart_without_the_password() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut header = [0u8; 8];
            socket.read_exact(&mut header).await.unwrap();
            socket
                .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                .await
                .unwrap();
        });
        let url = format!("amqp://u:hunter2@127.0.0.1:{port}/%2f");
        let error = server_version(&url, Duration::from_secs(5))
            .await
            .expect_err("not a broker");
        let message = error.to_string();
        assert!(
            matches!(error, ServerVersionError::NotAmqp { .. }),
            "{message}"
        );
        assert!(!message.contains("hunter2"), "{message}");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_silent_peer_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = format!("amqp://127.0.0.1:{port}");
        let error = server_version(&url, Duration::from_millis(300))
            .await
            .expect_err("no answer");
        assert!(
            matches!(error, ServerVersionError::Timeout { .. }),
            "{error}"
        );
        drop(listener);
    }
}
