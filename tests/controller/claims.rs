//! Claims against the real broker: racing claims end with exactly one owner; a rename
//! that would strand mail is refused; a namespace deleted whole cleans up; a topology
//! marked whole by an earlier release is taken over object by object, and its claim
//! markers folded into the pipeline's marker; a stronger policy
//! is seen; a namespace a cluster no longer allows loses its workers' access.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use lapin::BasicProperties;
use mailer::controller::reconcile;
use mailer::topology::ownership::{Claim, Owner, legacy_topology_marker};
use serde_json::{Value, json};

use super::broker::unique_pipeline;
use super::broker::{UserCleanup, eventually, secret_uri, unique};
use super::hostile::{broker_state, edit_spec, put_pipeline, reconcile_in};
use mailer_testkit::broker::{
    TestBroker, TestVhost, confirming_channel, management, management_host, publish, raw_api,
};
use mailer_testkit::management_proxy::Proxy;
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

fn spec(vhost: &str) -> Value {
    PipelineSpec::new()
        .vhost(vhost)
        .deletion_policy("Delete")
        .build()
}

use mailer_testkit::broker::owner_of;

fn queue(vhost: &str, name: &str) -> Claim {
    Claim::Queue {
        vhost: vhost.into(),
        name: name.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pipelines_made_at_once_end_with_exactly_one_owner_and_the_other_goes_on_later() {
    for round in 0..3 {
        let h = harness();
        let vhost = TestVhost::fresh("controller-race");
        let (a, b) = (unique("a"), unique("b"));
        let _users = UserCleanup(vec![worker_user(&a), worker_user(&b)]);
        connection_secret(&h, &secret_uri());
        h.seed_pipeline(&a, spec(&vhost.name), true);
        h.seed_pipeline(&b, spec(&vhost.name), true);
        // Made in the same second: the controller's watch sees both.
        let (store, mut watch) = kube::runtime::reflector::store();
        let seen = |name: &str| kube::core::DeserializeGuard(Ok(h.pipeline(name)));
        for name in [&a, &b] {
            watch.apply_watcher_event(&kube::runtime::watcher::Event::Apply(seen(name)));
        }
        h.ctx.register_store(store);
        let (first, second) = tokio::join!(
            tokio::spawn(reconcile(Arc::new(h.pipeline(&a)), h.ctx.clone())),
            tokio::spawn(reconcile(Arc::new(h.pipeline(&b)), h.ctx.clone())),
        );
        let results = [first.expect("ran"), second.expect("ran")];
        let won: Vec<usize> = (0..2).filter(|i| results[*i].is_ok()).collect();
        assert_eq!(won.len(), 1, "round {round}: {results:?}");
        let (winner, loser) = if won[0] == 0 { (&a, &b) } else { (&b, &a) };
        let refused = results[1 - won[0]].as_ref().unwrap_err();
        assert_eq!(refused.reason(), "Conflict", "{refused}");
        assert_eq!(
            owner_of(&queue(&vhost.name, "mail.send")).await.unwrap()["name"],
            winner.as_str()
        );
        assert!(
            raw_api().get_user(&worker_user(loser)).await.is_err(),
            "the refused one made nothing"
        );

        // Once the owner is gone, the other one is not stuck.
        h.mark_deleted(winner);
        let gone = seen(winner);
        h.reconcile(winner).await.0.expect("cleaned up");
        watch.apply_watcher_event(&kube::runtime::watcher::Event::Delete(gone));
        h.reconcile(loser).await.0.expect("the other goes on");
        assert_eq!(
            owner_of(&queue(&vhost.name, "mail.send")).await.unwrap()["name"],
            loser.as_str()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_claiming_at_once_end_with_exactly_one_owner() {
    for round in 0..2 {
        let (east, west) = (harness_of_cluster("east"), harness_of_cluster("west"));
        let vhost = TestVhost::fresh("controller-race-clusters");
        let name = unique("shop");
        let users = [
            format!("mailer-worker.east.{NS}.{name}"),
            format!("mailer-worker.west.{NS}.{name}"),
        ];
        let _users = UserCleanup(users.to_vec());
        // Writes take their time, so both claims read before either writes.
        let proxy = Proxy::start(&management_host(), Duration::from_millis(300)).await;
        let uids = [unique("uid-east"), unique("uid-west")];
        for (h, uid) in [(&east, &uids[0]), (&west, &uids[1])] {
            connection_secret(h, &proxy.url());
            h.fake.put(
                &pipeline_path(&name),
                json!({"apiVersion": "mailer.dev/v1alpha1", "kind": "MailerPipeline",
                       "metadata": {"name": name, "namespace": NS, "uid": uid, "generation": 1,
                                    "finalizers": [FINALIZER]},
                       "spec": spec(&vhost.name)}),
            );
        }
        let (e, w) = tokio::join!(
            tokio::spawn(reconcile(Arc::new(east.pipeline(&name)), east.ctx.clone())),
            tokio::spawn(reconcile(Arc::new(west.pipeline(&name)), west.ctx.clone())),
        );
        let results = [e.expect("ran"), w.expect("ran")];
        let won: Vec<usize> = (0..2).filter(|i| results[*i].is_ok()).collect();
        assert_eq!(won.len(), 1, "round {round}: {results:?}");
        let cluster = ["east", "west"][won[0]];
        for claim in [
            queue(&vhost.name, "mail.send"),
            queue(&vhost.name, "mail.send.dead"),
            Claim::Exchange {
                vhost: vhost.name.clone(),
                name: "mail".into(),
            },
        ] {
            assert_eq!(
                owner_of(&claim).await.unwrap()["cluster"],
                cluster,
                "{claim}"
            );
        }
        assert!(
            raw_api().get_user(&users[1 - won[0]]).await.is_err(),
            "the refused one made nothing"
        );
    }
}

#[tokio::test]
async fn a_rename_that_would_strand_mail_is_refused_until_the_queue_is_empty() {
    let h = harness();
    let vhost = TestVhost::fresh("controller-rename");
    let (name, _users) = unique_pipeline("shop");
    connection_secret(&h, &secret_uri());
    h.seed_pipeline(&name, spec(&vhost.name), true);
    h.reconcile(&name).await.0.expect("built");

    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    publish(
        &channel,
        "mail",
        "mail.send",
        b"{}",
        BasicProperties::default(),
    )
    .await;
    let depth = || async {
        raw_api()
            .get_queue_info(&vhost.name, "mail.send")
            .await
            .map_or(0, |q| q.message_count)
    };
    eventually(30, "the management API to count the message", || async {
        (depth().await == 1).then_some(())
    })
    .await;

    edit_spec(&h, NS, &name, |spec| {
        spec["topology"]["queue"] = json!("orders.send")
    });
    let before = broker_state(&[&vhost.name], &[&worker_user(&name)]).await;
    let (result, _) = h.reconcile(&name).await;
    let error = result.expect_err("refused");
    assert_eq!(error.reason(), "QueueNotEmpty", "{error}");
    assert!(error.is_transient(), "tried again as the workers drain it");
    let message = error.to_string();
    assert!(
        message.contains("\"mail.send\"") && message.contains("holds 1 messages"),
        "{message}"
    );
    let after = broker_state(&[&vhost.name], &[&worker_user(&name)]).await;
    assert_eq!(before, after, "nothing was changed");

    // The queue drained (the workers, still on the name before, took its mail).
    raw_api()
        .purge_queue(&vhost.name, "mail.send")
        .await
        .expect("purge");
    eventually(
        30,
        "the management API to count the queue empty",
        || async { (depth().await == 0).then_some(()) },
    )
    .await;
    h.reconcile(&name).await.0.expect("renamed");
    raw_api()
        .get_queue_info(&vhost.name, "orders.send")
        .await
        .expect("the new send queue");
    assert!(
        raw_api()
            .get_queue_info(&vhost.name, "mail.send")
            .await
            .is_err(),
        "the old one went, as deletionPolicy Delete says"
    );
    assert!(owner_of(&queue(&vhost.name, "mail.send")).await.is_none());
    assert_eq!(
        owner_of(&queue(&vhost.name, "orders.send")).await.unwrap()["name"],
        name.as_str()
    );
}

#[tokio::test]
async fn a_namespace_deleted_whole_cleans_up_with_the_secret_it_holds() {
    let h = harness();
    let vhost = TestVhost::fresh("controller-ns-gone");
    let (name, _users) = unique_pipeline("shop");
    let user = worker_user(&name);
    connection_secret(&h, &secret_uri());
    h.seed_pipeline(&name, spec(&vhost.name), true);
    h.reconcile(&name).await.0.expect("built");
    raw_api().get_user(&user).await.expect("its workers' user");

    // The namespace goes: the pipeline and its connection Secret are deleted together.
    h.mark_deleted(&name);
    let conn = h
        .fake
        .delete(&secret_path("conn"))
        .expect("the Secret is deleted");
    assert!(
        conn["metadata"]["deletionTimestamp"].is_string(),
        "the pipeline holds its connection Secret: {conn}"
    );
    let (result, requests) = h.reconcile(&name).await;
    result.expect("cleaned up");
    assert_eq!(
        events(&requests)[0].1,
        "CleanedUp",
        "{:?}",
        events(&requests)
    );
    assert!(
        raw_api().get_user(&user).await.is_err(),
        "no user is orphaned"
    );
    assert!(
        raw_api()
            .get_queue_info(&vhost.name, "mail.send")
            .await
            .is_err()
    );
    assert!(
        h.fake.get(&secret_path("conn")).is_none(),
        "the Secret goes once let go of"
    );
}

#[tokio::test]
async fn claim_markers_an_earlier_release_wrote_are_folded_into_the_pipelines_marker() {
    let h = harness();
    let vhost = TestVhost::fresh("controller-fold");
    let (name, _users) = unique_pipeline("shop");
    connection_secret(&h, &secret_uri());
    h.seed_pipeline(&name, spec(&vhost.name), true);
    h.reconcile(&name).await.0.expect("built");
    let uid = h.pipeline(&name).metadata.uid.expect("a uid");
    let pipeline_marker = mailer::topology::ownership::pipeline_marker(&uid);
    let listed = raw_api()
        .get_global_runtime_parameter(&pipeline_marker)
        .await
        .expect("one marker for the pipeline");
    let listed = Value::from(listed.value);
    let me: Owner = serde_json::from_value(listed.clone()).expect("an owner");
    let held = mailer::topology::ownership::marked_claims(&pipeline_marker, &listed);
    assert_eq!(
        held.len(),
        7,
        "3 exchanges, 3 queues, the workers' user: {listed}"
    );

    // What an earlier release left: a claim marker per claim, no pipeline marker.
    management()
        .clear_owner(&pipeline_marker)
        .await
        .expect("removed");
    for claim in &held {
        management()
            .set_owner_of(claim, &me)
            .await
            .expect("written");
    }
    h.reconcile(&name).await.0.expect("in sync");
    for claim in &held {
        assert_eq!(
            owner_of(claim).await.unwrap()["uid"],
            uid.as_str(),
            "{claim}"
        );
    }
    assert!(
        raw_api()
            .get_global_runtime_parameter(&pipeline_marker)
            .await
            .is_err(),
        "a pipeline in sync writes no marker"
    );

    // A second delay tier claims one queue more: the pipeline's marker lists it all.
    let mut object = h.fake.get(&pipeline_path(&name)).expect("the pipeline");
    object["spec"]["topology"]["retryDelays"] = json!(["1m", "1h"]);
    h.fake.put(&pipeline_path(&name), object);
    h.reconcile(&name).await.0.expect("a tier more");
    let listed = raw_api()
        .get_global_runtime_parameter(&pipeline_marker)
        .await
        .expect("the pipeline's marker");
    let now = mailer::topology::ownership::marked_claims(&pipeline_marker, &listed.value.into());
    assert_eq!(now.len(), 8, "{now:?}");
    for claim in &held {
        assert!(now.contains(claim), "{claim}");
        assert!(
            raw_api()
                .get_global_runtime_parameter(&claim.marker())
                .await
                .is_err(),
            "{claim}'s own marker is folded in"
        );
    }

    h.mark_deleted(&name);
    h.reconcile(&name).await.0.expect("cleaned up");
    assert!(
        raw_api()
            .get_global_runtime_parameter(&pipeline_marker)
            .await
            .is_err(),
        "released with the pipeline"
    );
}

#[tokio::test]
async fn a_topology_an_earlier_release_marked_whole_is_taken_over_object_by_object() {
    let h = harness();
    let vhost = TestVhost::fresh("controller-legacy");
    let (name, _users) = unique_pipeline("shop");
    connection_secret(&h, &secret_uri());
    h.seed_pipeline(&name, spec(&vhost.name), true);
    // What a 0.1 release left: the objects, and one marker of the whole topology.
    let topology_spec: mailer::spec::MailerPipelineSpec =
        serde_json::from_value(spec(&vhost.name)).expect("a spec");
    let topology = mailer::topology::Topology::desired(
        &vhost.name,
        &topology_spec.topology,
        TestBroker::get().capabilities(),
    )
    .expect("a topology");
    mailer::topology::apply(&management(), &topology)
        .await
        .expect("applied by the earlier release");
    let legacy = legacy_topology_marker(&vhost.name, "mail.send");
    let me = Owner {
        cluster: "default".into(),
        namespace: NS.into(),
        name: name.clone(),
        uid: h.pipeline(&name).metadata.uid.expect("a uid"),
        retained: false,
    };
    management()
        .set_owner(&legacy, &me)
        .await
        .expect("the old marker");

    h.reconcile(&name).await.0.expect("taken over");
    for claim in mailer::topology::ownership::topology_claims(&vhost.name, &topology_spec.topology)
    {
        assert_eq!(
            owner_of(&claim).await.unwrap()["uid"],
            me.uid.as_str(),
            "{claim}"
        );
    }
    assert!(
        raw_api()
            .get_global_runtime_parameter(&legacy)
            .await
            .is_err(),
        "the old marker is gone"
    );

    // Without the old marker, the same objects are nobody's to take.
    let other = unique("other");
    let other_vhost = TestVhost::fresh("controller-legacy-none");
    mailer::topology::apply(
        &management(),
        &mailer::topology::Topology::desired(
            &other_vhost.name,
            &topology_spec.topology,
            TestBroker::get().capabilities(),
        )
        .expect("a topology"),
    )
    .await
    .expect("applied by hand");
    h.seed_pipeline(&other, spec(&other_vhost.name), true);
    let (result, _) = h.reconcile(&other).await;
    let error = result.expect_err("refused");
    assert!(
        error
            .to_string()
            .contains("no pipeline's owner marker names it"),
        "{error}"
    );
}

#[tokio::test]
async fn a_policy_of_higher_priority_that_shadows_the_pipelines_is_reported() {
    let h = harness();
    let vhost = TestVhost::fresh("controller-shadow");
    let (name, _users) = unique_pipeline("shop");
    connection_secret(&h, &secret_uri());
    h.seed_pipeline(&name, spec(&vhost.name), true);
    h.reconcile(&name).await.0.expect("built");

    // The platform's catch-all policy, above the pipeline's priority of 10.
    raw_api()
        .declare_policy(&rabbitmq_http_client::requests::PolicyParams {
            vhost: &vhost.name,
            name: "platform.limits",
            pattern: "^mail\\.send\\.retry$",
            apply_to: rabbitmq_http_client::commons::PolicyTarget::Queues,
            priority: 20,
            definition: [("max-length".to_string(), json!(1000))]
                .into_iter()
                .collect(),
        })
        .await
        .expect("a stronger policy");
    let condition_of = |h: &Harness| {
        let stored = h.fake.get(&pipeline_path(&name)).expect("pipeline");
        condition(&stored["status"], "TopologyReady").clone()
    };
    let published = std::sync::Mutex::new(Vec::new());
    let shadowed = eventually(60, "PolicyShadowed", || async {
        let (result, requests) = h.reconcile(&name).await;
        result.expect("applied");
        published.lock().expect("events").extend(events(&requests));
        let topology = condition_of(&h);
        (topology["reason"] == "PolicyShadowed").then_some(topology)
    })
    .await;
    let message = shadowed["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("\"platform.limits\"")
            && message.contains("mail.send.retry")
            && message.contains("message-ttl")
            && message.contains("dead-letter-exchange"),
        "{message}"
    );
    let stored = h.fake.get(&pipeline_path(&name)).expect("pipeline");
    assert_condition(&stored["status"], "Ready", "False", None);
    let published = published.into_inner().expect("events");
    assert!(
        published.iter().any(|e| e.1 == "PolicyShadowed"),
        "{published:?}"
    );

    raw_api()
        .delete_policy(&vhost.name, "platform.limits", false)
        .await
        .expect("the stronger policy goes");
    eventually(60, "Reconciled again", || async {
        h.reconcile(&name).await.0.expect("applied");
        (condition_of(&h)["reason"] == "Reconciled").then_some(())
    })
    .await;
}

/// The RabbitmqCluster `platform/broker`: its Service names the test broker's ports,
/// reached as `broker.platform.svc` (which .ci/run resolves to 127.0.0.1).
fn seed_platform_cluster(h: &Harness, allowed: &str) {
    let broker = TestBroker::get();
    h.fake.put(
        "/apis/rabbitmq.com/v1beta1/namespaces/platform/rabbitmqclusters/broker",
        json!({"apiVersion": "rabbitmq.com/v1beta1", "kind": "RabbitmqCluster",
               "metadata": {"name": "broker", "namespace": "platform",
                            "annotations": {"rabbitmq.com/topology-allowed-namespaces": allowed}}}),
    );
    h.fake.put(
        "/api/v1/namespaces/platform/services/broker",
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "broker", "namespace": "platform"},
               "spec": {"ports": [{"name": "management", "port": broker.management_port},
                                  {"name": "amqp", "port": broker.amqp_port}]}}),
    );
    h.fake.put(
        "/api/v1/namespaces/platform/secrets/broker-default-user",
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "broker-default-user", "namespace": "platform"},
               "data": {"username": BASE64.encode("guest"), "password": BASE64.encode("guest")}}),
    );
}

#[tokio::test]
async fn a_namespace_a_cluster_no_longer_allows_loses_its_workers_access() {
    assert!(
        std::net::ToSocketAddrs::to_socket_addrs(&("broker.platform.svc", 80)).is_ok(),
        "broker.platform.svc does not resolve: add `127.0.0.1 broker.platform.svc` to /etc/hosts (.ci/run does)"
    );
    let h = harness();
    let vhost = TestVhost::fresh("controller-revoke");
    let (name, _users) = unique_pipeline("shop");
    let user = worker_user(&name);
    seed_platform_cluster(&h, NS);
    put_pipeline(
        &h,
        NS,
        &name,
        PipelineSpec::new()
            .vhost(&vhost.name)
            .cluster_ref(json!({"name": "broker", "namespace": "platform"}))
            .deletion_policy("Delete")
            .build(),
    );
    reconcile_in(&h, NS, &name).await.0.expect("allowed");
    raw_api().get_user(&user).await.expect("its workers' user");

    // The platform takes the namespace off the list.
    seed_platform_cluster(&h, "billing");
    let (result, requests) = reconcile_in(&h, NS, &name).await;
    assert_eq!(result.expect_err("refused").reason(), "NotAllowed");
    assert!(
        raw_api().get_user(&user).await.is_err(),
        "its workers' user is removed"
    );
    let published = events(&requests);
    assert!(
        published
            .iter()
            .any(|e| e.1 == "AccessRevoked" && e.2.contains(&user)),
        "{published:?}"
    );
    raw_api()
        .get_queue_info(&vhost.name, "mail.send")
        .await
        .expect("the mail it holds stays");
    let stored = h.fake.get(&pipeline_path(&name)).expect("pipeline");
    let message = condition(&stored["status"], "TopologyReady")["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("does not allow"), "{message}");

    // Deleted now: what it holds there goes, with the cluster's credentials used by the
    // operator alone.
    h.fake
        .delete(&pipeline_path(&name))
        .expect("the pipeline is deleted");
    reconcile_in(&h, NS, &name).await.0.expect("cleaned up");
    assert!(
        raw_api()
            .get_queue_info(&vhost.name, "mail.send")
            .await
            .is_err()
    );
    assert!(owner_of(&queue(&vhost.name, "mail.send")).await.is_none());
}
