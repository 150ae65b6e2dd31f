//! The fake API server against what kube-apiserver does, through `kube::Api` as the
//! controller uses it: each rule the controller's logic depends on, checked.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use mailer::spec::MailerPipeline;
use serde_json::json;

use mailer_testkit::fake_api::FakeApi;

const NS: &str = "prod";

fn pipeline(name: &str) -> serde_json::Value {
    json!({"apiVersion": "mailer.dev/v1alpha1", "kind": "MailerPipeline",
           "metadata": {"name": name, "namespace": NS},
           "spec": {"rabbitmq": {"connectionSecret": {"name": "conn"}}}})
}

fn secret(name: &str, labels: serde_json::Value) -> Secret {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "data": {"k": "dmFsdWU="}}))
    .unwrap()
}

#[tokio::test]
async fn status_is_a_subresource_and_generation_counts_spec_changes() {
    let fake = FakeApi::default();
    let api: Api<MailerPipeline> = Api::namespaced(fake.client(), NS);
    let mut with_status = pipeline("shop");
    with_status["status"] = json!({"observedGeneration": 7});
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(with_status).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.status.is_none(), "a create drops the status");
    assert!(created.metadata.uid.is_some());

    let patched = api
        .patch_status(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"observedGeneration": 1}, "spec": {"worker": {"replicas": 9}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.unwrap().observed_generation, Some(1));
    assert_eq!(
        patched.spec.worker.replicas, 1,
        "a status write changes only the status"
    );
    assert_eq!(patched.metadata.generation, Some(1), "nor the generation");

    let patched = api
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"observedGeneration": 5}, "metadata": {"labels": {"a": "b"}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.status.as_ref().unwrap().observed_generation,
        Some(1),
        "an object write never changes the status"
    );
    assert_eq!(patched.metadata.generation, Some(1), "metadata is not spec");

    let patched = api
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"worker": {"replicas": 3}}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, Some(2));

    let version = patched.metadata.resource_version.clone();
    let same = api
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"worker": {"replicas": 3}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        same.metadata.resource_version, version,
        "a write that changes nothing is none"
    );
}

#[tokio::test]
async fn a_stale_resource_version_is_a_conflict() {
    let fake = FakeApi::default();
    let api: Api<Secret> = Api::namespaced(fake.client(), NS);
    let first = api
        .create(&PostParams::default(), &secret("s", json!({})))
        .await
        .unwrap();
    let mut changed = first.clone();
    changed.metadata.labels = Some([("a".to_string(), "1".to_string())].into());
    api.replace("s", &PostParams::default(), &changed)
        .await
        .unwrap();
    let mut stale = first.clone();
    stale.metadata.labels = Some([("a".to_string(), "2".to_string())].into());
    let refused = api
        .replace("s", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, kube::Error::Api(ref s) if s.code == 409),
        "{refused}"
    );
    let refused = api
        .patch("s", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"resourceVersion": first.metadata.resource_version, "labels": {"a": "3"}}})))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, kube::Error::Api(ref s) if s.code == 409),
        "{refused}"
    );
    let again = api
        .create(&PostParams::default(), &secret("s", json!({})))
        .await
        .unwrap_err();
    assert!(
        matches!(again, kube::Error::Api(ref s) if s.code == 409 && s.reason == "AlreadyExists")
    );
}

#[tokio::test]
async fn finalizers_hold_a_deleted_object_and_owned_objects_go_with_their_owner() {
    let fake = FakeApi::default();
    let api: Api<MailerPipeline> = Api::namespaced(fake.client(), NS);
    let mut object = pipeline("shop");
    object["metadata"]["finalizers"] = json!(["mailer.dev/cleanup"]);
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(object).unwrap(),
        )
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(fake.client(), NS);
    let mut owned = secret("owned", json!({}));
    owned.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "mailer.dev/v1alpha1".into(),
            kind: "MailerPipeline".into(),
            name: "shop".into(),
            uid: created.metadata.uid.clone().unwrap(),
            controller: Some(true),
            ..Default::default()
        },
    ]);
    let owned = secrets
        .create(&PostParams::default(), &owned)
        .await
        .unwrap();
    assert_eq!(
        owned.metadata.owner_references.unwrap()[0].name,
        "shop",
        "owner references are kept"
    );

    api.delete("shop", &DeleteParams::default()).await.unwrap();
    let marked = api.get("shop").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    let refused = api
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(
                    json!([{"op": "add", "path": "/metadata/finalizers/-", "value": "other"}]),
                )
                .unwrap(),
            ),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(refused, kube::Error::Api(ref s) if s.code == 422),
        "no new finalizer while deleting"
    );
    assert!(secrets.get_opt("owned").await.unwrap().is_some());

    api.patch(
        "shop",
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(json!([{"op": "remove", "path": "/metadata/finalizers/0"}]))
                .unwrap(),
        ),
    )
    .await
    .unwrap();
    assert!(
        api.get_opt("shop").await.unwrap().is_none(),
        "gone with its last finalizer"
    );
    assert!(
        secrets.get_opt("owned").await.unwrap().is_none(),
        "what it owned went with it"
    );
}

#[tokio::test]
async fn watches_stream_what_happens_from_a_resource_version_through_label_selectors() {
    let fake = FakeApi::default();
    let api: Api<Secret> = Api::namespaced(fake.client(), NS);
    api.create(
        &PostParams::default(),
        &secret("before", json!({"app": "mail"})),
    )
    .await
    .unwrap();
    let list = api
        .list(&ListParams::default().labels("app=mail"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    let version = list.metadata.resource_version.unwrap();
    let events = api
        .watch(&WatchParams::default().labels("app=mail"), &version)
        .await
        .unwrap();
    tokio::pin!(events);
    api.create(
        &PostParams::default(),
        &secret("other", json!({"app": "web"})),
    )
    .await
    .unwrap();
    api.create(
        &PostParams::default(),
        &secret("new", json!({"app": "mail"})),
    )
    .await
    .unwrap();
    api.patch(
        "new",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "eA=="}})),
    )
    .await
    .unwrap();
    api.patch(
        "new",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await
    .unwrap();
    api.patch(
        "other",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "mail"}}})),
    )
    .await
    .unwrap();
    api.delete("before", &DeleteParams::default())
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let event = tokio::time::timeout(Duration::from_secs(5), events.try_next())
            .await
            .expect("events arrive as they happen")
            .unwrap()
            .unwrap();
        seen.push(match event {
            WatchEvent::Added(s) => format!("ADDED {}", s.metadata.name.unwrap()),
            WatchEvent::Modified(s) => format!("MODIFIED {}", s.metadata.name.unwrap()),
            WatchEvent::Deleted(s) => format!("DELETED {}", s.metadata.name.unwrap()),
            other => format!("{other:?}"),
        });
    }
    assert_eq!(
        seen,
        [
            "ADDED new",
            "MODIFIED new",
            "DELETED new",
            "ADDED other",
            "DELETED before"
        ]
    );
}

#[tokio::test]
async fn metadata_lists_and_watches_carry_no_data() {
    let fake = FakeApi::default();
    let api: Api<Secret> = Api::namespaced(fake.client(), NS);
    api.create(&PostParams::default(), &secret("a", json!({})))
        .await
        .unwrap();
    let list = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items[0].metadata.name.as_deref(), Some("a"));
    let metadata: Api<PartialObjectMeta<Secret>> = Api::namespaced(fake.client(), NS);
    let stream = watcher(metadata, watcher::Config::default()).applied_objects();
    tokio::pin!(stream);
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first.metadata.name.as_deref(), Some("a"));
    api.create(&PostParams::default(), &secret("b", json!({})))
        .await
        .unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(second.metadata.name.as_deref(), Some("b"));
    let requests = fake.take_requests();
    let watch = requests.iter().find(|r| r.is_watch()).unwrap();
    assert!(
        watch.accept.contains("as=PartialObjectMetadata"),
        "{}",
        watch.accept
    );
}

#[tokio::test]
async fn a_compacted_resource_version_is_gone_and_pages_continue() {
    let fake = FakeApi::default();
    let api: Api<Secret> = Api::namespaced(fake.client(), NS);
    for name in ["a", "b", "c"] {
        api.create(&PostParams::default(), &secret(name, json!({})))
            .await
            .unwrap();
    }
    let page = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(page.items.len(), 2);
    let token = page.metadata.continue_.clone().unwrap();
    let rest = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 1);
    assert!(rest.metadata.continue_.is_none());

    fake.compact();
    let events = api.watch(&WatchParams::default(), "1").await.unwrap();
    tokio::pin!(events);
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!(e.code, 410),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
}

mod address {
    use mailer_testkit::fake_api::address::*;

    #[test]
    fn paths_parse_into_addresses() {
        let a = Address::parse("/api/v1/namespaces/prod/secrets/conn").unwrap();
        assert_eq!(
            (
                a.prefix.as_str(),
                a.namespace.as_deref(),
                a.resource.as_str(),
                a.name.as_deref()
            ),
            ("/api/v1", Some("prod"), "secrets", Some("conn"))
        );
        assert_eq!(a.key(), "/api/v1/namespaces/prod/secrets/conn");
        let s =
            Address::parse("/apis/mailer.dev/v1alpha1/namespaces/prod/mailerpipelines/shop/status")
                .unwrap();
        assert_eq!(s.subresource.as_deref(), Some("status"));
        assert_eq!(
            s.key(),
            "/apis/mailer.dev/v1alpha1/namespaces/prod/mailerpipelines/shop"
        );
        let all = Address::parse("/apis/apps/v1/deployments").unwrap();
        assert!(all.namespace.is_none() && all.name.is_none());
        assert!(all.contains(&Address::parse("/apis/apps/v1/namespaces/x/deployments/d").unwrap()));
        let ns = Address::parse("/api/v1/namespaces/prod").unwrap();
        assert_eq!(
            (ns.resource.as_str(), ns.name.as_deref()),
            ("namespaces", Some("prod"))
        );
        assert!(Address::parse("/apis/rabbitmq.com/v1beta1").is_none());
        let q = Query::parse("labelSelector=a%3Db%2Cc&watch=true");
        assert_eq!(q.get("labelSelector"), Some("a=b,c"));
    }
}

mod selector {
    use mailer_testkit::fake_api::selector::*;
    use serde_json::json;

    #[test]
    fn selectors_match_as_the_api_server_does() {
        let object = json!({"metadata": {"labels": {"app": "mailer", "tier": "worker"}}});
        for (selector, expected) in [
            ("", true),
            ("app=mailer", true),
            ("app==mailer,tier=worker", true),
            ("app=other", false),
            ("app!=other", true),
            ("tier in (worker, web)", true),
            ("tier notin (worker)", false),
            ("app", true),
            ("!app", false),
            ("missing", false),
            ("!missing", true),
        ] {
            let parsed = Selector::parse(selector).unwrap();
            assert_eq!(parsed.matches(&object), expected, "{selector}");
        }
        assert!(
            !Selector::parse("app=mailer")
                .unwrap()
                .matches(&json!({"metadata": {}}))
        );
    }
}

mod patch {
    use mailer_testkit::fake_api::patch::*;
    use serde_json::json;

    #[test]
    fn a_failed_test_op_changes_nothing() {
        let mut object = json!({"metadata": {"finalizers": ["a"]}});
        let ops = json!([{"op": "remove", "path": "/metadata/finalizers/0"},
                         {"op": "test", "path": "/metadata/finalizers", "value": ["b"]}]);
        assert!(json_patch(&mut object, &ops).is_err());
        assert_eq!(object, json!({"metadata": {"finalizers": ["a"]}}));
        let ops = json!([{"op": "add", "path": "/metadata/labels", "value": {"a/b": "c"}},
                         {"op": "replace", "path": "/metadata/labels/a~1b", "value": "d"}]);
        json_patch(&mut object, &ops).unwrap();
        assert_eq!(object["metadata"]["labels"]["a/b"], "d");
    }
}

/// A raw request to `fake` as kubectl or Helm would send it.
async fn call(
    fake: &FakeApi,
    method: &str,
    path: &str,
    content_type: &str,
    accept: &str,
    body: Option<serde_json::Value>,
) -> Result<serde_json::Value, kube::Error> {
    let body = body.map_or_else(Vec::new, |b| serde_json::to_vec(&b).unwrap());
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .header("accept", accept)
        .body(body)
        .unwrap();
    fake.client().request::<serde_json::Value>(request).await
}

const JSON: &str = "application/json";
const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

fn code(result: Result<serde_json::Value, kube::Error>) -> u16 {
    match result {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(other) => panic!("{other}"),
    }
}

#[tokio::test]
async fn a_new_cluster_serves_what_its_crds_define_and_objects_need_their_namespace() {
    let fake = FakeApi::cluster(None);
    let pipelines = format!("/apis/mailer.dev/v1alpha1/namespaces/{NS}/mailerpipelines");
    let get = |path: String| {
        let fake = fake.clone();
        async move { call(&fake, "GET", &path, JSON, JSON, None).await }
    };
    assert_eq!(code(get("/apis/mailer.dev/v1alpha1".into()).await), 404);
    assert_eq!(
        code(get(pipelines.clone()).await),
        404,
        "no CRD, no resource"
    );
    let groups = get("/apis".into()).await.unwrap();
    assert!(!groups.to_string().contains("mailer.dev"));

    let crd: serde_json::Value = serde_yaml::from_str(&mailer::cli::crd::yaml().unwrap()).unwrap();
    let path = format!("{CRDS}/mailerpipelines.mailer.dev?fieldManager=kubectl&force=true");
    let applied = call(
        &fake,
        "PATCH",
        &path,
        "application/apply-patch+yaml",
        JSON,
        Some(crd),
    )
    .await
    .unwrap();
    let conditions = &applied["status"]["conditions"];
    assert!(
        conditions
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Established" && c["status"] == "True"),
        "{conditions}"
    );
    let resources = get("/apis/mailer.dev/v1alpha1".into()).await.unwrap();
    let resource = resources["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "mailerpipelines")
        .expect("served once the CRD is")
        .clone();
    assert_eq!(
        (
            &resource["kind"],
            &resource["shortNames"],
            &resource["namespaced"]
        ),
        (&json!("MailerPipeline"), &json!(["mp"]), &json!(true))
    );
    assert!(
        get("/apis".into())
            .await
            .unwrap()
            .to_string()
            .contains("mailer.dev/v1alpha1")
    );

    let refused = call(
        &fake,
        "POST",
        &pipelines,
        JSON,
        JSON,
        Some(pipeline("shop")),
    )
    .await;
    assert_eq!(code(refused), 404, "namespace {NS} does not exist yet");
    let namespace = call(
        &fake,
        "POST",
        "/api/v1/namespaces",
        JSON,
        JSON,
        Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})),
    )
    .await
    .unwrap();
    assert_eq!(namespace["status"]["phase"], "Active");
    assert_eq!(
        namespace["metadata"]["labels"]["kubernetes.io/metadata.name"],
        NS
    );
    call(
        &fake,
        "POST",
        &pipelines,
        JSON,
        JSON,
        Some(pipeline("shop")),
    )
    .await
    .unwrap();

    call(
        &fake,
        "DELETE",
        &format!("{CRDS}/mailerpipelines.mailer.dev"),
        JSON,
        JSON,
        None,
    )
    .await
    .unwrap();
    assert_eq!(code(get(pipelines).await), 404, "no longer served");
}

#[tokio::test]
async fn tables_field_selectors_core_events_and_string_data_as_kube_apiserver_answers_them() {
    let fake = FakeApi::cluster(None);
    let crd: serde_json::Value = serde_yaml::from_str(&mailer::cli::crd::yaml().unwrap()).unwrap();
    fake.put(&format!("{CRDS}/mailerpipelines.mailer.dev"), crd);
    fake.put(
        &format!("/api/v1/namespaces/{NS}"),
        json!({"apiVersion": "v1", "kind": "Namespace"}),
    );
    let mut shop = pipeline("shop");
    shop["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}],
                            "queues": {"send": 3, "retry": 5, "retryByTier": "1/4", "dead": 1}, "workers": {"ready": 2}});
    let pipelines = format!("/apis/mailer.dev/v1alpha1/namespaces/{NS}/mailerpipelines");
    fake.put(&format!("{pipelines}/shop"), shop);
    fake.put(&format!("{pipelines}/other"), pipeline("other"));

    let table = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    let answer = call(&fake, "GET", &pipelines, JSON, table, None)
        .await
        .unwrap();
    assert_eq!(answer["kind"], "Table");
    let names: Vec<&str> = answer["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "Name", "Ready", "Send", "Retry", "Tiers", "Dead", "Workers", "Age"
        ]
    );
    let cells = &answer["rows"][1]["cells"];
    assert_eq!(
        cells.as_array().unwrap()[..7],
        [
            json!("shop"),
            json!("True"),
            json!(3),
            json!(5),
            json!("1/4"),
            json!(1),
            json!(2)
        ]
    );
    assert_eq!(
        answer["rows"][0]["cells"][1],
        serde_json::Value::Null,
        "no status, no cell"
    );

    let selected = call(
        &fake,
        "GET",
        &format!("{pipelines}?fieldSelector=metadata.name%3Dshop"),
        JSON,
        JSON,
        None,
    )
    .await
    .unwrap();
    assert_eq!(selected["items"].as_array().unwrap().len(), 1);
    assert_eq!(selected["kind"], "MailerPipelineList");
    let unsupported = call(
        &fake,
        "GET",
        &format!("{pipelines}?fieldSelector=spec.x%3Dy"),
        JSON,
        JSON,
        None,
    )
    .await;
    assert_eq!(code(unsupported), 400);

    let secret = call(
        &fake,
        "POST",
        &format!("/api/v1/namespaces/{NS}/secrets"),
        JSON,
        JSON,
        Some(
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                    "stringData": {"url": "smtp://x"}}),
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        (&secret["data"]["url"], &secret["type"]),
        (&json!("c210cDovL3g="), &json!("Opaque"))
    );
    assert!(secret.get("stringData").is_none(), "never stored");

    // What the operator publishes through events.k8s.io/v1 is what kubectl describe
    // finds through core v1.
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "shop.1", "namespace": NS}, "reason": "TopologyCreated",
        "note": "made it", "type": "Normal", "reportingController": "mailer-operator",
        "regarding": {"kind": "MailerPipeline", "name": "shop", "namespace": NS, "uid": "u1"}});
    call(
        &fake,
        "POST",
        &format!("/apis/events.k8s.io/v1/namespaces/{NS}/events"),
        JSON,
        JSON,
        Some(event),
    )
    .await
    .unwrap();
    let core = call(
        &fake,
        "GET",
        &format!("/api/v1/namespaces/{NS}/events?fieldSelector=involvedObject.name%3Dshop,involvedObject.kind%3DMailerPipeline"),
        JSON,
        JSON,
        None,
    )
    .await
    .unwrap();
    let item = &core["items"][0];
    assert_eq!(
        (
            &item["apiVersion"],
            &item["message"],
            &item["involvedObject"]["uid"],
            &item["reportingComponent"]
        ),
        (
            &json!("v1"),
            &json!("made it"),
            &json!("u1"),
            &json!("mailer-operator")
        )
    );
    let none = call(
        &fake,
        "GET",
        &format!("/api/v1/namespaces/{NS}/events?fieldSelector=involvedObject.name%3Dother"),
        JSON,
        JSON,
        None,
    )
    .await
    .unwrap();
    assert!(none["items"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn strategic_merge_patches_merge_lists_by_key_and_unknown_fields_are_dropped_or_refused() {
    let fake = FakeApi::cluster(Some(super::clients::definitions()));
    fake.put(
        &format!("/api/v1/namespaces/{NS}"),
        json!({"apiVersion": "v1", "kind": "Namespace"}),
    );
    let deployments = format!("/apis/apps/v1/namespaces/{NS}/deployments");
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                 "template": {"metadata": {"labels": {"a": "b"}},
                              "spec": {"containers": [{"name": "one", "image": "i:1"},
                                                      {"name": "two", "image": "i:1", "args": ["x"]}]}}}});
    let strict = call(
        &fake,
        "POST",
        &format!("{deployments}?fieldValidation=Strict"),
        JSON,
        JSON,
        Some({
            let mut d = deployment.clone();
            d["spec"]["bogus"] = json!(1);
            d
        }),
    )
    .await;
    assert_eq!(code(strict), 400, "Strict refuses an unknown field");
    let mut warned = deployment.clone();
    warned["spec"]["bogus"] = json!(1);
    let created = call(&fake, "POST", &deployments, JSON, JSON, Some(warned))
        .await
        .unwrap();
    assert!(
        created["spec"].get("bogus").is_none(),
        "Warn (the default) drops it"
    );

    let patch = json!({"spec": {"replicas": 3, "template": {"spec": {
        "$setElementOrder/containers": [{"name": "two"}, {"name": "one"}],
        "containers": [{"name": "two", "image": "i:2"}]}}}});
    let patched = call(
        &fake,
        "PATCH",
        &format!("{deployments}/w"),
        "application/strategic-merge-patch+json",
        JSON,
        Some(patch),
    )
    .await
    .unwrap();
    let containers = &patched["spec"]["template"]["spec"]["containers"];
    assert_eq!(
        containers,
        &json!([{"name": "two", "image": "i:2", "args": ["x"]}, {"name": "one", "image": "i:1"}]),
        "merged by name, the other kept, in the order asked"
    );
    let delete = json!({"spec": {"template": {"spec": {"containers": [{"name": "one", "$patch": "delete"}]}}}});
    let patched = call(
        &fake,
        "PATCH",
        &format!("{deployments}/w"),
        "application/strategic-merge-patch+json",
        JSON,
        Some(delete),
    )
    .await
    .unwrap();
    assert_eq!(
        patched["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(patched["spec"]["replicas"], 3);

    let crd: serde_json::Value = serde_yaml::from_str(&mailer::cli::crd::yaml().unwrap()).unwrap();
    fake.put(&format!("{CRDS}/mailerpipelines.mailer.dev"), crd);
    let pipelines = format!("/apis/mailer.dev/v1alpha1/namespaces/{NS}/mailerpipelines");
    fake.put(&format!("{pipelines}/shop"), pipeline("shop"));
    let refused = call(
        &fake,
        "PATCH",
        &format!("{pipelines}/shop"),
        "application/strategic-merge-patch+json",
        JSON,
        Some(json!({"spec": {"worker": {"replicas": 2}}})),
    )
    .await;
    assert_eq!(
        code(refused),
        415,
        "custom resources take no strategic merge patch"
    );
}
