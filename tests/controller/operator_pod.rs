//! The operator's pod as the kubelet would run it, from the chart's rendered Deployment
//! (`tests/render_chart.py template`), with the binary cargo built in place of the
//! image's entrypoint:
//!
//! - its `command` and `args` (the image's entrypoint when it names no command);
//! - its `env`, each `valueFrom.fieldRef` (the downward API) resolved for a pod of the
//!   name and namespace the test gives, after the image's environment and the
//!   `KUBERNETES_SERVICE_*` variables the kubelet adds;
//! - its ServiceAccount's token, `ca.crt` and `namespace` mounted read-only where the
//!   kubelet mounts them, so kube's in-cluster configuration reads them and speaks
//!   HTTPS, with the token as a bearer token, to the in-memory API server behind a TLS
//!   front ([`ApiServerTls`]) whose certificate the CA in `ca.crt` signed;
//! - its `securityContext`: a read-only root file system (`tests/pod_sandbox.sh`, in a
//!   mount namespace of its own), the user and group it names, no privilege escalation
//!   (`no_new_privs`) and its capabilities dropped (`setpriv`). The seccomp profile is
//!   not applied;
//! - its probes, polled as the kubelet would ([`Prober`]): every `periodSeconds`, each
//!   within `timeoutSeconds`, on the port they name.
//!
//! The pod's network namespace would have its ports to itself; here each container port
//! is published on a free port of 127.0.0.1, and the environment variable that makes the
//! process listen on `0.0.0.0:<container port>` is pointed there: a container port the
//! environment does not listen on fails the test.
//!
//! Only what the chart uses is done: a volume, an `envFrom`, a Secret or ConfigMap
//! reference, a `$(VAR)` reference or an added capability fails the test, to be handled
//! here when the chart starts using it. A mount namespace needs root, which the tests
//! run as (`.ci/run`).

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;
use tokio::task::JoinHandle;

use mailer_testkit::process::free_port;
use mailer_testkit::smtp::TempDir;
use mailer_testkit::tls::TestCa;

/// The image's `ENTRYPOINT` (Dockerfile): the binary cargo built stands for it.
pub const IMAGE_ENTRYPOINT: &str = "/usr/local/bin/mailer";
/// The image's environment, user and working directory (deploy/image/runtime-base.sh,
/// which distroless' nonroot image matches).
const IMAGE_ENV: &[(&str, &str)] = &[
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"),
];
const IMAGE_USER: (i64, i64) = (65532, 65532);
const IMAGE_WORKDIR: &str = "/home/nonroot";
/// The user's home in the image's /etc/passwd, which the runtime sets as HOME.
const IMAGE_HOME: &str = "/home/nonroot";

/// Renders the chart with `values` (YAML) as `helm template --release <release>
/// --namespace <namespace>` would; every object.
pub fn render_chart(release: &str, namespace: &str, values: &str) -> Vec<Value> {
    let output = mailer_testkit::chart::render_chart(
        &[
            "template",
            "--release",
            release,
            "--namespace",
            namespace,
            "--values",
            "-",
        ],
        values,
    );
    assert!(
        output.status.success(),
        "the chart does not render: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("UTF-8 manifests");
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| serde::Deserialize::deserialize(document).expect("a YAML object"))
        .filter(|object: &Value| !object.is_null())
        .collect()
}

/// The one rendered object of `kind`.
pub fn of_kind<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let mut found = objects.iter().filter(|o| o["kind"] == kind);
    let object = found
        .next()
        .unwrap_or_else(|| panic!("the chart renders no {kind}"));
    assert!(found.next().is_none(), "the chart renders several {kind}s");
    object
}

/// The in-memory API server behind a TLS front on a free port of 127.0.0.1: a
/// certificate for 127.0.0.1 that the test CA signed (`server.pem`), each connection
/// passed on to the plain HTTP server `FakeApi::serve` runs. The front and every
/// connection it holds end when it is dropped.
pub struct ApiServerTls {
    pub port: u16,
    connections: Arc<AtomicU32>,
    task: JoinHandle<()>,
}

impl ApiServerTls {
    pub async fn start(ca: &TestCa, backend: &str) -> Self {
        mailer::install_crypto_provider();
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(ca.file("server.pem"))
                .expect("the server certificate")
                .collect::<Result<_, _>>()
                .expect("PEM certificates");
        let key = PrivateKeyDer::from_pem_file(ca.file("server.key")).expect("the server key");
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("a TLS server configuration");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let backend = backend
            .strip_prefix("http://")
            .expect("FakeApi::serve's URL")
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicU32::new(0));
        let counting = connections.clone();
        let task = tokio::spawn(async move {
            let mut open = tokio::task::JoinSet::new();
            while let Ok((socket, _)) = listener.accept().await {
                let (acceptor, backend, counting) =
                    (acceptor.clone(), backend.clone(), counting.clone());
                open.spawn(async move {
                    let Ok(mut tls) = acceptor.accept(socket).await else {
                        return;
                    };
                    counting.fetch_add(1, Ordering::SeqCst);
                    if let Ok(mut plain) = tokio::net::TcpStream::connect(&backend).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                    }
                });
            }
        });
        Self {
            port,
            connections,
            task,
        }
    }

    /// TLS connections that completed their handshake.
    pub fn connections(&self) -> u32 {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for ApiServerTls {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Who the pod is: what the downward API and the kubelet's environment tell of it.
pub struct PodIdentity {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub node_name: String,
}

/// The ServiceAccount's projected token, as the kubelet writes it: `token`, `ca.crt`
/// (the cluster's CA) and `namespace`, readable by the pod's user.
pub struct ServiceAccountToken {
    dir: TempDir,
    pub token: String,
}

impl ServiceAccountToken {
    pub fn new(ca: &TestCa, namespace: &str) -> Self {
        let dir = TempDir::new("serviceaccount");
        let token = super::broker::unique("sa-token");
        let ca_pem = std::fs::read_to_string(ca.file("ca.pem")).expect("the CA");
        for (file, content) in [
            ("token", &token),
            ("ca.crt", &ca_pem),
            ("namespace", &namespace.to_string()),
        ] {
            let path = dir.0.join(file);
            std::fs::write(&path, content).expect("a token file");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self { dir, token }
    }
}

/// The operator's container, running; killed when dropped.
pub struct OperatorPod {
    child: Child,
    container: Value,
    confinement: Confinement,
    /// Each container port and the port of 127.0.0.1 that stands for it.
    published: BTreeMap<i64, u16>,
    grace: Duration,
    _token: ServiceAccountToken,
}

impl OperatorPod {
    /// Starts the first container of `deployment`'s pod template as the pod `pod`,
    /// running as `service_account`, against the API server behind `api`.
    pub fn start(
        deployment: &Value,
        pod: &PodIdentity,
        service_account: &Value,
        token: ServiceAccountToken,
        api: &ApiServerTls,
    ) -> Self {
        let root_owned = std::fs::metadata("/proc/self").map(|m| m.uid());
        assert!(
            matches!(root_owned, Ok(0)),
            "the operator's pod runs in a mount namespace of its own, which needs root (as .ci/run has)"
        );
        let spec = &deployment["spec"]["template"]["spec"];
        let containers = spec["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "one container: {containers:?}");
        let container = containers[0].clone();
        assert!(
            spec["volumes"].is_null() && container["volumeMounts"].is_null(),
            "the chart mounts volumes now: project them here ({spec})"
        );
        assert!(
            container["envFrom"].is_null(),
            "envFrom is not handled here"
        );
        // The token is mounted unless the pod or its ServiceAccount says not to.
        assert_eq!(
            spec["serviceAccountName"], service_account["metadata"]["name"],
            "the pod runs as the chart's ServiceAccount"
        );
        assert_ne!(spec["automountServiceAccountToken"], false);
        assert_ne!(service_account["automountServiceAccountToken"], false);

        // The environment, in the order the kubelet builds it: the image's, the
        // services' (only the API server's here), the runtime's HOSTNAME and HOME, then
        // the container's, which may override them.
        let mut env: Vec<(String, String)> = IMAGE_ENV
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let api_port = api.port.to_string();
        for (name, value) in [
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_string()),
            ("KUBERNETES_SERVICE_PORT", api_port.clone()),
            ("KUBERNETES_SERVICE_PORT_HTTPS", api_port.clone()),
            ("KUBERNETES_PORT", format!("tcp://127.0.0.1:{api_port}")),
            ("HOSTNAME", pod.name.clone()),
            ("HOME", IMAGE_HOME.to_string()),
        ] {
            env.push((name.to_string(), value));
        }
        for var in container["env"].as_array().into_iter().flatten() {
            let name = var["name"].as_str().expect("an env name").to_string();
            let value = match var["value"].as_str() {
                Some(value) => value.to_string(),
                None if var["valueFrom"]["fieldRef"].is_object() => field_ref(
                    var["valueFrom"]["fieldRef"]["fieldPath"]
                        .as_str()
                        .expect("a fieldPath"),
                    deployment,
                    pod,
                ),
                None if var.get("value").is_some() || var.get("valueFrom").is_none() => {
                    String::new()
                }
                None => panic!("env {name}: only values and fieldRefs are handled here: {var}"),
            };
            assert!(
                !value.contains("$("),
                "env {name}: $(VAR) references are not expanded here"
            );
            env.retain(|(n, _)| *n != name);
            env.push((name, value));
        }

        // Each container port, published on a free port of 127.0.0.1.
        let mut published = BTreeMap::new();
        for port in container["ports"].as_array().into_iter().flatten() {
            let number = port["containerPort"].as_i64().expect("a containerPort");
            let listen = format!("0.0.0.0:{number}");
            let host_port = free_port();
            let mut pointed = 0;
            for (_, value) in env.iter_mut().filter(|(_, v)| *v == listen) {
                *value = format!("127.0.0.1:{host_port}");
                pointed += 1;
            }
            assert_eq!(
                pointed, 1,
                "one env var makes the process listen on container port {number} ({listen}): {env:?}"
            );
            published.insert(number, host_port);
        }

        // The command: the image's entrypoint unless the container names one.
        let strings = |field: &str| -> Vec<String> {
            container[field]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| a.as_str().expect("a string").to_string())
                .collect()
        };
        let mut command = strings("command");
        if command.is_empty() {
            command.push(IMAGE_ENTRYPOINT.to_string());
        }
        assert!(
            command[0] == IMAGE_ENTRYPOINT || command[0] == "mailer",
            "the container runs {command:?}, not the image's mailer"
        );
        command[0] = env!("CARGO_BIN_EXE_mailer").to_string();
        command.extend(strings("args"));
        for arg in &command {
            assert!(!arg.contains("$("), "{arg}: $(VAR) is not expanded here");
        }

        // Who it runs as, and what it may do.
        let pod_security = &spec["securityContext"];
        let security = &container["securityContext"];
        let setting = |field: &str| {
            let own = &security[field];
            if own.is_null() {
                pod_security[field].clone()
            } else {
                own.clone()
            }
        };
        let uid = setting("runAsUser").as_i64().unwrap_or(IMAGE_USER.0);
        let gid = setting("runAsGroup").as_i64().unwrap_or(IMAGE_USER.1);
        if setting("runAsNonRoot") == true {
            assert_ne!(uid, 0, "runAsNonRoot with user 0: the kubelet would refuse");
        }
        let mut setpriv = vec![
            "setpriv".to_string(),
            format!("--reuid={uid}"),
            format!("--regid={gid}"),
            "--clear-groups".to_string(),
        ];
        let no_new_privs = security["allowPrivilegeEscalation"] == false;
        if no_new_privs {
            setpriv.push("--no-new-privs".to_string());
        }
        let dropped = security["capabilities"]["drop"]
            .as_array()
            .is_some_and(|drop| drop.iter().any(|c| c == "ALL"));
        assert!(
            security["capabilities"]["add"].is_null(),
            "added capabilities are not handled here"
        );
        if dropped {
            setpriv.extend(["--inh-caps=-all".into(), "--bounding-set=-all".into()]);
        }
        setpriv.push("--".to_string());
        let root = if security["readOnlyRootFilesystem"] == true {
            "ro"
        } else {
            "rw"
        };

        let sandbox = mailer_testkit::repo_root().join("tests/pod_sandbox.sh");
        let child = Command::new("/usr/bin/unshare")
            .args([
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "--",
                "/bin/sh",
            ])
            .arg(sandbox)
            .arg(&token.dir.0)
            .args([IMAGE_WORKDIR, &format!("{uid}:{gid}"), &pod.name, root])
            .args(setpriv)
            .args(command)
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("unshare runs tests/pod_sandbox.sh");
        let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
        Self {
            child,
            container,
            confinement: Confinement {
                uid,
                gid,
                read_only_root: root == "ro",
                no_new_privs,
                capabilities_dropped: dropped,
            },
            published,
            grace: Duration::from_secs(grace),
            _token: token,
        }
    }

    /// The kubelet's prober of the container's `livenessProbe` or `readinessProbe`.
    pub fn prober(&self, probe: &str) -> Prober {
        let spec = &self.container[probe];
        let get = &spec["httpGet"];
        assert!(get.is_object(), "{probe} is an httpGet probe: {spec}");
        let port = match &get["port"] {
            Value::Number(n) => n.as_i64().expect("a port"),
            Value::String(name) => self.container["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == name.as_str())
                .and_then(|p| p["containerPort"].as_i64())
                .unwrap_or_else(|| panic!("{probe}: no container port named {name}")),
            other => panic!("{probe}: port {other}"),
        };
        let host_port = self.published.get(&port).unwrap_or_else(|| {
            panic!("{probe}: port {port} is not a container port, so nothing publishes it")
        });
        let path = get["path"].as_str().unwrap_or("/");
        let seconds = |field: &str, default: u64| spec[field].as_u64().unwrap_or(default);
        Prober::start(
            format!("http://127.0.0.1:{host_port}{path}"),
            Duration::from_secs(seconds("periodSeconds", 10)),
            Duration::from_secs(seconds("timeoutSeconds", 1)),
            u32::try_from(seconds("failureThreshold", 3)).expect("a small threshold"),
        )
    }

    /// Stops the pod as the kubelet does: SIGTERM, then `terminationGracePeriodSeconds`
    /// for it to exit (SIGKILL after). Returns how it exited and how long it took.
    pub async fn terminate(&mut self) -> (ExitStatus, Duration) {
        let started = Instant::now();
        let term = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(term.success());
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return (status, started.elapsed());
            }
            if started.elapsed() > self.grace {
                let _ = self.child.kill();
                panic!(
                    "the operator did not exit within terminationGracePeriodSeconds ({:?}): the kubelet kills it",
                    self.grace
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What the kernel says of the running process is what its securityContext asked:
    /// its user and group, no new privileges, no capabilities, a read-only root with the
    /// ServiceAccount's token mounted read-only where the kubelet mounts it, and the
    /// image's working directory.
    pub fn assert_confined(&self) {
        let pid = self.child.id();
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("the process's binary");
        assert_eq!(
            exe,
            Path::new(env!("CARGO_BIN_EXE_mailer")),
            "pid {pid} is mailer"
        );
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
        let field = |name: &str| -> Vec<String> {
            status
                .lines()
                .find_map(|line| line.strip_prefix(&format!("{name}:")))
                .unwrap_or_else(|| panic!("no {name} in {status}"))
                .split_whitespace()
                .map(str::to_string)
                .collect()
        };
        let c = &self.confinement;
        assert_eq!(field("Uid"), vec![c.uid.to_string(); 4], "{status}");
        assert_eq!(field("Gid"), vec![c.gid.to_string(); 4], "{status}");
        assert_eq!(field("Groups"), Vec::<String>::new(), "{status}");
        if c.no_new_privs {
            assert_eq!(field("NoNewPrivs"), ["1"], "{status}");
        }
        if c.capabilities_dropped {
            for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
                assert_eq!(field(set), ["0000000000000000"], "{set}: {status}");
            }
        }
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).expect("its working directory");
        assert_eq!(cwd, Path::new(IMAGE_WORKDIR));
        // mountinfo: the mount point is the 5th field, its options the 6th.
        let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("its mounts");
        let mut token_mounted = false;
        for line in mounts.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let (point, options) = (fields[4], fields[5]);
            let read_only = options.split(',').any(|o| o == "ro");
            if point == "/run/secrets/kubernetes.io/serviceaccount" {
                token_mounted = true;
                assert!(read_only, "the token is mounted read-only: {line}");
            }
            let kernel = ["/proc", "/sys", "/dev"]
                .iter()
                .any(|k| point == *k || point.starts_with(&format!("{k}/")))
                || line.contains(" - proc ");
            // A mount the pod's tmpfs over /run or /home covers (the host's network
            // namespaces under /run/netns, say) is listed, but out of the pod's reach.
            let covered = ["/run/", "/home/"]
                .iter()
                .any(|under| point.starts_with(under))
                && !point.starts_with("/run/secrets/")
                && !Path::new(&format!("/proc/{pid}/root{point}")).exists();
            if c.read_only_root && !kernel && !covered {
                assert!(read_only, "{point} is writable in the pod: {line}");
            }
        }
        assert!(token_mounted, "no ServiceAccount token mount in {mounts}");
    }

    /// Whether the process has exited, and how.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("wait")
    }
}

impl Drop for OperatorPod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the container's securityContext asked, as it was applied.
struct Confinement {
    uid: i64,
    gid: i64,
    read_only_root: bool,
    no_new_privs: bool,
    capabilities_dropped: bool,
}

/// The downward API's `fieldRef`s the kubelet resolves for a container's env.
fn field_ref(path: &str, deployment: &Value, pod: &PodIdentity) -> String {
    let template = &deployment["spec"]["template"];
    let from_map = |map: &str, key: &str| {
        template["metadata"][map][key]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let keyed = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix("']"))
            .map(str::to_string)
    };
    match path {
        "metadata.name" => pod.name.clone(),
        "metadata.namespace" => pod.namespace.clone(),
        "metadata.uid" => pod.uid.clone(),
        "spec.nodeName" => pod.node_name.clone(),
        "spec.serviceAccountName" => template["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
            .to_string(),
        "status.podIP" | "status.hostIP" | "status.podIPs" | "status.hostIPs" => {
            "127.0.0.1".to_string()
        }
        _ => {
            if let Some(key) = keyed("metadata.labels['") {
                from_map("labels", &key)
            } else if let Some(key) = keyed("metadata.annotations['") {
                from_map("annotations", &key)
            } else {
                panic!("fieldRef {path} is not one the kubelet resolves")
            }
        }
    }
}

/// One probe, polled as the kubelet would: every `period`, a GET that succeeds with a
/// status from 200 to 399 within `timeout`. Stops when dropped.
pub struct Prober {
    url: String,
    failure_threshold: u32,
    results: Arc<Mutex<Vec<bool>>>,
    task: JoinHandle<()>,
}

impl Prober {
    fn start(url: String, period: Duration, timeout: Duration, failure_threshold: u32) -> Self {
        let results = Arc::new(Mutex::new(Vec::new()));
        let (probing, recording) = (url.clone(), results.clone());
        let task = tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .timeout(timeout)
                .build()
                .expect("an HTTP client");
            let mut every = tokio::time::interval(period);
            loop {
                every.tick().await;
                let ok = client
                    .get(&probing)
                    .send()
                    .await
                    .is_ok_and(|r| (200..400).contains(&r.status().as_u16()));
                recording.lock().unwrap().push(ok);
            }
        });
        Self {
            url,
            failure_threshold,
            results,
            task,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Each probe's result so far, in order.
    pub fn results(&self) -> Vec<bool> {
        self.results.lock().unwrap().clone()
    }

    /// Whether failures in a row ever reached `failureThreshold` after the first success
    /// (`after_success`) or from the start: then the kubelet would have restarted the
    /// container (liveness) or taken the pod out of its Services (readiness).
    pub fn tripped(&self, after_success: bool) -> bool {
        let results = self.results();
        let start = if after_success {
            results.iter().position(|ok| *ok).unwrap_or(results.len())
        } else {
            0
        };
        let mut in_row = 0;
        for ok in &results[start..] {
            in_row = if *ok { 0 } else { in_row + 1 };
            if in_row >= self.failure_threshold {
                return true;
            }
        }
        false
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.task.abort();
    }
}
