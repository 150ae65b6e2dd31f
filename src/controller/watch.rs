//! What triggers a reconcile: a change of a pipeline, of what it owns (its worker
//! Deployment and Secret), of a Secret it names, and the periodic resync.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::watch as signal;

use super::context::Context;
use super::error::Error;
use super::meta::managed_by_selector;
use super::reconcile::{error_policy, reconcile_guarded};
use super::references::reads_secret;
use super::signalled;
use crate::spec::MailerPipeline;
use crate::telemetry::Health;

/// How often the heartbeat of `/livez` is given while controllers run.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// Runs one controller per namespace (one for all when `namespaces` is empty) until
/// `stop` or `abort` turns true. After `stop` no reconcile starts and those in flight
/// finish; `abort` drops those in flight at once (the Lease was lost, or they outlived
/// the drain after `stop`), so none of them writes anything more.
pub async fn run_controllers(
    client: Client,
    namespaces: &[String],
    ctx: Arc<Context>,
    health: &Health,
    stop: signal::Receiver<bool>,
    abort: signal::Receiver<bool>,
) {
    let scopes: Vec<Option<&str>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|ns| Some(ns.as_str())).collect()
    };
    let mut stores = Vec::new();
    let mut streams = Vec::new();
    for scope in scopes {
        let controller = controller_for(&client, scope);
        stores.push(controller.store());
        ctx.register_store(controller.store());
        let shutdown = shutdown_signal(stop.clone(), abort.clone());
        let aborted = abort.clone();
        let stream = controller
            .graceful_shutdown_on(shutdown)
            .run(
                move |pipeline, ctx| abortable(reconcile_guarded(pipeline, ctx), aborted.clone()),
                error_policy,
                ctx.clone(),
            )
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "controller event");
                }
            });
        streams.push(stream);
    }
    let all = futures::future::join_all(streams);
    tokio::pin!(all);
    let synced = futures::future::join_all(stores.iter().map(Store::wait_until_ready));
    tokio::pin!(synced);
    let mut is_synced = false;
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    loop {
        tokio::select! {
            _ = &mut all => break,
            _ = &mut synced, if !is_synced => {
                is_synced = true;
                health.set_ready(true);
                tracing::info!("caches synced: ready");
            }
            _ = heartbeat.tick() => health.beat(),
        }
    }
}

fn controller_for(
    client: &Client,
    namespace: Option<&str>,
) -> Controller<DeserializeGuard<MailerPipeline>> {
    fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let owned = watcher::Config::default().labels(&managed_by_selector());
    let controller = Controller::new(
        api::<DeserializeGuard<MailerPipeline>>(client, namespace),
        watcher::Config::default(),
    );
    let pipelines = controller.store();
    controller
        .owns(api::<Deployment>(client, namespace), owned.clone())
        .owns(api::<Secret>(client, namespace), owned)
        .watches(
            api::<Secret>(client, namespace),
            watcher::Config::default(),
            move |secret| pipelines_naming(&pipelines, &secret),
        )
}

fn pipelines_naming(
    pipelines: &Store<DeserializeGuard<MailerPipeline>>,
    secret: &Secret,
) -> Vec<ObjectRef<DeserializeGuard<MailerPipeline>>> {
    let namespace = secret.namespace().unwrap_or_default();
    let name = secret.name_any();
    pipelines
        .state()
        .iter()
        .filter(|p| {
            p.0.as_ref()
                .is_ok_and(|p| reads_secret(p, &namespace, &name))
        })
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

async fn shutdown_signal(mut stop: signal::Receiver<bool>, mut abort: signal::Receiver<bool>) {
    tokio::select! {
        () = signalled(&mut stop) => {}
        () = signalled(&mut abort) => {}
    }
}

/// `reconcile`, dropped (with whatever request it has in flight) the moment `abort`
/// turns true; one that starts after it does nothing.
async fn abortable(
    reconcile: impl Future<Output = Result<Action, Error>>,
    mut abort: signal::Receiver<bool>,
) -> Result<Action, Error> {
    tokio::select! {
        biased;
        () = signalled(&mut abort) => Ok(Action::await_change()),
        result = reconcile => result,
    }
}
