//! Reading Secrets: one that must exist, and the values of its keys.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};

use crate::controller::error::Error;

/// A Secret that must exist; `wanted` says what it should hold when it does not.
pub async fn get_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    wanted: &str,
) -> Result<Secret, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    secrets
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("read Secret {namespace}/{name}"), e))?
        .ok_or_else(|| Error::MissingSecret {
            namespace: namespace.to_string(),
            name: name.to_string(),
            wanted: wanted.to_string(),
        })
}

/// The value of `key`, from `data` or `stringData`, as text.
pub fn secret_value(secret: &Secret, key: &str) -> Option<String> {
    if let Some(bytes) = secret.data.as_ref().and_then(|data| data.get(key)) {
        return String::from_utf8(bytes.0.clone()).ok();
    }
    secret
        .string_data
        .as_ref()
        .and_then(|data| data.get(key))
        .cloned()
}

/// The value of `key`, or an error that names the Secret, the key and what belongs there.
pub fn required_key(
    secret: &Secret,
    namespace: &str,
    key: &str,
    what: &str,
) -> Result<String, Error> {
    secret_value(secret, key)
        .filter(|value| !value.is_empty())
        .ok_or_else(|| Error::MissingSecretKey {
            namespace: namespace.to_string(),
            name: secret.name_any(),
            key: key.to_string(),
            what: what.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn a_missing_or_empty_key_is_named() {
        let mut secret = Secret::default();
        secret.metadata.name = Some("conn".into());
        secret.data = Some([("uri".to_string(), ByteString(b"http://h".to_vec()))].into());
        secret.string_data = Some([("username".to_string(), String::new())].into());
        assert_eq!(secret_value(&secret, "uri").as_deref(), Some("http://h"));
        let err = required_key(&secret, "shop", "username", "the user")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "Secret shop/conn has no key \"username\"; add the user under that key"
        );
    }
}
