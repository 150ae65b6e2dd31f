//! `mailer controller` as a process, against the in-memory API server served over HTTP:
//! it takes the Lease, reconciles, serves `/readyz` and `/metrics`, and on SIGTERM gives
//! the Lease up and exits cleanly.

use std::process::{Child, Command, Stdio};

use serde_json::json;

use super::broker::{eventually, unique};
use super::harness::*;

/// The controller process; killed when dropped, should a test fail before it stops.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/mailer-operator";

async fn get(url: &str) -> Option<(u16, String)> {
    let response = reqwest::get(url).await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn the_controller_process_leads_reconciles_and_stops_on_sigterm() {
    mailer::install_crypto_provider();
    let h = harness();
    h.seed_pipeline(
        "shop",
        json!({"rabbitmq": {"connectionSecret": {"name": "conn"}}}),
        false,
    );
    let server = h.fake.serve().await;
    let kubeconfig = std::env::temp_dir().join(format!("{}.yaml", unique("mailer-kubeconfig")));
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
             clusters: [{{name: fake, cluster: {{server: '{server}'}}}}]\n\
             users: [{{name: fake, user: {{token: test}}}}]\n\
             contexts: [{{name: fake, context: {{cluster: fake, user: fake}}}}]\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let metrics = format!("http://127.0.0.1:{port}");
    let mut controller = Running(
        Command::new(env!("CARGO_BIN_EXE_mailer"))
            .args([
                "controller",
                "--worker-image",
                "reg/mailer:test",
                "--namespace",
                NS,
            ])
            .args([
                "--identity",
                "pod-a",
                "--lease-namespace",
                "ops",
                "--lease-retry",
                "1s",
            ])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start mailer controller"),
    );

    eventually(30, "/readyz to answer ready", || async {
        let (status, _) = get(&format!("{metrics}/readyz")).await?;
        (status == 200).then_some(())
    })
    .await;
    let lease = h.fake.get(LEASE_PATH).expect("the Lease is created");
    assert_eq!(lease["spec"]["holderIdentity"], "pod-a");
    eventually(30, "the pipeline's finalizer", || async {
        let stored = h.fake.get(&pipeline_path("shop"))?;
        (stored["metadata"]["finalizers"] == json!([FINALIZER])).then_some(())
    })
    .await;
    let (_, text) = get(&format!("{metrics}/metrics")).await.expect("/metrics");
    assert!(text.contains("mailer_controller_leader 1"), "{text}");
    assert!(
        text.contains(r#"mailer_controller_reconciles_total{result="success",category="none"}"#),
        "{text}"
    );
    let (status, _) = get(&format!("{metrics}/livez")).await.expect("/livez");
    assert_eq!(status, 200);

    let term = Command::new("kill")
        .args(["-TERM", &controller.0.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(term.success());
    let exit = eventually(30, "the controller to exit", || {
        let exited = controller.0.try_wait().expect("wait");
        async move { exited }
    })
    .await;
    assert!(exit.success(), "{exit}");
    let lease = h.fake.get(LEASE_PATH).expect("the Lease stays");
    assert!(
        lease["spec"]["holderIdentity"].is_null(),
        "the Lease is given up: {lease}"
    );
    let _ = std::fs::remove_file(kubeconfig);
}
