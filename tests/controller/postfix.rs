//! Postfix from Debian (`apt-get install postfix`, as `.ci/run` does) as the relay the
//! workers send through: an instance of its own, whose configuration, queue, data and
//! mailboxes are in a temporary directory, started with `postfix -c <dir> start` and
//! stopped with `postfix -c <dir> stop` when dropped. It
//!
//! - listens on a free port of 127.0.0.1 and offers STARTTLS with a certificate the test
//!   CA signed (so `smtp://` URLs, which require it, work with the CA given to the
//!   workers);
//! - delivers mail for `mail.test` to a Maildir per listed mailbox (`virtual(8)`, as the
//!   unprivileged user nobody: no system users needed), e.g.
//!   `<dir>/mailboxes/mail.test/delivered/new/…` for `delivered@mail.test`;
//! - refuses a recipient it has no mailbox for, for good: `550 5.1.1 … User unknown in
//!   virtual mailbox table`;
//! - asks a policy service ([`Greylist`], Postfix's policy delegation protocol on a port
//!   of the test) about every recipient, which defers the ones the test names with a
//!   temporary refusal (`450 4.7.1 … greylisted`) until the test lifts it. A lookup
//!   table would not do: an SMTP session already open (the workers keep theirs) goes on
//!   with the tables it started with, even after `postfix reload`; the policy service
//!   is asked at every RCPT TO;
//! - logs to `<dir>/maillog` (`postlogd`), which a failing test prints.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::task::JoinHandle;

use mailer_testkit::process::free_port;
use mailer_testkit::smtp::TempDir;
use mailer_testkit::tls::TestCa;

/// Where Debian's package puts the `postfix` command.
const POSTFIX: &str = "/usr/sbin/postfix";
/// The domain whose mail this relay delivers to its mailboxes.
pub const DOMAIN: &str = "mail.test";
/// The user and group `virtual(8)` writes the mailboxes as: nobody, nogroup.
const MAILBOX_OWNER: u32 = 65534;

/// A running Postfix instance; stopped, and its directory removed, when dropped.
pub struct Postfix {
    dir: TempDir,
    pub port: u16,
    greylist: Greylist,
}

impl Postfix {
    /// Starts an instance that has a mailbox for each of `mailboxes` (local parts of
    /// [`DOMAIN`]) and speaks TLS with `ca`'s `server` certificate.
    pub async fn start(ca: &TestCa, mailboxes: &[&str]) -> Self {
        assert!(
            Path::new(POSTFIX).exists(),
            "Postfix is not installed: apt-get install postfix (.ci/run does)"
        );
        let greylist = Greylist::start().await;
        let dir = TempDir::new("postfix");
        let at = |name: &str| dir.0.join(name);
        for sub in ["etc", "spool", "data", "mailboxes"] {
            std::fs::create_dir_all(at(sub)).expect("a Postfix directory");
        }
        // The master's lock and the TLS session cache are the mail owner's.
        chown("postfix", &at("data"));
        std::os::unix::fs::chown(at("mailboxes"), Some(MAILBOX_OWNER), Some(MAILBOX_OWNER))
            .expect("the mailboxes are nobody's");
        let (cert, key) = (at("etc/relay.pem"), at("etc/relay.key"));
        std::fs::copy(ca.file("server.pem"), &cert).expect("the relay's certificate");
        std::fs::copy(ca.file("server.key"), &key).expect("the relay's key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let listed: String = mailboxes
            .iter()
            .map(|local| format!("{local}@{DOMAIN} {DOMAIN}/{local}/\n"))
            .collect();
        std::fs::write(at("etc/mailboxes"), listed).expect("the mailbox table");

        let port = free_port();
        let d = dir.0.display();
        let main_cf = format!(
            "compatibility_level = 3.6\n\
             queue_directory = {d}/spool\n\
             data_directory = {d}/data\n\
             mail_owner = postfix\n\
             setgid_group = postdrop\n\
             myhostname = relay.mailer.test\n\
             mydestination =\n\
             inet_interfaces = 127.0.0.1\n\
             inet_protocols = ipv4\n\
             mynetworks = 127.0.0.0/8\n\
             maillog_file = {d}/maillog\n\
             maillog_file_prefixes = {d}\n\
             alias_maps =\n\
             alias_database =\n\
             local_recipient_maps =\n\
             biff = no\n\
             virtual_mailbox_domains = {DOMAIN}\n\
             virtual_mailbox_base = {d}/mailboxes\n\
             virtual_mailbox_maps = texthash:{d}/etc/mailboxes\n\
             virtual_uid_maps = static:{MAILBOX_OWNER}\n\
             virtual_gid_maps = static:{MAILBOX_OWNER}\n\
             smtpd_recipient_restrictions = check_policy_service inet:127.0.0.1:{policy}\n\
             smtpd_tls_security_level = may\n\
             smtpd_tls_chain_files = {key}, {cert}\n\
             smtpd_tls_received_header = yes\n",
            policy = greylist.port,
            key = key.display(),
            cert = cert.display(),
        );
        std::fs::write(at("etc/main.cf"), main_cf).expect("main.cf");
        // Every service runs unchrooted (`-` is n since Postfix 3.0), so no copies of
        // /etc files in the queue directory are needed.
        let master_cf = format!(
            "127.0.0.1:{port} inet n - - - - smtpd\n\
             cleanup unix n - - - 0 cleanup\n\
             qmgr unix n - - 300 1 qmgr\n\
             tlsmgr unix - - - 1000? 1 tlsmgr\n\
             rewrite unix - - - - - trivial-rewrite\n\
             bounce unix - - - - 0 bounce\n\
             defer unix - - - - 0 bounce\n\
             trace unix - - - - 0 bounce\n\
             verify unix - - - - 1 verify\n\
             proxymap unix - - - - - proxymap\n\
             showq unix n - - - - showq\n\
             error unix - - - - - error\n\
             retry unix - - - - - error\n\
             discard unix - - - - - discard\n\
             virtual unix - n - - - virtual\n\
             anvil unix - - - - 1 anvil\n\
             scache unix - - - - 1 scache\n\
             postlog unix-dgram n - - - 1 postlogd\n"
        );
        std::fs::write(at("etc/master.cf"), master_cf).expect("master.cf");

        let postfix = Self {
            dir,
            port,
            greylist,
        };
        // `start` returns once the master daemon is up (`master -w`).
        let output = postfix.command("start").output().expect("postfix start");
        assert!(
            output.status.success(),
            "postfix start failed: {}{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            postfix.log()
        );
        postfix
    }

    fn command(&self, action: &str) -> Command {
        let mut command = Command::new(POSTFIX);
        command.arg("-c").arg(self.dir.0.join("etc")).arg(action);
        command
    }

    /// The policy service Postfix asks about each recipient.
    pub fn greylist(&self) -> &Greylist {
        &self.greylist
    }

    /// The mails delivered to `local@DOMAIN`'s Maildir (`new/`), oldest first.
    pub fn mailbox(&self, local: &str) -> Vec<String> {
        let new = self.dir.0.join(format!("mailboxes/{DOMAIN}/{local}/new"));
        let mut files: Vec<PathBuf> = std::fs::read_dir(new)
            .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        // Maildir names start with the delivery's time in seconds, then a sequence.
        files.sort();
        files
            .iter()
            .map(|file| std::fs::read_to_string(file).expect("a delivered mail"))
            .collect()
    }

    /// Postfix's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("maillog")).unwrap_or_default()
    }
}

impl Drop for Postfix {
    fn drop(&mut self) {
        // `stop` waits up to 5 s for the master and its processes to exit, then kills
        // them; the directory goes after.
        let _ = self.command("stop").output();
    }
}

fn chown(user: &str, path: &Path) {
    let status = Command::new("chown")
        .arg(user)
        .arg(path)
        .status()
        .expect("chown");
    assert!(status.success(), "chown {user} {}", path.display());
}

/// A policy service (Postfix's SMTPD policy delegation protocol: `name=value` lines, an
/// empty line, and the answer `action=…`) that defers the recipients the test names, as
/// a greylisting service would, and lets every other recipient through to Postfix's own
/// checks (`DUNNO`). It remembers what it was asked.
pub struct Greylist {
    port: u16,
    state: Arc<Mutex<GreylistState>>,
    task: JoinHandle<()>,
}

#[derive(Default)]
struct GreylistState {
    deferred: BTreeSet<String>,
    /// Every recipient asked about, and whether it was deferred.
    asked: Vec<(String, bool)>,
}

impl Greylist {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(GreylistState::default()));
        let serving = state.clone();
        let task = tokio::spawn(async move {
            let mut open = tokio::task::JoinSet::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.spawn(answer(socket, serving.clone()));
            }
        });
        Self { port, state, task }
    }

    /// Defers `recipient` until [`Greylist::lift`].
    pub fn defer(&self, recipient: &str) {
        self.state
            .lock()
            .unwrap()
            .deferred
            .insert(recipient.to_string());
    }

    pub fn lift(&self, recipient: &str) {
        self.state.lock().unwrap().deferred.remove(recipient);
    }

    /// How often Postfix was told to defer `recipient`.
    pub fn deferrals(&self, recipient: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .asked
            .iter()
            .filter(|(asked, deferred)| asked == recipient && *deferred)
            .count()
    }
}

impl Drop for Greylist {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers the requests of one connection; Postfix keeps it for more.
async fn answer(socket: tokio::net::TcpStream, state: Arc<Mutex<GreylistState>>) {
    let (read, mut write) = socket.into_split();
    let mut lines = BufReader::new(read).lines();
    let mut recipient = String::new();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(value) = line.strip_prefix("recipient=") {
            recipient = value.to_string();
        }
        if !line.is_empty() {
            continue;
        }
        let deferred = {
            let mut state = state.lock().unwrap();
            let deferred = state.deferred.contains(&recipient);
            state.asked.push((std::mem::take(&mut recipient), deferred));
            deferred
        };
        let action = if deferred {
            "DEFER_IF_PERMIT greylisted, try again later"
        } else {
            "DUNNO"
        };
        if write
            .write_all(format!("action={action}\n\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}
