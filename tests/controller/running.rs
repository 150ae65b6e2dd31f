//! The controllers' wiring: watching pipelines triggers reconciles, synced caches make
//! the replica ready, and shutdown stops them.

use std::time::Duration;

use serde_json::json;

use super::broker::eventually;
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

#[tokio::test]
async fn watched_pipelines_are_reconciled_until_shutdown() {
    let h = harness();
    h.seed_pipeline("shop", PipelineSpec::new().build(), false);
    let health = controller_health();
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
    };
    run_controllers_until(&h, &health, Duration::from_secs(30), checking).await;
}

/// A pipeline the operator cannot deserialize (a field of a newer CRD) is reported on
/// its object, and the pipeline beside it is reconciled all the same.
#[tokio::test]
async fn an_unreadable_pipeline_does_not_stall_the_others() {
    let h = harness();
    let spec = PipelineSpec::new().build();
    h.seed_pipeline("good", spec.clone(), false);
    let mut newer = spec;
    newer["fieldOfANewerCrd"] = json!(true);
    h.seed_pipeline("newer", newer, false);
    let health = controller_health();
    let checking = async {
        eventually(20, "the good pipeline to be reconciled", || async {
            let stored = h.fake.get(&pipeline_path("good"))?;
            (stored["metadata"]["finalizers"] == json!([FINALIZER])).then_some(())
        })
        .await;
        let ready = eventually(20, "the unreadable pipeline to say so", || async {
            let stored = h.fake.get(&pipeline_path("newer"))?;
            let conditions = stored["status"]["conditions"].as_array()?.clone();
            conditions.into_iter().find(|c| c["type"] == "Ready")
        })
        .await;
        assert_eq!(ready["reason"], "Unreadable");
        assert!(
            ready["message"]
                .as_str()
                .unwrap()
                .contains("fieldOfANewerCrd"),
            "{ready}"
        );
    };
    run_controllers_until(&h, &health, Duration::from_secs(30), checking).await;
    let published = events(&h.fake.take_requests());
    assert_eq!(
        published
            .iter()
            .filter(|e| e.1 == "ReconcileFailedUnreadable")
            .count(),
        1,
        "{published:?}"
    );
}

/// A Secret a pipeline reads, created later, reconciles that pipeline: Secrets are
/// watched as metadata and mapped to the pipelines that read them through the index.
#[tokio::test]
async fn a_secret_that_appears_reconciles_the_pipeline_that_reads_it() {
    let h = harness();
    h.seed_pipeline("shop", PipelineSpec::new().build(), true);
    let health = controller_health();
    let reason = |h: &Harness| {
        let stored = h.fake.get(&pipeline_path("shop"))?;
        let conditions = stored["status"]["conditions"].as_array()?.clone();
        let ready = conditions.into_iter().find(|c| c["type"] == "Ready")?;
        ready["reason"].as_str().map(str::to_string)
    };
    let checking = async {
        eventually(20, "the missing Secret to be reported", || async {
            (reason(&h).as_deref() == Some("MissingSecret")).then_some(())
        })
        .await;
        // A failure that cannot pass waits for the resync (5 minutes): only the
        // Secret's watch event can bring the pipeline back now.
        connection_secret(&h, super::broker::CLOSED_MANAGEMENT_URL);
        eventually(
            20,
            "the pipeline to be reconciled with its Secret",
            || async { (reason(&h).as_deref() == Some("Unreachable")).then_some(()) },
        )
        .await;
        let watches: Vec<_> = h
            .fake
            .take_requests()
            .into_iter()
            .filter(|r| r.is_watch() && r.path.ends_with("/secrets"))
            .collect();
        // Only the operator's own Secrets (by its label) are watched whole.
        assert!(
            !watches.is_empty()
                && watches.iter().all(|w| {
                    w.accept.contains("as=PartialObjectMetadata")
                        || w.query.contains("managed-by%3Dmailer-operator")
                        || w.query.contains("managed-by=mailer-operator")
                }),
            "Secrets are watched as metadata only"
        );
    };
    run_controllers_until(&h, &health, Duration::from_secs(40), checking).await;
}
