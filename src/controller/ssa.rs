//! Server-side apply, made only when the object differs from what is asked for.
//!
//! Server-side apply is idempotent, but each one is still a write request the API server
//! handles and audits. So the live object is read first and the apply is skipped when
//! every field the operator sets already has the value it would set. Fields the server
//! or others added (defaults, status, annotations of other tools) do not count. Values
//! the server rewrites (a quantity like `0.5` that reads back as `500m`) look like a
//! difference and cost one idempotent apply per reconcile; nothing else does.

use std::fmt::Debug;

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::meta::FIELD_MANAGER;

/// Whether every field of `desired` is in `live` with the same value. Objects may have
/// more fields in `live`; lists must have the same length, element by element.
pub fn is_subset(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Object(want), Value::Object(have)) => {
            want.iter().all(|(key, value)| match have.get(key) {
                Some(found) => is_subset(value, found),
                None => value.is_null(),
            })
        }
        (Value::Array(want), Value::Array(have)) => {
            want.len() == have.len() && want.iter().zip(have).all(|(w, h)| is_subset(w, h))
        }
        (want, have) => want == have,
    }
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
}
