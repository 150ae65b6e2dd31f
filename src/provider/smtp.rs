//! SMTP through lettre's connection, with a small pool of reused connections.
//!
//! lettre's `AsyncSmtpTransport::send` stops at the first refused recipient, which
//! cannot tell "one recipient got 450, another 550" from "450" alone. This module
//! drives each transaction itself: `MAIL FROM`, then `RCPT TO` for every recipient,
//! collecting the replies, and `DATA` only when every recipient was accepted, so no
//! one gets a mail that others did not. If any recipient is refused for good (5xx) the
//! mail failed for good whatever follows, else a 4xx means it failed for now. After a
//! refused transaction `RSET` makes the connection reusable.

mod breaker;
mod failure;
mod settings;

use std::fmt;
use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{AsyncSmtpConnection, Certificate, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail as MailCommand, Rcpt, Rset};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use tokio::sync::Semaphore;

use breaker::{ConnectBreaker, Gate};
use failure::{Cause, Step, StepError, classify, refused_recipients};
pub use settings::{
    DEFAULT_CONNECTIONS, DEFAULT_SMTP_PORT, DEFAULT_SMTPS_PORT, DEFAULT_TIMEOUT, Security,
    SmtpSettings,
};

use super::refusals::Refusals;
use super::{ErrorClass, Failure, Provider, ProviderUrlError, SendError};
use crate::message::{Mail, Rendered};

/// An idle connection older than this is closed rather than reused: servers drop idle
/// clients after a while, and a stale connection costs a failed command to find out.
const MAX_IDLE: Duration = Duration::from_secs(60);
/// Mails sent over one connection before it is closed; many servers limit this.
const MAX_MAILS_PER_CONNECTION: u32 = 100;

/// Sends mail to one SMTP server, reusing up to `connections` connections.
pub struct SmtpProvider {
    settings: SmtpSettings,
    /// `host:port`, as every error names it.
    server: String,
    tls: Option<TlsParameters>,
    hello: ClientId,
    idle: Mutex<Vec<PooledConnection>>,
    /// One permit per connection: a send holds one while it uses a connection, so no
    /// more than `connections` are open at once.
    permits: Semaphore,
    /// Pauses connecting while the server cannot be reached.
    breaker: ConnectBreaker,
    /// Pauses sending while the server refuses our login.
    refusals: Refusals,
}

struct PooledConnection {
    connection: AsyncSmtpConnection,
    idle_since: Instant,
    mails_sent: u32,
}

impl SmtpProvider {
    /// Prepares the provider; it connects only when the first mail is sent. The server's
    /// certificate must chain to a public CA (webpki's roots) or to `ca_pem`, a PEM
    /// certificate (`MAIL_PROVIDER_CA_FILE`) for an internal relay.
    pub fn new(settings: SmtpSettings, ca_pem: Option<&[u8]>) -> Result<Self, ProviderUrlError> {
        let unusable = |problem: String| ProviderUrlError::Invalid {
            url: settings.to_string(),
            problem,
        };
        let tls = match settings.security {
            Security::Plaintext => None,
            _ => {
                let mut builder = TlsParameters::builder(settings.host.clone());
                if let Some(pem) = ca_pem {
                    // lettre takes a PEM file without a certificate as no certificate.
                    let has_certificate = std::str::from_utf8(pem)
                        .is_ok_and(|text| text.contains("-----BEGIN CERTIFICATE-----"));
                    if !has_certificate {
                        return Err(unusable(
                            "MAIL_PROVIDER_CA_FILE holds no PEM certificate \
                             (-----BEGIN CERTIFICATE-----)"
                                .to_string(),
                        ));
                    }
                    let ca = Certificate::from_pem(pem).map_err(|e| {
                        unusable(format!(
                            "MAIL_PROVIDER_CA_FILE is not a PEM certificate ({e})"
                        ))
                    })?;
                    builder = builder.add_root_certificate(ca);
                }
                Some(
                    builder
                        .build()
                        .map_err(|e| unusable(format!("cannot set up TLS: {e}")))?,
                )
            }
        };
        let hello = settings
            .hello
            .clone()
            .map(ClientId::Domain)
            .unwrap_or_default();
        Ok(Self {
            permits: Semaphore::new(settings.connections),
            server: settings.server(),
            settings,
            tls,
            hello,
            idle: Mutex::new(Vec::new()),
            breaker: ConnectBreaker::default(),
            refusals: Refusals::default(),
        })
    }

    pub fn settings(&self) -> &SmtpSettings {
        &self.settings
    }

    /// Sends one mail on a connection of the pool, within `limit` once it has one: the
    /// wait for a free connection (all `connections` busy) is not part of the send's
    /// deadline, so a slow server makes queued sends wait their turn rather than time out
    /// before they ever connect. A send cut at the deadline before a session was opened
    /// did not reach the server.
    /// A login the server refuses (class `auth`) pauses sending as an API's refused key
    /// does ([`super::refusals`]): no attempt spent, no mail given up.
    async fn send_mail(&self, mail: Mail, limit: Option<Duration>) -> Result<(), SendError> {
        let _permit = self.permits.acquire().await.map_err(|_| {
            SendError::for_now(ErrorClass::Io, format!("{self}: the provider is shut down"))
        })?;
        self.refusals.gate(Instant::now())?;
        let mut reached = false;
        let sending = self.send_on_connection(mail, &mut reached);
        let sent = match limit {
            None => sending.await,
            Some(limit) => tokio::time::timeout(limit, sending)
                .await
                .unwrap_or_else(|_| {
                    let error = SendError::past_deadline(self, limit);
                    Err(if reached { error } else { error.not_reached() })
                }),
        };
        self.refusals.answered(self, sent)
    }

    /// [`send_mail`](Self::send_mail) once it holds a permit; `reached` is set while it
    /// holds a session with the server.
    async fn send_on_connection(&self, mail: Mail, reached: &mut bool) -> Result<(), SendError> {
        let (mut pooled, reused) = match self.take_idle() {
            Some(pooled) => (pooled, true),
            None => (self.connect().await?, false),
        };
        *reached = true;
        // Rendered once a connection is ready, so a server that refuses us costs no
        // rendering, and at most one mail per connection is held rendered.
        let mail = mail.render().map_err(|e| super::unrenderable(self, &e))?;
        let result = self.transaction(&mut pooled.connection, &mail).await;
        match result {
            // A pooled connection the server has closed fails at its first command;
            // nothing was sent yet, so try once more on a new connection.
            Err(error) if reused && error.step == Step::MailFrom && !error.connection_usable => {
                tracing::debug!(
                    server = %self.server,
                    "a pooled connection was stale ({}); connecting again",
                    error.detail
                );
                drop(pooled);
                *reached = false;
                let mut fresh = self.connect().await?;
                *reached = true;
                let result = self.transaction(&mut fresh.connection, &mail).await;
                self.finish(fresh, result).await
            }
            result => self.finish(pooled, result).await,
        }
    }

    /// Returns the connection to the pool when it can be used again, and reports.
    async fn finish(
        &self,
        mut pooled: PooledConnection,
        result: Result<(), StepError>,
    ) -> Result<(), SendError> {
        match result {
            Ok(()) => {
                pooled.mails_sent += 1;
                self.keep(pooled).await;
                Ok(())
            }
            Err(error) => {
                if error.connection_usable {
                    let reset = self
                        .within(Step::Reset, "RSET", pooled.connection.command(Rset))
                        .await;
                    if reset.is_ok() {
                        self.keep(pooled).await;
                    }
                }
                Err(self.report(error))
            }
        }
    }

    fn take_idle(&self) -> Option<PooledConnection> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        // The most recently used connection is the likeliest to be alive; the rest
        // are dropped when too old.
        while let Some(pooled) = idle.pop() {
            if pooled.idle_since.elapsed() < MAX_IDLE && !pooled.connection.has_broken() {
                return Some(pooled);
            }
        }
        None
    }

    async fn keep(&self, mut pooled: PooledConnection) {
        if pooled.mails_sent >= MAX_MAILS_PER_CONNECTION {
            let _ = tokio::time::timeout(self.settings.timeout, pooled.connection.quit()).await;
            return;
        }
        pooled.idle_since = Instant::now();
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(pooled);
    }

    /// Opens a connection: greeting, `EHLO`, TLS as the settings say, and login; or fails
    /// at once while the [breaker](breaker) pauses connecting. Until the session is open
    /// (the greeting and `EHLO` answered) a failure did not reach the server
    /// ([`SendError::reached`]); STARTTLS and login come after and did.
    async fn connect(&self) -> Result<PooledConnection, SendError> {
        if let Gate::FailFast(error) = self.breaker.gate(Instant::now()) {
            return Err(error);
        }
        let attempt = breaker::Attempt::start(&self.breaker, &self.server);
        let reached = self.reach().await;
        attempt.finish(reached.as_ref().map(|_| ()));
        let connection = reached?;
        self.start_session(connection).await
    }

    /// The connection and the server's greeting, as the settings say (implicit TLS or not).
    async fn reach(&self) -> Result<AsyncSmtpConnection, SendError> {
        let settings = &self.settings;
        let implicit_tls = match settings.security {
            Security::ImplicitTls => self.tls.clone(),
            _ => None,
        };
        let connection = match implicit_tls {
            Some(tls) => {
                let connecting = AsyncSmtpConnection::connect_tokio1(
                    (settings.host.as_str(), settings.port),
                    Some(settings.timeout),
                    &self.hello,
                    Some(tls),
                    None,
                );
                self.within(Step::Connect, "connecting", connecting).await
            }
            None => match self.open_tcp().await {
                Ok(stream) => {
                    let greeting =
                        AsyncSmtpConnection::connect_with_transport(Box::new(stream), &self.hello);
                    self.within(Step::Connect, "connecting", greeting).await
                }
                Err(e) => Err(e),
            },
        }
        .map_err(|e| self.report(e).not_reached())?;
        tracing::debug!(server = %self.server, "connected");
        Ok(connection)
    }

    /// STARTTLS and login on a new connection, as the settings say.
    async fn start_session(
        &self,
        mut connection: AsyncSmtpConnection,
    ) -> Result<PooledConnection, SendError> {
        let settings = &self.settings;
        let wants_starttls = matches!(
            settings.security,
            Security::StartTlsRequired | Security::StartTlsOpportunistic
        );
        if let (true, Some(tls)) = (wants_starttls, &self.tls) {
            if connection.can_starttls() {
                self.within(
                    Step::StartTls,
                    "STARTTLS",
                    connection.starttls(tls.clone(), &self.hello),
                )
                .await
                .map_err(|e| self.report(e))?;
            } else if settings.security == Security::StartTlsRequired {
                return Err(self.for_now_error(
                    ErrorClass::Tls,
                    "the server does not offer STARTTLS, which tls=required needs \
                     (use tls=opportunistic or tls=none for a server without TLS)",
                ));
            }
        }

        if let (Some(username), Some(password)) = (&settings.username, settings.password()) {
            if !connection.is_encrypted() && settings.security != Security::Plaintext {
                return Err(self.for_now_error(
                    ErrorClass::Tls,
                    "the server does not offer STARTTLS, so the password is not sent \
                     (use tls=none to send it unencrypted anyway)",
                ));
            }
            let credentials = Credentials::new(username.clone(), password.to_owned());
            self.within(
                Step::Auth,
                "AUTH",
                connection.auth(&[Mechanism::Plain, Mechanism::Login], &credentials),
            )
            .await
            .map_err(|e| self.report(e))?;
        }
        Ok(PooledConnection {
            connection,
            idle_since: Instant::now(),
            mails_sent: 0,
        })
    }

    /// A TCP connection with Nagle's algorithm off. lettre writes the end of a message
    /// as a second small write; with Nagle on, that write waits for the server's delayed
    /// ACK on every mail, which caps what a connection can send (docs/benchmarks.md).
    async fn open_tcp(&self) -> Result<tokio::net::TcpStream, StepError> {
        let settings = &self.settings;
        let failed = |class, detail| StepError {
            step: Step::Connect,
            failure: Failure::ForNow,
            class,
            detail,
            connection_usable: false,
        };
        let connecting = tokio::net::TcpStream::connect((settings.host.as_str(), settings.port));
        let stream = match tokio::time::timeout(settings.timeout, connecting).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(failed(ErrorClass::Connect, format!("connecting: {e}"))),
            Err(_) => {
                let within = humantime::format_duration(settings.timeout);
                return Err(failed(
                    ErrorClass::Timeout,
                    format!("connecting: no answer within {within}"),
                ));
            }
        };
        // Only a latency cost if it fails, so carry on without it.
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    /// One mail: `MAIL FROM`, `RCPT TO` for each recipient, and `DATA` only when every
    /// recipient was accepted.
    async fn transaction(
        &self,
        connection: &mut AsyncSmtpConnection,
        mail: &Rendered,
    ) -> Result<(), StepError> {
        let envelope = mail.envelope();
        let parameters = mail_parameters(connection, mail)?;
        let sender = envelope.from().map(address_text).unwrap_or_default();
        self.within(
            Step::MailFrom,
            Command("MAIL FROM", sender),
            connection.command(MailCommand::new(envelope.from().cloned(), parameters)),
        )
        .await?;

        let mut refusals = Vec::new();
        for recipient in envelope.to() {
            let command = Rcpt::new(recipient.clone(), Vec::new());
            match self
                .within(
                    Step::RcptTo,
                    Command("RCPT TO", recipient.as_ref()),
                    connection.command(command),
                )
                .await
            {
                Ok(_) => {}
                Err(refusal) if refusal.connection_usable => refusals.push(refusal),
                // The session ended (a 421, the network): a recipient already refused
                // for good still makes the mail rejected.
                Err(error) if refusals.iter().any(|r| r.failure == Failure::ForGood) => {
                    refusals.push(error);
                    break;
                }
                Err(error) => return Err(error),
            }
        }
        if !refusals.is_empty() {
            return Err(refused_recipients(refusals));
        }

        self.within(Step::Data, "DATA", connection.command(Data))
            .await?;
        self.within(
            Step::Message,
            "sending the message",
            // In parts, each body encoded as it is written, so neither the encoding nor
            // lettre's dot-stuffed copy is more than a part at a time.
            connection.message_iter(mail.parts()),
        )
        .await?;
        Ok(())
    }

    /// Runs one step within the timeout and classifies its failure.
    async fn within<T>(
        &self,
        step: Step,
        what: impl fmt::Display,
        work: impl Future<Output = Result<T, lettre::transport::smtp::Error>>,
    ) -> Result<T, StepError> {
        match tokio::time::timeout(self.settings.timeout, work).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(classify(step, &what.to_string(), Cause::of(&error))),
            Err(_) => Err(StepError {
                step,
                failure: Failure::ForNow,
                class: ErrorClass::Timeout,
                detail: format!(
                    "{what}: no answer within {}",
                    humantime::format_duration(self.settings.timeout)
                ),
                connection_usable: false,
            }),
        }
    }

    fn report(&self, error: StepError) -> SendError {
        let message = format!("{}: {}", self.server, error.detail);
        match error.failure {
            Failure::ForNow => SendError::for_now(error.class, message),
            Failure::ForGood => SendError::for_good(error.class, message),
        }
    }

    fn for_now_error(&self, class: ErrorClass, detail: &str) -> SendError {
        SendError::for_now(class, format!("{}: {detail}", self.server))
    }
}

impl fmt::Display for SmtpProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.settings.fmt(f)
    }
}

impl fmt::Debug for SmtpProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let idle = self.idle.lock().map(|idle| idle.len()).unwrap_or_default();
        f.debug_struct("SmtpProvider")
            .field("settings", &self.settings)
            .field("idle_connections", &idle)
            .finish()
    }
}

impl Provider for SmtpProvider {
    fn send(&self, mail: Mail) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(self.send_mail(mail, None))
    }

    fn send_within(&self, mail: Mail, limit: Duration) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(self.send_mail(mail, Some(limit)))
    }

    fn concurrency(&self) -> Option<NonZeroUsize> {
        NonZeroUsize::new(self.settings.connections)
    }

    fn paused(&self) -> Option<super::Pause> {
        let unreachable = self.breaker.paused_until().map(|until| super::Pause {
            until,
            cause: super::PauseCause::Unreachable,
        });
        unreachable.or_else(|| self.refusals.paused())
    }
}

/// An SMTP command and its address, as an error names it: `RCPT TO:<a@example.com>`.
/// Formatted only when the command failed.
struct Command<'a>(&'static str, &'a str);

impl fmt::Display for Command<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:<{}>", self.0, self.1)
    }
}

/// The `MAIL FROM` parameters the mail needs, or why this server cannot take it.
fn mail_parameters(
    connection: &AsyncSmtpConnection,
    mail: &Rendered,
) -> Result<Vec<MailParameter>, StepError> {
    let envelope = mail.envelope();
    let server = connection.server_info();
    let unsupported = |detail: &str| StepError {
        step: Step::MailFrom,
        failure: Failure::ForGood,
        class: ErrorClass::Protocol,
        detail: detail.to_owned(),
        connection_usable: true,
    };
    let mut parameters = Vec::new();
    let mut addresses = envelope.from().into_iter().chain(envelope.to());
    if addresses.any(|address| !address_text(address).is_ascii()) {
        if !server.supports_feature(Extension::SmtpUtfEight) {
            return Err(unsupported(
                "the mail has non-ASCII addresses and the server does not support SMTPUTF8",
            ));
        }
        parameters.push(MailParameter::SmtpUtfEight);
    }
    if !mail.is_ascii() {
        if !server.supports_feature(Extension::EightBitMime) {
            return Err(unsupported(
                "the mail is not ASCII and the server does not support 8BITMIME",
            ));
        }
        parameters.push(MailParameter::Body(MailBodyParameter::EightBitMime));
    }
    Ok(parameters)
}

fn address_text(address: &lettre::Address) -> &str {
    address.as_ref()
}
