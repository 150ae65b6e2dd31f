//! `namespace/name` of a pipeline, checked once: its key in the operator's own maps
//! (backoff, when its queues were last read), its logs and its events.

use std::fmt;

use kube::Resource;

use crate::controller::error::Error;

/// A pipeline's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PipelineKey {
    pub namespace: String,
    pub name: String,
}

impl PipelineKey {
    /// The key of `object`, which must have both (every object from an API server has).
    pub fn of<K: Resource>(object: &K) -> Result<Self, Error> {
        let meta = object.meta();
        Ok(Self {
            namespace: meta
                .namespace
                .clone()
                .ok_or(Error::IncompleteObject("namespace"))?,
            name: meta
                .name
                .clone()
                .ok_or(Error::IncompleteObject("metadata.name"))?,
        })
    }

    /// The key of `object` as far as it has one, for an object that may lack its
    /// namespace or name (one that could not be read).
    pub fn as_far_as_known<K: Resource>(object: &K) -> Self {
        let meta = object.meta();
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Display for PipelineKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{MailerPipeline, MailerPipelineSpec};

    #[test]
    fn a_key_needs_a_namespace_and_reads_as_a_path() {
        let mut p = MailerPipeline::new("shop", MailerPipelineSpec::default());
        assert_eq!(
            PipelineKey::of(&p).unwrap_err().to_string(),
            "the MailerPipeline has no namespace"
        );
        assert_eq!(PipelineKey::as_far_as_known(&p).to_string(), "/shop");
        p.metadata.namespace = Some("prod".into());
        assert_eq!(PipelineKey::of(&p).unwrap().to_string(), "prod/shop");
    }
}
