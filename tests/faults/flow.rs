//! Mail flowing through the cluster while a fault hits it: a publisher that goes on
//! publishing through the front as an application would (each request confirmed, or
//! counted as not), three workers under kubelets, a slow SMTP server, and a watch on
//! the mails it stores.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde_json::json;

use super::cluster::{Cluster, NODES};
use super::kubelet::Kubelet;
use super::node::Pipeline;
use super::proxy::{Mode, SmtpProxy};
use crate::{Tally, delivered, depth, secs, smtp_url};
use mailer_testkit::process::eventually;
use mailer_testkit::smtp::SmtpServer;

/// Requests a second while mail flows: with the slow SMTP server (about 0.3s a mail),
/// some ten sends are in flight across the workers.
const RATE: u32 = 40;
/// How long the publisher waits for a confirm before it counts the request as not
/// confirmed and connects again, as an application with a deadline would.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(15);

/// Request `i`'s recipient: one in ten is refused once at the end of DATA (the worker
/// parks it, which publishes to the retry queue), one in fifty is malformed (the worker
/// dead-letters it), the rest are sent at once.
fn recipient(i: usize) -> String {
    if i % 50 == 25 {
        "not an address".into()
    } else if i % 10 == 5 {
        format!("f-{i:05}+451once@example.com")
    } else {
        "ok@example.com".into()
    }
}

/// What the publisher did.
#[derive(Debug, Default, Clone)]
pub struct Published {
    /// Requests the broker confirmed: from then on they are its to keep.
    pub confirmed: BTreeSet<String>,
    /// The confirmed ones that are malformed (dead-lettered by design).
    pub malformed: BTreeSet<String>,
    /// Requests sent whose confirm did not come (a nack, a lost connection, or no answer
    /// within the deadline): they may or may not be in a queue.
    pub unconfirmed: BTreeSet<String>,
    /// Attempts to connect through the front that failed.
    pub connects_failed: usize,
    /// When each confirm came.
    pub confirms: Vec<Instant>,
}

impl Published {
    /// The longest time between two confirms (or the ends of the window) within
    /// `from..to`: how long publishing stood still.
    pub fn longest_pause(&self, from: Instant, to: Instant) -> Duration {
        longest_gap(&self.confirms, from, to)
    }

    pub fn confirmed_after(&self, at: Instant) -> usize {
        self.confirms.iter().filter(|c| **c > at).count()
    }
}

fn longest_gap(times: &[Instant], from: Instant, to: Instant) -> Duration {
    let mut last = from;
    let mut longest = Duration::ZERO;
    for at in times.iter().filter(|t| **t > from && **t < to) {
        longest = longest.max(*at - last);
        last = *at;
    }
    longest.max(to.saturating_duration_since(last))
}

/// Publishes requests `f-00000`, `f-00001`, ... at [`RATE`] through the front until
/// stopped, each with mandatory routing and a confirm.
pub struct Stream {
    stop: Arc<AtomicBool>,
    state: Arc<Mutex<Published>>,
    task: tokio::task::JoinHandle<()>,
}

impl Stream {
    pub fn start(amqp_url: String) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Mutex::new(Published::default()));
        let task = tokio::spawn(publishing(amqp_url, stop.clone(), state.clone()));
        Self { stop, state, task }
    }

    pub fn now(&self) -> Published {
        self.state.lock().unwrap().clone()
    }

    pub async fn stop(mut self) -> Published {
        self.stop.store(true, Ordering::SeqCst);
        let _ = (&mut self.task).await;
        self.now()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

async fn publishing(url: String, stop: Arc<AtomicBool>, state: Arc<Mutex<Published>>) {
    let mut next = 0usize;
    let mut tick = tokio::time::interval(Duration::from_secs(1) / RATE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::SeqCst) {
        let opened = tokio::time::timeout(Duration::from_secs(5), async {
            let connection = Connection::connect(&url, ConnectionProperties::default()).await?;
            let channel = connection.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Ok::<_, lapin::Error>((connection, channel))
        })
        .await;
        let Ok(Ok((connection, channel))) = opened else {
            state.lock().unwrap().connects_failed += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        };
        while !stop.load(Ordering::SeqCst) {
            tick.tick().await;
            let id = format!("f-{next:05}");
            let to = recipient(next);
            next += 1;
            let body = serde_json::to_vec(&json!({
                "from": "Shop <noreply@shop.example>", "to": [to], "subject": "Hi", "text": "Hello"
            }))
            .unwrap();
            let properties = BasicProperties::default()
                .with_message_id(id.as_str().into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2);
            let confirmed = tokio::time::timeout(CONFIRM_TIMEOUT, async {
                let mandatory = BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                };
                let confirm = channel
                    .basic_publish(
                        "mail".into(),
                        "mail.send".into(),
                        mandatory,
                        &body,
                        properties,
                    )
                    .await?;
                confirm.await
            })
            .await;
            let mut published = state.lock().unwrap();
            match confirmed {
                Ok(Ok(confirmation)) if confirmation.is_ack() => {
                    if to == "not an address" {
                        published.malformed.insert(id.clone());
                    }
                    published.confirmed.insert(id);
                    published.confirms.push(Instant::now());
                }
                _ => {
                    published.unconfirmed.insert(id);
                    break;
                }
            }
        }
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            connection.close(200, "published".into()),
        )
        .await;
    }
}

/// When the SMTP server stored mails: a thread counts its files every 100 ms.
pub struct Progress {
    stop: Arc<AtomicBool>,
    stored: Arc<Mutex<Vec<Instant>>>,
}

impl Progress {
    pub fn start(dir: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stored = Arc::new(Mutex::new(Vec::new()));
        std::thread::spawn({
            let (stop, stored) = (stop.clone(), stored.clone());
            move || {
                let mut seen = 0;
                while !stop.load(Ordering::SeqCst) {
                    let count = std::fs::read_dir(&dir)
                        .map(|entries| {
                            entries
                                .filter_map(Result::ok)
                                .filter(|e| e.file_name().to_string_lossy().ends_with(".eml"))
                                .count()
                        })
                        .unwrap_or(seen);
                    if count > seen {
                        seen = count;
                        stored.lock().unwrap().push(Instant::now());
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        });
        Self { stop, stored }
    }

    /// The longest time within `from..to` in which no mail was stored.
    pub fn longest_stall(&self, from: Instant, to: Instant) -> Duration {
        longest_gap(&self.stored.lock().unwrap(), from, to)
    }

    /// When the first mail after `at` was stored, if one was.
    pub fn first_after(&self, at: Instant) -> Option<Instant> {
        self.stored
            .lock()
            .unwrap()
            .iter()
            .copied()
            .find(|t| *t > at)
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// A pipeline on the cluster's front with mail flowing: three workers, one consuming
/// from each node, and the publisher.
pub struct Flow {
    // Dropped in this order when a test fails: the workers and the publisher stop
    // before the pipeline's vhost goes.
    pub workers: Vec<Kubelet>,
    pub stream: Stream,
    pub progress: Progress,
    _provider: SmtpProxy,
    pub smtp: SmtpServer,
    pub pipeline: Pipeline,
    pub cluster: &'static Cluster,
}

/// What a fault's run came to, beside its [`Tally`].
pub struct Outcome {
    pub tally: Tally,
    pub published: Published,
    /// Worker restarts, over the three kubelets.
    pub restarts: usize,
    /// Connections the workers made again after a loss (`mailer_worker_reconnects_total`).
    pub reconnects: usize,
    /// How long after the publisher stopped every confirmed request was settled.
    pub settled: Duration,
}

impl Flow {
    /// Waits for a whole cluster, makes the pipeline (its queues with three members),
    /// starts a worker at a time until each consumes from another node, and the
    /// publisher; returns once 100 mails were delivered.
    pub async fn start(fault: &str) -> Self {
        let cluster = Cluster::get();
        cluster.wait_whole(180).await;
        let pipeline = Pipeline::on(cluster.broker(), fault, "").await;
        for queue in ["mail.send", "mail.send.retry", "mail.send.dead"] {
            let nodes = cluster
                .queue(&pipeline.vhost, queue)
                .await
                .expect("the queue");
            assert_eq!(
                nodes.members, NODES,
                "{queue}: RabbitMQ 4.0 gives a quorum queue declared with only x-queue-type three members (quorum_cluster_size)"
            );
        }
        let smtp = SmtpServer::start();
        let provider = SmtpProxy::start(smtp.port, Mode::Slow).await;
        // One at a time: the front hands connections out in turn, two a worker (consume,
        // publish), so the three consuming connections land on the three nodes.
        let mut workers = Vec::new();
        for _ in NODES {
            let worker = Kubelet::start(&pipeline.amqp_url(), &smtp_url(provider.port), &[]);
            eventually(60, "the worker ready", || async {
                worker.readyz().filter(|(status, _)| *status == 200)
            })
            .await;
            workers.push(worker);
        }
        let consuming = eventually(30, "three consuming connections", || async {
            let nodes = cluster
                .connection_nodes(&pipeline.vhost, "mailer-worker-consume")
                .await?;
            (nodes.len() == 3).then_some(nodes)
        })
        .await;
        assert_eq!(consuming, NODES, "a worker consuming from each node");
        let progress = Progress::start(smtp.mail_dir.0.clone());
        let stream = Stream::start(pipeline.amqp_url());
        eventually(60, "100 mails delivered", || async {
            (delivered(&smtp).len() >= 100).then_some(())
        })
        .await;
        Self {
            cluster,
            pipeline,
            smtp,
            _provider: provider,
            workers,
            stream,
            progress,
        }
    }

    /// Every worker's `/readyz` status (0: nothing answers).
    pub fn readiness(&self) -> Vec<u16> {
        self.workers
            .iter()
            .map(|w| w.readyz().map_or(0, |(status, _)| status))
            .collect()
    }

    /// Stored mails now.
    pub fn stored(&self) -> usize {
        delivered(&self.smtp).len()
    }

    /// Waits until the workers consume from three connections again, none on `avoid`.
    pub async fn consuming_again(&self, avoid: &[u8], seconds: u64) -> Vec<u8> {
        eventually(seconds, "three consuming connections again", || async {
            let nodes = self
                .cluster
                .connection_nodes(&self.pipeline.vhost, "mailer-worker-consume")
                .await?;
            (nodes.len() == 3 && !nodes.iter().any(|n| avoid.contains(n))).then_some(nodes)
        })
        .await
    }

    /// Stops publishing, waits until every confirmed request is delivered or
    /// dead-lettered (at most `seconds`), stops the workers and counts.
    pub async fn finish(self, fault: &'static str, seconds: u64) -> Outcome {
        let Flow {
            pipeline,
            smtp,
            workers,
            stream,
            progress,
            _provider,
            ..
        } = self;
        let published = stream.stop().await;
        let stopped = Instant::now();
        let good: BTreeSet<&String> = published
            .confirmed
            .difference(&published.malformed)
            .collect();
        eventually(seconds, "every confirmed request settled", || async {
            let stored = delivered(&smtp);
            let stored: BTreeSet<&String> = stored.iter().collect();
            let dead = depth(&pipeline, "mail.send.dead").await as usize;
            (good.iter().all(|id| stored.contains(*id)) && dead >= published.malformed.len())
                .then_some(())
        })
        .await;
        let settled = stopped.elapsed();
        let restarts = workers.iter().map(Kubelet::restarts).sum();
        let reconnects = workers
            .iter()
            .map(|w| w.metric("mailer_worker_reconnects_total") as usize)
            .sum();
        for worker in workers {
            worker.stop();
        }
        drop(progress);
        let tally = Tally::take(
            fault,
            &pipeline,
            published.confirmed.clone(),
            delivered(&smtp),
        )
        .await;
        Outcome {
            tally,
            published,
            restarts,
            reconnects,
            settled,
        }
    }
}

impl Outcome {
    /// What the table's last column says of the publisher and the workers, after
    /// `fault`'s own findings.
    pub fn line(&self, fault: &str) -> String {
        let arrived = {
            let delivered: BTreeSet<&String> = self.tally.delivered.iter().collect();
            self.published
                .unconfirmed
                .iter()
                .filter(|id| delivered.contains(id))
                .count()
        };
        eprintln!("sent twice: {:?}", self.sent_twice());
        format!(
            "{fault}; publisher: {} confirmed, {} not confirmed ({arrived} of them delivered anyway), {} failed connects; workers: {} reconnects, {} restarts; all settled {} after publishing stopped",
            self.published.confirmed.len(),
            self.published.unconfirmed.len(),
            self.published.connects_failed,
            self.reconnects,
            self.restarts,
            secs(self.settled)
        )
    }

    pub fn twice(&self) -> usize {
        self.tally.twice()
    }

    /// The requests delivered more than once; those refused once first (`+451once`)
    /// were parked before.
    pub fn sent_twice(&self) -> Vec<&String> {
        let mut seen = BTreeSet::new();
        let mut twice: Vec<&String> = self
            .tally
            .delivered
            .iter()
            .filter(|id| !seen.insert(*id))
            .collect();
        twice.sort();
        twice.dedup();
        twice
    }
}
