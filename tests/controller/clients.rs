//! The in-memory API server as a new cluster for the clients people use, with the
//! built-in kinds' OpenAPI schemas.

use std::path::Path;
use std::process::Command;

use super::fake_api::openapi::Definitions;

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
    let version = super::fake_api::discovery::GIT_VERSION;
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
