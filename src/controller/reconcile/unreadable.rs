//! A MailerPipeline the operator cannot deserialize (a CRD newer than the operator, or a
//! field of the wrong type) is reported on that object, and the others go on: the root
//! watch reads pipelines through kube's `DeserializeGuard`, so one such object does not
//! stall the watch of all of them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::error_boundary::InvalidObject;
use kube::core::{ApiResource, DeserializeGuard};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::reasons::event;
use crate::spec::{MailerPipeline, READY, TOPOLOGY_READY};

/// Says on the object why it cannot be read: `TopologyReady` and `Ready` False with the
/// reason `Unreadable`, and a warning event, both only when that is news. The reconcile
/// fails with the same error (counted in the metrics, retried at the resync interval).
pub async fn report(
    guard: &DeserializeGuard<MailerPipeline>,
    invalid: &InvalidObject,
    ctx: &Context,
) -> Error {
    let error = Error::Unreadable(invalid.error.clone());
    let (Some(namespace), Some(name)) = (guard.namespace(), guard.meta().name.clone()) else {
        return error;
    };
    let resource = ApiResource::erase::<MailerPipeline>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &namespace, &resource);
    let reason = error.reason();
    let message = error.to_string();
    let said_already = match api.get_opt(&name).await {
        Ok(Some(object)) => {
            object.data["status"]["conditions"]
                .as_array()
                .is_some_and(|conditions| {
                    conditions.iter().any(|c| {
                        c["type"] == READY
                            && c["reason"] == reason.as_str()
                            && c["message"] == message
                    })
                })
        }
        Ok(None) => return error,
        Err(e) => return Error::kube("read the unreadable MailerPipeline", e),
    };
    if said_already {
        return error;
    }
    let condition = |type_: &str| Condition {
        type_: type_.to_string(),
        status: "False".to_string(),
        reason: reason.clone(),
        message: message.clone(),
        observed_generation: guard.meta().generation,
        last_transition_time: Time(Timestamp::now()),
    };
    let patch = json!({"status": {"conditions": [condition(TOPOLOGY_READY), condition(READY)]}});
    if let Err(e) = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        return Error::kube("write the status", e);
    }
    let event_reason = format!("{}{reason}", event::RECONCILE_FAILED_PREFIX);
    let regarding = guard.object_ref(&());
    ctx.publish(
        &regarding,
        EventType::Warning,
        &event_reason,
        "Reconcile",
        message,
    )
    .await;
    error
}
