//! The README's "Install and run" as a person runs it, with the clients people use:
//! Helm v4's library installs, upgrades and uninstalls the chart, and kubectl runs every
//! line of "Or with plain manifests", then `wait`, `get`, `describe`, `explain` and
//! `delete`, against the in-memory API server as a new cluster (`FakeApi::cluster`),
//! with the operator running in this process against the same server and the real
//! broker. What is asserted is what the commands print.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::broker::{eventually, unique};
use super::clients::{User, cluster};
use mailer_testkit::broker::{TestBroker, TestVhost, management_host};
use mailer_testkit::operator::{NS, controller_health, harness_on, run_controllers_until};
use mailer_testkit::repo_root;
use mailer_testkit::smtp::TempDir;

/// The commands of the README's sh block that follows the line starting with `after`:
/// continuation lines joined, comments dropped, as (words, the comment lines after it).
fn readme_block(after: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let start = readme
        .find(after)
        .unwrap_or_else(|| panic!("README has {after:?}"));
    let block = &readme[start..];
    let block = &block[block.find("```sh\n").expect("an sh block") + 6..];
    let block = &block[..block.find("```").expect("the block ends")];
    let mut commands: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    let mut pending = String::new();
    for line in block.lines() {
        if let Some(comment) = line.strip_prefix('#') {
            if let Some((_, comments)) = commands.last_mut() {
                comments.push(comment.trim().to_string());
            }
            continue;
        }
        let line = line.split(" # ").next().unwrap_or_default();
        match line.trim_end().strip_suffix('\\') {
            Some(part) => pending.push_str(part),
            None => {
                pending.push_str(line);
                let words = pending.split_whitespace().map(str::to_string).collect();
                commands.push((words, Vec::new()));
                pending.clear();
            }
        }
    }
    commands
}

fn words(list: &[String]) -> Vec<&str> {
    list.iter().map(String::as_str).collect()
}

/// Runs `tests/helm_release.py` with a `helm` command line's arguments.
fn helm(user: &User, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new("python3")
        .arg(repo_root().join("tests/helm_release.py"))
        .args(args)
        .env("HOME", &user.home.0)
        .env("KUBECONFIG", &user.kubeconfig)
        .current_dir(repo_root())
        .output()
        .expect("python3 runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(what: &str, (success, stdout, stderr): (bool, String, String)) -> String {
    assert!(success, "{what} failed:\n{stdout}\n{stderr}");
    stdout
}

/// The release Helm printed.
fn release(stdout: &str) -> Value {
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_upgrades_and_uninstalls_the_chart_and_keeps_the_crd() {
    let fake = cluster();
    let user = User::new(&fake.serve().await, "default");
    let kubectl = |args: &[&str]| user.kubectl_in(&repo_root(), args);

    let install = readme_block("With Helm")
        .into_iter()
        .map(|(words, _)| words)
        .find(|w| w.first().map(String::as_str) == Some("helm"))
        .expect("the README's helm install line");
    assert_eq!(words(&install)[..2], ["helm", "install"]);
    let installed = release(&ok("helm install", helm(&user, &words(&install)[1..])));
    assert_eq!(
        (
            &installed["status"],
            &installed["revision"],
            &installed["namespace"]
        ),
        (&json!("deployed"), &json!(1), &json!("mailer-system"))
    );
    // Helm 4 applies server-side, as its own field manager.
    let writes = fake.take_requests();
    let deployment = "/apis/apps/v1/namespaces/mailer-system/deployments/mailer-mailer-operator";
    let applied = writes
        .iter()
        .find(|r| r.method == "PATCH" && r.path == deployment)
        .expect("Helm wrote the Deployment");
    assert!(
        applied.content_type.starts_with("application/apply-patch"),
        "{applied:?}"
    );

    let out = ok("get", kubectl(&["get", "namespace", "mailer-system"]));
    assert!(out.contains("mailer-system   Active"), "{out}");
    let out = ok(
        "get",
        kubectl(&["get", "deployment", "-n", "mailer-system"]),
    );
    assert_eq!(
        columns(&out, 0),
        ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    );
    assert_eq!(
        columns(&out, 1)[..4],
        ["mailer-mailer-operator", "0/2", "0", "0"]
    );
    let out = ok("get", kubectl(&["get", "crd"]));
    assert!(out.contains("mailerpipelines.mailer.dev"), "{out}");
    let (_, _, err) = kubectl(&["get", "mp", "-A"]);
    assert!(err.contains("No resources found"), "{err}");

    let upgraded = release(&ok(
        "helm upgrade",
        helm(
            &user,
            &[
                "upgrade",
                "mailer",
                "charts/mailer-operator",
                "-n",
                "mailer-system",
                "--set",
                "replicas=3",
                "--set",
                "resources.limits.memory=512Mi",
            ],
        ),
    ));
    assert_eq!(
        (&upgraded["status"], &upgraded["revision"]),
        (&json!("deployed"), &json!(2))
    );
    let out = ok(
        "get",
        kubectl(&[
            "get",
            "deployment",
            "mailer-mailer-operator",
            "-n",
            "mailer-system",
            "-o",
            "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].resources.limits.memory} {.spec.template.spec.containers[0].resources.requests.cpu}",
        ]),
    );
    assert_eq!(
        out, "3 512Mi 50m",
        "the new values landed and the others stayed"
    );

    let uninstalled = release(&ok(
        "helm uninstall",
        helm(&user, &["uninstall", "mailer", "-n", "mailer-system"]),
    ));
    assert_eq!(uninstalled["status"], "uninstalled");
    let (_, _, err) = kubectl(&["get", "all,secrets,serviceaccounts", "-n", "mailer-system"]);
    assert!(err.contains("No resources found"), "{err}");
    let out = ok(
        "get",
        kubectl(&["get", "crd", "mailerpipelines.mailer.dev", "-o", "name"]),
    );
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io/mailerpipelines.mailer.dev"
    );
}

/// The words of line `n` of a table kubectl printed.
fn columns(table: &str, n: usize) -> Vec<&str> {
    table
        .lines()
        .nth(n)
        .unwrap_or_else(|| panic!("no line {n} in {table:?}"))
        .split_whitespace()
        .collect()
}

/// A copy of the files the README's lines name, in a directory laid out like the
/// repository's, with the connection Secret pointing at the test broker (its management
/// API, guest's credentials, its AMQP port) and the pipeline in the test's vhost.
fn workdir(vhost: &str) -> TempDir {
    let dir = TempDir::new("readme");
    for file in [
        "crds/mailerpipeline.yaml",
        "deploy/operator.yaml",
        "examples/rabbitmq-connection-secret.yaml",
        "examples/smtp-provider-secret.yaml",
        "examples/pipeline.yaml",
    ] {
        let mut text = std::fs::read_to_string(repo_root().join(file)).unwrap();
        let mut replace = |from: &str, to: &str| {
            assert!(text.contains(from), "{file} has {from:?}");
            text = text.replace(from, to);
        };
        if file.ends_with("rabbitmq-connection-secret.yaml") {
            let broker = TestBroker::get();
            replace(
                "uri: http://rabbitmq.rabbitmq-system.svc:15672",
                &format!("uri: http://{}", management_host()),
            );
            replace("username: mailer-operator", "username: guest");
            replace("password: change-me", "password: guest");
            replace(
                "# amqpUri: amqp://rabbitmq.rabbitmq-system.svc:5672",
                &format!("amqpUri: amqp://127.0.0.1:{}", broker.amqp_port),
            );
        }
        if file.ends_with("/pipeline.yaml") {
            replace("vhost: shop", &format!("vhost: {vhost}"));
        }
        let path = dir.0.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

/// kubectl in `dir`, off the runtime's threads.
async fn kubectl(user: &std::sync::Arc<User>, dir: &Path, args: &[&str]) -> (bool, String, String) {
    let (user, dir) = (user.clone(), dir.to_path_buf());
    let args: Vec<String> = args.iter().map(|s| (*s).to_string()).collect();
    tokio::task::spawn_blocking(move || user.kubectl_in(&dir, &words(&args)))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_kubectl_lines_install_the_operator_and_a_pipeline_that_gets_ready() {
    mailer::install_crypto_provider();
    let fake = cluster();
    let user = std::sync::Arc::new(User::new(&fake.serve().await, NS));
    let vhost = TestVhost::fresh("readme");
    let dir = workdir(&vhost.name);
    let dir = dir.0.clone();
    let h = harness_on(fake.clone(), |settings| {
        // The workers' RabbitMQ user is named after the cluster: one of its own.
        settings.cluster_name = unique("readme");
    });

    // A namespace for the pipeline, as a person makes one.
    let out = ok(
        "create namespace",
        kubectl(&user, &dir, &["create", "namespace", NS]).await,
    );
    assert_eq!(out.trim(), format!("namespace/{NS} created"));

    let lines = readme_block("Or with plain manifests");
    let (get, expected) = lines.last().expect("the README's lines").clone();
    assert_eq!(words(&get), ["kubectl", "get", "mp"]);
    let mut printed = String::new();
    for (line, _) in &lines[..lines.len() - 1] {
        assert_eq!(line[0], "kubectl", "{line:?}");
        let out = ok(
            &line.join(" "),
            kubectl(&user, &dir, &words(&line[1..])).await,
        );
        printed.push_str(&out);
    }
    for line in [
        "customresourcedefinition.apiextensions.k8s.io/mailerpipelines.mailer.dev serverside-applied",
        "namespace/mailer-system created",
        "deployment.apps/mailer-operator created",
        "clusterrole.rbac.authorization.k8s.io/mailer-operator created",
        "secret/shop-rabbitmq created",
        "secret/shop-smtp created",
        "mailerpipeline.mailer.dev/shop created",
    ] {
        assert!(
            printed.lines().any(|l| l == line),
            "{line:?} not in:\n{printed}"
        );
    }
    let stored = fake
        .get(&format!("/api/v1/namespaces/{NS}/secrets/shop-smtp"))
        .expect("the Secret is stored");
    assert!(stored.get("stringData").is_none() && stored["data"]["url"].is_string());

    let worker = format!("/apis/apps/v1/namespaces/{NS}/deployments/shop-worker");
    let health = controller_health();
    run_controllers_until(&h, &health, Duration::from_secs(240), async {
        // The operator makes the workers' Deployment; its pods become ready, as the
        // kubelet and the Deployment controller would say.
        let mut deployment =
            eventually(60, "the worker Deployment", || async { fake.get(&worker) }).await;
        let replicas = deployment["spec"]["replicas"].clone();
        deployment["status"] = json!({"observedGeneration": deployment["metadata"]["generation"],
            "replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas,
            "availableReplicas": replicas});
        fake.put(&worker, deployment);

        let out = ok(
            "kubectl wait",
            kubectl(
                &user,
                &dir,
                &["wait", "--for=condition=Ready", "mp/shop", "--timeout=120s"],
            )
            .await,
        );
        assert_eq!(out.trim(), "mailerpipeline.mailer.dev/shop condition met");

        let out = ok(
            "kubectl get mp",
            kubectl(&user, &dir, &words(&get[1..])).await,
        );
        // The README's example output: the same columns, and the same row but its age.
        assert_eq!(
            columns(&out, 0),
            expected[0].split_whitespace().collect::<Vec<_>>()
        );
        let row = expected[1].split_whitespace().collect::<Vec<_>>();
        assert_eq!(columns(&out, 1)[..6], row[..6], "{out}");

        let out = ok(
            "describe",
            kubectl(&user, &dir, &["describe", "mp", "shop"]).await,
        );
        // Each condition's lines end with its type; Ready's status is the line before.
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        let ready = lines
            .iter()
            .position(|l| l.split_whitespace().collect::<Vec<_>>() == ["Type:", "Ready"])
            .unwrap_or_else(|| panic!("no Ready condition in {out}"));
        assert_eq!(
            lines[ready - 1].split_whitespace().collect::<Vec<_>>(),
            ["Status:", "True"]
        );
        assert!(lines.contains(&"Conditions:"), "{out}");
        let events = &out[out.find("\nEvents:").unwrap_or_else(|| panic!("{out}"))..];
        assert_eq!(
            columns(events, 2),
            ["Type", "Reason", "Age", "From", "Message"],
            "{out}"
        );
        assert!(
            events.lines().any(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                c.len() > 4
                    && c[0] == "Normal"
                    && c[1] == "TopologyCreated"
                    && c[3] == "mailer-operator"
            }),
            "{out}"
        );

        let out = ok(
            "explain",
            kubectl(&user, &dir, &["explain", "mailerpipeline.spec.topology"]).await,
        );
        assert!(out.contains("KIND:       MailerPipeline"), "{out}");
        assert!(out.contains("FIELD: topology <Object>"), "{out}");
        assert!(out.contains("deadQueue\t<string>"), "{out}");
        assert!(
            out.contains("The quorum queue that keeps dead letters."),
            "{out}"
        );

        // Deleting it waits for the operator's cleanup (its finalizer).
        let out = ok(
            "delete",
            kubectl(
                &user,
                &dir,
                &["delete", "-f", "examples/pipeline.yaml", "--timeout=120s"],
            )
            .await,
        );
        assert_eq!(
            out.trim(),
            format!("mailerpipeline.mailer.dev \"shop\" deleted from {NS} namespace")
        );
        let (_, _, err) = kubectl(&user, &dir, &["get", "mp"]).await;
        assert!(
            err.contains(&format!("No resources found in {NS} namespace.")),
            "{err}"
        );
    })
    .await;
    drop(vhost);
}
