//! Pipelines for the controller's unit tests, built one way.

use crate::spec::MailerPipeline;

/// Pipeline `prod/shop` (uid `uid-1`) with the spec `yaml` (a YAML flow mapping, `{}`
/// for the defaults).
pub fn pipeline(yaml: &str) -> MailerPipeline {
    pipeline_named("prod", "shop", yaml)
}

/// Pipeline `namespace/name` (uid `uid-<namespace>-<name>`, or `uid-1` for `prod/shop`)
/// with the spec `yaml`.
pub fn pipeline_named(namespace: &str, name: &str, yaml: &str) -> MailerPipeline {
    let spec = serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("a spec: {e}: {yaml}"));
    let mut p = MailerPipeline::new(name, spec);
    p.metadata.namespace = Some(namespace.into());
    p.metadata.uid = Some(if (namespace, name) == ("prod", "shop") {
        "uid-1".to_string()
    } else {
        format!("uid-{namespace}-{name}")
    });
    p
}
