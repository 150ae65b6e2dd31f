//! `mailer dead replay`: sends dead letters again as fresh requests, and removes each from
//! the dead queue only after the broker confirmed its new copy.
//!
//! Interrupted at any moment, every dead letter is either still dead or back in the send
//! queue: the copy is published (mandatory, confirmed) before the dead letter is acked,
//! and an unacked dead letter goes back to the dead queue when the connection goes. The
//! one in flight may be in both, and so be sent twice; no other can.

use std::io::Write;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::AMQPValue;
use tokio::time::Instant;
use tracing::Instrument;

use super::queue::Verdict;
use super::value::{dead_letters, one_line};
use super::{DeadError, Filter, Target, for_each_match, open_checked};
use crate::amqp::publish::DEFAULT_PUBLISH_TIMEOUT;
use crate::amqp::{publish_confirmed, republished};
use crate::mail::REPLAYS_HEADER;

/// At most this many replays a second: `10/s`, `600/m`, `0.5/s` or `10`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    per_second: f64,
}

impl Rate {
    /// The time between two replays.
    pub fn interval(self) -> Duration {
        Duration::from_secs_f64(1.0 / self.per_second)
    }
}

impl FromStr for Rate {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        let (count, unit) = value.split_once('/').unwrap_or((value, "s"));
        let seconds = match unit {
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => f64::NAN,
        };
        match count.trim().parse::<f64>() {
            Ok(count) if count > 0.0 && count.is_finite() && seconds.is_finite() => Ok(Self {
                per_second: (count / seconds).max(1e-3),
            }),
            _ => Err(format!(
                "{value:?} is not a rate such as 10/s, 600/m or 5 (a second)"
            )),
        }
    }
}

/// How a replay runs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReplayOptions {
    /// Say what would be replayed, and publish nothing.
    pub dry_run: bool,
    pub rate: Option<Rate>,
}

/// The properties of a replayed request: the dead letter's own (content, identity,
/// producer headers, priority) with none of the worker's or the broker's headers but
/// [`REPLAYS_HEADER`] one higher, so the worker takes it as a first attempt. It is
/// published as `user` (RabbitMQ refuses another user-id), and without the original's
/// expiration, which the broker already moved into `x-death` or which would expire it on
/// its way again.
pub fn fresh_request(original: &BasicProperties, replays: u32, user: &str) -> BasicProperties {
    let ours = [(REPLAYS_HEADER, AMQPValue::LongLongInt(replays.into()))];
    republished(original, &ours, user)
}

/// Replays the dead letters that match `filter`, in their order, until done or until
/// `stop` resolves (then after the one in flight).
pub async fn replay(
    target: &Target,
    filter: &Filter,
    options: ReplayOptions,
    user: &str,
    stop: impl Future<Output = ()> + Send + 'static,
    out: &mut impl Write,
) -> Result<(), DeadError> {
    let queue = open_checked(target).await?;
    let publisher = match options.dry_run {
        true => None,
        false => Some(queue.confirming_channel().await?),
    };
    let stopped = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn({
        let stopped = stopped.clone();
        async move {
            stop.await;
            stopped.store(true, Ordering::SeqCst);
        }
    });

    let destination = format!("exchange {} with key {}", target.exchange, target.send_key);
    let (mut replayed, mut interrupted) = (0, false);
    let mut next_at = Instant::now();
    let read = for_each_match(&queue, filter, async |delivery, letter| {
        let id = one_line(letter.message_id.as_deref().unwrap_or("-"));
        let reason = one_line(&letter.reason);
        let Some(channel) = &publisher else {
            let _ = writeln!(out, "would replay {id} ({reason})");
            return Ok(Verdict::Keep);
        };
        if let Some(rate) = options.rate {
            tokio::time::sleep_until(next_at).await;
            next_at = Instant::now().max(next_at) + rate.interval();
        }
        if stopped.load(Ordering::SeqCst) {
            interrupted = true;
            return Ok(Verdict::Stop);
        }
        let properties = fresh_request(&delivery.properties, letter.replays + 1, user);
        let span = tracing::info_span!("replay", message_id = %id);
        let published = publish_confirmed(
            channel,
            &target.exchange,
            &target.send_key,
            properties,
            &delivery.data,
            DEFAULT_PUBLISH_TIMEOUT,
        )
        .instrument(span)
        .await;
        match published {
            Ok(()) => {
                replayed += 1;
                let _ = writeln!(out, "replayed {id} ({reason}) to {destination}");
                let _ = out.flush();
                Ok(Verdict::Remove)
            }
            Err(source) => Err(DeadError::Replay {
                done: format!("replayed {}", dead_letters(replayed)),
                message_id: id,
                source,
            }),
        }
    })
    .await;
    watcher.abort();
    queue.close().await;
    let read = read?;
    if interrupted {
        return Err(DeadError::Interrupted(format!(
            "interrupted: replayed {}; the rest are still in {}, run the same command again to go on",
            dead_letters(replayed),
            target.dead_queue
        )));
    }
    let _ = if options.dry_run {
        writeln!(
            out,
            "would replay {} to {destination}; nothing was published (dry run)",
            dead_letters(read.matched)
        )
    } else {
        writeln!(
            out,
            "replayed {} to {destination}; {} left in {}",
            dead_letters(replayed),
            (read.pass.depth.ready as usize).saturating_sub(read.pass.removed),
            target.dead_queue
        )
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use lapin::types::{FieldTable, LongString};

    use super::*;

    #[test]
    fn rates_per_second_minute_or_hour() {
        assert_eq!(
            "10/s".parse::<Rate>().unwrap().interval(),
            Duration::from_millis(100)
        );
        assert_eq!(
            "10".parse::<Rate>().unwrap().interval(),
            Duration::from_millis(100)
        );
        assert_eq!(
            "120/m".parse::<Rate>().unwrap().interval(),
            Duration::from_millis(500)
        );
        assert_eq!(
            "0.5/s".parse::<Rate>().unwrap().interval(),
            Duration::from_secs(2)
        );
        assert_eq!(
            "3600/h".parse::<Rate>().unwrap().interval(),
            Duration::from_secs(1)
        );
        for bad in ["0/s", "-1/s", "fast", "10/d", "inf/s", "NaN"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_replayed_request_is_fresh_but_keeps_what_its_producer_gave_it() {
        let mut headers = FieldTable::default();
        for (name, value) in [
            ("traceparent", "00-abc-def-01"),
            ("x-mail-attempt", "5"),
            ("x-mail-dead-reason", "gave-up"),
            ("x-mail-dead-error", "smtp: 450"),
            ("x-mail-dead-at", "1"),
            ("x-mail-dead-attempts", "5"),
            ("x-mail-replays", "1"),
            ("x-death", "[]"),
            ("x-first-death-reason", "expired"),
            ("x-delivery-count", "7"),
        ] {
            headers.insert(name.into(), AMQPValue::LongString(LongString::from(value)));
        }
        let original = BasicProperties::default()
            .with_headers(headers)
            .with_message_id("order-42".into())
            .with_correlation_id("corr".into())
            .with_content_type("application/json".into())
            .with_priority(7)
            .with_expiration("1000".into())
            .with_user_id("shop".into());
        let fresh = fresh_request(&original, 2, "oncall");
        let headers = fresh.headers().clone().unwrap();
        let names: Vec<&str> = headers.inner().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["traceparent", "x-mail-replays"]);
        assert_eq!(headers.inner()["x-mail-replays"], AMQPValue::LongLongInt(2));
        assert_eq!(
            fresh.message_id().as_ref().map(|s| s.as_str()),
            Some("order-42")
        );
        assert_eq!(
            fresh.correlation_id().as_ref().map(|s| s.as_str()),
            Some("corr")
        );
        assert_eq!(*fresh.priority(), Some(7));
        assert_eq!(*fresh.delivery_mode(), Some(2));
        assert_eq!(*fresh.expiration(), None);
        assert_eq!(fresh.user_id().as_ref().map(|s| s.as_str()), Some("oncall"));
    }
}
