//! What running the operator takes beyond its code: the image (built with buildah and
//! run against the real broker), the Argo CD health check (run by Lua 5.1 on fixtures
//! for every condition reason), the runbook (docs/operations.md names every reason,
//! metric and alert) and `make demo`, end to end against the real broker and on a
//! machine that is not ready for it.
//!
//! Needs buildah, lua5.1 and promtool (.ci/run installs them) and the real broker at
//! 127.0.0.1; each broker test works in a vhost of its own.

pub mod support;

#[path = "operations/argocd.rs"]
mod argocd;
#[path = "operations/demo.rs"]
mod demo;
#[path = "operations/image.rs"]
mod image;
#[path = "operations/runbook.rs"]
mod runbook;

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}
