//! Reading MailerPipelines from YAML files with one or more documents, as `kubectl`
//! would: every MailerPipeline is taken, any other kind is skipped with a note.

use kube::ResourceExt;
use serde::Deserialize;

use crate::spec::MailerPipeline;

pub const API_VERSION: &str = "mailer.dev/v1alpha1";
pub const KIND: &str = "MailerPipeline";

/// The pipelines of a file, and a note for each document that was skipped.
#[derive(Debug, Default)]
pub struct Manifest {
    pub pipelines: Vec<MailerPipeline>,
    pub skipped: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: document {index} is not valid YAML: {message}")]
    Yaml {
        path: String,
        index: usize,
        message: String,
    },
    #[error("{path}: document {index} ({name}): {message}")]
    Invalid {
        path: String,
        index: usize,
        name: String,
        message: String,
    },
    #[error("{path} holds no MailerPipeline{skipped}")]
    Empty { path: String, skipped: String },
}

/// Reads `path` (`-` for standard input).
pub fn read(path: &str) -> Result<Manifest, ManifestError> {
    let text = if path == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    }
    .map_err(|source| ManifestError::Read {
        path: path.to_string(),
        source,
    })?;
    parse(path, &text)
}

/// Parses the documents of `text`; `path` only names them in errors.
pub fn parse(path: &str, text: &str) -> Result<Manifest, ManifestError> {
    let mut manifest = Manifest::default();
    for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let index = i + 1;
        let value = serde_yaml::Value::deserialize(document).map_err(|e| ManifestError::Yaml {
            path: path.to_string(),
            index,
            message: e.to_string(),
        })?;
        if value.is_null() {
            continue;
        }
        let field = |name: &str| {
            value
                .get(name)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let (kind, api_version) = (field("kind"), field("apiVersion"));
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(|n| n.as_str())
            .unwrap_or("unnamed")
            .to_string();
        if kind != KIND {
            let kind = if kind.is_empty() {
                "a document without a kind".to_string()
            } else {
                kind
            };
            manifest.skipped.push(format!(
                "skipped document {index} ({kind} {name}): not a {KIND}"
            ));
            continue;
        }
        let invalid = |message: String| ManifestError::Invalid {
            path: path.to_string(),
            index,
            name: name.clone(),
            message,
        };
        if api_version != API_VERSION {
            return Err(invalid(format!(
                "apiVersion is {api_version:?}; a {KIND} is {API_VERSION}"
            )));
        }
        let pipeline: MailerPipeline =
            serde_path_to_error::deserialize(value.clone()).map_err(|e| {
                let at = e.path().to_string();
                let message = e.into_inner().to_string();
                invalid(if at == "." {
                    message
                } else {
                    format!("{at}: {message}")
                })
            })?;
        pipeline
            .spec
            .validate()
            .map_err(|e| invalid(e.to_string()))?;
        manifest.pipelines.push(pipeline);
    }
    if manifest.pipelines.is_empty() {
        let skipped = if manifest.skipped.is_empty() {
            String::new()
        } else {
            format!(" ({})", manifest.skipped.join("; "))
        };
        return Err(ManifestError::Empty {
            path: path.to_string(),
            skipped,
        });
    }
    Ok(manifest)
}

/// A pipeline's name for messages: `namespace/name`, or `name`.
pub fn display_name(pipeline: &MailerPipeline) -> String {
    match pipeline.namespace() {
        Some(ns) => format!("{ns}/{}", pipeline.name_any()),
        None => pipeline.name_any(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipelines_are_taken_and_other_kinds_skipped() {
        let text = "apiVersion: v1\nkind: Secret\nmetadata: {name: creds}\n---\n\
                    apiVersion: mailer.dev/v1alpha1\nkind: MailerPipeline\nmetadata: {name: shop}\nspec: {rabbitmq: {vhost: shop}}\n---\n";
        let m = parse("f.yaml", text).unwrap();
        assert_eq!(m.pipelines.len(), 1);
        assert_eq!(m.pipelines[0].spec.rabbitmq.vhost, "shop");
        assert_eq!(
            m.skipped,
            ["skipped document 1 (Secret creds): not a MailerPipeline"]
        );
    }

    #[test]
    fn a_wrong_field_is_named_with_the_document() {
        let text = "apiVersion: mailer.dev/v1alpha1\nkind: MailerPipeline\nmetadata: {name: shop}\nspec:\n  topology:\n    retryDelya: 5m\n";
        let err = parse("f.yaml", text).unwrap_err().to_string();
        assert!(err.starts_with("f.yaml: document 1 (shop): "), "{err}");
        assert!(
            err.contains("spec.topology.retryDelya: unknown field `retryDelya`"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_value_is_named_by_its_field() {
        let text = "apiVersion: mailer.dev/v1alpha1\nkind: MailerPipeline\nmetadata: {name: shop}\nspec: {topology: {retryDelay: banana}}\n";
        let err = parse("f.yaml", text).unwrap_err().to_string();
        assert!(
            err.contains("spec.topology.retryDelay: \"banana\" is not a duration"),
            "{err}"
        );
    }

    #[test]
    fn a_file_without_pipelines_is_an_error() {
        let err = parse("f.yaml", "kind: ConfigMap\nmetadata: {name: x}\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "f.yaml holds no MailerPipeline (skipped document 1 (ConfigMap x): not a MailerPipeline)"
        );
        assert!(parse("f.yaml", "a: [").is_err());
    }
}
