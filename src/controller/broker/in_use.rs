//! The connection Secret a pipeline's cleanup needs, held while the pipeline exists.
//!
//! Deleting a namespace deletes its pipelines and their connection Secret at once; a
//! pipeline whose Secret went first could not reach its broker to remove its workers'
//! user and topology. So a pipeline holds its connection Secret with a finalizer of its
//! own, `mailer.dev/in-use-<uid>` (one per pipeline, so no pipeline waits for another's
//! to let go), added before anything is made in the broker and removed once its cleanup
//! is done. Each pipeline adds or removes only its own, by a JSON patch, so a thousand
//! pipelines sharing one Secret do not conflict ([`MetaPatch`]). The label
//! `mailer.dev/in-use` finds the Secrets held, to let go of one the pipeline no longer
//! names. Only a Secret of the pipeline's own namespace is held: a
//! RabbitmqCluster's default user belongs to the cluster's owner.
//!
//! The tenant may remove the finalizer (it may write its Secrets): the next reconcile
//! adds it again, and a Secret deleted meanwhile leaves a cleanup that says what it could
//! not remove. It protects the tenant's own cleanup, not anyone else's objects.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::controller::error::Error;
use crate::controller::kube::owned::OwnedCaches;
use crate::spec::MailerPipeline;

/// The label on every Secret a pipeline holds.
pub const IN_USE_LABEL: &str = "mailer.dev/in-use";
/// What every pipeline's finalizer on a Secret starts with.
const FINALIZER_PREFIX: &str = "mailer.dev/in-use-";

/// The finalizer `pipeline` holds a Secret with.
pub fn finalizer(pipeline: &MailerPipeline) -> String {
    format!("{FINALIZER_PREFIX}{}", pipeline.uid().unwrap_or_default())
}

/// A patch of a held Secret's metadata.
#[derive(Debug, PartialEq)]
pub enum MetaPatch {
    /// A JSON patch that adds or removes one pipeline's finalizer where it stands,
    /// without the `resourceVersion`: it overwrites nothing another wrote, so pipelines
    /// holding one Secret at once do not conflict (a thousand pipelines sharing one
    /// Secret met 409s in every try when each rewrote the whole list). Its `test` ops
    /// make the API server refuse it (422) when the Secret is not as read.
    Json(Value),
    /// A merge patch carrying the `resourceVersion` read, so a Secret changed since is
    /// not overwritten (409): for the first pipeline to hold it (no finalizers or label
    /// to add to yet) and the last to let go (the label goes too).
    Merge(Value),
}

impl MetaPatch {
    fn into_kube(self) -> Result<Patch<Value>, serde_json::Error> {
        Ok(match self {
            Self::Json(ops) => Patch::Json(serde_json::from_value(ops)?),
            Self::Merge(patch) => Patch::Merge(patch),
        })
    }
}

/// The patch that adds `finalizer` (and the label) to a Secret with `meta`; `None` when
/// it holds both, or when it is being deleted (no finalizer may be added then).
pub fn hold_patch(meta: &ObjectMeta, finalizer: &str) -> Option<MetaPatch> {
    if meta.deletion_timestamp.is_some() {
        return None;
    }
    let mut finalizers = meta.finalizers.clone().unwrap_or_default();
    let has_finalizer = finalizers.iter().any(|f| f == finalizer);
    let has_label = meta
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(IN_USE_LABEL));
    if has_finalizer && has_label {
        return None;
    }
    if has_label && !finalizers.is_empty() {
        return Some(MetaPatch::Json(json!([
            {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
        ])));
    }
    if !has_finalizer {
        finalizers.push(finalizer.to_string());
    }
    Some(MetaPatch::Merge(json!({"metadata": {
        "resourceVersion": meta.resource_version,
        "finalizers": finalizers,
        "labels": {IN_USE_LABEL: "true"},
    }})))
}

/// The patch that removes `finalizer` from a Secret with `meta` (and the label, when no
/// other pipeline holds it); `None` when it does not hold it.
pub fn release_patch(meta: &ObjectMeta, finalizer: &str) -> Option<MetaPatch> {
    let finalizers = meta.finalizers.as_deref().unwrap_or_default();
    let at = finalizers.iter().position(|f| f == finalizer)?;
    let remaining: Vec<&String> = finalizers.iter().filter(|f| *f != finalizer).collect();
    let others_hold = remaining.iter().any(|f| f.starts_with(FINALIZER_PREFIX));
    if others_hold && remaining.len() + 1 == finalizers.len() {
        let path = format!("/metadata/finalizers/{at}");
        return Some(MetaPatch::Json(json!([
            {"op": "test", "path": path, "value": finalizer},
            {"op": "remove", "path": path},
        ])));
    }
    let mut patch = json!({"metadata": {
        "resourceVersion": meta.resource_version,
        "finalizers": remaining,
    }});
    if !others_hold {
        patch["metadata"]["labels"] = json!({IN_USE_LABEL: null});
    }
    Some(MetaPatch::Merge(patch))
}

/// How often holding or letting go of a Secret is tried when other pipelines change it
/// at the same moment.
const PATCH_TRIES: usize = 5;

/// Holds the Secret of `meta` (as read) for `pipeline`; `true` when it wrote.
pub async fn hold(
    client: &Client,
    writes: &OwnedCaches,
    pipeline: &MailerPipeline,
    meta: &ObjectMeta,
) -> Result<bool, Error> {
    let finalizer = finalizer(pipeline);
    patch_until_taken(client, writes, meta, "hold", |meta| {
        hold_patch(meta, &finalizer)
    })
    .await
}

/// Patches the Secret of `meta` with what `patch_for` makes of it, as read; when the
/// API server refuses the patch because the Secret changed since (409 for a merge
/// patch's version, 422 for a JSON patch's test), reads it again and tries again.
/// `true` when it wrote, `false` when there was nothing to write.
async fn patch_until_taken(
    client: &Client,
    writes: &OwnedCaches,
    meta: &ObjectMeta,
    verb: &str,
    patch_for: impl Fn(&ObjectMeta) -> Option<MetaPatch>,
) -> Result<bool, Error> {
    let mut meta = meta.clone();
    for _ in 1..PATCH_TRIES {
        let Some(patch) = patch_for(&meta) else {
            return Ok(false);
        };
        match patch_secret(client, writes, &meta, patch, verb).await {
            Err(Error::Kube {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 409 || status.code == 422 => {
                meta = read_meta(client, &meta).await?;
            }
            written => return written.map(|()| true),
        }
    }
    let Some(patch) = patch_for(&meta) else {
        return Ok(false);
    };
    patch_secret(client, writes, &meta, patch, verb).await?;
    Ok(true)
}

async fn read_meta(client: &Client, meta: &ObjectMeta) -> Result<ObjectMeta, Error> {
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    secrets
        .get_metadata(&name)
        .await
        .map(|secret| secret.metadata)
        .map_err(|e| Error::kube(format!("read Secret {namespace}/{name}"), e))
}

/// Lets go of every Secret of the pipeline's namespace it holds but the one named
/// `keep`; returns the names of those let go.
pub async fn release_all_but(
    client: &Client,
    writes: &OwnedCaches,
    pipeline: &MailerPipeline,
    keep: Option<&str>,
) -> Result<Vec<String>, Error> {
    let namespace = pipeline
        .namespace()
        .ok_or(Error::IncompleteObject("namespace"))?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let held = secrets
        .list_metadata(&ListParams::default().labels(IN_USE_LABEL))
        .await
        .map_err(|e| Error::kube("list the Secrets held by pipelines", e))?;
    let finalizer = finalizer(pipeline);
    let mut released = Vec::new();
    for secret in held.items {
        let name = secret.name_any();
        if keep == Some(name.as_str()) {
            continue;
        }
        let let_go = patch_until_taken(client, writes, &secret.metadata, "let go of", |meta| {
            release_patch(meta, &finalizer)
        })
        .await?;
        if let_go {
            released.push(name);
        }
    }
    Ok(released)
}

/// Patches the Secret's metadata, and notes the version written, so its watch event
/// coming back triggers no reconcile.
async fn patch_secret(
    client: &Client,
    writes: &OwnedCaches,
    meta: &ObjectMeta,
    patch: MetaPatch,
    verb: &str,
) -> Result<(), Error> {
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let failed = |e| Error::kube(format!("{verb} Secret {namespace}/{name}"), e);
    let patch = patch
        .into_kube()
        .map_err(|e| failed(kube::Error::SerdeError(e)))?;
    let _writing = writes.writing("Secret", &namespace, &name);
    let written = secrets
        .patch_metadata(&name, &PatchParams::default(), &patch)
        .await
        .map_err(failed)?;
    writes.written_meta("Secret", &written.metadata);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(finalizers: Option<&[&str]>, labelled: bool) -> ObjectMeta {
        ObjectMeta {
            name: Some("conn".into()),
            namespace: Some("prod".into()),
            resource_version: Some("7".into()),
            finalizers: finalizers.map(|f| f.iter().map(|s| s.to_string()).collect()),
            labels: labelled.then(|| [(IN_USE_LABEL.to_string(), "true".to_string())].into()),
            ..ObjectMeta::default()
        }
    }

    const MINE: &str = "mailer.dev/in-use-uid-1";
    const THEIRS: &str = "mailer.dev/in-use-uid-2";

    #[test]
    fn holding_adds_the_finalizer_once_keeping_everyone_elses() {
        // The first to hold it writes the list and the label, at the version read.
        let patch = hold_patch(&meta(Some(&["example.com/keep"]), false), MINE).unwrap();
        assert_eq!(
            patch,
            MetaPatch::Merge(json!({"metadata": {"resourceVersion": "7",
                                "finalizers": ["example.com/keep", MINE],
                                "labels": {IN_USE_LABEL: "true"}}}))
        );
        // Those after it append theirs, whatever else was added meanwhile.
        assert_eq!(
            hold_patch(&meta(Some(&[THEIRS]), true), MINE),
            Some(MetaPatch::Json(json!([
                {"op": "add", "path": "/metadata/finalizers/-", "value": MINE},
            ])))
        );
        assert_eq!(hold_patch(&meta(Some(&[MINE]), true), MINE), None);
        // A label removed by hand is put back.
        assert!(matches!(
            hold_patch(&meta(Some(&[MINE]), false), MINE),
            Some(MetaPatch::Merge(_))
        ));
        let mut deleting = meta(None, false);
        deleting.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(hold_patch(&deleting, MINE), None);
    }

    #[test]
    fn letting_go_keeps_the_label_while_another_pipeline_holds_the_secret() {
        // Others still hold it: this finalizer alone goes, if it is still where it was.
        let shared = release_patch(&meta(Some(&[THEIRS, MINE]), true), MINE).unwrap();
        assert_eq!(
            shared,
            MetaPatch::Json(json!([
                {"op": "test", "path": "/metadata/finalizers/1", "value": MINE},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ]))
        );
        // The last lets go of the label too, at the version read.
        let last = release_patch(&meta(Some(&["example.com/keep", MINE]), true), MINE).unwrap();
        assert_eq!(
            last,
            MetaPatch::Merge(json!({"metadata": {"resourceVersion": "7",
                                "finalizers": ["example.com/keep"],
                                "labels": {IN_USE_LABEL: null}}}))
        );
        assert_eq!(release_patch(&meta(Some(&[THEIRS]), true), MINE), None);
        for patch in [shared, last] {
            assert!(patch.into_kube().is_ok(), "a patch kube can send");
        }
    }
}
