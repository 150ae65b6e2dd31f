//! What running the operator takes beyond its code: the image (built with buildah and
//! run against the real broker), the Argo CD health check (run by Lua 5.1 on fixtures
//! for every condition reason), the runbook (docs/operations.md names every reason,
//! metric and alert) and `make demo`, end to end against the real broker and on a
//! machine that is not ready for it.
//!
//! Needs buildah, lua5.1 and promtool (.ci/run installs them) and the real broker at
//! 127.0.0.1; each broker test works in a vhost of its own.

mod argocd;
mod demo;
mod image;
mod runbook;
