//! The end-to-end run against a real cluster; see `end_to_end_on_a_real_cluster`.

use std::time::Duration;

use mailer::controller::Settings;
use mailer::spec::MailerPipeline;

use super::broker::eventually;

/// See `end_to_end_on_a_real_cluster` in controller.rs.
pub async fn end_to_end() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams};

    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "set KUBECONFIG to a test cluster"
    );
    mailer::install_crypto_provider();
    let client = kube::Client::try_default().await.expect("a cluster");
    let apply = PatchParams::apply("mailer-e2e").force();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition =
        serde_yaml::from_str(&mailer::cli::crd::yaml().unwrap()).unwrap();
    crds.patch("mailerpipelines.mailer.dev", &apply, &Patch::Apply(&crd))
        .await
        .expect("CRD installed");
    let namespace = "default";
    let image = std::env::var("MAILER_E2E_IMAGE").unwrap_or_else(|_| "mailer:dev".into());
    let options = mailer::controller::Options {
        namespaces: vec![namespace.to_string()],
        settings: Settings {
            worker_image: image,
            resync_interval: Duration::from_secs(30),
            concurrency: mailer::controller::context::DEFAULT_CONCURRENCY,
            cluster_name: "default".into(),
            queue_depth_interval: Duration::from_secs(30),
            definitions_max_age: mailer::controller::reconcile::apply::SHARED_DEFINITIONS_MAX_AGE,
            cleanup_deadline: Duration::from_secs(600),
            policy_window: mailer::controller::context::POLICY_WINDOW,
            claim_window: mailer::controller::context::CLAIM_WINDOW,
        },
        metrics_addr: "127.0.0.1:0".parse().unwrap(),
        leader: None,
        drain_timeout: Duration::from_secs(10),
    };
    let controller = tokio::spawn(mailer::controller::run(options));
    let examples = mailer_testkit::repo_root().join("examples");
    for file in [
        "rabbitmq-connection-secret.yaml",
        "smtp-provider-secret.yaml",
        "pipeline.yaml",
    ] {
        let text = std::fs::read_to_string(examples.join(file)).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let object: kube::api::DynamicObject =
                serde::Deserialize::deserialize(document).unwrap();
            let types = object.types.clone().expect("apiVersion and kind");
            let gvk = kube::core::GroupVersionKind::try_from(&types).unwrap();
            let (resource, _) = kube::discovery::pinned_kind(&client, &gvk).await.unwrap();
            let api: Api<kube::api::DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, &resource);
            let name = object.metadata.name.clone().unwrap();
            api.patch(&name, &apply, &Patch::Apply(&object))
                .await
                .expect("example applied");
        }
    }
    let pipelines: Api<MailerPipeline> = Api::namespaced(client.clone(), namespace);
    eventually(180, "the example pipeline to be Ready", || async {
        let pipeline = pipelines.get("shop").await.ok()?;
        pipeline.status.filter(|s| s.is_true("Ready")).map(|_| ())
    })
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client, namespace);
    deployments
        .get("shop-worker")
        .await
        .expect("the worker Deployment exists");
    controller.abort();
}
