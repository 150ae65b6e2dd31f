//! A local SMTP sink: `tests/smtp_server.py` (aiosmtpd), which stores every mail, and
//! the sink's own limit, measured with the provider alone.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use mailer::message::Mail;
use mailer::provider::Provider;

const START_LIMIT: Duration = Duration::from_secs(30);

/// `tests/smtp_server.py` as a child process, stopped and its mail removed when dropped.
pub struct SmtpSink {
    child: Child,
    pub port: u16,
    pub mail_dir: PathBuf,
}

impl SmtpSink {
    pub fn start() -> Result<Self> {
        let mail_dir =
            std::env::temp_dir().join(format!("mailer-bench-smtp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&mail_dir);
        std::fs::create_dir_all(&mail_dir)?;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/smtp_server.py");
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

    /// The provider URL of this sink, plain text as a local relay would be.
    pub fn provider_url(&self) -> String {
        format!("smtp://127.0.0.1:{}?tls=none", self.port)
    }

    /// How many mails the sink has stored.
    pub fn stored(&self) -> usize {
        std::fs::read_dir(&self.mail_dir).map_or(0, |entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "eml"))
                .count()
        })
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        // SIGTERM is the script's way out; kill() is SIGKILL, which also ends it.
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
