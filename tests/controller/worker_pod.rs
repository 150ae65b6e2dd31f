//! Runs `mailer worker` as the worker Deployment's pod would: with the container's args
//! and env, each `secretKeyRef` read from its Secret in the in-memory API server. So the
//! Deployment and the worker user the operator made are checked against the real worker.

use std::process::{Child, Command, Stdio};

use super::harness::Harness;

/// The worker process; killed when dropped.
pub struct WorkerPod(Child);

impl Drop for WorkerPod {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn start(h: &Harness, deployment_path: &str) -> WorkerPod {
    let deployment = h
        .fake
        .get(deployment_path)
        .expect("the Deployment is stored");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let mut command = Command::new(env!("CARGO_BIN_EXE_mailer"));
    for arg in container["args"].as_array().expect("args") {
        command.arg(arg.as_str().expect("a string arg"));
    }
    for var in container["env"].as_array().expect("env") {
        let name = var["name"].as_str().expect("an env name");
        let value = match var["value"].as_str() {
            Some(value) => value.to_string(),
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
    // The pod's own address, 0.0.0.0:8080, may be taken on a shared test machine.
    command
        .env("MAIL_HTTP_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    WorkerPod(command.spawn().expect("start mailer worker"))
}
