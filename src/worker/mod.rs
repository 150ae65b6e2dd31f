//! `mailer worker`: consume mail requests, send them, park what failed for now and
//! dead-letter what never will succeed.

pub mod attempt;
pub mod outcome;
pub mod publish;
