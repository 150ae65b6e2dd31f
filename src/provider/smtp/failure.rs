//! Sorting what went wrong in an SMTP session into for now or for good, and a class.
//!
//! Only a 5xx reply to the mail itself (a recipient, or its content after every
//! recipient was accepted) is for good. A 5xx to the session (the greeting, STARTTLS,
//! AUTH, or MAIL FROM, where a relay asks for authentication with 530 or refuses this
//! client as a sender) is about this client or its settings, which someone can fix, so
//! the mail is retried: a misconfigured relay must not dead-letter the whole queue.
//! Everything without a reply (the network, TLS, a timeout) is for now.

use crate::provider::{ErrorClass, Failure};

/// The most refused recipients one error message lists.
const MAX_LISTED_REFUSALS: usize = 10;
/// How lettre words a reply cut short because the server closed the connection; it
/// has no error kind for that, and it is the network failing, not the protocol.
const LETTRE_CONNECTION_CLOSED: &str = "incomplete response";
/// The reply of a server that is closing the connection.
const SERVICE_CLOSING: u16 = 421;
/// RFC 4954's "authentication required" and "authentication credentials invalid".
const AUTH_REQUIRED: u16 = 530;
const AUTH_FAILED: u16 = 535;

/// The step of a session a failure happened at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    Connect,
    StartTls,
    Auth,
    MailFrom,
    RcptTo,
    Data,
    Message,
    Reset,
}

impl Step {
    /// Whether a reply at this step is about the mail rather than the session.
    fn is_about_the_mail(self) -> bool {
        matches!(self, Self::RcptTo | Self::Data | Self::Message)
    }
}

/// A failed step: what to report, and whether the connection can still be used.
#[derive(Debug)]
pub(super) struct StepError {
    pub step: Step,
    pub failure: Failure,
    pub class: ErrorClass,
    /// What failed and why, without the server's name, e.g. `RCPT TO:<a@b>: 550 …`.
    pub detail: String,
    /// The server replied and will take another command (after `RSET`).
    pub connection_usable: bool,
}

/// What went wrong in a step, as far as sorting it is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Cause {
    /// The server answered with a 4xx or 5xx reply.
    Reply {
        code: u16,
        text: String,
    },
    Timeout(String),
    Tls(String),
    /// The server said something that is not SMTP, or lettre refused to go on.
    Protocol(String),
    /// Connecting, reading or writing failed.
    Io(String),
}

impl Cause {
    pub fn of(error: &lettre::transport::smtp::Error) -> Self {
        if let Some(code) = error.status() {
            let text = std::error::Error::source(error)
                .map(ToString::to_string)
                .unwrap_or_default();
            return Self::Reply {
                code: code.into(),
                text,
            };
        }
        let text = error.to_string();
        if error.is_timeout() {
            Self::Timeout(text)
        } else if error.is_tls() || caused_by_tls(error) {
            match tls_advice(error) {
                Some(advice) => Self::Tls(format!("{text}; {advice}")),
                None => Self::Tls(text),
            }
        } else if error.is_response() && text.ends_with(LETTRE_CONNECTION_CLOSED) {
            Self::Io("the server closed the connection".into())
        } else if error.is_response() || error.is_client() {
            Self::Protocol(text)
        } else {
            Self::Io(text)
        }
    }
}

/// Sorts a failed step; `what` names it in the detail, e.g. `RCPT TO:<a@b>`.
pub(super) fn classify(step: Step, what: &str, cause: Cause) -> StepError {
    let (failure, class, text, connection_usable) = match cause {
        Cause::Reply { code, text } => {
            let permanent = code / 100 == 5;
            let class = match step {
                Step::Auth => ErrorClass::Auth,
                _ if code == AUTH_REQUIRED || code == AUTH_FAILED => ErrorClass::Auth,
                _ if permanent && !step.is_about_the_mail() => ErrorClass::Protocol,
                _ if permanent => ErrorClass::PermanentReply,
                _ => ErrorClass::TemporaryReply,
            };
            let failure = if permanent && step.is_about_the_mail() {
                Failure::ForGood
            } else {
                Failure::ForNow
            };
            let text = format!("{code} {text}").trim_end().to_owned();
            (failure, class, text, code != SERVICE_CLOSING)
        }
        Cause::Timeout(text) => (Failure::ForNow, ErrorClass::Timeout, text, false),
        Cause::Tls(text) => (Failure::ForNow, ErrorClass::Tls, text, false),
        Cause::Protocol(text) | Cause::Io(text) if step == Step::StartTls => {
            (Failure::ForNow, ErrorClass::Tls, text, false)
        }
        Cause::Protocol(text) | Cause::Io(text) if step == Step::Connect => {
            (Failure::ForNow, ErrorClass::Connect, text, false)
        }
        Cause::Protocol(text) | Cause::Io(text) if step == Step::Auth => {
            (Failure::ForNow, ErrorClass::Auth, text, false)
        }
        Cause::Protocol(text) => (Failure::ForNow, ErrorClass::Protocol, text, false),
        Cause::Io(text) => (Failure::ForNow, ErrorClass::Io, text, false),
    };
    StepError {
        step,
        failure,
        class,
        detail: format!("{what}: {text}"),
        connection_usable,
    }
}
/// One error for a transaction whose recipients were refused: for good when any
/// refusal is (a 5xx), even if a 4xx came first or the server closed the connection
/// after (a 421 at a later recipient); else for now.
pub(super) fn refused_recipients(refusals: Vec<StepError>) -> StepError {
    let for_good = refusals.iter().any(|r| r.failure == Failure::ForGood);
    let mut listed: Vec<&str> = refusals
        .iter()
        .take(MAX_LISTED_REFUSALS)
        .map(|r| r.detail.as_str())
        .collect();
    let more = refusals.len().saturating_sub(MAX_LISTED_REFUSALS);
    let more_note = format!("and {more} more");
    if more > 0 {
        listed.push(&more_note);
    }
    StepError {
        step: Step::RcptTo,
        failure: if for_good {
            Failure::ForGood
        } else {
            Failure::ForNow
        },
        class: if for_good {
            ErrorClass::PermanentReply
        } else {
            ErrorClass::TemporaryReply
        },
        detail: format!(
            "recipients refused, so the mail went to no one: {}",
            listed.join("; ")
        ),
        connection_usable: refusals.iter().all(|r| r.connection_usable),
    }
}

/// Whether rustls is behind an error: lettre reports a failed handshake as a
/// connection error around an I/O error around the rustls error.
pub(super) fn caused_by_tls(error: &(dyn std::error::Error + 'static)) -> bool {
    rustls_error(error).is_some()
}

fn rustls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(tls) = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        cause = error.source();
    }
    None
}

/// What to do about a certificate the worker refused, when the TLS error says why.
pub(super) fn tls_advice(error: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    use rustls::CertificateError as Why;
    let rustls::Error::InvalidCertificate(why) = rustls_error(error)? else {
        return None;
    };
    Some(match why {
        Why::UnknownIssuer => {
            "the server's certificate is not signed by a CA this worker trusts: for an internal relay, set MAIL_PROVIDER_CA_FILE to its CA certificate (PEM)"
        }
        Why::Expired | Why::ExpiredContext { .. } => {
            "the server's certificate has expired: the relay's operator must renew it"
        }
        Why::NotValidYet | Why::NotValidYetContext { .. } => {
            "the server's certificate is not valid yet: check the clocks of the relay and the worker"
        }
        Why::NotValidForName | Why::NotValidForNameContext { .. } => {
            "the server's certificate is not for the host in MAIL_PROVIDER_URL: use the name it was issued for"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
