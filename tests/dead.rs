//! `mailer dead` end to end: the real binary against the real RabbitMQ (3.10, and 4.0
//! with `MAILER_TEST_BROKER=4.0`), dead letters made by the real worker and by the broker,
//! replayed requests sent by a running worker through a real SMTP server (aiosmtpd). One
//! vhost per test.

pub mod support;

#[path = "dead/harness.rs"]
mod harness;
#[path = "dead/limit.rs"]
mod limit;
#[path = "dead/reading.rs"]
mod reading;
#[path = "dead/reasons.rs"]
mod reasons;
#[path = "dead/replay.rs"]
mod replay;
