//! `make demo` (examples/demo.sh): end to end against the real broker, in a vhost of
//! its own, checked by what a user sees (the outbox, the worker's metrics, `mailer
//! dead`); and on a machine that is not ready for it, without touching the shared
//! broker: fake `rabbitmq-server`, `systemctl` and `rabbitmq-plugins` come first on PATH
//! and start stand-ins for the broker's ports (tests/operations/fake_broker.py) on ports
//! nothing else uses.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use mailer_testkit::broker::{TestVhost, amqp_base, management_url, raw_api};
use mailer_testkit::repo_root;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("address")
        .port()
}

/// A directory of fake commands, and the stand-ins they started (killed when dropped).
struct Fakes {
    dir: PathBuf,
}

impl Fakes {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("mailer-demo-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).expect("fake bin");
        Self { dir }
    }

    /// A fake command that logs its arguments and, when they are `when`, starts the
    /// stand-in for `mode` (amqp or http) on `port`.
    fn command(&self, name: &str, when: &str, mode: &str, port: u16) {
        let script = format!(
            "#!/bin/bash\n\
             echo \"{name} $*\" >>'{log}'\n\
             if [[ \"$*\" == '{when}' ]]; then\n\
             \x20 python3 '{fake}' {mode} {port} </dev/null >/dev/null 2>&1 &\n\
             \x20 echo $! >>'{pids}'\n\
             fi\n",
            log = self.dir.join("calls").display(),
            fake = repo_root()
                .join("tests/operations/fake_broker.py")
                .display(),
            pids = self.dir.join("pids").display(),
        );
        let path = self.dir.join("bin").join(name);
        std::fs::write(&path, script).expect("fake command");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    fn calls(&self) -> String {
        std::fs::read_to_string(self.dir.join("calls")).unwrap_or_default()
    }

    fn bin(&self) -> PathBuf {
        self.dir.join("bin")
    }
}

impl Drop for Fakes {
    fn drop(&mut self) {
        for pid in std::fs::read_to_string(self.dir.join("pids"))
            .unwrap_or_default()
            .lines()
        {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs examples/demo.sh with the mailer these tests built, `path` as PATH and the
/// broker's URLs on `amqp_port` and `management_port`.
fn demo(path: &str, amqp_port: u16, management_port: u16) -> Output {
    Command::new(repo_root().join("examples/demo.sh"))
        .env("PATH", path)
        .env("MAILER", env!("CARGO_BIN_EXE_mailer"))
        .env(
            "RABBITMQ_MANAGEMENT_URL",
            format!("http://guest:guest@127.0.0.1:{management_port}"),
        )
        .env(
            "MAIL_AMQP_URL",
            format!("amqp://guest:guest@127.0.0.1:{amqp_port}"),
        )
        .env("DEMO_HTTP_ADDR", format!("127.0.0.1:{}", free_port()))
        .env("DEMO_BROKER_WAIT", "20")
        .output()
        .expect("examples/demo.sh runs")
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn path_with(first: &Path) -> String {
    format!(
        "{}:{}",
        first.display(),
        std::env::var("PATH").expect("PATH")
    )
}

#[test]
fn a_stopped_broker_is_started_its_plugin_enabled_and_a_failing_worker_shows_its_error() {
    let fakes = Fakes::new("stopped");
    let (amqp_port, management_port) = (free_port(), free_port());
    // The broker is installed but stopped: starting it opens its AMQP port; enabling
    // the plugin opens a management API that answers /api/overview and nothing else,
    // so `mailer run` stops with an error the demo must show.
    fakes.command("rabbitmq-server", "-detached", "amqp", amqp_port);
    fakes.command("systemctl", "start rabbitmq-server", "amqp", amqp_port);
    fakes.command(
        "rabbitmq-plugins",
        "enable rabbitmq_management",
        "http",
        management_port,
    );
    fakes.command("rabbitmqctl", "never", "amqp", 0);

    let output = demo(&path_with(&fakes.bin()), amqp_port, management_port);
    let (stdout, stderr) = text(&output);
    let calls = fakes.calls();
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("RabbitMQ is installed but not running: starting it"),
        "{stdout}"
    );
    assert!(
        calls.contains("rabbitmq-server -detached")
            || calls.contains("systemctl start rabbitmq-server"),
        "{calls}"
    );
    assert!(
        stdout.contains("RabbitMQ runs without its management plugin"),
        "{stdout}"
    );
    assert!(
        calls.contains("rabbitmq-plugins enable rabbitmq_management"),
        "{calls}"
    );
    assert!(
        stdout.contains(&format!(
            "the management API answers at 127.0.0.1:{management_port}"
        )),
        "{stdout}"
    );
    // The worker's own error, not a timeout.
    assert!(
        stderr.contains("mailer run stopped before its worker was ready; its error:"),
        "{stderr}"
    );
    assert!(
        stderr.contains("error: RabbitMQ refused to create vhost \"mailer-demo\""),
        "{stderr}"
    );
    assert!(!stderr.contains("timed out"), "{stderr}");
}

#[test]
fn a_running_broker_without_its_plugin_gets_it_enabled() {
    let fakes = Fakes::new("plugin");
    let (amqp_port, management_port) = (free_port(), free_port());
    // The broker runs (its AMQP port answers); only the plugin is off.
    let _broker = TcpListener::bind(("127.0.0.1", amqp_port)).expect("the broker's AMQP port");
    fakes.command("rabbitmq-server", "never", "amqp", 0);
    fakes.command("systemctl", "never", "amqp", 0);
    fakes.command(
        "rabbitmq-plugins",
        "enable rabbitmq_management",
        "http",
        management_port,
    );

    let output = demo(&path_with(&fakes.bin()), amqp_port, management_port);
    let (stdout, stderr) = text(&output);
    let calls = fakes.calls();
    assert_eq!(
        calls.trim(),
        "rabbitmq-plugins enable rabbitmq_management",
        "the broker is not started again"
    );
    assert!(!stdout.contains("starting it"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "the management API answers at 127.0.0.1:{management_port}"
        )),
        "{stdout}\n{stderr}"
    );
}

#[test]
fn without_a_broker_the_demo_prints_how_to_install_one() {
    let fakes = Fakes::new("none");
    // No rabbitmq-server on this PATH (Debian installs it in /usr/sbin).
    let output = demo(
        &format!("{}:/usr/bin:/bin", fakes.bin().display()),
        free_port(),
        free_port(),
    );
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("RabbitMQ is not installed here."),
        "{stderr}"
    );
    assert!(
        stderr.contains("sudo apt-get install -y rabbitmq-server && sudo rabbitmq-plugins enable rabbitmq_management")
            || stderr.contains("docker run -d --name rabbitmq"),
        "{stderr}"
    );
    assert!(fakes.calls().is_empty());
}

/// The work directory the demo is told to create (DEMO_WORK_DIR), removed when dropped.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("mailer-demo-work-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Self(dir)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `command` in a process group of its own for at most `within`; past it, the whole
/// group (the script and the worker it started) is killed and the test fails with what
/// the script printed.
fn output_within(mut command: Command, within: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("examples/demo.sh starts");
    let read_all = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = read_all(Box::new(child.stdout.take().expect("stdout")));
    let stderr = read_all(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for examples/demo.sh") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            let stdout = stdout.join().unwrap_or_default();
            let stderr = stderr.join().unwrap_or_default();
            panic!(
                "examples/demo.sh did not finish within {within:?}:\n{}\n{}",
                String::from_utf8_lossy(&stdout),
                String::from_utf8_lossy(&stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Output {
        status,
        stdout: stdout.join().expect("stdout read"),
        stderr: stderr.join().expect("stderr read"),
    }
}

/// The mails in `outbox`, by their Message-ID header.
fn mails_in(outbox: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(outbox)
        .unwrap_or_else(|e| panic!("the outbox {}: {e}", outbox.display()))
        .map(|entry| entry.expect("outbox entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "eml"))
        .map(|path| {
            let mail = std::fs::read_to_string(&path).expect("an .eml file");
            let id = header(&mail, "Message-ID")
                .unwrap_or_else(|| panic!("{} has no Message-ID:\n{mail}", path.display()));
            (id, mail)
        })
        .collect()
}

/// A header of a mail, as written (the demo's are one line each).
fn header(mail: &str, name: &str) -> Option<String> {
    mail.lines()
        .map(|line| line.trim_end_matches('\r'))
        .take_while(|line| !line.is_empty())
        .find_map(|line| {
            let (field, value) = line.split_once(':')?;
            field
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_string())
        })
}

/// Whether the broker has the vhost `name`, read from its management API.
fn vhost_exists(name: &str) -> bool {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        raw_api()
            .list_vhosts()
            .await
            .expect("list the broker's vhosts")
            .iter()
            .any(|vhost| vhost.name == name)
    })
}

/// Where `needle` first is in `haystack`, failing the test when it is not there.
fn position(haystack: &str, needle: &str) -> usize {
    haystack
        .find(needle)
        .unwrap_or_else(|| panic!("the demo did not print {needle:?}:\n{haystack}"))
}

#[test]
fn the_demo_delivers_a_mail_retries_a_parked_one_and_dead_letters_a_malformed_one() {
    // A vhost of its own (deleted when the test ends, however it ends), so it never meets
    // a person's `make demo` in mailer-demo or another run of this test.
    let vhost = TestVhost::fresh("demo");
    let work = WorkDir::new();
    let mut command = Command::new(repo_root().join("examples/demo.sh"));
    command
        .env("MAILER", env!("CARGO_BIN_EXE_mailer"))
        .env("RABBITMQ_MANAGEMENT_URL", management_url())
        .env("MAIL_AMQP_URL", amqp_base())
        .env("DEMO_VHOST", &vhost.name)
        .env("DEMO_WORK_DIR", &work.0)
        .env("DEMO_HTTP_ADDR", format!("127.0.0.1:{}", free_port()))
        // What a user sees does not depend on the log level: no worker log line at all
        // below error.
        .env("RUST_LOG", "error");
    let started = Instant::now();
    let output = output_within(command, Duration::from_secs(180));
    let (stdout, stderr) = text(&output);
    eprintln!("examples/demo.sh took {:.1?}", started.elapsed());
    assert!(
        output.status.success(),
        "examples/demo.sh: {}\n{stdout}\n{stderr}",
        output.status
    );
    assert!(!stderr.contains("timed out"), "{stderr}");
    assert!(
        stdout.contains(&format!("(vhost {:?}): topology applied", vhost.name)),
        "the demo runs in the vhost DEMO_VHOST names:\n{stdout}"
    );

    // The outbox the demo names holds the two mails that were to be delivered, and only
    // those.
    let outbox = work.0.join("outbox");
    position(
        &stdout,
        &format!(
            "done: the mails are in {}; stopping the worker and removing the demo vhost {}",
            outbox.display(),
            vhost.name
        ),
    );
    let mails = mails_in(&outbox);
    assert_eq!(
        mails.keys().collect::<Vec<_>>(),
        ["<receipt-bob@shop.example>", "<welcome-alice@shop.example>"],
        "{mails:#?}"
    );
    let welcome = &mails["<welcome-alice@shop.example>"];
    assert_eq!(
        header(welcome, "Subject").as_deref(),
        Some("Welcome, Alice")
    );
    assert_eq!(header(welcome, "To").as_deref(), Some("alice@example.com"));
    let receipt = &mails["<receipt-bob@shop.example>"];
    assert_eq!(header(receipt, "Subject").as_deref(), Some("Your receipt"));
    assert_eq!(header(receipt, "To").as_deref(), Some("bob@example.com"));

    // The receipt was parked once, as the worker's metrics count it, before its retry
    // delivered it; both mails count as sent.
    let parked = position(
        &stdout,
        "\nmailer_worker_deliveries_total{outcome=\"parked\"} 1\n",
    );
    let delivered = position(
        &stdout,
        &format!(
            "delivered by its retry: {}",
            outbox.join("receipt-bob@shop.example.eml").display()
        ),
    );
    assert!(parked < delivered, "parked before delivered:\n{stdout}");
    let sent = position(
        &stdout,
        "\nmailer_worker_deliveries_total{outcome=\"sent\"} 2\n",
    );
    assert!(delivered < sent, "{stdout}");

    // The malformed request is dead-lettered, counted, and `mailer dead list` and `show`
    // say so.
    let dead_counted = position(
        &stdout,
        "\nmailer_worker_dead_letters_total{reason=\"malformed\"} 1\n",
    );
    let listed = stdout
        .lines()
        .filter(|line| line.split_whitespace().next() == Some("sneaky-carol"))
        .collect::<Vec<_>>();
    assert!(
        listed.len() == 1 && listed[0].split_whitespace().nth(1) == Some("malformed"),
        "mailer dead list shows sneaky-carol as malformed:\n{stdout}"
    );
    assert!(dead_counted < position(&stdout, listed[0]), "{stdout}");
    position(
        &stdout,
        "message id: sneaky-carol\nreason: malformed (by the worker)\n",
    );
    position(
        &stdout,
        "error: malformed request: subject contains a line break\n",
    );
    position(&stdout, "would replay sneaky-carol (malformed)\n");
    position(&stdout, "would remove sneaky-carol (malformed)\n");

    // The demo removed its vhost itself.
    assert!(
        !vhost_exists(&vhost.name),
        "the demo left its vhost {} behind",
        vhost.name
    );
}
