//! Faults of a three-node RabbitMQ 4.0 cluster (`.ci/rabbitmq-cluster.sh`) behind its
//! HAProxy front, with mail flowing: a worker consuming from each node, a publisher
//! going on through the front. Each counts every request as the node faults do, and
//! holds the cluster's targets: nothing lost, nothing sent twice beyond what was in
//! flight, no worker restart, recovery within a stated bound. `make faults` runs them
//! once the cluster is up (`on_cluster::`, one at a time).

use std::time::{Duration, Instant};

use super::cluster::{Cluster, NODES, Restore, raft_leader, script, wait_node};
use super::flow::Flow;
use super::node::Pipeline;
use crate::secs;
use mailer_testkit::process::eventually;

/// Sends a worker may have in flight (its default prefetch): all a worker that loses
/// its connection can have sent without the broker learning it.
const PREFETCH: usize = 16;

/// The queue leader of the pipeline's send queue, as node `from` sees it.
async fn leader(flow: &Flow, from: &[u8]) -> Option<u8> {
    flow.cluster
        .queue_from(from, &flow.pipeline.vhost, "mail.send")
        .await?
        .leader
}

fn other_than(nodes: &[u8]) -> Vec<u8> {
    NODES.into_iter().filter(|n| !nodes.contains(n)).collect()
}

/// The node leading `mail.send` is SIGKILLed mid-stream and started again 10s later.
/// Expected: a new leader among the two others within seconds, the worker consuming
/// from the killed node connecting again through the front, deliveries never pausing
/// 30s, the node back with its members, nothing lost, at most one worker's sends in
/// flight sent twice, no worker restart.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs the private cluster: make faults"]
async fn leader_of_the_send_queue_killed_and_restarted() {
    let _restore = Restore;
    let flow = Flow::start("leader").await;
    let cluster = flow.cluster;
    let old = leader(&flow, &NODES).await.expect("a leader");
    let n = old.to_string();
    let survivors = other_than(&[old]);

    let killed = Instant::now();
    script(&["kill", &n]);
    let new = eventually(60, "a new Raft leader of mail.send", || async {
        raft_leader(survivors[0], &flow.pipeline.vhost, "mail.send")
            .await
            .filter(|l| *l != old)
    })
    .await;
    let elected = killed.elapsed();
    let consuming = flow.consuming_again(&[old], 60).await;
    let reconsumed = killed.elapsed();
    // The node stays down 10s, as a pod being rescheduled would.
    tokio::time::sleep_until((killed + Duration::from_secs(10)).into()).await;
    let stall = flow.progress.longest_stall(killed, Instant::now());
    let unconfirmed = flow.stream.now().longest_pause(killed, Instant::now());
    let down = flow.stored();
    script(&["start-node", &n]);
    let started = Instant::now();
    let crashed = wait_node(old);
    cluster.wait_members(&flow.pipeline.vhost, 120).await;
    cluster.wait_whole(60).await;
    let back = started.elapsed();
    assert!(flow.stored() > down, "mail flowed while the node was down");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let outcome = flow
        .finish("leader of mail.send SIGKILLed, restarted 10s later", 120)
        .await;
    let twice = outcome.twice();
    outcome.tally.report(&outcome.line(&format!(
        "new Raft leader (node {new}) {} after SIGKILL of node {old}; the 3 workers consuming again ({consuming:?}) after {}; longest pause in deliveries {}, in confirms {}; node back, its members online {} after its start{}",
        secs(elected),
        secs(reconsumed),
        secs(stall),
        secs(unconfirmed),
        secs(back),
        crashes(crashed)
    )));
    assert_eq!(outcome.restarts, 0, "no worker restarts");
    assert!(
        twice <= PREFETCH,
        "{twice} sent twice: at most one worker's sends in flight"
    );
    assert!(
        stall < Duration::from_secs(30),
        "deliveries paused {stall:?}"
    );
}

/// Each node in turn is stopped (`rabbitmqctl stop`, as a pod's deletion does), the
/// workers consume elsewhere, the node is started, and the next waits until it runs in
/// the cluster with every queue's three members online and the front has it UP.
/// Expected: deliveries never pausing 30s, nothing lost, at most one worker's sends in
/// flight sent twice per node stopped, no worker restart.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs the private cluster: make faults"]
async fn rolling_restart_one_node_at_a_time() {
    let _restore = Restore;
    let flow = Flow::start("rolling").await;
    let cluster = flow.cluster;
    let began = Instant::now();
    let mut steps = Vec::new();
    for n in NODES {
        let name = n.to_string();
        let stopping = Instant::now();
        script(&["stop-node", &name]);
        let stopped = stopping.elapsed();
        flow.consuming_again(&[n], 60).await;
        let reconsumed = stopping.elapsed();
        script(&["start-node", &name]);
        let started = Instant::now();
        let crashed = wait_node(n);
        cluster.wait_members(&flow.pipeline.vhost, 120).await;
        cluster.wait_whole(60).await;
        let back = started.elapsed();
        let stall = flow.progress.longest_stall(stopping, Instant::now());
        let unconfirmed = flow.stream.now().longest_pause(stopping, Instant::now());
        steps.push(format!(
            "node {n}: stopped in {}, workers consuming elsewhere {} after the stop, back with its members {} after its start{}, longest pause in deliveries {}, in confirms {}",
            secs(stopped),
            secs(reconsumed),
            secs(back),
            crashes(crashed),
            secs(stall),
            secs(unconfirmed)
        ));
    }
    let took = began.elapsed();
    let stall = flow.progress.longest_stall(began, Instant::now());
    let outcome = flow
        .finish("rolling restart, one node at a time", 120)
        .await;
    let twice = outcome.twice();
    outcome.tally.report(&outcome.line(&format!(
        "{}; whole restart {}",
        steps.join("; "),
        secs(took)
    )));
    assert_eq!(outcome.restarts, 0, "no worker restarts");
    assert!(
        twice <= 3 * PREFETCH,
        "{twice} sent twice: at most one worker's sends in flight per node stopped"
    );
    assert!(
        stall < Duration::from_secs(30),
        "deliveries paused {stall:?}"
    );
}

/// The node leading `mail.send` is cut off from the other two (every packet between
/// them dropped; clients still reach it) until it pauses itself (pause_minority), then
/// the cut heals. Expected: a new leader on the majority's side, deliveries going on
/// there (never pausing 30s), the cut node pausing once the others are declared down
/// (net_ticktime, 60s by default), the cluster whole again without a partition once the
/// cut heals, nothing lost.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs the private cluster: make faults"]
async fn a_node_cut_off_from_the_other_two_pauses() {
    let _restore = Restore;
    let flow = Flow::start("partition").await;
    let cluster = flow.cluster;
    // The node leading mail.send is the one cut off: the majority must elect another.
    let cut = leader(&flow, &NODES).await.expect("a leader");
    let n = cut.to_string();
    let majority = other_than(&[cut]);

    let cutting = Instant::now();
    script(&["cut", &n]);
    // quorum_status waits for the cut member's answer until its timeout, some 6s: the
    // time is that coarse.
    let new = eventually(120, "a Raft leader on the majority's side", || async {
        raft_leader(majority[0], &flow.pipeline.vhost, "mail.send")
            .await
            .filter(|l| *l != cut)
    })
    .await;
    let elected = cutting.elapsed();
    eventually(180, "the cut node paused (pause_minority)", || async {
        (!cluster.takes_connections(cut)).then_some(())
    })
    .await;
    let paused = cutting.elapsed();
    let consuming = flow.consuming_again(&[cut], 60).await;
    let reconsumed = cutting.elapsed();
    let during = flow.progress.longest_stall(cutting, Instant::now());
    let unconfirmed = flow.stream.now().longest_pause(cutting, Instant::now());
    let healing = Instant::now();
    script(&["heal", &n]);
    cluster.wait_whole(120).await;
    cluster.wait_members(&flow.pipeline.vhost, 120).await;
    let healed = healing.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let outcome = flow
        .finish("one node (mail.send's leader) cut off, pause_minority", 180)
        .await;
    let twice = outcome.twice();
    outcome.tally.report(&outcome.line(&format!(
        "new Raft leader (node {new}) within {} after node {cut} was cut off; node {cut} paused {} after; the 3 workers consuming again ({consuming:?}) after {}; longest pause while cut in deliveries {}, in confirms {}; whole again, members online {} after the cut healed",
        secs(elected),
        secs(paused),
        secs(reconsumed),
        secs(during),
        secs(unconfirmed),
        secs(healed)
    )));
    // The worker publishing through the cut node gets no confirm for its parks until that
    // node pauses; after MAIL_PUBLISH_TIMEOUT it connects again (through the front, to
    // another node) instead of exiting.
    assert_eq!(
        outcome.restarts, 0,
        "no worker restarts: a publish never confirmed makes the worker connect again"
    );
    assert!(
        twice <= 2 * PREFETCH,
        "{twice} sent twice: at most the sends in flight of the workers with a connection to the cut node"
    );
    assert!(
        during < Duration::from_secs(30),
        "deliveries paused {during:?}"
    );
}

/// Two nodes (the leader's among them) stopped at once for 20s: no quorum. Expected:
/// the third pauses itself (pause_minority), so nothing takes connections; no publish
/// is confirmed, no worker is ready, nothing is lost; once both are started again,
/// deliveries resume within 60s, with no worker restart (MAIL_RECONNECT_TIMEOUT, 5m).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs the private cluster: make faults"]
async fn two_of_three_nodes_down_then_back() {
    let _restore = Restore;
    let flow = Flow::start("quorum").await;
    let cluster = flow.cluster;
    let first = leader(&flow, &NODES).await.expect("a leader");
    let second = other_than(&[first])[0];
    let survivor = other_than(&[first, second])[0];

    let stopping = Instant::now();
    let (a, b) = (first.to_string(), second.to_string());
    std::thread::scope(|s| {
        s.spawn(|| script(&["stop-node", &a]));
        s.spawn(|| script(&["stop-node", &b]));
    });
    let stopped = Instant::now();
    eventually(60, "the survivor paused (pause_minority)", || async {
        (!cluster.takes_connections(survivor)).then_some(())
    })
    .await;
    let paused = stopping.elapsed();
    let not_ready = eventually(60, "no worker ready", || async {
        let readiness = flow.readiness();
        readiness.iter().all(|s| *s != 200).then_some(readiness)
    })
    .await;
    let unready = stopping.elapsed();
    // Down for 20s.
    tokio::time::sleep_until((stopping + Duration::from_secs(20)).into()).await;
    let now = flow.stream.now();
    let confirmed_while_down = now.confirmed_after(stopped + Duration::from_secs(1));
    let stored_at = flow.stored();
    let probes_down = flow.readiness();

    let starting = Instant::now();
    script(&["start-node", &a]);
    script(&["start-node", &b]);
    let crashed: usize = [first, second, survivor].into_iter().map(wait_node).sum();
    cluster.wait_whole(120).await;
    let whole = starting.elapsed();
    eventually(120, "every worker ready again", || async {
        flow.readiness().iter().all(|s| *s == 200).then_some(())
    })
    .await;
    let ready = starting.elapsed();
    let delivering = eventually(60, "delivering again", || async {
        flow.progress.first_after(starting)
    })
    .await
        - starting;
    eventually(60, "confirms again", || async {
        (flow.stream.now().confirmed_after(starting) > 0).then_some(())
    })
    .await;
    let confirming = starting.elapsed();
    cluster.wait_members(&flow.pipeline.vhost, 120).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let outcome = flow
        .finish(
            "two of three nodes stopped 20s (the leader's among them)",
            180,
        )
        .await;
    let twice = outcome.twice();
    outcome.tally.report(&outcome.line(&format!(
        "nodes {first} and {second} stopped: node {survivor} paused {} after, no worker ready after {} ({not_ready:?}, {probes_down:?} at 20s), {confirmed_while_down} confirms while down ({stored_at} stored by then); after starting them: whole {}{}, workers ready {}, delivering {}, confirming {}",
        secs(paused),
        secs(unready),
        secs(whole),
        crashes(crashed),
        secs(ready),
        secs(delivering),
        secs(confirming)
    )));
    assert_eq!(confirmed_while_down, 0, "no confirm without a quorum");
    assert_eq!(
        outcome.restarts, 0,
        "no worker restarts within MAIL_RECONNECT_TIMEOUT"
    );
    assert!(
        twice <= 3 * PREFETCH,
        "{twice} sent twice: at most every worker's sends in flight"
    );
    assert!(
        delivering < Duration::from_secs(60),
        "delivering {delivering:?} after the start"
    );
}

/// What the table says of nodes whose VM was gone before they answered and were
/// started again (`.ci/rabbitmq-cluster.sh wait-node` names the reason).
fn crashes(again: usize) -> String {
    if again == 0 {
        String::new()
    } else {
        format!(" (a node crashed while booting {again}×, started again)")
    }
}

/// `mailer ARGS` with `env`: its exit code and output.
fn mailer(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_mailer"))
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run mailer");
    (
        output.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

/// Runs `mailer topology apply -f file` through the front until it succeeds, once a
/// second, for at most `seconds`: how long it took, and why each failed attempt failed.
async fn apply_until_ok(file: &str, management: &str, seconds: u64) -> (Duration, Vec<String>) {
    let started = Instant::now();
    let mut failures = Vec::new();
    loop {
        let (code, output) = mailer(
            &[
                "topology",
                "apply",
                "-f",
                file,
                "--management-url",
                management,
            ],
            &[],
        );
        if code == 0 {
            return (started.elapsed(), failures);
        }
        let reason = output.lines().last().unwrap_or_default();
        let reason = reason.split("; check").next().unwrap_or_default();
        failures.push(reason.replace(management, "<front>"));
        assert!(
            started.elapsed() < Duration::from_secs(seconds),
            "mailer topology apply still fails after {seconds}s: {failures:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Removes what the test made on the cluster when dropped: vhosts, and users with the
/// operator's owner markers.
struct Made {
    vhosts: Vec<String>,
    users: Vec<String>,
}

impl Drop for Made {
    fn drop(&mut self) {
        let (vhosts, users) = (self.vhosts.clone(), self.users.clone());
        let _ = mailer_testkit::run_apart(move || async move {
            let cluster = Cluster::get();
            for n in NODES {
                let api = format!("http://{}:15672/api", cluster.address(n));
                let client = rabbitmq_http_client::api::Client::new(&api, "guest", "guest");
                if client.list_nodes().await.is_err() {
                    continue;
                }
                for vhost in &vhosts {
                    let _ = client.delete_vhost(vhost, true).await;
                }
                for user in &users {
                    let _ = client.delete_user(user, true).await;
                    let marker =
                        mailer::topology::ownership::Claim::User { name: user.clone() }.marker();
                    let _ = client.clear_global_runtime_parameter(&marker).await;
                }
                break;
            }
        });
    }
}

/// The node of the front's management backend with the most sessions open now: the
/// node behind a client's kept-alive connections.
async fn behind_the_management_connections(cluster: &Cluster) -> Option<(u8, u32)> {
    cluster
        .front("management")
        .await
        .into_iter()
        .filter(|server| server.sessions > 0)
        .max_by_key(|server| server.sessions)
        .map(|server| (server.node, server.sessions))
}

/// Waits until the front no longer hands node `n` connections, AMQP nor management, as
/// a Service's endpoints drop a pod that is not ready.
async fn out_of_the_front(cluster: &Cluster, n: u8) {
    eventually(30, "the stopped node out of the front", || async {
        let mut front = cluster.front("amqp").await;
        front.extend(cluster.front("management").await);
        let out = front.iter().filter(|s| s.node == n && !s.in_rotation());
        (out.count() == 2).then_some(())
    })
    .await;
}

/// With a node stopped (and out of the front): `mailer topology apply` of a new
/// pipeline, `mailer dead stats` of it, the controller's reconcile of another whose
/// connection Secret names the front, and requests published into it; the node back and
/// every queue's three members online. Then the node behind the controller's kept-alive
/// management connections SIGKILLed: the controller's next reconciles until one is in
/// sync, and `mailer topology apply` again. Expected: every command succeeds, each
/// within 30s (retried once a second), nothing lost.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs the private cluster: make faults"]
async fn topology_apply_and_reconcile_with_a_node_down() {
    use mailer_testkit::operator::{FINALIZER, condition, harness};
    use serde_json::json;

    let _restore = Restore;
    let cluster = Cluster::get();
    cluster.wait_whole(180).await;
    let front = cluster.broker();
    let management = format!("http://guest:guest@{}", front.management);
    let amqp = format!("amqp://guest:guest@{}", front.amqp);
    let pid = std::process::id();
    let (applied, reconciled) = (
        format!("mailer-fault-apply-{pid}"),
        format!("mailer-fault-reconcile-{pid}"),
    );
    let name = format!("cluster-{pid}");
    let user = mailer_testkit::operator::worker_user(&name);
    let _made = Made {
        vhosts: vec![applied.clone(), reconciled.clone()],
        users: vec![user.clone()],
    };

    // One node down, and out of the front (as a Service's endpoints would drop it).
    let down = 3u8;
    script(&["stop-node", &down.to_string()]);
    out_of_the_front(cluster, down).await;

    let dir = mailer_testkit::smtp::TempDir::new("cluster-apply");
    let file = dir.0.join("pipeline.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: mailer.dev/v1alpha1\nkind: MailerPipeline\nmetadata: {{name: apply}}\nspec:\n  rabbitmq: {{vhost: {applied}}}\n  topology: {{retryDelay: 1s}}\n"
        ),
    )
    .unwrap();
    let file = file.to_string_lossy().into_owned();
    let (apply_took, apply_failed) = apply_until_ok(&file, &management, 30).await;
    let nodes = cluster
        .queue(&applied, "mail.send")
        .await
        .expect("mail.send made");
    assert_eq!(nodes.members, NODES, "three members, one of them down");
    let online_then = nodes.online.clone();
    let dead_env = [
        ("MAIL_AMQP_URL", amqp.as_str()),
        ("RABBITMQ_MANAGEMENT_URL", management.as_str()),
    ];
    let (code, output) = mailer(&["dead", "stats", "-f", &file], &dead_env);
    assert_eq!(code, 0, "mailer dead stats with node {down} down: {output}");

    // The controller's reconcile of a pipeline whose connection Secret names the front.
    let h = harness();
    h.seed_secret(
        "conn",
        &[
            ("uri", &format!("http://{}", front.management)),
            ("username", "guest"),
            ("password", "guest"),
            ("amqpUri", &format!("amqp://{}", front.amqp)),
        ],
    );
    h.seed_secret("smtp", &[("url", "discard://")]);
    let spec = json!({"rabbitmq": {"vhost": reconciled, "connectionSecret": {"name": "conn"}},
                      "topology": {"deletionPolicy": "Delete", "retryDelay": "1s"},
                      "worker": {"provider": {"urlSecretKeyRef": {"name": "smtp", "key": "url"}}}});
    h.seed_pipeline(&name, spec, false);
    h.reconcile(&name).await.0.expect("the finalizer added");
    assert_eq!(
        h.pipeline(&name).metadata.finalizers,
        Some(vec![FINALIZER.to_string()])
    );
    let started = Instant::now();
    let (result, _) = h.reconcile(&name).await;
    let reconcile_took = started.elapsed();
    result.unwrap_or_else(|e| panic!("the reconcile with node {down} down: {e}"));
    let status = serde_json::to_value(h.pipeline(&name).status).unwrap();
    assert_eq!(
        condition(&status, "TopologyReady")["status"],
        "True",
        "{status}"
    );

    // Requests go in through the front, into queues made with a node down.
    let pipeline = super::node::Pipeline {
        vhost: reconciled.clone(),
        topology: String::new(),
        broker: front.clone(),
    };
    let published = crate::publish(&pipeline, 0..20, |_| "ok@example.com".into()).await;

    let starting = Instant::now();
    script(&["start-node", &down.to_string()]);
    let crashed = wait_node(down);
    cluster.wait_whole(60).await;
    cluster.wait_members(&applied, 120).await;
    cluster.wait_members(&reconciled, 120).await;
    let members_back = starting.elapsed();

    // The node behind the controller's kept-alive management connections crashes. The
    // management API closes a connection after 5s without a request, so the node is
    // found and killed right after a reconcile.
    h.reconcile(&name).await.0.expect("a reconcile in sync");
    let (behind, sessions) = behind_the_management_connections(cluster)
        .await
        .expect("the controller's kept-alive connections at the front");
    script(&["kill", &behind.to_string()]);
    let stopped = Instant::now();
    let mut attempts = Vec::new();
    let recovered = loop {
        let (result, _) = h.reconcile(&name).await;
        match result {
            Ok(_) => {
                attempts.push("ok".to_string());
                break stopped.elapsed();
            }
            Err(e) => {
                let message = e.to_string();
                let cause = message.split("; check").next().unwrap_or_default();
                attempts.push(format!("{}: {cause}", e.category()));
            }
        }
        assert!(
            attempts.len() < 5,
            "the reconcile fails after node {behind} went: {attempts:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let status = serde_json::to_value(h.pipeline(&name).status).unwrap();
    assert_eq!(
        condition(&status, "TopologyReady")["status"],
        "True",
        "{status}"
    );
    out_of_the_front(cluster, behind).await;
    let (again_took, again_failed) = apply_until_ok(&file, &management, 30).await;
    script(&["start-node", &behind.to_string()]);
    let crashed = crashed + wait_node(behind);
    cluster.wait_whole(60).await;

    let tally = crate::Tally::take(
        "topology apply, mailer dead and the controller's reconcile with a node down",
        &pipeline,
        published,
        Vec::new(),
    )
    .await;
    tally.report(&format!(
        "node {down} stopped: mailer topology apply ok in {} (failed before: {apply_failed:?}; members of mail.send {:?}, online {online_then:?}), mailer dead stats ok, reconcile {} (TopologyReady), 20 requests published; node {down} back, every queue's members online {} after its start; node {behind} (behind {sessions} of the controller's kept-alive management connections) SIGKILLed: reconciles {attempts:?}, in sync {} after; mailer topology apply of the same pipeline ok after {} (failed before: {again_failed:?}){}",
        secs(apply_took),
        nodes.members,
        secs(reconcile_took),
        secs(members_back),
        secs(recovered),
        secs(again_took),
        crashes(crashed)
    ));
    assert_eq!(tally.waiting.len(), 20, "the requests wait in mail.send");
}

/// Requests at the size limit through a slow SMTP server, on the cluster through its
/// front (`large.rs`): every quorum write of a 10 MiB request replicated to three nodes.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs the private cluster: make faults"]
async fn large_mail_through_a_slow_smtp_server() {
    let cluster = Cluster::get();
    cluster.wait_whole(180).await;
    let pipeline = Pipeline::on(cluster.broker(), "large", "").await;
    super::large::large_mail_through_a_slow_smtp_server(
        &pipeline,
        "requests at the size limit through a slow SMTP server",
    )
    .await;
}
