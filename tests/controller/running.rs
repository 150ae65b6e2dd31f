//! The controllers' wiring: watching pipelines triggers reconciles, synced caches make
//! the replica ready, and shutdown stops them.

use std::time::Duration;

use mailer::controller::watch::run_controllers;
use mailer::telemetry::Health;
use serde_json::json;
use tokio::sync::watch;

use super::broker::eventually;
use super::harness::*;

#[tokio::test]
async fn watched_pipelines_are_reconciled_until_shutdown() {
    let h = harness();
    h.seed_pipeline(
        "shop",
        json!({"rabbitmq": {"connectionSecret": {"name": "conn"}}}),
        false,
    );
    let health = Health::new(Duration::from_secs(60));
    let (stop_tx, stop) = watch::channel(false);
    let (_lost_tx, lost) = watch::channel(false);
    let namespaces = [NS.to_string()];
    let running = run_controllers(
        h.fake.client(),
        &namespaces,
        h.ctx.clone(),
        &health,
        stop,
        lost,
    );
    let checking = async {
        eventually(20, "the finalizer to be added by a reconcile", || async {
            let stored = h.fake.get(&pipeline_path("shop"))?;
            (stored["metadata"]["finalizers"] == json!([FINALIZER])).then_some(())
        })
        .await;
        eventually(20, "readiness once the caches synced", || async {
            health.is_ready().then_some(())
        })
        .await;
        stop_tx.send(true).unwrap();
    };
    tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(running, checking)
    })
    .await
    .expect("the controllers stop on shutdown");
}
