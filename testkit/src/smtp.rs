//! A real SMTP server for the tests: `tests/smtp_server.py`, built on aiosmtpd.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use mailer::provider::{self, Provider};

/// How long the test server may take to start.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(30);

/// A directory under the system's temporary directory, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(purpose: &str) -> Self {
        static COUNT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "mailer-test-{purpose}-{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("the temporary directory is created");
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `tests/smtp_server.py` running as a child process, killed when dropped.
pub struct SmtpServer {
    child: Child,
    pub port: u16,
    pub mail_dir: TempDir,
}

impl SmtpServer {
    /// Starts a server on a port the system picks.
    pub fn start() -> Self {
        Self::start_on(0, TempDir::new("smtp"))
    }

    pub fn start_on(port: u16, mail_dir: TempDir) -> Self {
        Self::start_with(port, mail_dir, &[])
    }

    /// Starts a server that takes every session and refuses every mail for now (451 to
    /// `MAIL FROM`): sends reach it, and fail.
    pub fn start_busy() -> Self {
        Self::start_with(0, TempDir::new("smtp"), &[Path::new("busy")])
    }

    /// Starts a server that speaks TLS: `tls` is `["starttls" | "implicit", CERT, KEY]`.
    pub fn start_tls(tls: [&Path; 3]) -> Self {
        Self::start_with(0, TempDir::new("smtp"), &tls)
    }

    fn start_with(port: u16, mail_dir: TempDir, extra: &[&Path]) -> Self {
        let script = crate::repo_root().join("tests/smtp_server.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .arg(port.to_string())
            .arg(&mail_dir.0)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs tests/smtp_server.py (pip install aiosmtpd)");
        let stdout = child.stdout.take().expect("the server's stdout");
        let (lines, ready) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let line = ready
            .recv_timeout(SERVER_START_TIMEOUT)
            .unwrap_or_else(|_| {
                let _ = child.kill();
                panic!("tests/smtp_server.py did not print READY; is aiosmtpd installed?")
            });
        let port = line
            .strip_prefix("READY ")
            .and_then(|port| port.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line from the server: {line:?}"));
        Self {
            child,
            port,
            mail_dir,
        }
    }

    /// Stops this server and starts another on the same port with the same directory,
    /// so connections to the first one are gone.
    pub fn restart(self) -> Self {
        let (port, mail_dir) = self.kill();
        Self::start_on(port, mail_dir)
    }

    /// Kills this server (its sessions are reset, connections to its port refused) and
    /// gives back its port and directory, to start another with later
    /// ([`SmtpServer::start_on`]).
    pub fn kill(mut self) -> (u16, TempDir) {
        self.stop();
        (self.port, TempDir(std::mem::take(&mut self.mail_dir.0)))
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn provider(&self, options: &str) -> std::sync::Arc<dyn Provider> {
        provider::from_url(&format!("smtp://127.0.0.1:{}?tls=none{options}", self.port))
            .expect("a valid provider URL")
    }

    /// The stored mails, in the order they arrived.
    pub fn mails(&self) -> Vec<String> {
        let mut numbered: Vec<(u32, String)> = std::fs::read_dir(&self.mail_dir.0)
            .expect("the mail directory")
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let number = name.strip_suffix(".eml")?.parse().ok()?;
                let text = std::fs::read_to_string(entry.path()).ok()?;
                Some((number, text))
            })
            .collect();
        numbered.sort();
        numbered.into_iter().map(|(_, text)| text).collect()
    }

    /// The Message-IDs of the stored mails, in the order they arrived.
    pub fn message_ids(&self) -> Vec<String> {
        self.mails()
            .iter()
            .filter_map(|mail| {
                mail.lines().find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("message-id")
                        .then(|| value.trim().trim_matches(['<', '>']).to_string())
                })
            })
            .collect()
    }

    /// The Message-IDs of the mails refused once at the end of DATA (recipients
    /// `…+451once@…`), in the order they came.
    pub fn refused_message_ids(&self) -> Vec<String> {
        std::fs::read_to_string(self.mail_dir.0.join("refused.log"))
            .map(|log| {
                log.lines()
                    .map(|id| id.trim_matches(['<', '>']).to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many SMTP sessions (EHLO or HELO) the server has seen.
    pub fn sessions(&self) -> usize {
        std::fs::read_to_string(self.mail_dir.0.join("sessions.log"))
            .map(|log| log.lines().count())
            .unwrap_or_default()
    }
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port on which nothing listens.
pub fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}
