//! A hostile tenant: what a namespace's editor can write (its pipelines' specs, its
//! Secrets, the worker Secret the operator made, annotations) in every combination that
//! once made the operator act on someone else's objects, against the real broker. After
//! each step the broker's state of everyone else (the platform's vhost, users and
//! markers; another tenant's pipeline) is compared whole with what it was before.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use kube::runtime::controller::Action;
use mailer::controller::{Error, reconcile};
use mailer::spec::MailerPipeline;
use mailer::topology::ownership::{Claim, marked_claims};
use serde_json::{Value, json};

use super::broker::{UserCleanup, secret_uri, unique};
use mailer_testkit::broker::{TestBroker, TestVhost, management, management_host};
use mailer_testkit::fake_api::Recorded;
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

/// The namespace of the other tenant, whose pipeline the hostile one goes after.
const VICTIM_NS: &str = "victim";

pub fn pipeline_path_in(namespace: &str, name: &str) -> String {
    format!("/apis/mailer.dev/v1alpha1/namespaces/{namespace}/mailerpipelines/{name}")
}

pub fn secret_path_in(namespace: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/secrets/{name}")
}

/// A Secret `namespace/name` with `data`, as its namespace's editor writes it.
pub fn put_secret(h: &Harness, namespace: &str, name: &str, data: &[(&str, &str)]) {
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), json!(BASE64.encode(v))))
        .collect();
    h.fake.put(
        &secret_path_in(namespace, name),
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": name, "namespace": namespace}, "data": data}),
    );
}

/// Rewrites the data of the Secret `namespace/name` as `kubectl edit` would: its
/// metadata (owner references, labels) stays.
pub fn edit_secret_data(h: &Harness, namespace: &str, name: &str, data: &[(&str, &str)]) {
    let path = secret_path_in(namespace, name);
    let mut secret = h.fake.get(&path).expect("the Secret");
    secret["data"] = data
        .iter()
        .map(|(k, v)| (k.to_string(), json!(BASE64.encode(v))))
        .collect::<serde_json::Map<String, Value>>()
        .into();
    h.fake.put(&path, secret);
}

/// The connection Secret `conn` of `namespace`, to the test broker as guest.
pub fn put_connection(h: &Harness, namespace: &str) {
    put_secret(
        h,
        namespace,
        "conn",
        &[
            ("uri", &secret_uri()),
            ("username", "guest"),
            ("password", "guest"),
            ("amqpUri", &amqp_uri()),
        ],
    );
}

/// A pipeline `namespace/name` with `spec`, its finalizer already added.
pub fn put_pipeline(h: &Harness, namespace: &str, name: &str, spec: Value) {
    h.fake.put(
        &pipeline_path_in(namespace, name),
        json!({"apiVersion": "mailer.dev/v1alpha1", "kind": "MailerPipeline",
               "metadata": {"name": name, "namespace": namespace, "generation": 1,
                            "uid": format!("uid-{namespace}-{name}"), "finalizers": [FINALIZER]},
               "spec": spec}),
    );
}

/// Changes the spec of `namespace/name` as `kubectl edit` would: a new generation.
pub fn edit_spec(h: &Harness, namespace: &str, name: &str, edit: impl FnOnce(&mut Value)) {
    let path = pipeline_path_in(namespace, name);
    let mut object = h.fake.get(&path).expect("the pipeline");
    edit(&mut object["spec"]);
    let generation = object["metadata"]["generation"].as_i64().unwrap_or(1);
    object["metadata"]["generation"] = json!(generation + 1);
    h.fake.put(&path, object);
}

pub async fn reconcile_in(
    h: &Harness,
    namespace: &str,
    name: &str,
) -> (Result<Action, Error>, Vec<Recorded>) {
    let object = h
        .fake
        .get(&pipeline_path_in(namespace, name))
        .expect("the pipeline");
    let pipeline: MailerPipeline = serde_json::from_value(object).expect("a pipeline");
    h.fake.take_requests();
    let result = reconcile(Arc::new(pipeline), h.ctx.clone()).await;
    let requests = h.fake.take_requests();
    assert_listed_in_rbac(&requests);
    (result, requests)
}

/// GETs `path` below the management API as guest; `None` on 404.
async fn get(path: &str) -> Option<Value> {
    let response = reqwest::Client::new()
        .get(format!("http://{}/api/{path}", management_host()))
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .expect("the management API answers");
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        return None;
    }
    assert!(response.status().is_success(), "GET {path}: {response:?}");
    Some(response.json().await.expect("JSON"))
}

fn pick(object: &Value, fields: &[&str]) -> Value {
    Value::Object(
        fields
            .iter()
            .map(|field| (field.to_string(), object[*field].clone()))
            .collect(),
    )
}

fn list(value: Option<Value>) -> Vec<Value> {
    value
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

/// Everything the broker holds of `vhosts` and `users`: each vhost, its exchanges,
/// queues, bindings, policies and permissions; each
/// user, its tags, password hash and permissions; and every owner marker that names one
/// of them. What else shares the broker (other tests run at once) is left out.
pub async fn broker_state(vhosts: &[&str], users: &[&str]) -> BTreeMap<String, Value> {
    let mut state = BTreeMap::new();
    for vhost in vhosts {
        let Some(found) = get(&format!("vhosts/{vhost}")).await else {
            state.insert(format!("vhost {vhost}"), json!("absent"));
            continue;
        };
        state.insert(format!("vhost {vhost}"), pick(&found, &["name"]));
        for e in list(get(&format!("exchanges/{vhost}")).await) {
            state.insert(
                format!("exchange {vhost} {}", e["name"]),
                pick(
                    &e,
                    &["type", "durable", "auto_delete", "internal", "arguments"],
                ),
            );
        }
        for q in list(get(&format!("queues/{vhost}")).await) {
            state.insert(
                format!("queue {vhost} {}", q["name"]),
                // Not its `policy`: a statistic, reported seconds late for a new queue.
                pick(&q, &["type", "durable", "arguments"]),
            );
        }
        for b in list(get(&format!("bindings/{vhost}")).await) {
            state.insert(
                format!(
                    "binding {vhost} {} -> {} {}",
                    b["source"], b["destination"], b["routing_key"]
                ),
                pick(&b, &["arguments"]),
            );
        }
        for p in list(get(&format!("policies/{vhost}")).await) {
            state.insert(
                format!("policy {vhost} {}", p["name"]),
                pick(&p, &["pattern", "definition", "priority", "apply-to"]),
            );
        }
        for p in list(get(&format!("vhosts/{vhost}/permissions")).await) {
            state.insert(
                format!("permissions {vhost} {}", p["user"]),
                pick(&p, &["configure", "write", "read"]),
            );
        }
    }
    for user in users {
        let found = get(&format!("users/{user}")).await;
        state.insert(
            format!("user {user}"),
            found.map_or(json!("absent"), |u| pick(&u, &["tags", "password_hash"])),
        );
        for p in list(get(&format!("users/{user}/permissions")).await) {
            state.insert(
                format!(
                    "permissions {} {user}",
                    p["vhost"].as_str().unwrap_or_default()
                ),
                pick(&p, &["configure", "write", "read"]),
            );
        }
    }
    // A claim counts once per marker naming it: a pipeline marker's each on its own, so a
    // claim of someone else's in a tenant's own pipeline marker is seen as such.
    for parameter in list(get("global-parameters").await) {
        let name = parameter["name"].as_str().unwrap_or_default().to_string();
        let value = &parameter["value"];
        let legacy = vhosts
            .iter()
            .any(|v| name.starts_with(&format!("mailer-owner|topology|{v}|")));
        if legacy {
            state.insert(format!("marker {name}"), value.clone());
        }
        let mut owner = value.clone();
        let of_pipeline = owner
            .as_object_mut()
            .and_then(|fields| fields.remove("claims"))
            .is_some();
        for claim in marked_claims(&name, value) {
            let named = match &claim {
                Claim::User { name: user } => users.contains(&user.as_str()),
                claim => claim.vhost().is_some_and(|v| vhosts.contains(&v)),
            };
            let key = match of_pipeline {
                true => format!("marker {} in {name}", claim.id()),
                false => format!("marker {name}"),
            };
            if named {
                state.insert(key, owner.clone());
            }
        }
    }
    state
}

/// Fails, naming every difference, unless `after` holds everything `before` did as it
/// was, and nothing more; what `is_theirs` says is the hostile tenant's own may change.
pub fn assert_unchanged(
    step: &str,
    before: &BTreeMap<String, Value>,
    after: &BTreeMap<String, Value>,
    is_theirs: impl Fn(&str) -> bool,
) {
    let mut changed = Vec::new();
    for (key, was) in before.iter().filter(|(key, _)| !is_theirs(key)) {
        match after.get(key) {
            Some(now) if now == was => {}
            Some(now) => changed.push(format!("{key}: {was} -> {now}")),
            None => changed.push(format!("{key}: {was} -> gone")),
        }
    }
    for (key, now) in after {
        if !before.contains_key(key) && !is_theirs(key) {
            changed.push(format!("{key}: new {now}"));
        }
    }
    assert!(
        changed.is_empty(),
        "{step}: the hostile tenant changed someone else's broker state:\n{}",
        changed.join("\n")
    );
}

/// A RabbitMQ user made by the platform, with `tags`, permissions on `vhost`.
async fn platform_user(name: &str, tags: &str, vhost: &str) {
    use rabbitmq_http_client::password_hashing::{
        HashingAlgorithm, base64_encoded_salted_password_hash, salt,
    };
    let api = mailer_testkit::broker::raw_api();
    let hash =
        base64_encoded_salted_password_hash(&salt(), "platform-pw", &HashingAlgorithm::SHA256);
    api.create_user(&rabbitmq_http_client::requests::UserParams {
        name,
        password_hash: &hash,
        tags,
    })
    .await
    .expect("a platform user");
    api.declare_permissions(&rabbitmq_http_client::requests::Permissions {
        user: name,
        vhost,
        configure: ".*",
        write: ".*",
        read: ".*",
    })
    .await
    .expect("its permissions");
}

/// The platform's vhost: the default topology applied by hand (no owner markers), as
/// `mailer topology apply` or a platform's own tooling would.
async fn platform_vhost() -> TestVhost {
    let vhost = TestVhost::fresh("hostile-platform");
    let spec: mailer::spec::MailerPipelineSpec =
        serde_yaml::from_str(&format!("rabbitmq: {{vhost: {}}}", vhost.name)).expect("a spec");
    let topology = mailer::topology::Topology::desired(
        &vhost.name,
        &spec.topology,
        TestBroker::get().capabilities(),
    )
    .expect("a topology");
    mailer::topology::apply(&management(), &topology)
        .await
        .expect("the platform's topology");
    vhost
}

fn delete_policy(vhost: &str) -> Value {
    PipelineSpec::new()
        .vhost(vhost)
        .deletion_policy("Delete")
        .build()
}

/// Own names for every object, prefixed.
fn own_names(prefix: &str) -> Value {
    json!({"exchange": format!("{prefix}"), "queue": format!("{prefix}.send"),
           "retryExchange": format!("{prefix}.retry"), "retryQueue": format!("{prefix}.send.retry"),
           "deadExchange": format!("{prefix}.dead"), "deadQueue": format!("{prefix}.send.dead"),
           "deletionPolicy": "Delete"})
}

fn refused(result: &Result<Action, Error>, reason: &str, says: &str) {
    let error = result.as_ref().expect_err("refused");
    assert_eq!(error.reason(), reason, "{error}");
    assert!(error.to_string().contains(says), "{says:?} not in {error}");
}

#[tokio::test]
async fn a_hostile_tenant_changes_nothing_of_anyone_elses() {
    let h = harness();
    let platform = platform_vhost().await;
    let victims = TestVhost::fresh("hostile-victim");
    let own = TestVhost::fresh("hostile-own");
    let (admin, app) = (unique("platform-admin"), unique("platform-app"));
    let (victim, evil) = (unique("shop"), unique("evil"));
    let victim_user = format!("mailer-worker.default.{VICTIM_NS}.{victim}");
    let evil_user = worker_user(&evil);
    let _users = UserCleanup(vec![
        admin.clone(),
        app.clone(),
        victim_user.clone(),
        evil_user.clone(),
    ]);
    platform_user(&admin, "administrator", &platform.name).await;
    platform_user(&app, "", &platform.name).await;

    // Another tenant's pipeline, built and in sync.
    put_connection(&h, VICTIM_NS);
    put_pipeline(&h, VICTIM_NS, &victim, delete_policy(&victims.name));
    reconcile_in(&h, VICTIM_NS, &victim)
        .await
        .0
        .expect("the victim's pipeline");

    // The hostile tenant's own pipeline, in a vhost of its own, deletionPolicy Delete.
    put_connection(&h, NS);
    put_pipeline(&h, NS, &evil, delete_policy(&own.name));
    reconcile_in(&h, NS, &evil)
        .await
        .0
        .expect("its own pipeline");

    let vhosts = [platform.name.as_str(), victims.name.as_str()];
    let users = [admin.as_str(), app.as_str(), victim_user.as_str()];
    let worker_secret = format!("{evil}-worker-amqp");
    // The hostile tenant's own: its user's permissions and objects in a vhost it shares.
    let theirs = |key: &str| key.contains(&evil_user) || key.contains("evil-own");

    // 1. The worker Secret the operator made names someone else's user: the platform's
    //    administrator, a platform application's, the other tenant's workers'.
    for target in [&admin, &app, &victim_user] {
        let before = broker_state(&vhosts, &users).await;
        let url = h.secret_value(&worker_secret, "url");
        edit_secret_data(
            &h,
            NS,
            &worker_secret,
            &[("username", target), ("password", "x"), ("url", &url)],
        );
        let (result, requests) = reconcile_in(&h, NS, &evil).await;
        result.expect("its own pipeline goes on");
        assert_unchanged(
            &format!("username {target}"),
            &before,
            &broker_state(&vhosts, &users).await,
            theirs,
        );
        assert_eq!(
            h.secret_value(&worker_secret, "username"),
            evil_user,
            "the tampered Secret is put back"
        );
        // Told once, then counted in that event's series (the same object version).
        let told = events(&requests)
            .iter()
            .any(|e| e.1 == "TopologyRepaired" && e.2.contains(&worker_secret))
            || event_repeats(&requests)
                .iter()
                .any(|(reason, _)| reason == "TopologyRepaired");
        assert!(
            told,
            "a tampered Secret is reported: {:#?}",
            writes(&requests)
        );
    }

    // 2. Its url names the platform's vhost or the other tenant's, with the annotation
    //    that once said the user was the operator's to delete.
    for vhost in vhosts {
        let before = broker_state(&vhosts, &users).await;
        let url = format!("{}/{vhost}", amqp_uri().replace("amqp://", "amqp://x:y@"));
        edit_secret_data(
            &h,
            NS,
            &worker_secret,
            &[("username", &evil_user), ("password", "x"), ("url", &url)],
        );
        let mut secret = h.fake.get(&secret_path(&worker_secret)).unwrap();
        secret["metadata"]["annotations"] = json!({"mailer.dev/user-managed": "true"});
        h.fake.put(&secret_path(&worker_secret), secret);
        reconcile_in(&h, NS, &evil)
            .await
            .0
            .expect("its own pipeline goes on");
        assert_unchanged(
            &format!("url to {vhost}"),
            &before,
            &broker_state(&vhosts, &users).await,
            theirs,
        );
    }

    // 3. Its spec names the platform's vhost (objects nobody's marker names), then the
    //    other tenant's: with the default names, with only the send queue its own, with
    //    the other's dead queue as its send queue. Each is refused before any write.
    let steps: Vec<(&str, Value, &str, &str)> = vec![
        (
            "the platform's vhost",
            json!({"vhost": platform.name}),
            "Conflict",
            "no pipeline's owner marker names it",
        ),
        (
            "the other tenant's vhost",
            json!({"vhost": victims.name}),
            "Conflict",
            &victim,
        ),
        (
            "only its send queue its own",
            json!({"vhost": victims.name, "queue": "evil-own.send"}),
            "Conflict",
            "exchange \"mail\"",
        ),
        (
            "the other's dead queue as its send queue",
            json!({"vhost": victims.name, "names": own_names("evil-own"), "queue": "mail.send.dead"}),
            "Conflict",
            "queue \"mail.send.dead\"",
        ),
    ];
    for (step, change, reason, says) in steps {
        let before = broker_state(&vhosts, &users).await;
        edit_spec(&h, NS, &evil, |spec| {
            spec["rabbitmq"]["vhost"] = change["vhost"].clone();
            if let Some(names) = change.get("names") {
                spec["topology"] = names.clone();
            }
            if let Some(queue) = change.get("queue") {
                spec["topology"]["queue"] = queue.clone();
            }
        });
        let (result, _) = reconcile_in(&h, NS, &evil).await;
        refused(&result, reason, says);
        assert_unchanged(step, &before, &broker_state(&vhosts, &users).await, |_| {
            false
        });
    }

    // 4. Names of its own in the other tenant's vhost: allowed (the vhost is shared),
    //    and nothing of the other tenant's changes.
    let before = broker_state(&vhosts, &users).await;
    edit_spec(&h, NS, &evil, |spec| {
        spec["rabbitmq"]["vhost"] = json!(victims.name);
        spec["topology"] = own_names("evil-own");
    });
    reconcile_in(&h, NS, &evil)
        .await
        .0
        .expect("names of its own are its own");
    assert_unchanged(
        "names of its own beside the other's",
        &before,
        &broker_state(&vhosts, &users).await,
        theirs,
    );

    // 5. Its workers' user named by a Secret of its own, as the platform's
    //    administrator: used as given, never reset, never deleted.
    let before = broker_state(&vhosts, &users).await;
    put_secret(
        &h,
        NS,
        "own-user",
        &[("username", &admin), ("password", "guessed")],
    );
    edit_spec(&h, NS, &evil, |spec| {
        spec["worker"] = json!({"userSecret": {"name": "own-user"}});
    });
    reconcile_in(&h, NS, &evil)
        .await
        .0
        .expect("a user of its own");
    assert_unchanged(
        "userSecret naming the administrator",
        &before,
        &broker_state(&vhosts, &users).await,
        theirs,
    );

    // 6. Deleted under deletionPolicy Delete: only what it holds goes.
    let before = broker_state(&vhosts, &users).await;
    h.fake
        .delete(&pipeline_path_in(NS, &evil))
        .expect("the pipeline is deleted");
    reconcile_in(&h, NS, &evil).await.0.expect("cleaned up");
    let after = broker_state(&vhosts, &users).await;
    let its_own_went = |key: &str| theirs(key);
    let kept: BTreeMap<String, Value> = before
        .into_iter()
        .filter(|(key, _)| !its_own_went(key))
        .collect();
    assert_unchanged("deletion", &kept, &after, |_| false);
    for key in after.keys() {
        assert!(!theirs(key), "{key} of the deleted pipeline is left");
    }

    // The other tenant's pipeline is still in sync: its reconcile writes nothing.
    let writes_before = h.ctx.brokers.get(&endpoint()).expect("client").writes();
    reconcile_in(&h, VICTIM_NS, &victim)
        .await
        .0
        .expect("still in sync");
    assert_eq!(
        h.ctx.brokers.get(&endpoint()).expect("client").writes(),
        writes_before,
        "the other tenant's pipeline needed no repair"
    );
}

fn endpoint() -> mailer::topology::ManagementEndpoint {
    mailer::topology::ManagementEndpoint::with_credentials(&secret_uri(), "guest", "guest")
        .expect("endpoint")
}
