//! The metadata every object the operator makes for a pipeline carries: its labels and
//! the owner reference that lets Kubernetes delete it with the pipeline.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::controller::error::Error;
use crate::controller::kube::ssa::FIELD_MANAGER;
use crate::spec::MailerPipeline;

/// The `app.kubernetes.io/name` of worker pods and their objects.
pub const WORKER_APP: &str = "mailer-worker";

/// The label that names the pipeline a worker pod (and every object the operator makes
/// for it) belongs to. Not `app.kubernetes.io/instance`: Argo CD tracks what it deployed
/// by that label, and would take the workers for objects of an Application of the
/// pipeline's name.
pub const PIPELINE_LABEL: &str = "mailer.dev/pipeline";

/// The labels that select a pipeline's worker pods; they never change for a pipeline.
pub fn selector_labels(pipeline: &MailerPipeline) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), WORKER_APP.to_string()),
        (PIPELINE_LABEL.to_string(), pipeline.name_any()),
    ])
}

/// The selector labels, and what else tells a person who made the object and why.
pub fn labels(pipeline: &MailerPipeline) -> BTreeMap<String, String> {
    let mut labels = selector_labels(pipeline);
    labels.insert(
        "app.kubernetes.io/managed-by".to_string(),
        FIELD_MANAGER.to_string(),
    );
    labels.insert(
        "app.kubernetes.io/component".to_string(),
        "worker".to_string(),
    );
    labels
}

/// A label selector for everything the operator made (to keep its Secret cache small).
pub fn managed_by_selector() -> String {
    format!("app.kubernetes.io/managed-by={FIELD_MANAGER}")
}

/// Metadata of an object named `name` in the pipeline's namespace, labelled and owned by
/// the pipeline as its controller.
pub fn owned_meta(pipeline: &MailerPipeline, name: String) -> Result<ObjectMeta, Error> {
    let owner = pipeline
        .controller_owner_ref(&())
        .ok_or(Error::IncompleteObject("metadata.uid"))?;
    Ok(ObjectMeta {
        name: Some(name),
        namespace: Some(
            pipeline
                .namespace()
                .ok_or(Error::IncompleteObject("namespace"))?,
        ),
        labels: Some(labels(pipeline)),
        owner_references: Some(vec![owner]),
        ..ObjectMeta::default()
    })
}
