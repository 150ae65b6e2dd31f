//! Leader safety: every Lease call has a timeout, the leader steps down at its renew
//! deadline when renewals hang, and losing the Lease aborts the reconciles in flight.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use mailer::controller::runtime::leader::{LeaderElection, LeaseError};
use mailer::controller::runtime::leader::{Renewal, keep_leading};
use mailer::controller::runtime::watch::run_controllers;
use mailer::telemetry::Health;
use tokio::sync::watch;

use super::broker::{BlackHole, eventually};
use mailer_testkit::fake_api::FakeApi;
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases";

fn election(fake: &FakeApi, lease: Duration) -> LeaderElection {
    let api: Api<Lease> = Api::namespaced(fake.client(), "ops");
    LeaderElection::new(api, "mailer-operator", "pod-a", lease)
}

#[tokio::test]
async fn a_lease_call_that_hangs_times_out() {
    let fake = FakeApi::default();
    let a = election(&fake, Duration::from_secs(3));
    fake.stall(LEASES);
    let started = Instant::now();
    let error = a.try_lead().await.unwrap_err();
    assert!(matches!(error, LeaseError::TimedOut { .. }), "{error}");
    assert!(started.elapsed() < a.call_timeout() + Duration::from_millis(500));
}

#[tokio::test]
async fn a_leader_whose_renewals_hang_steps_down_at_its_renew_deadline() {
    let fake = FakeApi::default();
    let a = election(&fake, Duration::from_secs(3));
    let acquired = tokio::time::Instant::now();
    assert!(a.try_lead().await.unwrap());
    let (_done_tx, done) = watch::channel(false);
    let renewing = keep_leading(&a, Duration::from_millis(200), acquired, done);
    let stalling = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        fake.stall(LEASES);
        Instant::now()
    };
    let (renewal, stalled_at) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(renewing, stalling)
    })
    .await
    .expect("the leader steps down while its renewal hangs");
    assert_eq!(renewal, Renewal::Lost);
    // It last renewed at most one retry (200ms) before the stall; its deadline is two
    // thirds of the 3s Lease after that.
    let after_stall = stalled_at.elapsed();
    assert!(
        after_stall <= a.renew_deadline() + Duration::from_millis(300),
        "stepped down {after_stall:?} after renewals began to hang"
    );
    assert!(after_stall >= a.renew_deadline() - Duration::from_millis(500));
}

#[tokio::test]
async fn an_abort_drops_the_reconciles_in_flight_before_they_write() {
    let h = harness();
    let broker = BlackHole::start().await;
    connection_secret(&h, &broker.url);
    h.seed_pipeline("shop", PipelineSpec::new().build(), true);
    let health = Health::new(Duration::from_secs(60));
    let (_stop_tx, stop) = watch::channel(false);
    let (abort_tx, abort) = watch::channel(false);
    let namespaces = [NS.to_string()];
    let running = run_controllers(
        h.fake.client(),
        &namespaces,
        h.ctx.clone(),
        &health,
        stop,
        abort,
    );
    let aborting = async {
        eventually(20, "a reconcile to hang on the broker", || async {
            (broker.accepted() > 0).then_some(())
        })
        .await;
        h.fake.take_requests();
        abort_tx.send(true).unwrap();
        Instant::now()
    };
    let ((), aborted_at) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(running, aborting)
    })
    .await
    .expect("the controllers stop at once, without waiting for the broker");
    assert!(aborted_at.elapsed() < Duration::from_secs(2));
    // The reconcile, dropped, cannot write when the broker would have answered.
    assert_eq!(writes(&h.fake.take_requests()), Vec::<String>::new());
}
