//! The image: built by `deploy/image/build.sh` (what `make image` runs) through the
//! Dockerfile's runtime stage, from the binary these tests were built with, and run with
//! buildah against the real broker.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use mailer::spec::MailerPipelineSpec;
use mailer::topology::{self, Topology};
use serde_json::Value;

use mailer_testkit::broker::{TestBroker, TestVhost, management};
use mailer_testkit::repo_root;

/// The user and group the image runs as (the Dockerfile's `USER`).
const IMAGE_UID: u32 = 65532;

fn buildah(args: &[&str]) -> Output {
    Command::new("buildah")
        .args(["--storage-driver", "vfs"])
        .args(args)
        .output()
        .expect("buildah runs (apt-get install buildah; .ci/run installs it)")
}

fn buildah_ok(args: &[&str]) -> String {
    let output = buildah(args);
    assert!(
        output.status.success(),
        "buildah {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// The images a test built, removed when it ends (a failed test leaves none either).
struct Images(Vec<String>);

impl Drop for Images {
    fn drop(&mut self) {
        for image in &self.0 {
            let _ = buildah(&["rmi", image]);
        }
    }
}

/// A buildah working container of an image, removed when dropped.
struct WorkingContainer(String);

impl WorkingContainer {
    fn of(image: &str) -> Self {
        let name = format!("mailer-image-test-{}", std::process::id());
        let _ = buildah(&["rm", &name]);
        buildah_ok(&["from", "--pull=never", "--name", &name, image]);
        Self(name)
    }

    /// `buildah run` of `command` inside the container, as the image's user, on the
    /// host's network (chroot isolation), with `env` and `volume` (host:container).
    fn command(&self, env: &[(&str, &str)], volume: Option<&str>, command: &[&str]) -> Command {
        let mut run = Command::new("buildah");
        run.args(["--storage-driver", "vfs", "run", "--isolation", "chroot"]);
        for (name, value) in env {
            run.args(["--env", &format!("{name}={value}")]);
        }
        if let Some(volume) = volume {
            run.args(["--volume", volume]);
        }
        run.arg(&self.0).arg("--").args(command);
        run
    }

    /// Runs `command` in the container to its end, as [`Self::command`] does, and runs it
    /// again if buildah failed to start it ([`start_again`]).
    fn output(&self, env: &[(&str, &str)], command: &[&str]) -> Output {
        let mut attempt = 1;
        loop {
            let output = self
                .command(env, None, command)
                .output()
                .expect("buildah run");
            if output.status.success()
                || !start_again(&String::from_utf8_lossy(&output.stderr), attempt)
            {
                return output;
            }
            eprintln!("buildah could not start {command:?} (attempt {attempt}), running it again");
            attempt += 1;
        }
    }
}

/// How many times a test asks buildah to start one command in the container.
const START_ATTEMPTS: usize = 3;

/// Whether a command that failed with `stderr` on its `attempt`th start (from 1) is
/// started again: only when buildah could not start it, up to [`START_ATTEMPTS`] times.
fn start_again(stderr: &str, attempt: usize) -> bool {
    buildah_could_not_start(stderr) && attempt < START_ATTEMPTS
}

/// Whether `stderr` says buildah failed before the command in the container started.
///
/// With chroot isolation, buildah re-executes itself in new namespaces through
/// containers/storage's unshare code, which copies buildah's binary into a memfd and seals
/// it. The kernel refuses the seal (`EBUSY`) while another reference to one of the copy's
/// pages is still held, which happened once in CI. Nothing inside the container ran then,
/// so running the command again cannot send a mail twice; any other failure is reported.
fn buildah_could_not_start(stderr: &str) -> bool {
    stderr.contains("sealing memfd copy: Device or resource busy")
}

impl Drop for WorkingContainer {
    fn drop(&mut self) {
        let _ = buildah(&["rm", &self.0]);
    }
}

/// Stops `buildah run` (it takes the worker with it) if the test ends early.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn output_text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn eml_files(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .expect("outbox")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "eml"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_image_runs_as_65532_and_its_worker_delivers_a_mail_from_the_real_broker() {
    let id = std::process::id();
    let image = format!("localhost/mailer:test-{id}");
    let base = format!("localhost/mailer-runtime-base:test-{id}");
    let _images = Images(vec![image.clone(), base.clone()]);

    // The binary these tests were built with, packaged as `make image` packages the
    // release binary.
    let started = Instant::now();
    let built = Command::new(repo_root().join("deploy/image/build.sh"))
        .args([env!("CARGO_BIN_EXE_mailer"), &image, &base])
        .output()
        .expect("deploy/image/build.sh runs");
    let report = output_text(&built);
    assert!(built.status.success(), "the image did not build:\n{report}");
    eprintln!("{} in {:?}", report.trim(), started.elapsed());
    assert!(report.contains(&format!("image {image}: ")), "{report}");

    // What the Dockerfile declares.
    let inspected: Value =
        serde_json::from_str(&buildah_ok(&["inspect", "--type", "image", &image]))
            .expect("buildah inspect prints JSON");
    let config = &inspected["OCIv1"]["config"];
    assert_eq!(config["User"], "65532:65532", "a numeric, non-root user");
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/mailer"])
    );
    let labels = &config["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert_eq!(
        labels["org.opencontainers.image.source"],
        "https://github.com/mailer-operator/mailer"
    );

    let container = WorkingContainer::of(&image);
    let version = container.output(&[], &["/usr/local/bin/mailer", "--version"]);
    assert!(version.status.success(), "{}", output_text(&version));
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("mailer {}", env!("CARGO_PKG_VERSION"))
    );

    // A pipeline's topology in a vhost of this test, a request published from inside
    // the image, and a worker inside the image that writes it to an outbox on the host.
    let vhost = TestVhost::fresh("image");
    let spec: MailerPipelineSpec =
        serde_yaml::from_str(&format!("rabbitmq: {{vhost: {}}}", vhost.name)).unwrap();
    topology::apply(
        &management(),
        &Topology::desired(
            &spec.rabbitmq.vhost,
            &spec.topology,
            TestBroker::get().capabilities(),
        )
        .unwrap(),
    )
    .await
    .expect("topology");
    let amqp_url = vhost.amqp_url();
    let sent = container.output(
        &[("MAIL_AMQP_URL", &amqp_url)],
        &[
            "/usr/local/bin/mailer",
            "send",
            "--message-id",
            "from-the-image",
            "--from",
            "Shop <noreply@shop.example>",
            "--to",
            "alice@example.com",
            "--subject",
            "Hi",
            "--text",
            "Sent and delivered inside the image.",
        ],
    );
    assert!(sent.status.success(), "{}", output_text(&sent));

    let outbox = tempdir(&format!("mailer-image-outbox-{id}"));
    // The image's user must be able to write it, as a volume would be in a pod.
    std::fs::set_permissions(&outbox, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod");
    let volume = format!("{}:/outbox", outbox.display());
    let start_worker = || {
        let worker = container
            .command(
                &[
                    ("MAIL_AMQP_URL", &amqp_url),
                    ("MAIL_PROVIDER_URL", "file:///outbox"),
                    ("MAIL_HTTP_ADDR", "127.0.0.1:0"),
                ],
                Some(&volume),
                &["/usr/local/bin/mailer", "worker"],
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("buildah run the worker");
        Running(worker)
    };
    let mut worker = start_worker();
    let mut worker_starts = 1;

    let deadline = Instant::now() + Duration::from_secs(60);
    let delivered = loop {
        let found = eml_files(&outbox);
        if !found.is_empty() {
            break found;
        }
        if let Some(status) = worker.0.try_wait().expect("wait") {
            let mut log = String::new();
            if let Some(mut stderr) = worker.0.stderr.take() {
                std::io::Read::read_to_string(&mut stderr, &mut log).ok();
            }
            if start_again(&log, worker_starts) {
                eprintln!(
                    "buildah could not start the worker (attempt {worker_starts}), starting it again"
                );
                worker = start_worker();
                worker_starts += 1;
                continue;
            }
            panic!("the worker in the image exited ({status}) before delivering:\n{log}");
        }
        assert!(
            Instant::now() < deadline,
            "no mail delivered by the worker in the image within 60s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    drop(worker);

    assert_eq!(delivered.len(), 1, "{delivered:?}");
    let eml = &delivered[0];
    let text = std::fs::read_to_string(eml).expect("the mail");
    assert!(
        text.contains("Sent and delivered inside the image."),
        "{text}"
    );
    assert!(
        text.contains("Message-ID: <from-the-image@shop.example>"),
        "{text}"
    );
    let owner = std::fs::metadata(eml).expect("metadata");
    assert_eq!(
        (owner.uid(), owner.gid()),
        (IMAGE_UID, IMAGE_UID),
        "the worker ran as the image's user"
    );
    std::fs::remove_dir_all(&outbox).ok();
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
