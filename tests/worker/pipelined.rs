//! Many publishes in flight on one confirming channel, some unroutable and some routed:
//! each must learn its own outcome, although lapin hands a returned message to whichever
//! confirm it completes next.

use std::time::Duration;

use futures::future::join_all;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::{BasicProperties, ExchangeKind};
use mailer::amqp::{PipelinedPublisher, PublishError};

use mailer_testkit::broker::{TestVhost, confirming_channel, no_args};

const ROUTED: &str = "routed";
const UNBOUND: &str = "unbound";
const QUEUE: &str = "parked";
const KEY: &str = "mail.send";

#[tokio::test]
async fn each_of_many_publishes_in_flight_on_one_channel_learns_its_own_outcome() {
    let vhost = TestVhost::created("pipelined").await;
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
    let declared = setup
        .queue_declare(
            QUEUE.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            no_args(),
        )
        .await
        .expect("count the queue");
    assert_eq!(
        declared.message_count() as usize,
        routed,
        "every publish told it was routed is in the queue, and no other"
    );
}
