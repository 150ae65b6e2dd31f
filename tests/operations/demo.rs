//! `make demo` (examples/demo.sh) on a machine that is not ready for it, without
//! touching the shared broker: fake `rabbitmq-server`, `systemctl` and `rabbitmq-plugins`
//! come first on PATH and start stand-ins for the broker's ports
//! (tests/operations/fake_broker.py) on ports nothing else uses.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::root;

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
            fake = root().join("tests/operations/fake_broker.py").display(),
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
    Command::new(root().join("examples/demo.sh"))
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
