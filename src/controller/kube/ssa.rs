//! Server-side apply, made only when the object differs from what is asked for, and
//! never to an object another controller owns.
//!
//! Server-side apply is idempotent, but each one is still a write request the API server
//! handles and audits. So the live object is read first and the apply is skipped when
//! every field the operator sets already has the value it would set. Fields the server
//! or others added (defaults, status, annotations of other tools, `replicas` set by an
//! autoscaler when the operator sets none) do not count, and quantities compare by value
//! (`0.5` is the `500m` the API server returns), so a steady state makes no write.
//!
//! An object of the name the operator would use that is controlled by something else (a
//! Deployment someone made by hand, another pipeline's) is never taken over: the
//! reconcile stops with `Conflict` before it writes anything.

use std::fmt::Debug;

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::controller::error::Error;
use crate::quantity;
use crate::spec::MailerPipeline;

/// The field manager of every server-side apply the operator makes, and the value of
/// `app.kubernetes.io/managed-by` on what it makes.
pub const FIELD_MANAGER: &str = "mailer-operator";

/// Whether every field of `desired` is in `live` with the same value. Objects may have
/// more fields in `live`; lists must have the same length, element by element; under
/// `resources`, quantities compare by value.
pub fn is_subset(desired: &Value, live: &Value) -> bool {
    subset(desired, live, false)
}

fn subset(desired: &Value, live: &Value, quantities: bool) -> bool {
    match (desired, live) {
        (Value::Object(want), Value::Object(have)) => {
            want.iter().all(|(key, value)| match have.get(key) {
                Some(found) => subset(value, found, quantities || key == "resources"),
                None => value.is_null(),
            })
        }
        (Value::Array(want), Value::Array(have)) => {
            want.len() == have.len() && want.iter().zip(have).all(|(w, h)| subset(w, h, quantities))
        }
        (Value::String(want), Value::String(have)) if quantities => {
            quantity::same_value(want, have).unwrap_or(want == have)
        }
        (want, have) => want == have,
    }
}

/// Fails with `Conflict` when `live` exists and its controller is not `pipeline` (an
/// object without a controller counts as someone else's: the operator always sets
/// itself as the controller of what it makes).
pub fn ensure_ours<K: Resource>(
    kind: &str,
    live: Option<&K>,
    pipeline: &MailerPipeline,
) -> Result<(), Error> {
    let Some(live) = live else {
        return Ok(());
    };
    let controller = live
        .meta()
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true));
    if controller.is_some_and(|owner| Some(&owner.uid) == pipeline.metadata.uid.as_ref()) {
        return Ok(());
    }
    Err(Error::NotOurs {
        kind: kind.to_string(),
        namespace: live.namespace().unwrap_or_default(),
        name: live.name_any(),
        controller: controller.map(|owner| format!("{} {}", owner.kind, owner.name)),
    })
}

/// Applies `desired` with the operator's field manager unless `live` already holds it;
/// returns the object as applied, or `None` when nothing needed applying.
pub async fn apply_if_changed<K>(
    api: &Api<K>,
    desired: &K,
    live: Option<&K>,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let wanted = serde_json::to_value(desired).map_err(kube::Error::SerdeError)?;
    if let Some(live) = live {
        let have = serde_json::to_value(live).map_err(kube::Error::SerdeError)?;
        if is_subset(&wanted, &have) {
            return Ok(None);
        }
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let applied = api
        .patch(&desired.name_any(), &params, &Patch::Apply(desired))
        .await?;
    Ok(Some(applied))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_others_added_do_not_count() {
        let desired = json!({"spec": {"replicas": 2, "template": {"containers": [{"name": "w"}]}}});
        let live = json!({
            "spec": {"replicas": 2, "revisionHistoryLimit": 10,
                     "template": {"containers": [{"name": "w", "terminationMessagePath": "/dev/x"}]}},
            "status": {"readyReplicas": 1}
        });
        assert!(is_subset(&desired, &live));
    }

    #[test]
    fn a_changed_value_or_list_counts() {
        let live = json!({"spec": {"replicas": 2, "args": ["worker"]}});
        assert!(!is_subset(&json!({"spec": {"replicas": 3}}), &live));
        assert!(!is_subset(
            &json!({"spec": {"args": ["worker", "x"]}}),
            &live
        ));
        assert!(!is_subset(&json!({"spec": {"missing": 1}}), &live));
        assert!(is_subset(&json!({"spec": {"absent": null}}), &live));
    }

    #[test]
    fn quantities_under_resources_compare_by_value_and_nothing_else_does() {
        let desired =
            json!({"resources": {"requests": {"cpu": "0.5", "memory": "1024Mi"}}, "env": "1"});
        let live = json!({"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}, "env": "1"});
        assert!(is_subset(&desired, &live));
        let more = json!({"resources": {"requests": {"cpu": "600m", "memory": "1Gi"}}, "env": "1"});
        assert!(!is_subset(&desired, &more));
        assert!(!is_subset(&json!({"env": "1"}), &json!({"env": "1000m"})));
    }
}
