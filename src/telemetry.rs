//! Logs, metrics and health: what every long-running role (`worker`, `controller`)
//! serves at `/metrics`, `/livez` and `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tracing_subscriber::EnvFilter;

/// Log line format, chosen with `MAIL_LOG_FORMAT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Log targets that would print what must never be logged.
const SILENCED: &str = "lapin::returned_messages=off";

/// Logs to standard error at `default_level`, or as `RUST_LOG` says.
pub fn init_logging(default_level: &str, format: LogFormat) {
    // lapin logs a returned message whole, mail body included: never let it.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(default_level))
        .add_directive(SILENCED.parse().expect("a valid directive"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
}

/// Whether a role is alive (its main loop keeps turning) and ready (doing its job).
///
/// Liveness is a heartbeat, not a constant: the main loop calls [`Health::beat`] on
/// every turn (and on a timer while idle), so a loop that hangs stops answering `/livez`
/// within `stall_after` and the kubelet restarts it.
#[derive(Debug)]
pub struct Health {
    ready: AtomicBool,
    /// Why the role is not ready, for `/readyz`'s answer.
    not_ready_because: std::sync::Mutex<&'static str>,
    last_beat: AtomicU64,
    stall_after: Duration,
}

impl Health {
    pub fn new(stall_after: Duration) -> Arc<Self> {
        let health = Self {
            ready: AtomicBool::new(false),
            not_ready_because: std::sync::Mutex::new("starting"),
            last_beat: AtomicU64::new(0),
            stall_after,
        };
        health.beat();
        Arc::new(health)
    }

    pub fn beat(&self) {
        self.last_beat.store(now_secs(), Ordering::Relaxed);
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Not ready, and why (shown by `/readyz`).
    pub fn set_not_ready(&self, because: &'static str) {
        *self
            .not_ready_because
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = because;
        self.set_ready(false);
    }

    /// Why the role is not ready (the last reason given), as `/readyz` says it.
    pub fn not_ready_because(&self) -> &'static str {
        *self
            .not_ready_because
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    pub fn is_live(&self) -> bool {
        now_secs().saturating_sub(self.last_beat.load(Ordering::Relaxed))
            <= self.stall_after.as_secs()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[derive(Clone)]
struct Served {
    registry: Arc<Registry>,
    health: Arc<Health>,
}

/// The `/metrics`, `/livez` and `/readyz` routes.
pub fn router(registry: Arc<Registry>, health: Arc<Health>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(Served { registry, health })
}

/// Serves [`router`] on `addr` until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /livez and /readyz");
    axum::serve(listener, router(registry, health))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Binds `addr` now, so a taken port is an error at start, then serves in the background.
pub async fn spawn_server(
    addr: SocketAddr,
    registry: Arc<Registry>,
    health: Arc<Health>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /livez and /readyz");
    let app = router(registry, health);
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics and health server stopped");
        }
    }))
}

async fn metrics(State(served): State<Served>) -> impl IntoResponse {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &served.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            String::new(),
        ),
    }
}

async fn livez(State(served): State<Served>) -> impl IntoResponse {
    if served.health.is_live() {
        (StatusCode::OK, "live\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "stalled: the main loop has not turned for too long\n",
        )
    }
}

async fn readyz(State(served): State<Served>) -> impl IntoResponse {
    if served.health.is_ready() {
        (StatusCode::OK, "ready\n".to_string())
    } else {
        let because = served.health.not_ready_because();
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {because}\n"),
        )
    }
}

/// A future that resolves on SIGTERM (what Kubernetes sends) or SIGINT (Ctrl-C): how every
/// process of the mailer is asked to stop. The handlers are installed before this
/// returns, not when the future is first polled.
pub fn stop_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_follows_the_heartbeat() {
        let health = Health::new(Duration::from_secs(30));
        assert!(health.is_live());
        health.last_beat.store(now_secs() - 31, Ordering::Relaxed);
        assert!(!health.is_live());
        health.beat();
        assert!(health.is_live());
    }

    #[test]
    fn readiness_is_off_until_set() {
        let health = Health::new(Duration::from_secs(30));
        assert!(!health.is_ready());
        health.set_ready(true);
        assert!(health.is_ready());
        health.set_not_ready("blocked");
        assert!(!health.is_ready());
        assert_eq!(health.not_ready_because(), "blocked");
    }
}
