//! A local SMTP sink, and its own limit measured with the provider alone. Either
//! `tests/smtp_server.py` (aiosmtpd, Python; the default), or, when
//! `MAILER_BENCH_SMTP_SINK` names it, Postfix's `smtp-sink`: Postfix's own test server
//! for measuring SMTP clients, written in C: the Python server cannot keep up with the
//! worker (docs/benchmarks.md). Both store every mail as a file, which the bench counts.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use mailer::message::Mail;
use mailer::provider::Provider;

const START_LIMIT: Duration = Duration::from_secs(30);
/// The names Postfix's `smtp-sink -d` gives the mails it dumps: this, then a random
/// hexadecimal number.
const POSTFIX_DUMP_PREFIX: &str = "mail.";

/// Which server the sink runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Aiosmtpd,
    PostfixSmtpSink,
}

/// The sink's server as a child process, stopped and its mail removed when dropped.
pub struct SmtpSink {
    child: Child,
    pub server: Server,
    pub port: u16,
    pub mail_dir: PathBuf,
}

impl SmtpSink {
    /// Starts the server `MAILER_BENCH_SMTP_SINK` names (a path to Postfix's `smtp-sink`),
    /// or aiosmtpd when it is unset or empty.
    pub fn start() -> Result<Self> {
        let mail_dir =
            std::env::temp_dir().join(format!("mailer-bench-smtp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&mail_dir);
        std::fs::create_dir_all(&mail_dir)?;
        match std::env::var_os("MAILER_BENCH_SMTP_SINK").filter(|path| !path.is_empty()) {
            Some(path) => Self::start_postfix(Path::new(&path), mail_dir),
            None => Self::start_aiosmtpd(mail_dir),
        }
    }

    fn start_aiosmtpd(mail_dir: PathBuf) -> Result<Self> {
        let script = mailer_testkit::repo_root().join("tests/smtp_server.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .arg("0")
            .arg(&mail_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("python3 runs tests/smtp_server.py")?;
        let stdout = child.stdout.take().context("the sink's stdout")?;
        let (lines, ready) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let mut sink = Self {
            child,
            server: Server::Aiosmtpd,
            port: 0,
            mail_dir,
        };
        let line = ready.recv_timeout(START_LIMIT).unwrap_or_default();
        match line
            .strip_prefix("READY ")
            .and_then(|p| p.trim().parse().ok())
        {
            Some(port) => sink.port = port,
            None => bail!(
                "tests/smtp_server.py did not start (is aiosmtpd installed? pip install aiosmtpd)"
            ),
        }
        Ok(sink)
    }

    /// Postfix's `smtp-sink`, dumping each mail into `mail_dir`. Taken from Debian's
    /// postfix package without installing it (which would start a mail server):
    /// `apt-get download postfix && dpkg-deb -x postfix_*.deb /opt/postfix`, then
    /// `MAILER_BENCH_SMTP_SINK=/opt/postfix/usr/sbin/smtp-sink`. Its libraries are looked
    /// for in `../lib/postfix` beside it.
    fn start_postfix(binary: &Path, mail_dir: PathBuf) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("a free local port")?
            .port();
        let libraries = binary
            .parent()
            .and_then(Path::parent)
            .map(|usr| usr.join("lib/postfix"))
            .unwrap_or_default();
        let mut command = Command::new(binary);
        // As root it must drop to another user, who then writes the mail.
        // SAFETY: geteuid only reads the process's effective user id.
        if unsafe { libc::geteuid() } == 0 {
            command.args(["-u", "nobody"]);
            Command::new("chmod").arg("0777").arg(&mail_dir).status()?;
        }
        let child = command
            .arg("-d")
            .arg(mail_dir.join(POSTFIX_DUMP_PREFIX))
            .arg(format!("127.0.0.1:{port}"))
            // The listen backlog.
            .arg("256")
            .env("LD_LIBRARY_PATH", libraries)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("MAILER_BENCH_SMTP_SINK: cannot run {}", binary.display()))?;
        let sink = Self {
            child,
            server: Server::PostfixSmtpSink,
            port,
            mail_dir,
        };
        let deadline = Instant::now() + START_LIMIT;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("{} does not listen on port {port}", binary.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(sink)
    }

    /// What the sink is, as the bench prints it.
    pub fn describe(&self) -> &'static str {
        match self.server {
            Server::Aiosmtpd => "tests/smtp_server.py, aiosmtpd, stores each mail",
            Server::PostfixSmtpSink => "Postfix's smtp-sink, dumps each mail to a file",
        }
    }

    /// The provider URL of this sink, plain text as a local relay would be.
    pub fn provider_url(&self) -> String {
        format!("smtp://127.0.0.1:{}?tls=none", self.port)
    }

    /// How many mails the sink has stored.
    pub fn stored(&self) -> usize {
        let is_mail = |path: &Path| match self.server {
            Server::Aiosmtpd => path.extension().is_some_and(|x| x == "eml"),
            Server::PostfixSmtpSink => path
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with(POSTFIX_DUMP_PREFIX)),
        };
        std::fs::read_dir(&self.mail_dir).map_or(0, |entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| is_mail(&e.path()))
                .count()
        })
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        // SIGTERM is either server's way out; kill() is SIGKILL, which also ends it.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.mail_dir);
    }
}

/// The sink's own limit: `mails` sent by `provider` alone, `concurrency` at a time, as
/// fast as it takes them.
pub async fn provider_alone(
    provider: &dyn Provider,
    mails: &[Mail],
    concurrency: usize,
) -> Result<Duration> {
    let started = Instant::now();
    let mut sends = futures::stream::iter(mails.iter().cloned())
        .map(|mail| provider.send(mail))
        .buffer_unordered(concurrency);
    while let Some(sent) = sends.next().await {
        sent.context("the sink refused a mail")?;
    }
    Ok(started.elapsed())
}
