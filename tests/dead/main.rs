//! `mailer dead` end to end: the real binary against the real RabbitMQ (3.10, and 4.0
//! with `MAILER_TEST_BROKER=4.0`), dead letters made by the real worker and by the broker,
//! replayed requests sent by a running worker through a real SMTP server (aiosmtpd). One
//! vhost per test.

mod harness;
mod limit;
mod reading;
mod reasons;
mod replay;
