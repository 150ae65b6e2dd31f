//! Reading loses nothing and keeps the order: 100 lists in a row while the worker keeps
//! dead-lettering, a queue read through several consumers, another consumer on the dead
//! queue, and a purge without `--yes`.

use std::collections::BTreeSet;

use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use mailer::dead::{DeadLetter, DeadQueue, Verdict};

use crate::harness::{DEAD_QUEUE, Pipeline, SEND_QUEUE, ids};
use mailer_testkit::process::{eventually, start_worker, stop_worker};

#[tokio::test]
async fn a_hundred_lists_in_a_row_lose_nothing_and_keep_the_order_while_the_worker_runs() {
    let p = Pipeline::new("hundred").await;
    let first = ids("d", 30);
    for id in &first {
        p.publish_dead(id, "gave-up", "ok@example.com").await;
    }
    // Meanwhile the worker dead-letters new requests, which must neither wait for the
    // lists nor get lost among them.
    let worker = start_worker(&p.vhost.amqp_url(), "discard://", 5);
    let later = ids("n", 20);
    let producer = {
        let later = later.clone();
        let vhost_url = p.vhost.amqp_url();
        tokio::spawn(async move {
            let connection = lapin::Connection::connect(&vhost_url, Default::default())
                .await
                .unwrap();
            let channel = mailer_testkit::broker::confirming_channel(&connection).await;
            for id in later {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                mailer_testkit::broker::publish(
                    &channel,
                    "mail",
                    SEND_QUEUE,
                    b"{not json",
                    crate::harness::properties(&id, FieldTable::default()),
                )
                .await;
            }
        })
    };

    let mut seen_later = 0;
    for run in 0..100 {
        let listed = p.listed(&[]);
        assert_eq!(
            listed[..first.len()],
            first,
            "run {run}: the first 30 in order"
        );
        let arrived: Vec<&String> = listed[first.len()..].iter().collect();
        assert!(
            arrived.iter().all(|id| id.starts_with("n-")),
            "run {run}: {listed:?}"
        );
        let unique: BTreeSet<&&String> = arrived.iter().collect();
        assert_eq!(unique.len(), arrived.len(), "run {run}: no duplicate");
        assert!(
            arrived.len() >= seen_later,
            "run {run}: a dead letter listed before is missing"
        );
        seen_later = arrived.len();
    }
    producer.await.unwrap();
    p.wait_for(DEAD_QUEUE, 50).await;
    stop_worker(worker);

    let listed = p.listed(&[]);
    assert_eq!(listed.len(), 50);
    assert_eq!(listed[..30], first);
    let arrived: BTreeSet<&String> = listed[30..].iter().collect();
    assert_eq!(
        arrived,
        later.iter().collect(),
        "every new dead letter is there"
    );
    let (_, shown, _) = p.dead(&["show", "d-000"]);
    println!("100 lists: 50 of 50 dead letters still there, the first 30 in order");
    assert!(
        shown.contains("\n  x-delivery-count: 101\n"),
        "every list counted as a delivery, and none dropped it: {shown}"
    );
}

/// The message ids of one pass over the queue, through consumers of `window` deliveries;
/// each `remove_every`-th is removed.
async fn pass_ids(queue: &DeadQueue, window: u16, remove_every: usize) -> Vec<String> {
    let mut seen = Vec::new();
    let pass = queue
        .pass(window, async |delivery| {
            let letter = DeadLetter::read(&delivery.properties, &delivery.data);
            seen.push(letter.message_id.unwrap_or_default());
            Ok(if seen.len() % remove_every == 0 {
                Verdict::Remove
            } else {
                Verdict::Keep
            })
        })
        .await
        .unwrap();
    assert!(pass.put_back, "{pass:?}");
    assert_eq!(pass.read, seen.len());
    seen
}

#[tokio::test]
async fn a_queue_read_through_several_consumers_keeps_its_order() {
    let p = Pipeline::new("windows").await;
    let all = ids("w", 50);
    for id in &all {
        p.publish_dead(id, "gave-up", "ok@example.com").await;
    }
    let queue = DeadQueue::open(&p.vhost.amqp_url(), DEAD_QUEUE)
        .await
        .unwrap();
    assert_eq!(
        pass_ids(&queue, 7, usize::MAX).await,
        all,
        "8 consumers of at most 7"
    );
    assert_eq!(pass_ids(&queue, 7, usize::MAX).await, all);
    let read = pass_ids(&queue, 7, 5).await;
    assert_eq!(read, all);
    let left: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| (i + 1) % 5 != 0)
        .map(|(_, id)| id.clone())
        .collect();
    assert_eq!(
        pass_ids(&queue, 7, usize::MAX).await,
        left,
        "every fifth removed"
    );
    let mut stopped_at = 0;
    queue
        .pass(7, async |_| {
            stopped_at += 1;
            Ok(if stopped_at == 12 {
                Verdict::Stop
            } else {
                Verdict::Keep
            })
        })
        .await
        .unwrap();
    assert_eq!(
        pass_ids(&queue, 7, usize::MAX).await,
        left,
        "a pass stopped half-way"
    );
    queue.close().await;
}

#[tokio::test]
async fn another_consumer_of_the_dead_queue_hides_what_it_holds_and_loses_nothing() {
    let p = Pipeline::new("other-consumer").await;
    let all = ids("o", 10);
    for id in &all {
        p.publish_dead(id, "rejected", "ok@example.com").await;
    }
    let theirs = p.vhost.connect().await;
    let channel = theirs.create_channel().await.unwrap();
    channel
        .basic_qos(3, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = channel
        .basic_consume(
            DEAD_QUEUE.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for _ in 0..3 {
        consumer.next().await.unwrap().unwrap();
    }

    let (code, out, err) = p.dead(&["list", "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: 1 other consumer(s) on mail.send.dead: the dead letters they hold were not read"),
        "{err}"
    );
    assert_eq!(out.lines().count(), 7, "{out}");

    channel.close(200, "done".into()).await.unwrap();
    eventually(10, "their consumer gone", || async {
        (p.consumers(DEAD_QUEUE).await == 0).then_some(())
    })
    .await;
    let listed: BTreeSet<String> = p.listed(&[]).into_iter().collect();
    assert_eq!(listed, all.into_iter().collect(), "all ten are back");
}

#[tokio::test]
async fn purge_without_yes_removes_nothing_and_with_yes_only_the_matches() {
    let p = Pipeline::new("purge").await;
    for (i, reason) in ["malformed", "gave-up", "malformed", "gave-up", "malformed"]
        .iter()
        .enumerate()
    {
        p.publish_dead(&format!("p-{i}"), reason, "ok@example.com")
            .await;
    }
    let before = p.listed(&[]);

    let (code, out, err) = p.dead(&["purge", "--reason", "malformed"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "would remove p-0 (malformed)\nwould remove p-2 (malformed)\nwould remove p-4 (malformed)\n\
         would remove 3 dead letters from mail.send.dead; nothing was removed: run again with --yes to remove them\n"
    );
    assert_eq!(p.listed(&[]), before, "nothing was removed");

    let (code, out, err) = p.dead(&["purge", "--reason", "malformed", "--limit", "2", "--yes"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.ends_with("removed 2 dead letters from mail.send.dead\n"),
        "{out}"
    );
    assert_eq!(p.listed(&[]), ["p-1", "p-3", "p-4"]);
}
