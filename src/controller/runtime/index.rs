//! Which pipelines read which Secret, and which use which RabbitmqCluster: kept up to
//! date from the pipelines' own watch, so a change of one of thousands of Secrets finds
//! its pipelines by a lookup instead of a scan of every pipeline.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use kube::ResourceExt;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;

use crate::controller::broker::secrets::secrets_read;
use crate::spec::MailerPipeline;

/// A pipeline as the root watch reads it.
pub type Guarded = DeserializeGuard<MailerPipeline>;

/// An object pipelines refer to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Referenced {
    Secret { namespace: String, name: String },
    Cluster { namespace: String, name: String },
}

#[derive(Default)]
struct Inner {
    by_pipeline: HashMap<ObjectRef<Guarded>, Vec<Referenced>>,
    readers: HashMap<Referenced, HashSet<ObjectRef<Guarded>>>,
}

/// The index; clones share it.
#[derive(Clone, Default)]
pub struct ReferenceIndex {
    inner: Arc<RwLock<Inner>>,
}

impl ReferenceIndex {
    /// Takes in one event of the pipelines' watch. A relist starts from scratch, so
    /// pipelines deleted while the watch was away are forgotten.
    pub fn observe(&self, event: &Event<Guarded>) {
        match event {
            Event::Init => *self.write() = Inner::default(),
            Event::Apply(pipeline) | Event::InitApply(pipeline) => self.set(pipeline),
            Event::Delete(pipeline) => {
                self.write().remove(&ObjectRef::from_obj(pipeline));
            }
            Event::InitDone => {}
        }
    }

    /// The pipelines that refer to `referenced`.
    pub fn pipelines(&self, referenced: &Referenced) -> Vec<ObjectRef<Guarded>> {
        let inner = self
            .inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner
            .readers
            .get(referenced)
            .map(|readers| readers.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn set(&self, pipeline: &Guarded) {
        let key = ObjectRef::from_obj(pipeline);
        let referenced = references(pipeline);
        let mut inner = self.write();
        inner.remove(&key);
        for object in &referenced {
            inner
                .readers
                .entry(object.clone())
                .or_default()
                .insert(key.clone());
        }
        inner.by_pipeline.insert(key, referenced);
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Inner {
    fn remove(&mut self, key: &ObjectRef<Guarded>) {
        for object in self.by_pipeline.remove(key).unwrap_or_default() {
            if let Some(readers) = self.readers.get_mut(&object) {
                readers.remove(key);
                if readers.is_empty() {
                    self.readers.remove(&object);
                }
            }
        }
    }
}

/// What a pipeline refers to: the Secrets it reads and its RabbitmqCluster. One that
/// could not be read refers to nothing.
fn references(pipeline: &Guarded) -> Vec<Referenced> {
    let Ok(pipeline) = &pipeline.0 else {
        return Vec::new();
    };
    let mut referenced: Vec<Referenced> = secrets_read(pipeline)
        .into_iter()
        .map(|read| Referenced::Secret {
            namespace: read.namespace,
            name: read.name,
        })
        .collect();
    if let Some(cluster) = &pipeline.spec.rabbitmq.cluster_ref {
        let own = pipeline.namespace().unwrap_or_default();
        referenced.push(Referenced::Cluster {
            namespace: cluster.namespace_or(&own).to_string(),
            name: cluster.name.clone(),
        });
    }
    referenced
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline(name: &str, yaml: &str) -> Guarded {
        DeserializeGuard(Ok(crate::controller::fixtures::pipeline_named(
            "prod", name, yaml,
        )))
    }

    fn secret(name: &str) -> Referenced {
        Referenced::Secret {
            namespace: "prod".into(),
            name: name.into(),
        }
    }

    #[test]
    fn secrets_map_to_the_pipelines_that_read_them_as_they_change() {
        let index = ReferenceIndex::default();
        let a = pipeline("a", "rabbitmq: {connectionSecret: {name: conn}}");
        let b = pipeline(
            "b",
            "rabbitmq: {clusterRef: {name: rmq}}\nworker: {provider: {urlSecretKeyRef: {name: smtp, key: url}}}",
        );
        index.observe(&Event::Init);
        index.observe(&Event::InitApply(a.clone()));
        index.observe(&Event::InitApply(b.clone()));
        index.observe(&Event::InitDone);
        assert_eq!(index.pipelines(&secret("conn")), [ObjectRef::from_obj(&a)]);
        assert_eq!(index.pipelines(&secret("smtp")), [ObjectRef::from_obj(&b)]);
        assert_eq!(index.pipelines(&secret("rmq-default-user")).len(), 1);
        let cluster = Referenced::Cluster {
            namespace: "prod".into(),
            name: "rmq".into(),
        };
        assert_eq!(index.pipelines(&cluster), [ObjectRef::from_obj(&b)]);
        assert!(index.pipelines(&secret("unrelated")).is_empty());

        let moved = pipeline("a", "rabbitmq: {connectionSecret: {name: other}}");
        index.observe(&Event::Apply(moved));
        assert!(index.pipelines(&secret("conn")).is_empty());
        assert_eq!(index.pipelines(&secret("other")).len(), 1);
        index.observe(&Event::Delete(b));
        assert!(index.pipelines(&secret("smtp")).is_empty());
    }
}
