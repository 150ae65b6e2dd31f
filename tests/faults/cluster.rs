//! The three-node RabbitMQ 4.0 cluster of `.ci/rabbitmq-cluster.sh` and its HAProxy
//! front: what the cluster's faults (`super::on_cluster`) do to it and read of it.
//!
//! Workers, the operator's topology apply, the controller and `mailer dead` reach the
//! cluster only through the front, as they would a Kubernetes Service. The test itself
//! looks at the cluster (queue leaders and members, nodes, connections) through the
//! management API of a node straight, so the front's sessions are the product's alone.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use mailer::topology::BrokerCapabilities;
use serde_json::Value;

use super::node::Broker;
use mailer_testkit::process::eventually;

pub const NODES: [u8; 3] = [1, 2, 3];

/// The cluster as `.ci/rabbitmq-cluster.sh ports` describes its front.
pub struct Cluster {
    pub amqp_port: u16,
    pub management_port: u16,
    pub stats_port: u16,
    addresses: [String; 3],
}

/// An HTTP client for one request: a client's pooled connections belong to the runtime
/// that made them, and each test has a runtime of its own.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("an HTTP client")
}

fn script_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/rabbitmq-cluster.sh")
}

/// `.ci/rabbitmq-cluster.sh ARGS`; its output. Fails the test when it fails.
pub fn script(args: &[&str]) -> String {
    let output = Command::new(script_path())
        .args(args)
        .output()
        .expect("run .ci/rabbitmq-cluster.sh");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    // What the script says of what it did (a node started again, say) goes to the
    // test's output.
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        ".ci/rabbitmq-cluster.sh {args:?}: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    text
}

/// Waits until node `n` runs (`.ci/rabbitmq-cluster.sh wait-node`): how many times it
/// had to be started again after its VM exited while booting.
pub fn wait_node(n: u8) -> usize {
    let again = script(&["wait-node", &n.to_string()]);
    again
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("wait-node {n} printed {again:?}"))
}

/// The node number of a node name, `rabbit@mailer-c2` → 2.
pub fn node_of(name: &str) -> u8 {
    name.rsplit("mailer-c")
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a node of the cluster: {name}"))
}

impl Cluster {
    pub fn get() -> &'static Cluster {
        static CLUSTER: OnceLock<Cluster> = OnceLock::new();
        CLUSTER.get_or_init(|| {
            let output = Command::new(script_path())
                .arg("ports")
                .output()
                .expect("run .ci/rabbitmq-cluster.sh");
            assert!(
                output.status.success(),
                "no cluster: start it with .ci/rabbitmq-cluster.sh start (make faults does)"
            );
            let ports: Vec<u16> = String::from_utf8_lossy(&output.stdout)
                .split_whitespace()
                .map(|p| p.parse().expect("a port"))
                .collect();
            mailer::install_crypto_provider();
            Cluster {
                amqp_port: ports[0],
                management_port: ports[1],
                stats_port: ports[2],
                addresses: NODES.map(|n| script(&["address", &n.to_string()]).trim().to_string()),
            }
        })
    }

    /// The front as the broker of a pipeline.
    pub fn broker(&self) -> Broker {
        Broker {
            label: "4.0, 3 nodes".into(),
            amqp: format!("127.0.0.1:{}", self.amqp_port),
            management: format!("127.0.0.1:{}", self.management_port),
            capabilities: BrokerCapabilities::RABBITMQ_4,
        }
    }

    pub fn address(&self, n: u8) -> &str {
        &self.addresses[usize::from(n - 1)]
    }

    /// GET `path` of node `n`'s management API, straight.
    pub async fn api_of(&self, n: u8, path: &str) -> Option<Value> {
        let url = format!("http://{}:15672/api/{path}", self.address(n));
        let response = http()
            .get(url)
            .basic_auth("guest", Some("guest"))
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        serde_json::from_str(&response.text().await.ok()?).ok()
    }

    /// GET `path` of the first node whose management API answers, straight.
    pub async fn api(&self, path: &str) -> Option<Value> {
        self.api_from(&NODES, path).await
    }

    /// GET `path` of the first of `nodes` whose management API answers.
    pub async fn api_from(&self, nodes: &[u8], path: &str) -> Option<Value> {
        for n in nodes {
            if let Some(found) = self.api_of(*n, path).await {
                return Some(found);
            }
        }
        None
    }

    /// The nodes running, as the first node that answers sees the cluster, and whether
    /// any node reports a partition.
    pub async fn running(&self) -> Option<(Vec<u8>, bool)> {
        let nodes = self.api("nodes").await?;
        let nodes = nodes.as_array()?;
        let running = nodes
            .iter()
            .filter(|n| n["running"] == true)
            .map(|n| node_of(n["name"].as_str().unwrap_or_default()))
            .collect();
        let partitioned = nodes
            .iter()
            .any(|n| n["partitions"].as_array().is_some_and(|p| !p.is_empty()));
        Some((running, partitioned))
    }

    /// A queue's leader, members and members online (node numbers).
    pub async fn queue(&self, vhost: &str, queue: &str) -> Option<QueueNodes> {
        self.queue_from(&NODES, vhost, queue).await
    }

    /// The same, as the first of `nodes` that answers sees it.
    pub async fn queue_from(&self, nodes: &[u8], vhost: &str, queue: &str) -> Option<QueueNodes> {
        let path = format!("queues/{}/{queue}", percent(vhost));
        let info = self.api_from(nodes, &path).await?;
        let nodes = |field: &str| -> Vec<u8> {
            let mut nodes: Vec<u8> = info[field]
                .as_array()
                .map(|a| a.iter().filter_map(|n| n.as_str()).map(node_of).collect())
                .unwrap_or_default();
            nodes.sort_unstable();
            nodes
        };
        Some(QueueNodes {
            leader: info["leader"].as_str().map(node_of),
            members: nodes("members"),
            online: nodes("online"),
        })
    }

    /// The nodes of the connections named `name` in `vhost` (a worker's
    /// `mailer-worker-consume`, say), sorted.
    pub async fn connection_nodes(&self, vhost: &str, name: &str) -> Option<Vec<u8>> {
        let listed = self
            .api(&format!("vhosts/{}/connections", percent(vhost)))
            .await?;
        let mut nodes: Vec<u8> = listed
            .as_array()?
            .iter()
            .filter(|c| c["client_properties"]["connection_name"] == name)
            .filter_map(|c| c["node"].as_str())
            .map(node_of)
            .collect();
        nodes.sort_unstable();
        Some(nodes)
    }

    /// The front's servers of `backend` (`amqp` or `management`): node, its state as
    /// HAProxy's statistics say (`UP`; `UP 1/2` while checks fail but it still takes
    /// connections; `DOWN`; `DOWN 1/2` while checks pass but it does not yet), and its
    /// sessions now.
    pub async fn front(&self, backend: &str) -> Vec<Server> {
        let url = format!("http://127.0.0.1:{}/;csv", self.stats_port);
        let Ok(response) = http().get(url).send().await else {
            return Vec::new();
        };
        let text = response.text().await.unwrap_or_default();
        text.lines()
            .map(|line| line.split(',').collect::<Vec<_>>())
            .filter(|f| f.len() > 17 && f[0] == backend && f[1].starts_with("mailer-c"))
            .map(|f| Server {
                node: node_of(f[1]),
                status: f[17].to_string(),
                sessions: f[4].parse().unwrap_or(0),
            })
            .collect()
    }

    /// Whether node `n` takes AMQP connections (a paused or stopped node does not).
    pub fn takes_connections(&self, n: u8) -> bool {
        let address = format!("{}:5672", self.address(n));
        std::net::TcpStream::connect_timeout(
            &address.parse().expect("an address"),
            Duration::from_secs(1),
        )
        .is_ok()
    }

    /// Waits until all three nodes run, none reports a partition, and the front has
    /// them all UP: how every cluster fault starts and ends.
    pub async fn wait_whole(&self, seconds: u64) {
        eventually(
            seconds,
            "three nodes running, no partition, all UP at the front",
            || async {
                let (running, partitioned) = self.running().await?;
                let mut front = self.front("amqp").await;
                front.extend(self.front("management").await);
                (running.len() == 3
                    && !partitioned
                    && front.len() == 6
                    && front.iter().all(|s| s.status == "UP"))
                .then_some(())
            },
        )
        .await;
    }

    /// Waits until every queue of `vhost` has its three members online.
    pub async fn wait_members(&self, vhost: &str, seconds: u64) {
        eventually(seconds, "every queue's three members online", || async {
            for queue in ["mail.send", "mail.send.retry", "mail.send.dead"] {
                let nodes = self.queue(vhost, queue).await?;
                if nodes.online.len() != 3 || nodes.leader.is_none() {
                    return None;
                }
            }
            Some(())
        })
        .await;
    }
}

/// The member of `queue` in `vhost` that is its Raft leader, as `rabbitmq-queues
/// quorum_status` on node `from` finds the members (the management API's `leader` is
/// the metadata store's record, which a partition holds back until the cut node is
/// declared down). A member that does not answer is not a leader.
pub async fn raft_leader(from: u8, vhost: &str, queue: &str) -> Option<u8> {
    let (vhost, queue) = (vhost.to_string(), queue.to_string());
    let output = tokio::task::spawn_blocking(move || {
        Command::new(script_path())
            .args([
                "queues",
                &from.to_string(),
                "quorum_status",
                "--vhost",
                &vhost,
                &queue,
            ])
            .args(["--formatter", "json"])
            .output()
    })
    .await
    .ok()?
    .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let members: Value = serde_json::from_str(&text[text.find('[')?..]).ok()?;
    members
        .as_array()?
        .iter()
        .find(|m| m["Raft State"] == "leader")
        .and_then(|m| m["Node Name"].as_str())
        .map(node_of)
}

/// A server of the front.
#[derive(Debug, Clone)]
pub struct Server {
    pub node: u8,
    pub status: String,
    pub sessions: u32,
}

impl Server {
    /// Whether the front hands it connections.
    pub fn in_rotation(&self) -> bool {
        self.status.starts_with("UP")
    }
}

/// A quorum queue's nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueNodes {
    pub leader: Option<u8>,
    pub members: Vec<u8>,
    pub online: Vec<u8>,
}

fn percent(vhost: &str) -> String {
    percent_encoding::utf8_percent_encode(vhost, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Puts the cluster back together when dropped (a node started again, a cut healed),
/// so a fault that failed half-way leaves the next one a whole cluster.
pub struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        // Whatever fails here, the next fault's wait for a whole cluster says so.
        let quietly = |args: &[&str]| {
            let _ = Command::new(script_path()).args(args).output();
        };
        for n in NODES.map(|n| n.to_string()) {
            quietly(&["heal", &n]);
            quietly(&["start-node", &n]);
        }
        for n in NODES.map(|n| n.to_string()) {
            quietly(&["wait-node", &n]);
        }
    }
}
