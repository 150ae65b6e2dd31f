//! Runs `mailer worker` as the worker Deployment's pod would: with the container's args
//! and env, each `secretKeyRef` read from its Secret in the in-memory API server, and
//! each Secret volume projected into a directory, as the kubelet would. So the
//! Deployment and the worker user the operator made are checked against the real worker.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use mailer_testkit::operator::Harness;
use mailer_testkit::process::free_port;
use mailer_testkit::smtp::TempDir;

/// The worker process, killed when dropped, and its projected volumes.
pub struct WorkerPod {
    child: Child,
    /// The port of 127.0.0.1 that stands for the pod's port 8080 (`/metrics`, `/livez`,
    /// `/readyz`).
    pub http_port: u16,
    _volumes: Vec<TempDir>,
}

impl Drop for WorkerPod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start(h: &Harness, deployment_path: &str) -> WorkerPod {
    let deployment = h
        .fake
        .get(deployment_path)
        .expect("the Deployment is stored");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let (volumes, mounts) = project_volumes(h, pod, container);
    let mut command = Command::new(env!("CARGO_BIN_EXE_mailer"));
    for arg in container["args"].as_array().expect("args") {
        command.arg(arg.as_str().expect("a string arg"));
    }
    for var in container["env"].as_array().expect("env") {
        let name = var["name"].as_str().expect("an env name");
        let value = match var["value"].as_str() {
            Some(value) => in_pod_path(value, &mounts),
            None => {
                let reference = &var["valueFrom"]["secretKeyRef"];
                h.secret_value(
                    reference["name"].as_str().expect("a Secret name"),
                    reference["key"].as_str().expect("a Secret key"),
                )
            }
        };
        command.env(name, value);
    }
    // The pod's own address, 0.0.0.0:8080, may be taken on a shared test machine: a
    // free port of 127.0.0.1 stands for it.
    let http_port = free_port();
    command
        .env("MAIL_HTTP_ADDR", format!("127.0.0.1:{http_port}"))
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    WorkerPod {
        child: command.spawn().expect("start mailer worker"),
        http_port,
        _volumes: volumes,
    }
}

/// Writes each Secret volume's items (the keys the volume names, under their paths) into
/// a directory of its own; returns the directories and each mount's path → directory.
/// A volume of any other kind, or a key the Secret lacks, fails the test: the kubelet
/// would not start the pod.
fn project_volumes(
    h: &Harness,
    pod: &Value,
    container: &Value,
) -> (Vec<TempDir>, BTreeMap<String, String>) {
    let mut dirs = BTreeMap::new();
    let mut volumes = Vec::new();
    for volume in pod["volumes"].as_array().into_iter().flatten() {
        let name = volume["name"].as_str().expect("a volume name");
        let secret = &volume["secret"];
        let secret_name = secret["secretName"]
            .as_str()
            .unwrap_or_else(|| panic!("volume {name}: only Secret volumes are projected"));
        let dir = TempDir::new("volume");
        for item in secret["items"].as_array().expect("the volume's items") {
            let key = item["key"].as_str().expect("an item key");
            let path = item["path"].as_str().expect("an item path");
            std::fs::write(dir.0.join(path), h.secret_value(secret_name, key))
                .expect("the item is written");
        }
        dirs.insert(name.to_string(), dir.0.display().to_string());
        volumes.push(dir);
    }
    let mut mounts = BTreeMap::new();
    for mount in container["volumeMounts"].as_array().into_iter().flatten() {
        let name = mount["name"].as_str().expect("a mount's volume");
        let dir = dirs
            .get(name)
            .unwrap_or_else(|| panic!("volume {name} is mounted but not in the pod"));
        let path = mount["mountPath"].as_str().expect("a mount path");
        mounts.insert(path.to_string(), dir.clone());
    }
    (volumes, mounts)
}

/// `value`, a path under a mount, as the path of the directory that stands for it here.
fn in_pod_path(value: &str, mounts: &BTreeMap<String, String>) -> String {
    for (mount_path, dir) in mounts {
        if let Some(rest) = value.strip_prefix(mount_path.as_str())
            && (rest.is_empty() || rest.starts_with('/'))
        {
            return format!("{dir}{rest}");
        }
    }
    value.to_string()
}
