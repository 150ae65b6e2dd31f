//! Deletion and idempotence: a broker outage during deletion is waited out (until the
//! cleanup deadline), and the workers' password is saved before RabbitMQ is told it.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use kube::runtime::controller::Action;
use mailer::topology::users::password_matches;
use serde_json::json;

use super::broker::unique_pipeline;
use super::broker::{CLOSED_MANAGEMENT_URL, UserCleanup, secret_uri, unique};
use mailer_testkit::broker::{TestVhost, raw_api};
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

/// The broker is away when the pipeline is deleted, and comes back: the cleanup is
/// retried (the finalizer stays), then removes the worker user and the queues.
#[tokio::test]
async fn deletion_during_a_broker_outage_waits_for_the_broker() {
    let h = harness();
    let (name, _users) = unique_pipeline("shop");
    let vhost = TestVhost::fresh("controller-outage");
    let user = worker_user(&name);
    connection_secret(&h, &secret_uri());
    let spec = PipelineSpec::new()
        .vhost(&vhost.name)
        .deletion_policy("Delete")
        .build();
    h.seed_pipeline(&name, spec, true);
    h.reconcile(&name).await.0.unwrap();
    let admin = raw_api();
    admin.get_user(&user).await.expect("the worker user exists");

    // The broker goes away (its address no longer answers), and the pipeline is deleted.
    connection_secret(&h, CLOSED_MANAGEMENT_URL);
    h.mark_deleted(&name);
    let (result, requests) = h.reconcile(&name).await;
    let error = result.unwrap_err();
    assert_eq!(error.category(), "unreachable", "{error}");
    assert_eq!(
        writes(&requests),
        Vec::<String>::new(),
        "the finalizer stays"
    );

    // It comes back.
    connection_secret(&h, &secret_uri());
    let (result, requests) = h.reconcile(&name).await;
    assert_eq!(result.unwrap(), Action::await_change());
    let published = events(&requests);
    assert_eq!(published[0].1, "CleanedUp", "{published:?}");
    assert!(
        admin.get_user(&user).await.is_err(),
        "the worker user is gone"
    );
    assert!(
        admin
            .get_queue_info(&vhost.name, "mail.send")
            .await
            .is_err(),
        "the queues are gone"
    );
    assert!(
        h.fake.get(&pipeline_path(&name)).is_none(),
        "the finalizer went, and the pipeline with it"
    );
}

/// The worker Secret is lost, and saving its new one fails: RabbitMQ still knows the old
/// password (which running workers use), since the new one is set only once saved.
#[tokio::test]
async fn a_new_password_reaches_rabbitmq_only_once_saved_in_its_secret() {
    let h = harness();
    let (name, _users) = unique_pipeline("shop");
    let vhost = TestVhost::fresh("controller-password");
    let user = worker_user(&name);
    connection_secret(&h, &secret_uri());
    let spec = PipelineSpec::new().vhost(&vhost.name).build();
    h.seed_pipeline(&name, spec, true);
    h.reconcile(&name).await.0.unwrap();
    let secret = secret_path(&format!("{name}-worker-amqp"));
    let first = h.secret_value(&format!("{name}-worker-amqp"), "password");
    let admin = raw_api();
    let stored_hash = async || {
        admin
            .get_user(&user)
            .await
            .unwrap()
            .password_hash
            .unwrap()
            .to_string()
    };
    assert!(password_matches(&stored_hash().await, &first));

    h.fake.delete(&secret).unwrap();
    h.fake.fail(&secret);
    let (result, _) = h.reconcile(&name).await;
    assert_eq!(result.unwrap_err().category(), "kube-api");
    assert!(
        password_matches(&stored_hash().await, &first),
        "RabbitMQ still has the password the workers use"
    );

    h.fake.release_failures();
    h.reconcile(&name).await.0.unwrap();
    let second = h.secret_value(&format!("{name}-worker-amqp"), "password");
    assert_ne!(second, first, "a new password was made");
    assert!(password_matches(&stored_hash().await, &second));
    let saved = h.fake.get(&secret).unwrap();
    let url = BASE64
        .decode(saved["data"]["url"].as_str().unwrap())
        .unwrap();
    assert!(String::from_utf8(url).unwrap().contains(&second));
}

/// The operator's own permissions on the pipeline's vhost are checked on every pass:
/// when they are missing (the grant after creating the vhost failed, or someone removed
/// it), they are granted again.
#[tokio::test]
async fn the_operators_own_grant_is_rechecked_every_pass() {
    let h = harness();
    let (name, _users) = unique_pipeline("shop");
    let vhost = TestVhost::fresh("controller-grant");
    connection_secret(&h, &secret_uri());
    let spec = PipelineSpec::new().vhost(&vhost.name).build();
    h.seed_pipeline(&name, spec, true);
    h.reconcile(&name).await.0.unwrap();
    let admin = raw_api();
    admin
        .clear_permissions(&vhost.name, "guest", false)
        .await
        .expect("the operator's grant was there");

    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    admin
        .get_permissions(&vhost.name, "guest")
        .await
        .expect("the grant is back");
    let published = events(&requests);
    assert!(
        published
            .iter()
            .any(|e| e.2.contains("set the permissions of user \"guest\"")),
        "{published:?}"
    );
}

/// `spec.rabbitmq.vhost` changes: the pipeline is built in the new vhost, and the old
/// one loses the workers' permissions and, under `deletionPolicy: Delete`, its objects.
#[tokio::test]
async fn a_vhost_change_removes_the_old_vhosts_topology_and_permissions() {
    let h = harness();
    let name = unique("shop");
    let (old, new) = (
        TestVhost::fresh("controller-vhost-old"),
        TestVhost::fresh("controller-vhost-new"),
    );
    let user = worker_user(&name);
    let _users = UserCleanup(vec![user.clone()]);
    connection_secret(&h, &secret_uri());
    let spec = PipelineSpec::new()
        .vhost(&old.name)
        .deletion_policy("Delete")
        .build();
    h.seed_pipeline(&name, spec, true);
    h.reconcile(&name).await.0.unwrap();
    let admin = raw_api();
    admin
        .get_permissions(&old.name, &user)
        .await
        .expect("the workers' permissions");

    let mut object = h.fake.get(&pipeline_path(&name)).unwrap();
    object["spec"]["rabbitmq"]["vhost"] = json!(new.name);
    h.fake.put(&pipeline_path(&name), object);
    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    admin
        .get_queue_info(&new.name, "mail.send")
        .await
        .expect("built in the new vhost");
    admin
        .get_permissions(&new.name, &user)
        .await
        .expect("permissions on the new vhost");
    assert!(
        admin.get_permissions(&old.name, &user).await.is_err(),
        "no permissions left on the old vhost"
    );
    for queue in ["mail.send", "mail.send.retry", "mail.send.dead"] {
        assert!(
            admin.get_queue_info(&old.name, queue).await.is_err(),
            "{queue} left in the old vhost"
        );
    }
    let published = events(&requests);
    assert_eq!(published[0].1, "TopologyUpdated", "{published:?}");
    let url = h.secret_value(&format!("{name}-worker-amqp"), "url");
    assert!(url.ends_with(&new.name.replace('-', "%2D")), "{url}");
}

/// Pipelines sharing one connection Secret each hold it with a finalizer of their own and
/// let go of only theirs: the first writes the list and the label at the version it read,
/// those after it append, and one leaving removes its own where it stands, so pipelines
/// holding or leaving at once never rewrite each other's (nor anyone else's) finalizers.
#[tokio::test]
async fn pipelines_sharing_a_connection_secret_add_and_remove_only_their_own_finalizer() {
    let h = harness();
    connection_secret(&h, &secret_uri());
    let conn_path = secret_path("conn");
    let mut conn = h.fake.get(&conn_path).expect("the connection Secret");
    conn["metadata"]["finalizers"] = json!(["example.com/keep"]);
    h.fake.put(&conn_path, conn);
    let vhosts: Vec<TestVhost> = (0..3).map(|_| TestVhost::fresh("controller")).collect();
    let names: Vec<String> = (0..3).map(|_| unique("shared")).collect();
    let _users = UserCleanup(names.iter().map(|n| worker_user(n)).collect());
    let mut finalizers = vec![json!("example.com/keep")];
    for (name, vhost) in names.iter().zip(&vhosts) {
        let spec = PipelineSpec::new()
            .vhost(&vhost.name)
            .deletion_policy("Delete")
            .build();
        h.seed_pipeline(name, spec, true);
        let (result, requests) = h.reconcile(name).await;
        result.unwrap();
        let uid = h.pipeline(name).metadata.uid.expect("a uid");
        let hold = write_to(&requests, "PATCH", &conn_path);
        if finalizers.len() == 1 {
            assert_eq!(hold.content_type, "application/merge-patch+json");
            assert!(hold.body["metadata"]["resourceVersion"].is_string());
        } else {
            assert_eq!(hold.content_type, "application/json-patch+json");
            assert_eq!(
                hold.body,
                json!([{"op": "add", "path": "/metadata/finalizers/-",
                        "value": format!("mailer.dev/in-use-{uid}")}])
            );
        }
        finalizers.push(json!(format!("mailer.dev/in-use-{uid}")));
        let conn = h.fake.get(&conn_path).expect("the connection Secret");
        assert_eq!(conn["metadata"]["finalizers"], json!(finalizers));
        assert_eq!(conn["metadata"]["labels"]["mailer.dev/in-use"], "true");
    }

    // The middle one goes: its finalizer alone, tested where it stands; the label stays.
    h.mark_deleted(&names[1]);
    let (result, requests) = h.reconcile(&names[1]).await;
    assert_eq!(result.unwrap(), Action::await_change());
    let release = write_to(&requests, "PATCH", &conn_path);
    assert_eq!(release.content_type, "application/json-patch+json");
    assert_eq!(
        release.body,
        json!([{"op": "test", "path": "/metadata/finalizers/2", "value": finalizers[2]},
               {"op": "remove", "path": "/metadata/finalizers/2"}])
    );
    finalizers.remove(2);
    let conn = h.fake.get(&conn_path).expect("the connection Secret");
    assert_eq!(conn["metadata"]["finalizers"], json!(finalizers));
    assert_eq!(conn["metadata"]["labels"]["mailer.dev/in-use"], "true");

    // The last to go takes the label with it; the other finalizer stays.
    for name in [&names[0], &names[2]] {
        h.mark_deleted(name);
        let (result, _) = h.reconcile(name).await;
        assert_eq!(result.unwrap(), Action::await_change());
    }
    let conn = h.fake.get(&conn_path).expect("the connection Secret");
    assert_eq!(conn["metadata"]["finalizers"], json!(["example.com/keep"]));
    assert!(
        conn["metadata"]["labels"]["mailer.dev/in-use"].is_null(),
        "{conn}"
    );
}
