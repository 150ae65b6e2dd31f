//! The worker Deployment of a pipeline, as a pure function of the pipeline and what the
//! operator resolved for it.
//!
//! The env names are the worker's contract (`mailer worker` reads them); secrets only
//! ever reach the pod by `secretKeyRef`, never inline.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, KeyToPath,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SeccompProfile, Secret, SecretKeySelector,
    SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use ring::digest::{SHA256, digest};

use crate::controller::error::Error;
use crate::controller::objects::meta::{owned_meta, selector_labels};
use crate::controller::objects::worker_secret::{self, URL_KEY};
use crate::spec::MailerPipeline;

/// The pod-template annotation with the hash of the Secrets the workers read: when one
/// of them changes, so does the template, and the workers roll.
pub const SECRETS_HASH_ANNOTATION: &str = "mailer.dev/secrets-hash";
/// The user and group the workers run as: numeric, so the kubelet can check
/// `runAsNonRoot` whatever the image declares (the release image's `USER` is the same).
pub const WORKER_UID: i64 = 65532;
/// Where the worker serves `/livez`, `/readyz` and `/metrics`.
pub const WORKER_HTTP_ADDR: &str = "0.0.0.0:8080";
const WORKER_HTTP_PORT: i32 = 8080;
const CONTAINER_NAME: &str = "worker";
/// The volume with `spec.worker.provider.caSecretKeyRef`'s CA, where it is mounted, and
/// the file the worker reads (`MAIL_PROVIDER_CA_FILE`).
const PROVIDER_CA_VOLUME: &str = "provider-ca";
const PROVIDER_CA_DIR: &str = "/etc/mailer/provider-ca";
const PROVIDER_CA_FILE: &str = "ca.pem";

/// What the Deployment needs besides the pipeline.
#[derive(Debug, Clone, Copy)]
pub struct WorkerInputs<'a> {
    /// The image when `spec.worker.image` is absent: the operator's own.
    pub default_image: &'a str,
    /// [`secrets_hash`] of the Secrets the workers read.
    pub secrets_hash: &'a str,
}

/// The name of a pipeline's worker Deployment.
pub fn deployment_name(pipeline: &MailerPipeline) -> String {
    format!("{}-worker", pipeline.name_any())
}

/// The worker Deployment the pipeline asks for.
pub fn desired_deployment(
    pipeline: &MailerPipeline,
    inputs: WorkerInputs<'_>,
) -> Result<Deployment, Error> {
    let spec = &pipeline.spec;
    let worker = &spec.worker;
    let topology = &spec.topology;
    let metadata = owned_meta(pipeline, deployment_name(pipeline))?;

    let secret_env = |name: &str, secret: &str, key: &str| EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_string(),
                key: key.to_string(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    let plain_env = |name: &str, value: String| EnvVar {
        name: name.to_string(),
        value: Some(value),
        ..EnvVar::default()
    };
    let mut env = vec![secret_env(
        "MAIL_AMQP_URL",
        &worker_secret::secret_name(pipeline),
        URL_KEY,
    )];
    if let Some(provider) = &worker.provider {
        let selector = &provider.url_secret_key_ref;
        env.push(secret_env(
            "MAIL_PROVIDER_URL",
            &selector.name,
            &selector.key,
        ));
    }
    env.extend([
        plain_env("MAIL_MAX_ATTEMPTS", worker.max_attempts.to_string()),
        plain_env("MAIL_PREFETCH", worker.prefetch.to_string()),
        plain_env("MAIL_QUEUE", topology.queue.clone()),
        plain_env("MAIL_RETRY_EXCHANGE", topology.retry_exchange.clone()),
        plain_env("MAIL_DEAD_EXCHANGE", topology.dead_exchange.clone()),
        // Requests are routed by the send queue's name (see topology::desired).
        plain_env("MAIL_SEND_KEY", topology.queue.clone()),
        plain_env("MAIL_HTTP_ADDR", WORKER_HTTP_ADDR.to_string()),
        plain_env(
            "MAIL_SHUTDOWN_TIMEOUT",
            format!(
                "{}s",
                shutdown_timeout(worker.termination_grace_period_seconds)
            ),
        ),
        plain_env("MAIL_LOG_FORMAT", "json".to_string()),
    ]);
    // Only with tiers, so a pipeline of one delay rolls no worker when tiers came.
    if topology.retry_tier_count() > 1 {
        env.push(plain_env(
            "MAIL_RETRY_KEYS",
            topology.retry_tier_keys().join(","),
        ));
        // The tiers' delays, so that a provider's Retry-After can pick a later tier.
        // Validated before any object is built; a spec that fails here got no workers.
        if let Ok(delays) = topology.retry_delays() {
            let delays: Vec<String> = delays
                .iter()
                .map(|delay| {
                    humantime::format_duration(*delay)
                        .to_string()
                        .replace(' ', "")
                })
                .collect();
            env.push(plain_env("MAIL_RETRY_DELAYS", delays.join(",")));
        }
    }
    // Only when set, so a pipeline without it rolls no worker when this field came.
    if let Some(size) = &worker.max_request_size {
        env.push(plain_env("MAIL_MAX_REQUEST_BYTES", size.0.clone()));
    }
    // The pipeline's rate shared by the pods (see ProviderSpec::rate_limit); only when
    // set, like the size.
    if let Some(rate) = worker.rate_per_replica() {
        env.push(plain_env("MAIL_RATE_LIMIT", rate.to_string()));
    }

    let provider_ca = worker
        .provider
        .as_ref()
        .and_then(|provider| provider.ca_secret_key_ref.as_ref());
    if provider_ca.is_some() {
        env.push(plain_env(
            "MAIL_PROVIDER_CA_FILE",
            format!("{PROVIDER_CA_DIR}/{PROVIDER_CA_FILE}"),
        ));
    }
    // Only the one key is projected, read-only. World-readable: the worker's user owns
    // no group of the volume (no fsGroup), and a CA certificate is no secret.
    let volumes = provider_ca.map(|ca| {
        vec![Volume {
            name: PROVIDER_CA_VOLUME.to_string(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(ca.name.clone()),
                items: Some(vec![KeyToPath {
                    key: ca.key.clone(),
                    path: PROVIDER_CA_FILE.to_string(),
                    mode: None,
                }]),
                default_mode: Some(0o444),
                optional: Some(false),
            }),
            ..Volume::default()
        }]
    });
    let volume_mounts = provider_ca.map(|_| {
        vec![VolumeMount {
            name: PROVIDER_CA_VOLUME.to_string(),
            mount_path: PROVIDER_CA_DIR.to_string(),
            read_only: Some(true),
            ..VolumeMount::default()
        }]
    });

    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String("http".to_string()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    };
    let container = Container {
        name: CONTAINER_NAME.to_string(),
        image: Some(
            worker
                .image
                .clone()
                .unwrap_or_else(|| inputs.default_image.to_string()),
        ),
        image_pull_policy: worker.image_pull_policy.map(|p| p.as_str().to_string()),
        args: Some(vec!["worker".to_string()]),
        env: Some(env),
        volume_mounts,
        ports: Some(vec![ContainerPort {
            name: Some("http".to_string()),
            container_port: WORKER_HTTP_PORT,
            protocol: Some("TCP".to_string()),
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(probe("/livez", 10, 3)),
        readiness_probe: Some(probe("/readyz", 5, 2)),
        resources: worker.resources.clone(),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_string()]),
                ..Capabilities::default()
            }),
            seccomp_profile: Some(runtime_default_seccomp()),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };

    let mut annotations = worker.pod_annotations.clone().unwrap_or_default();
    annotations.insert(
        SECRETS_HASH_ANNOTATION.to_string(),
        inputs.secrets_hash.to_string(),
    );
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: metadata.labels.clone(),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![container],
            volumes,
            service_account_name: worker.service_account_name.clone(),
            node_selector: worker.node_selector.clone(),
            tolerations: worker.tolerations.clone(),
            affinity: worker.affinity.clone(),
            image_pull_secrets: worker.image_pull_secrets.clone(),
            termination_grace_period_seconds: Some(worker.termination_grace_period_seconds),
            // The worker needs no Kubernetes API access.
            automount_service_account_token: Some(false),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(WORKER_UID),
                run_as_group: Some(WORKER_UID),
                seccomp_profile: Some(runtime_default_seccomp()),
                ..PodSecurityContext::default()
            }),
            ..PodSpec::default()
        }),
    };
    Ok(Deployment {
        metadata,
        spec: Some(DeploymentSpec {
            // Under autoscaling KEDA's autoscaler owns the count: applying one would
            // undo its every decision.
            replicas: worker.autoscaling.is_none().then_some(worker.replicas),
            selector: LabelSelector {
                match_labels: Some(selector_labels(pipeline)),
                ..LabelSelector::default()
            },
            template,
            ..DeploymentSpec::default()
        }),
        status: None,
    })
}

/// Keeps the selector of a Deployment that exists: it is immutable, and one made by an
/// earlier version of the operator selects by other labels (`app.kubernetes.io/instance`
/// before `mailer.dev/pipeline`). The pods then carry those labels too, so they still
/// match it; the Deployment's own labels are the current ones.
pub fn keep_live_selector(desired: &mut Deployment, live: &Deployment) {
    let Some(live_selector) = live.spec.as_ref().map(|spec| spec.selector.clone()) else {
        return;
    };
    let Some(spec) = desired.spec.as_mut() else {
        return;
    };
    if spec.selector == live_selector {
        return;
    }
    if let Some(metadata) = spec.template.metadata.as_mut() {
        let labels = metadata.labels.get_or_insert_with(BTreeMap::new);
        for (key, value) in live_selector.match_labels.iter().flatten() {
            labels.insert(key.clone(), value.clone());
        }
    }
    spec.selector = live_selector;
}

/// How long a stopping worker waits for the mail in flight: most of the grace period,
/// leaving the last part (up to 10s) to close its connections before it is killed.
pub fn shutdown_timeout(grace_period_seconds: i64) -> i64 {
    let margin = (grace_period_seconds / 4).min(10);
    (grace_period_seconds - margin).max(1)
}

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_string(),
        ..SeccompProfile::default()
    }
}

/// A hash of the data of `secrets` (names, keys and values), in hex. Order does not
/// matter; a missing Secret is simply not part of it.
pub fn secrets_hash(secrets: &[&Secret]) -> String {
    let mut entries: BTreeMap<(String, String), Vec<u8>> = BTreeMap::new();
    for secret in secrets {
        for (key, value) in secret.data.iter().flatten() {
            entries.insert((secret.name_any(), key.clone()), value.0.clone());
        }
        for (key, value) in secret.string_data.iter().flatten() {
            entries.insert((secret.name_any(), key.clone()), value.as_bytes().to_vec());
        }
    }
    let mut input = Vec::new();
    for ((name, key), value) in &entries {
        for part in [name.as_bytes(), key.as_bytes(), value.as_slice()] {
            input.extend_from_slice(&(part.len() as u64).to_be_bytes());
            input.extend_from_slice(part);
        }
    }
    digest(&SHA256, &input)
        .as_ref()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use serde_json::{Value, json};

    use crate::controller::fixtures::pipeline;

    fn deployment(yaml: &str) -> Value {
        let inputs = WorkerInputs {
            default_image: "reg/mailer:1.0",
            secrets_hash: "abc",
        };
        serde_json::to_value(desired_deployment(&pipeline(yaml), inputs).unwrap()).unwrap()
    }

    fn env(d: &Value) -> Vec<(String, Value)> {
        d["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let value = e
                    .get("value")
                    .cloned()
                    .unwrap_or_else(|| e["valueFrom"].clone());
                (e["name"].as_str().unwrap().to_string(), value)
            })
            .collect()
    }

    #[test]
    fn the_worker_gets_its_contract_env_with_secrets_by_reference() {
        let d = deployment(
            "topology: {queue: shop.out, retryExchange: shop.later, deadExchange: shop.dead}\n\
             worker: {maxAttempts: 7, prefetch: 4, provider: {urlSecretKeyRef: {name: smtp, key: url}}}",
        );
        assert_eq!(
            env(&d),
            [
                (
                    "MAIL_AMQP_URL".to_string(),
                    json!({"secretKeyRef": {"name": "shop-worker-amqp", "key": "url", "optional": false}})
                ),
                (
                    "MAIL_PROVIDER_URL".to_string(),
                    json!({"secretKeyRef": {"name": "smtp", "key": "url", "optional": false}})
                ),
                ("MAIL_MAX_ATTEMPTS".to_string(), json!("7")),
                ("MAIL_PREFETCH".to_string(), json!("4")),
                ("MAIL_QUEUE".to_string(), json!("shop.out")),
                ("MAIL_RETRY_EXCHANGE".to_string(), json!("shop.later")),
                ("MAIL_DEAD_EXCHANGE".to_string(), json!("shop.dead")),
                ("MAIL_SEND_KEY".to_string(), json!("shop.out")),
                ("MAIL_HTTP_ADDR".to_string(), json!("0.0.0.0:8080")),
                ("MAIL_SHUTDOWN_TIMEOUT".to_string(), json!("110s")),
                ("MAIL_LOG_FORMAT".to_string(), json!("json")),
            ]
        );
    }

    #[test]
    fn delay_tiers_pass_their_keys_and_delays_and_one_delay_passes_neither() {
        let tiers = |yaml: &str| -> Vec<(String, Value)> {
            env(&deployment(yaml))
                .into_iter()
                .filter(|(name, _)| {
                    name.starts_with("MAIL_RETRY_") && name != "MAIL_RETRY_EXCHANGE"
                })
                .collect()
        };
        assert_eq!(
            tiers("topology: {retryDelays: [30s, 300s, 1h30m]}"),
            [
                (
                    "MAIL_RETRY_KEYS".to_string(),
                    json!("mail.send,mail.send.retry.2,mail.send.retry.3")
                ),
                ("MAIL_RETRY_DELAYS".to_string(), json!("30s,5m,1h30m")),
            ]
        );
        assert_eq!(tiers("topology: {retryDelay: 10m}"), []);
    }

    #[test]
    fn the_request_size_limit_is_passed_only_when_the_spec_sets_it() {
        let size = |d: &Value| {
            env(d)
                .into_iter()
                .find(|(name, _)| name == "MAIL_MAX_REQUEST_BYTES")
                .map(|(_, value)| value)
        };
        assert_eq!(size(&deployment("{}")), None, "the worker's default");
        assert_eq!(
            size(&deployment("worker: {maxRequestSize: 32Mi}")),
            Some(json!("32Mi"))
        );
        assert_eq!(
            size(&deployment("worker: {maxRequestSize: 33554432}")),
            Some(json!("33554432"))
        );
    }

    #[test]
    fn a_provider_ca_is_mounted_read_only_and_named_to_the_worker() {
        let without = deployment("worker: {provider: {urlSecretKeyRef: {name: smtp, key: url}}}");
        assert!(without["spec"]["template"]["spec"].get("volumes").is_none());
        assert!(
            !env(&without)
                .iter()
                .any(|(name, _)| name == "MAIL_PROVIDER_CA_FILE")
        );

        let d = deployment(
            "worker: {provider: {urlSecretKeyRef: {name: smtp, key: url}, \
             caSecretKeyRef: {name: relay-tls, key: ca.crt}}}",
        );
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(
            pod["volumes"],
            json!([{"name": "provider-ca", "secret": {"secretName": "relay-tls",
                    "items": [{"key": "ca.crt", "path": "ca.pem"}],
                    "defaultMode": 0o444, "optional": false}}])
        );
        assert_eq!(
            pod["containers"][0]["volumeMounts"],
            json!([{"name": "provider-ca", "mountPath": "/etc/mailer/provider-ca", "readOnly": true}])
        );
        assert!(env(&d).contains(&(
            "MAIL_PROVIDER_CA_FILE".to_string(),
            json!("/etc/mailer/provider-ca/ca.pem")
        )));
    }

    #[test]
    fn the_pod_is_restricted_probed_and_runs_the_worker() {
        let d = deployment("{}");
        let pod = &d["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "reg/mailer:1.0");
        assert_eq!(c["args"], json!(["worker"]));
        assert_eq!(
            c["ports"],
            json!([{"name": "http", "containerPort": 8080, "protocol": "TCP"}])
        );
        assert_eq!(
            c["livenessProbe"]["httpGet"],
            json!({"path": "/livez", "port": "http"})
        );
        assert_eq!(
            c["readinessProbe"]["httpGet"],
            json!({"path": "/readyz", "port": "http"})
        );
        assert_eq!(
            c["securityContext"],
            json!({"runAsNonRoot": true, "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                   "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}})
        );
        assert_eq!(
            pod["securityContext"],
            json!({"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                   "seccompProfile": {"type": "RuntimeDefault"}}),
            "a numeric user: an image without one would fail with CreateContainerConfigError"
        );
        assert_eq!(pod["terminationGracePeriodSeconds"], 120);
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(
            d["spec"]["selector"]["matchLabels"],
            json!({"mailer.dev/pipeline": "shop", "app.kubernetes.io/name": "mailer-worker"})
        );
        assert_eq!(d["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(d["metadata"]["name"], "shop-worker");
        assert_eq!(
            d["spec"]["template"]["metadata"]["annotations"][SECRETS_HASH_ANNOTATION],
            "abc"
        );
    }

    #[test]
    fn pod_overrides_are_passed_through() {
        let d = deployment(
            "worker: {image: 'own/img:2', imagePullPolicy: IfNotPresent, replicas: 3, serviceAccountName: mail,\n\
             nodeSelector: {disk: ssd}, tolerations: [{key: k, operator: Exists}],\n\
             imagePullSecrets: [{name: reg}], podAnnotations: {a: b},\n\
             resources: {requests: {cpu: 100m}}, terminationGracePeriodSeconds: 300,\n\
             affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [a]}]}]}}}}",
        );
        let pod = &d["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "own/img:2");
        assert_eq!(c["imagePullPolicy"], "IfNotPresent");
        assert_eq!(c["resources"], json!({"requests": {"cpu": "100m"}}));
        assert_eq!(pod["serviceAccountName"], "mail");
        assert_eq!(pod["nodeSelector"], json!({"disk": "ssd"}));
        assert_eq!(
            pod["tolerations"],
            json!([{"key": "k", "operator": "Exists"}])
        );
        assert_eq!(pod["imagePullSecrets"], json!([{"name": "reg"}]));
        assert_eq!(pod["terminationGracePeriodSeconds"], 300);
        assert_eq!(
            pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                [0]["matchExpressions"][0]["key"],
            "zone"
        );
        assert_eq!(d["spec"]["replicas"], 3);
        let annotations = &d["spec"]["template"]["metadata"]["annotations"];
        assert_eq!(annotations["a"], "b");
        assert_eq!(annotations[SECRETS_HASH_ANNOTATION], "abc");
    }

    #[test]
    fn an_older_selector_is_kept_and_the_pods_still_match_it() {
        let inputs = WorkerInputs {
            default_image: "reg/mailer:1.0",
            secrets_hash: "abc",
        };
        let p = pipeline("{}");
        let mut old = desired_deployment(&p, inputs).unwrap();
        let old_selector = BTreeMap::from([
            (
                "app.kubernetes.io/name".to_string(),
                "mailer-worker".to_string(),
            ),
            ("app.kubernetes.io/instance".to_string(), "shop".to_string()),
        ]);
        old.spec.as_mut().unwrap().selector.match_labels = Some(old_selector.clone());
        let mut desired = desired_deployment(&p, inputs).unwrap();
        keep_live_selector(&mut desired, &old);
        let spec = desired.spec.unwrap();
        assert_eq!(spec.selector.match_labels, Some(old_selector.clone()));
        let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
        for (key, value) in &old_selector {
            assert_eq!(pod_labels.get(key), Some(value));
        }
        assert_eq!(pod_labels["mailer.dev/pipeline"], "shop");
        assert!(
            !desired
                .metadata
                .labels
                .unwrap()
                .contains_key("app.kubernetes.io/instance")
        );
    }

    #[test]
    fn the_rate_limit_is_shared_by_the_replicas_or_the_most_the_autoscaler_runs() {
        let rate = |yaml: &str| {
            let env = env(&deployment(yaml));
            env.into_iter()
                .find(|(name, _)| name == "MAIL_RATE_LIMIT")
                .map(|(_, value)| value)
        };
        let provider = "provider: {urlSecretKeyRef: {name: p, key: url}, rateLimit: 14}";
        assert_eq!(
            rate(&format!("worker: {{replicas: 4, {provider}}}")),
            Some(json!("3.5"))
        );
        assert_eq!(
            rate(&format!(
                "worker: {{replicas: 1, autoscaling: {{minReplicas: 0, maxReplicas: 7}}, {provider}}}"
            )),
            Some(json!("2"))
        );
        assert_eq!(rate(&format!("worker: {{replicas: 0, {provider}}}")), None);
        assert_eq!(
            rate("worker: {provider: {urlSecretKeyRef: {name: p, key: url}}}"),
            None,
            "no limit, no variable: a pipeline without one rolls no worker"
        );
    }

    #[test]
    fn under_autoscaling_the_count_is_left_to_the_autoscaler() {
        let d = deployment("worker: {replicas: 3, autoscaling: {minReplicas: 0, maxReplicas: 5}}");
        assert!(d["spec"].get("replicas").is_none(), "{}", d["spec"]);
    }

    #[test]
    fn the_worker_stops_waiting_for_mail_before_the_kubelet_kills_it() {
        assert_eq!(shutdown_timeout(120), 110);
        assert_eq!(shutdown_timeout(30), 23);
        assert_eq!(shutdown_timeout(1), 1);
    }

    #[test]
    fn the_secrets_hash_changes_with_any_value_and_not_with_order() {
        let secret = |name: &str, value: &str| {
            let mut s = Secret::default();
            s.metadata.name = Some(name.into());
            s.data = Some([("url".to_string(), ByteString(value.as_bytes().to_vec()))].into());
            s
        };
        let (a, b) = (secret("a", "1"), secret("b", "2"));
        assert_eq!(secrets_hash(&[&a, &b]), secrets_hash(&[&b, &a]));
        assert_ne!(
            secrets_hash(&[&a, &b]),
            secrets_hash(&[&a, &secret("b", "3")])
        );
        assert_ne!(secrets_hash(&[&a]), secrets_hash(&[&secret("a", "12")]));
        assert_eq!(secrets_hash(&[&a]).len(), 32);
    }
}
