//! Label selectors as kube-apiserver reads them: `a=b`, `a==b`, `a!=b`, `a`, `!a`,
//! `a in (x,y)`, `a notin (x,y)`, comma-separated, all of which must hold; and field
//! selectors (`metadata.name=x,type!=Opaque`) on the fields kube-apiserver supports for
//! the resource (`fields_supported`), anything else being a 400.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed selector; the empty selector selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    labels: Vec<Requirement>,
    /// (field path, whether it must equal, the value).
    fields: Vec<(String, bool, String)>,
}

impl Selector {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            requirements.push(requirement(part)?);
        }
        Ok(Self {
            labels: requirements,
            fields: Vec::new(),
        })
    }

    /// This selector with a field selector's requirements, each on a field that
    /// `supported` says the resource can be selected by.
    pub fn with_fields(
        mut self,
        text: &str,
        supported: impl Fn(&str) -> bool,
    ) -> Result<Self, String> {
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, equals, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                ));
            };
            let field = field.trim();
            if !supported(field) {
                return Err(format!("field label not supported: {field}"));
            }
            self.fields
                .push((field.to_string(), equals, value.trim().to_string()));
        }
        Ok(self)
    }

    /// Whether the object's labels satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let label = |key: &str| labels.get(key).and_then(Value::as_str);
        let field = |path: &str| {
            let found = path.split('.').try_fold(object, |v, key| v.get(key));
            match found {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            }
        };
        let fields_hold = self
            .fields
            .iter()
            .all(|(path, equals, value)| (field(path) == *value) == *equals);
        fields_hold
            && self.labels.iter().all(|r| match r {
                Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
                Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
                Requirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
                Requirement::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
                Requirement::Exists(k) => label(k).is_some(),
                Requirement::DoesNotExist(k) => label(k).is_none(),
            })
    }
}

/// Splits at commas outside parentheses.
/// Whether kube-apiserver lets `resource` (of group `group`) be selected by `field`:
/// every resource by its name and namespace, events by what they are about, Secrets by
/// their type, Namespaces by their phase.
pub fn fields_supported(group: &str, resource: &str, field: &str) -> bool {
    if matches!(field, "metadata.name" | "metadata.namespace") {
        return true;
    }
    match (group, resource) {
        ("", "events") => {
            field.starts_with("involvedObject.")
                || matches!(field, "reason" | "reportingComponent" | "type")
        }
        ("events.k8s.io", "events") => {
            field.starts_with("regarding.")
                || matches!(field, "reason" | "reportingController" | "type")
        }
        ("", "secrets") => field == "type",
        ("", "namespaces") => field == "status.phase",
        _ => false,
    }
}

fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn requirement(part: &str) -> Result<Requirement, String> {
    let set = |rest: &str| -> Result<Vec<String>, String> {
        let inner = rest
            .trim()
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .ok_or_else(|| format!("bad set in {part:?}"))?;
        Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
    };
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key.trim().to_string()));
    }
    if let Some((key, value)) = part.split_once("!=") {
        return Ok(Requirement::NotEquals(
            key.trim().into(),
            value.trim().into(),
        ));
    }
    if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return Ok(Requirement::Equals(key.trim().into(), value.trim().into()));
    }
    if let Some((key, rest)) = part.split_once(" notin ") {
        return Ok(Requirement::NotIn(key.trim().into(), set(rest)?));
    }
    if let Some((key, rest)) = part.split_once(" in ") {
        return Ok(Requirement::In(key.trim().into(), set(rest)?));
    }
    Ok(Requirement::Exists(part.to_string()))
}
