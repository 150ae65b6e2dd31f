//! What triggers a reconcile: a change of a pipeline's spec or finalizers, of what it
//! owns (its worker Deployment and Secret), of a Secret it reads or the RabbitmqCluster
//! it uses, and the periodic resync. The pipelines and what the operator made (selected
//! by its label) are kept in memory, whole; all the rest is watched as metadata
//! (`docs/controller.md`).

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Predicate, PredicateConfig, WatchStreamExt, predicates, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::watch as signal;

use crate::controller::broker::connection::rabbitmq_cluster_resource;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::kube::owned::{Owned, OwnedStores, Packed};
use crate::controller::objects::meta::managed_by_selector;
use crate::controller::reconcile::{error_policy, reconcile_guarded};
use crate::controller::runtime::index::{Guarded, ReferenceIndex, Referenced};
use crate::controller::runtime::signalled;
use crate::telemetry::Health;

/// How many of its own Deployments or Secrets the operator lists at once when a watch
/// starts: a page is parsed whole before it is packed, and a parsed Deployment is
/// several times its JSON (`docs/benchmarks.md`, the controller's notes).
const OWNED_PAGE: u32 = 100;

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
        let controller = controller_for(&client, scope, &ctx).await;
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
    let mut aborted = abort;
    loop {
        tokio::select! {
            _ = &mut all => break,
            // kube's controller, stopped before its cache of pipelines is ready, never
            // ends: its runner waits for that cache, which its stopped watch no longer
            // fills. An abort (the drain timed out, or the Lease is lost) drops it.
            () = signalled(&mut aborted) => break,
            _ = &mut synced, if !is_synced => {
                is_synced = true;
                health.set_ready(true);
                tracing::info!("caches synced: ready");
            }
            _ = heartbeat.tick() => health.beat(),
        }
    }
}

/// The controller of one scope, running at most `--concurrency` reconciles at once.
/// Pipelines are watched whole, through `DeserializeGuard`, and reconciled when their
/// generation or finalizers change (their status written by the operator itself does
/// not trigger another reconcile). What they own (Deployment, Secret) is watched whole,
/// by the operator's label, into the caches the reconciles read ([`owned`](crate::controller::kube::owned)),
/// and the Secrets and RabbitmqClusters they refer to as metadata only, mapped through
/// the [`ReferenceIndex`].
async fn controller_for(
    client: &Client,
    namespace: Option<&str>,
    ctx: &Arc<Context>,
) -> Controller<Guarded> {
    let index = ReferenceIndex::default();
    let (reader, writer) = reflector::store();
    let pipelines = pipeline_triggers(api::<Guarded>(client, namespace), writer, index.clone());
    let (deployments, deployment_events) = owned_cache::<Deployment>(client, namespace, ctx);
    let (secrets, secret_events) = owned_cache::<Secret>(client, namespace, ctx);
    ctx.owned.register(OwnedStores {
        deployments,
        secrets,
    });
    let by_secret = index.clone();
    let mut controller = Controller::for_stream(pipelines, reader)
        .with_config(Config::default().concurrency(ctx.settings.concurrency))
        .reconcile_on(ctx.ahead.triggers(namespace))
        .owns_stream(deployment_events)
        .owns_stream(secret_events)
        .watches_stream(
            after_first_list(not_own_writes(
                watcher(
                    api::<PartialObjectMeta<Secret>>(client, namespace),
                    watcher::Config::default(),
                ),
                ctx.clone(),
                "Secret",
            )),
            move |secret| {
                by_secret.pipelines(&Referenced::Secret {
                    namespace: secret.namespace().unwrap_or_default(),
                    name: secret.name_any(),
                })
            },
        );
    if rabbitmq_clusters_served(client).await {
        let resource = rabbitmq_cluster_resource();
        let clusters: Api<PartialObjectMeta<DynamicObject>> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        controller = controller.watches_stream_with(
            after_first_list(watcher(clusters, watcher::Config::default())),
            move |cluster| {
                index.pipelines(&Referenced::Cluster {
                    namespace: cluster.namespace().unwrap_or_default(),
                    name: cluster.name_any(),
                })
            },
            resource,
        );
    }
    controller
}

/// The pipelines' watch as the controller's trigger: every event kept in `writer`'s store
/// (without its `managedFields`, which no reconcile reads and which a pipeline written by
/// several tools makes several times its own size) and the index, and passed on only when a pipeline's generation or finalizers changed
/// (a new pipeline, a spec change, the finalizer added, deletion), not for a status
/// write or another metadata change.
pub fn pipeline_triggers(
    api: Api<Guarded>,
    writer: reflector::store::Writer<Guarded>,
    index: ReferenceIndex,
) -> impl Stream<Item = Result<Guarded, watcher::Error>> + Send + 'static {
    watcher(api, watcher::Config::default())
        .default_backoff()
        .map_ok(move |event| {
            index.observe(&event);
            event
        })
        .modify(|pipeline| pipeline.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            predicates::generation::<Guarded>.combine(predicates::finalizers::<Guarded>),
            PredicateConfig::default(),
        )
}

/// The operator's own objects of kind `K` in the scope, whole but for their
/// `managedFields`, kept [`Packed`] in a cache; the stream of their changes (deletions
/// included) triggers their pipelines' reconciles once the cache holds the change. They
/// are listed [`OWNED_PAGE`] at a time.
fn owned_cache<K>(
    client: &Client,
    namespace: Option<&str>,
    ctx: &Arc<Context>,
) -> (
    Store<Packed<K>>,
    impl Stream<Item = Result<Packed<K>, watcher::Error>> + Send + 'static,
)
where
    K: Owned,
{
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default()
        .labels(&managed_by_selector())
        .page_size(OWNED_PAGE);
    let events = watcher(api::<K>(client, namespace), config)
        .map_ok(Packed::pack_event)
        .reflect(writer);
    (
        reader,
        after_first_list(not_own_writes(events, ctx.clone(), K::KIND)),
    )
}

/// A watch's events without those that are the operator's own writes coming back (an
/// object changed, in the very version the operator's write returned): they trigger no
/// reconcile, since the reconcile that wrote them already acted on them. A deletion, or
/// a change by anyone else, still triggers one.
fn not_own_writes<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    ctx: Arc<Context>,
    kind: &'static str,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: kube::Resource + Send + 'static,
{
    events.try_filter(move |event| {
        let ctx = ctx.clone();
        let changed = match event {
            watcher::Event::Apply(object) => Some(object.meta().clone()),
            _ => None,
        };
        async move {
            let Some(meta) = changed else {
                return true;
            };
            // The event may come back before the write that made it has returned.
            ctx.owned.writes_done(kind, &meta).await;
            !ctx.owned.is_own_write(kind, &meta)
        }
    })
}

/// The objects a watch's events touch, to trigger the reconciles of the pipelines they
/// map to, except those of its first list: at start every pipeline is reconciled once,
/// from its own watch's list, and the lists of what pipelines own or read would only
/// reconcile each again (one pipeline 3 times or more). A later list (the watch
/// reconnected) does trigger, since things may have changed meanwhile. The watch backs
/// off after errors as kube's own do.
fn after_first_list<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Send + 'static,
{
    let mut listed = false;
    events
        .default_backoff()
        .map_ok(move |event| {
            let objects = match event {
                watcher::Event::InitDone => {
                    listed = true;
                    None
                }
                watcher::Event::InitApply(_) if !listed => None,
                watcher::Event::Init => None,
                watcher::Event::Apply(object)
                | watcher::Event::InitApply(object)
                | watcher::Event::Delete(object) => Some(object),
            };
            futures::stream::iter(objects.map(Ok))
        })
        .try_flatten()
}

/// Whether RabbitMQ's cluster-operator CRD is installed, so RabbitmqClusters can be
/// watched.
async fn rabbitmq_clusters_served(client: &Client) -> bool {
    let resource = rabbitmq_cluster_resource();
    match client.list_api_group_resources(&resource.api_version).await {
        Ok(list) => list.resources.iter().any(|r| r.name == resource.plural),
        Err(e) => {
            tracing::info!(error = %e, "RabbitmqClusters are not served: not watching them");
            false
        }
    }
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
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
