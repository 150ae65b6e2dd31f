//! Many publishes in flight on one confirming channel, some unroutable and some routed:
//! each must learn its own outcome, although lapin hands a returned message to whichever
//! confirm it completes next.

use std::time::Duration;

use futures::future::join_all;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::{BasicProperties, Connection, ExchangeKind};
use mailer::amqp::{PipelinedPublisher, PublishError};

use mailer_testkit::broker::{TestVhost, confirming_channel, live_count, no_args};

const ROUTED: &str = "routed";
const UNBOUND: &str = "unbound";
const QUEUE: &str = "parked";
const KEY: &str = "mail.send";

#[tokio::test]
async fn each_of_many_publishes_in_flight_on_one_channel_learns_its_own_outcome() {
    let vhost = TestVhost::created("pipelined").await;
    let connection = routed_and_unbound(&vhost).await;
    let publisher = PipelinedPublisher::new(vec![
        confirming_channel(&connection).await,
        confirming_channel(&connection).await,
    ]);

    // In waves of 16 at once (the worker's prefetch), unroutable ones among routed ones,
    // and a duplicate of a routed request in flight with it in every wave.
    let mut routed = 0;
    for wave in 0..20 {
        let publishes: Vec<(usize, &str, String)> = (0..16)
            .map(|i| {
                let exchange = if (i + wave) % 3 == 0 { UNBOUND } else { ROUTED };
                let id = if i == 15 {
                    format!("request-{wave}-1")
                } else {
                    format!("request-{wave}-{i}")
                };
                (i, exchange, id)
            })
            .collect();
        let outcomes = join_all(publishes.iter().map(|(i, exchange, id)| {
            let properties = BasicProperties::default().with_message_id(id.as_str().into());
            let body = format!("body of {id}").into_bytes();
            let publisher = publisher.clone();
            let exchange = if *i == 15 { ROUTED } else { *exchange };
            async move {
                let outcome = publisher
                    .publish(exchange, KEY, properties, &body, Duration::from_secs(10))
                    .await;
                (exchange, outcome)
            }
        }))
        .await;
        for ((_, _, id), (exchange, outcome)) in publishes.iter().zip(outcomes) {
            match (exchange, outcome) {
                (ROUTED, Ok(())) => routed += 1,
                (UNBOUND, Err(PublishError::Unroutable { .. })) => {}
                (exchange, outcome) => {
                    panic!("{id} published to {exchange}: wrong outcome {outcome:?}")
                }
            }
        }
    }
    let parked = live_count(&connection, QUEUE).await.expect("the queue") as usize;
    assert_eq!(
        parked, routed,
        "every publish told it was routed is in the queue, and no other"
    );
}

/// lapin numbers a publish (its delivery tag) and queues its frames in two steps, so two
/// publishes handed to it at once from two threads could go out in the other order than
/// they were numbered: the broker's confirm of one then completes the other's, and an
/// unroutable park that is confirmed before its return arrives would be taken for routed.
/// Here many tasks on a multi-threaded runtime publish at once, with bodies large enough
/// that copying them into frames widens the gap between the two steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publishes_handed_to_lapin_from_several_threads_at_once_each_learn_their_own_outcome() {
    let vhost = TestVhost::created("pipelined-threads").await;
    let connection = routed_and_unbound(&vhost).await;
    let publisher = PipelinedPublisher::new(vec![confirming_channel(&connection).await]);

    let mut routed = 0;
    let mut wrong = Vec::new();
    let (waves, per_wave) = (40, 32);
    for wave in 0..waves {
        let tasks: Vec<_> = (0..per_wave)
            .map(|i| {
                // Mostly unroutable: a return confirmed for another publish is what loses.
                let exchange = if i % 4 == 0 { ROUTED } else { UNBOUND };
                let id = format!("request-{wave}-{i}");
                let mut body = vec![b'x'; 48 * 1024 + i * 97];
                body[..id.len()].copy_from_slice(id.as_bytes());
                let properties = BasicProperties::default().with_message_id(id.as_str().into());
                let publisher = publisher.clone();
                tokio::spawn(async move {
                    let outcome = publisher
                        .publish(exchange, KEY, properties, &body, Duration::from_secs(10))
                        .await;
                    (id, exchange, outcome)
                })
            })
            .collect();
        for task in join_all(tasks).await {
            match task.expect("the publish task") {
                (_, ROUTED, Ok(())) => routed += 1,
                (_, UNBOUND, Err(PublishError::Unroutable { .. })) => {}
                (id, exchange, outcome) => wrong.push(format!("{id} to {exchange}: {outcome:?}")),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} publishes learned another's outcome: {wrong:#?}",
        wrong.len(),
        waves * per_wave
    );
    let parked = live_count(&connection, QUEUE).await.expect("the queue") as usize;
    assert_eq!(
        parked, routed,
        "every publish told it was routed is in the queue"
    );
}

/// `ROUTED` bound to `QUEUE` and `UNBOUND` bound to nothing, in `vhost`; the connection
/// they were declared on.
async fn routed_and_unbound(vhost: &TestVhost) -> Connection {
    let connection = vhost.connect().await;
    let setup = connection.create_channel().await.expect("channel");
    for exchange in [ROUTED, UNBOUND] {
        setup
            .exchange_declare(
                exchange.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                no_args(),
            )
            .await
            .expect("declare an exchange");
    }
    setup
        .queue_declare(QUEUE.into(), QueueDeclareOptions::default(), no_args())
        .await
        .expect("declare the queue");
    setup
        .queue_bind(
            QUEUE.into(),
            ROUTED.into(),
            KEY.into(),
            QueueBindOptions::default(),
            no_args(),
        )
        .await
        .expect("bind the queue");
    connection
}
